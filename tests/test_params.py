"""Typed mechanism options: one declaration gives validation, CLI flags and
the Flex Template's parameters; unknown flags are errors with a suggestion;
a new mechanism is one module plus one registry line."""
import dataclasses
import inspect
import json
import math
from pathlib import Path

import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.cli import flags, template
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import ReportBatch, with_statuses
from kvldp.mechanisms.params import Options, flag_name, option
from kvldp.mechanisms.protocol import Mechanism
from ldp_audit import all_users, log_worst_ratio

ROOT = Path(__file__).resolve().parents[1]


def constructor_defaults(name):
    params = inspect.signature(registry.factory(name)).parameters
    return {k: p.default for k, p in params.items() if k not in ("d", "epsilon", "variant")}


@pytest.mark.parametrize("name", registry.names())
def test_options_defaults_are_the_constructors(name):
    fields = {f.name: f.default for f in dataclasses.fields(registry.options_type(name))}
    expected = constructor_defaults(name)
    assert set(fields) == set(expected)
    for k, v in expected.items():
        assert (tuple(v) if isinstance(v, (list, tuple)) else v) == fields[k], k
    # default options build the mechanism with its defaults
    default = registry.make(name, 6, 1.0, registry.options_type(name)())
    assert default.config() == registry.factory(name)(6, 1.0).config()


@pytest.mark.parametrize("name", registry.names())
def test_options_round_trip_through_flags(name):
    """Every option's default, written as its flag, parses back to itself."""
    parser = cli.subcommand_parser(cli.parser(), "simulate")
    argv = ["--mechanism", name, "--epsilon", "1"]
    for f in dataclasses.fields(registry.options_type(name)):
        if f.default is None:
            continue
        text = ",".join(map(str, f.default)) if isinstance(f.default, tuple) else str(f.default)
        argv += [flag_name(f.name), text]
    args, rest = parser.parse_known_args(argv)
    assert rest == []
    opts = registry.options(name, **{f: getattr(args, f) for f in registry.options_of(name)})
    assert opts == registry.options_type(name)()


def test_one_option_name_means_one_thing():
    found = flags.mechanism_flags()
    assert {"padding", "clip", "rounds", "t", "a0", "max_rounds", "default_value", "ioh_keys", "top",
            "group_split", "group_shares", "coverage", "key_share", "kept_share"} == set(found)
    assert sorted(m for m, _ in found["padding"].takers) == ["ks-ue", "pckv-grr", "pckv-ue"]
    assert sorted(m for m, _ in found["kept_share"].takers) == ["ks-grr", "ks-ue", "pckv-grr", "pckv-ue"]


@pytest.mark.parametrize("name, option_name, value, says", [
    ("pckv-ue", "padding", 0, "--padding must be >= 1"),
    ("pckv-grr", "clip", "never", "--clip must be one of paper, matlab"),
    ("ks-adap", "coverage", 1.5, "--coverage must be in (0, 1]"),
    ("ks-adap", "group_shares", (0.5, 1.2, 0.1), "--group-shares must be in (0, 1)"),
    ("privkvm-plus", "max_rounds", 2.5, "--max-rounds must be a whole number"),
    ("f2m", "default_value", math.nan, "--default-value must be a finite number"),
])
def test_out_of_range_options_are_refused_naming_the_flag(name, option_name, value, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
                       .replace("]", r"\]")):
        registry.options(name, **{option_name: value})


def test_an_option_the_mechanism_does_not_take_is_refused():
    with pytest.raises(ValueError, match="does not take clip"):
        registry.options("privkv", clip="paper")


# -- unknown flags ------------------------------------------------------------

@pytest.mark.parametrize("argv, suggestion", [
    (["--paddng", "3"], "--padding"),
    (["--epsilom", "3"], "--epsilon"),
    (["--direct_num_worker=1"], "--direct_num_workers"),
])
def test_unknown_flag_is_an_error_with_a_suggestion(argv, suggestion, capsys):
    rc = cli.main(["simulate", "--mechanism", "pckv-ue", "--epsilon", "1", "--users", "100", *argv])
    err = capsys.readouterr().err
    assert rc != 0
    assert f"unrecognized argument {argv[0].split('=')[0]}" in err and f"did you mean {suggestion}?" in err, err


def test_stray_positional_is_an_error(capsys):
    assert cli.main(["simulate", "--mechanism", "pckv-ue", "--epsilon", "1", "--users", "100", "stray"]) != 0
    assert "unrecognized argument 'stray'" in capsys.readouterr().err


def test_beam_flags_still_pass_through():
    ours = cli.subcommand_parser(cli.parser(), "simulate")
    for beam_args in (["--runner", "DirectRunner"], ["--runner=DirectRunner"], ["--direct_num_workers", "1"],
                      ["--temp_location", "/tmp/x"], ["--save_main_session"], ["--experiments=a", "--experiments=b"],
                      ["--flink_master", "localhost:8081", "--environment_type", "LOOPBACK"],
                      ["--render_output=graph.png"]):
        flags.check_beam_args(beam_args, ours)          # no error


# -- the Flex Template --------------------------------------------------------

@pytest.mark.parametrize("command, expected", [
    ("collect", {"mechanism", "epsilon", "input", "output", "key_dictionary", "padding", "key_share"}),
    ("stream", {"mechanism", "epsilon", "subscription", "window", "early_every", "allowed_lateness",
                "output_topic", "dead_letter_topic", "broadcast_topic", "collection_id"}),
])
def test_committed_template_metadata_is_generated_from_the_flags(command, expected):
    name = template.TEMPLATES[command][0]
    committed = json.loads((ROOT / "deploy" / "dataflow" / name).read_text())
    regenerate = f"python -m kvldp.cli.template {command} > deploy/dataflow/{name}"
    assert committed == template.metadata(command), regenerate
    assert expected <= {p["name"] for p in committed["parameters"]}


def test_template_parameters_become_cli_flags():
    assert template.template_argv(["--key_dictionary=gs://b/k.txt", "--max_rounds=4", "--temp_location=gs://t"]) == [
        "collect", "--key-dictionary=gs://b/k.txt", "--max-rounds=4", "--temp_location=gs://t"]
    assert template.template_argv(["--early_every=30s", "--output_topic=projects/p/topics/t"], "stream") == [
        "stream", "--early-every=30s", "--output-topic=projects/p/topics/t"]


# -- a new mechanism: one module (here: this class) plus one registry line ----

@dataclasses.dataclass(frozen=True)
class ToyOptions(Options):
    flip_share: float = option(0.5, "toy: the share of epsilon on the key bit", low=0.0, high=1.0,
                               low_open=True, high_open=True, parse=float)


class ToyKV(Mechanism):
    """Key bit by randomised response (eps1), value sign by randomised
    response (eps2) for one uniformly sampled key -- a small F2M."""

    name = "toy-kv"
    options_type = ToyOptions

    def __init__(self, d, epsilon, flip_share=0.5):
        self.flip_share = flip_share
        super().__init__(d, epsilon)
        e1, e2 = (math.exp(self.ledger.round_epsilon(0, c)) for c in ("key", "value"))
        self.p1, self.p2 = e1 / (e1 + 1), e2 / (e2 + 1)

    def budget_shares(self):
        from kvldp.mechanisms.privacy.accountant import Share
        key = self.epsilon * self.flip_share
        return [Share(0, "key", key), Share(0, "value", self.epsilon - key)]

    def config(self, round_index=None):
        return {**super().config(), "flip_share": self.flip_share}

    def perturb(self, users, rng):
        from kvldp.mechanisms.frequency.sampling import discretise, uniform_key_sampling
        n = users.n_users
        j, held, values = uniform_key_sampling(users, self.d, rng)
        bit = np.where(rng.random(n) < self.p1, held, ~held)
        x = discretise(np.where(held, values, 0.0), rng)
        x = np.where(rng.random(n) < self.p2, x, -x)
        return ReportBatch(np.arange(n + 1), j, (x * (1 + bit)).astype(np.int8), users.batch_id)

    @property
    def counts_size(self):
        return 1 + 4 * self.d

    def accumulate(self, counts, reports):
        sym = {-2: 0, -1: 1, 1: 2, 2: 3}
        idx = np.vectorize(sym.get)(reports.symbols) if len(reports.symbols) else np.zeros(0, np.int64)
        counts[0] += reports.n_reports
        np.add.at(counts, 1 + idx * self.d + reports.positions, 1)
        return counts

    def estimate(self, counts):
        n, d = max(int(counts[0]), 1), self.d
        c = counts[1:].reshape(4, d).astype(float)
        held = (c[2] + c[3] + c[0] + c[1])          # every report of key j
        ones = c[0] + c[3]                           # key bit 1
        f = d * ((ones / n) - (1 - self.p1) / d) / (2 * self.p1 - 1)
        up = c[3] + c[2] - c[0] - c[1]
        with np.errstate(divide="ignore", invalid="ignore"):
            m = np.where(held > 0, up / held / (2 * self.p2 - 1), np.nan)
        nan = np.full(d, np.nan)
        return with_statuses(np.clip(f, 0, 1), np.clip(m, -1, 1), f, m, nan, nan, n_reports=n, mechanism=self.name,
                             epsilon=self.epsilon, mean_biased=True)

    def output_probabilities(self, pairs, round_index=0, state=None):
        held, out = dict(pairs), []
        for j in range(self.d):
            v = held.get(j)
            bit1 = self.p1 if v is not None else 1 - self.p1
            up = (1 + v) / 2 if v is not None else 0.5
            plus = up * self.p2 + (1 - up) * (1 - self.p2)
            out += [(1 - plus) * bit1, (1 - plus) * (1 - bit1), plus * (1 - bit1), plus * bit1]
        return np.array(out) / self.d


@pytest.fixture
def toy_registered(monkeypatch):
    monkeypatch.setitem(registry.MECHANISMS, ToyKV.name, ToyKV)      # the one registry line
    return ToyKV


def test_a_registered_toy_mechanism_gets_flags_jobs_and_the_audit(toy_registered, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--help"])
    help_text = capsys.readouterr().out
    assert "--flip-share" in help_text and "toy-kv" in help_text
    out = tmp_path / "est.jsonl"
    assert cli.main(["simulate", "--mechanism", "toy-kv", "--epsilon", "2", "--flip-share", "0.4", "--users", "20000",
                     "--keys", "4", "--seed", "3", "--output", str(out)]) == 0
    reports = tmp_path / "R.avro"
    assert cli.main(["perturb", "--mechanism", "toy-kv", "--epsilon", "2", "--flip-share", "0.4", "--users", "5000",
                     "--keys", "4", "--seed", "3", "--output", str(reports)]) == 0
    assert cli.main(["collect", "--mechanism", "toy-kv", "--epsilon", "2", "--flip-share", "0.4",
                     "--input", str(tmp_path / "R-*.avro"), "--key-dictionary", str(tmp_path / "R.keys.txt"),
                     "--output", str(tmp_path / "c.jsonl")]) == 0
    with pytest.raises(SystemExit):       # its declared range, checked when the flag is parsed
        cli.main(["simulate", "--mechanism", "toy-kv", "--epsilon", "2", "--flip-share", "1.5"])
    # the exact audit: every ratio within the ledger's epsilon
    mech = registry.make("toy-kv", 3, 1.2, flip_share=0.3)
    P = np.array([mech.output_probabilities(u) for u in all_users(3)])
    assert log_worst_ratio(P) <= mech.ledger.round_epsilon(0) + 1e-9
    assert "flip_share" in {p["name"] for p in template.parameters()}
