"""The padding length of padding-and-sampling (``mechanisms/frequency/padding.py``,
``pipelines/padding.py``): set-size histograms, the truncation they imply,
KSKV §4.3's coverage rule for ``l``, ``kvldp advise`` choosing ``l``, and the
ingest jobs' ``--padding auto`` and truncation warning.

Why it matters (PCKV Alg. 1/4): a user with ``|S| > l`` pairs reports each
w.p. ``1/|S|`` and the estimator scales by ``l``, so a truncated holder
counts ``l/|S|``: ``E[f_hat_k] = (1/n) sum_{i holds k} l/max(|S_i|, l)``.
The end-to-end test below fails on the old code, which had neither the
warning nor ``auto`` (``--padding`` was ``type=int``).
"""
from __future__ import annotations

import argparse
import json
import re

import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.cli import mechanism_args
from kvldp.datasets import InMemoryDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.frequency.padding import (
    MAX_PADDING,
    check_padding,
    choose_padding,
    covered_fraction,
    expected_frequency,
    kept_share,
    lost_pair_fraction,
    merge_histograms,
    size_histogram,
    truncated_fraction,
    truncated_users,
)
from kvldp.mechanisms.local import run_local
from kvldp.pipelines import advise as advise_mod
from kvldp.pipelines.mechanism_config import MechanismConfig
from kvldp.pipelines.padding import padding_from_reports, parse_set_sizes, resolve_padding
from kvldp.plots.tables import read_estimates
from kvldp.transforms.io import report_config
from tolerances import Z_FEW

# sizes 1:500, 2:300, 3:200 (and nobody empty)
H = np.array([0, 500, 300, 200])


def _batch(sets, batch_id=0):
    """A ``UserBatch`` from ``[[(key, value), …], …]``."""
    sizes = [len(s) for s in sets]
    pairs = [p for s in sets for p in s]
    return UserBatch(np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                     [k for k, _ in pairs], [v for _, v in pairs], batch_id)


# ------------------------------------------------------- histograms ------
def test_size_histogram_of_a_hand_built_batch():
    users = _batch([[(0, 0.5)], [(1, 1.0), (2, -1.0)], [], [(0, 0.0), (1, 0.2), (3, 0.1)], [(4, 0.0)]])
    assert users.sizes.tolist() == [1, 2, 0, 3, 1]
    assert size_histogram(users).tolist() == [1, 2, 1, 1]
    assert size_histogram(np.array([2, 2, 5])).tolist() == [0, 0, 2, 0, 0, 1]
    assert size_histogram(_batch([])).tolist() == [0]                  # no users
    with pytest.raises(ValueError):
        size_histogram(np.array([1, -1]))


def test_histograms_merge_in_any_order_and_grouping():
    a, b, c = np.array([1, 2]), np.array([0, 0, 0, 4]), np.array([3])
    whole = merge_histograms([a, b, c])
    assert whole.tolist() == [4, 2, 0, 4]
    assert merge_histograms([merge_histograms([a, b]), c]).tolist() == whole.tolist()
    assert merge_histograms([c, merge_histograms([b, a])]).tolist() == whole.tolist()
    assert merge_histograms([]).tolist() == [0]
    # the histogram of a concatenation is the merge of the parts'
    u1, u2 = _batch([[(0, 0.0)], [(1, 0.0), (2, 0.0)]]), _batch([[], [(0, 0.0), (1, 0.0), (2, 0.0)]])
    assert (size_histogram(UserBatch.concat([u1, u2])).tolist()
            == merge_histograms([size_histogram(u1), size_histogram(u2)]).tolist())


def test_truncation_shares_are_exact():
    """l = 1: 500 of 1000 users truncated; pairs 500 + 600 + 600 = 1700, of
    which a truncated user keeps l in expectation: lost (300·1 + 200·2)/1700."""
    assert truncated_users(H, 1) == 500 and truncated_fraction(H, 1) == 0.5
    assert truncated_users(H, 2) == 200 and truncated_fraction(H, 2) == 0.2
    assert truncated_users(H, 3) == 0 and truncated_fraction(H, 10) == 0.0
    assert lost_pair_fraction(H, 1) == pytest.approx(700 / 1700, abs=0, rel=1e-15)
    assert lost_pair_fraction(H, 2) == pytest.approx(200 / 1700, abs=0, rel=1e-15)
    assert lost_pair_fraction(H, 3) == 0.0
    assert covered_fraction(H, 2) == pytest.approx(0.8)
    # empty sets count as users, never truncated; nobody at all: shares 0
    assert truncated_fraction([100, 0, 0, 100], 2) == 0.5
    assert truncated_fraction([0], 1) == 0.0 and lost_pair_fraction([5], 1) == 0.0
    for bad in (0, -1, 1.5):
        with pytest.raises(ValueError):
            truncated_fraction(H, bad)


def test_choose_padding_on_known_histograms():
    # cumulative shares 0.5, 0.8, 1.0
    assert choose_padding(H) == 3
    assert choose_padding(H, coverage=0.8) == 2          # reaching the coverage is enough
    assert choose_padding(H, coverage=0.81) == 3
    assert choose_padding(H, coverage=0.5) == 1
    assert choose_padding(H, coverage=1.0) == 3          # nobody truncated
    assert choose_padding([0, 9, 1]) == 1                # 9/10 = 0.9 reaches 0.9 (no float slip)
    assert choose_padding([950, 0, 0, 50]) == 1          # empty sets count: l >= 1 anyway
    assert choose_padding([0, 10, 0, 0, 0, 0, 0, 0, 90]) == 8
    assert choose_padding([0]) == 1                      # no user to cover
    big = np.zeros(41, np.int64)
    big[40] = 100
    assert choose_padding(big) == MAX_PADDING            # capped
    assert choose_padding(big, max_padding=50) == 40
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError):
            choose_padding(H, coverage=bad)


def test_check_padding_flags_a_too_small_l():
    small = check_padding(H, 1)
    assert small.too_small and small.suggested == 3 and small.suggested_covers == 1.0
    assert (small.n_users, small.truncated_users, small.largest_size) == (1000, 500, 3)
    assert not check_padding(H, 3).too_small
    assert not check_padding(H, 2, coverage=0.8).too_small          # 20% truncated is 1 - 0.8
    capped = np.zeros(31, np.int64)
    capped[[1, 30]] = 50
    c = check_padding(capped, MAX_PADDING)
    assert c.too_small and c.suggested == MAX_PADDING


def test_expected_frequency_scales_truncated_holders_by_l_over_size():
    """Users {0,1}, {0}, {1,2,3}: at l = 1 they count 1/2, 1, 1/3 per pair."""
    users = _batch([[(0, 0.1), (1, 0.2)], [(0, 0.3)], [(1, 0.0), (2, 0.0), (3, 0.0)]])
    assert expected_frequency(users, 5, 1) == pytest.approx([1.5 / 3, (1 / 2 + 1 / 3) / 3, 1 / 9, 1 / 9, 0])
    assert expected_frequency(users, 5, 2) == pytest.approx([2 / 3, (1 + 2 / 3) / 3, 2 / 9, 2 / 9, 0])
    assert expected_frequency(users, 5, 3) == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3, 0])   # the truth


# -------------------------------------------- statistics (local runner) --
def _multi_data(n: int, d: int, seed: int, probs=(0.3, 0.3, 0.4)) -> InMemoryDataset:
    """``n`` users with 1, 2 or 3 distinct keys (shares ``probs``) drawn with
    weights ~ 1/(k+1), values ``m_k`` + noise."""
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 2, 3], size=n, p=probs)
    w = 1.0 / np.arange(1, d + 1)
    scores = np.log(w / w.sum())[None, :] + rng.gumbel(size=(n, d))
    top = np.argsort(-scores, axis=1)[:, :3]
    keys = top[np.arange(3)[None, :] < sizes[:, None]]
    means = np.linspace(-0.8, 0.8, d)
    values = np.clip(means[keys] + rng.normal(0, 0.2, len(keys)), -1, 1)
    users = UserBatch(np.concatenate([[0], np.cumsum(sizes)]), keys, values)
    return InMemoryDataset("multi-1to3", users, [f"m{k}" for k in range(d)])


@pytest.mark.parametrize("name", ["pckv-ue", "pckv-grr", "ks-ue"])
def test_chosen_padding_is_unbiased_where_l1_is_not(name):
    """Every |S| <= 3: at the chosen l = 3 each key's f_hat is within 4 s.e.
    of f; at l = 1 it is within 4 s.e. of E[f_hat] = expected_frequency and
    the top key sits far (> 10 s.e.) below f."""
    d = 10
    data = _multi_data(60_000, d, seed=3)
    hist = size_histogram(data.users)
    l = choose_padding(hist)
    assert l == 3
    good = run_local(registry.make(name, d, 4.0, padding=l), data, seed=11)
    f, _ = good.true_values(d)
    z = (good.estimates.frequency_raw - f) / good.estimates.frequency_se
    assert np.all(np.abs(z) < Z_FEW), z
    bad = run_local(registry.make(name, d, 4.0, padding=1), data, seed=11)
    g = expected_frequency(data.users, d, 1)
    z_g = (bad.estimates.frequency_raw - g) / bad.estimates.frequency_se
    assert np.all(np.abs(z_g) < Z_FEW), z_g
    z_f = (bad.estimates.frequency_raw - f) / bad.estimates.frequency_se
    assert z_f[0] < -10, z_f


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pckv-ue", "pckv-grr", "ks-ue"])
def test_bias_is_l_over_size_on_synthetic_multi_over_repeats(name):
    """synthetic-multi (1 + Poisson(1) Zipf keys): averaged over R = 30
    perturbations, f_hat_k is within 4 s.e. of expected_frequency(l) =
    (1/n) sum_{holders} l/max(|S|, l) for l = 1, 2 and the chosen l, and the
    chosen l's bias is a fraction of l = 1's."""
    from kvldp.datasets import SyntheticDataset

    d, R = 20, 30
    synth = SyntheticDataset("multi", 100_000, d, seed=4)
    users = UserBatch.concat(list(synth.batches()))
    data = InMemoryDataset("multi", users, synth.key_names)
    f = np.bincount(users.keys, minlength=d) / users.n_users
    chosen = choose_padding(size_histogram(users))
    assert chosen == 3
    bias = {}
    for l in (1, 2, chosen):
        mech = registry.make(name, d, 2.0, padding=l)
        runs = [run_local(mech, data, seed=100 + r).estimates for r in range(R)]
        mean = np.mean([e.frequency_raw for e in runs], axis=0)
        se = np.sqrt(np.mean([e.frequency_se ** 2 for e in runs], axis=0) / R)
        g = expected_frequency(users, d, l)
        assert np.all(np.abs(mean - g) / se < Z_FEW), (l, (mean - g) / se)
        bias[l] = np.abs(g - f).sum()
    assert bias[chosen] < bias[2] < bias[1]
    assert bias[chosen] < 0.2 * bias[1]


# ------------------------------------------------------------ parsing ----
def test_padding_argument_takes_a_number_or_auto():
    assert mechanism_args.parse_padding("3") == 3 and mechanism_args.parse_padding("auto") == "auto"
    assert mechanism_args.parse_padding("AUTO") == "auto"
    for bad in ("0", "-2", "two", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            mechanism_args.parse_padding(bad)
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--mechanism", "pckv-ue", "--epsilon", "1", "--padding", "0"])


def test_parse_set_sizes():
    assert parse_set_sizes("1:500,2:300,3:200").tolist() == H.tolist()
    assert parse_set_sizes("3:2, 0:1").tolist() == [1, 0, 0, 2]
    for bad in ("", "1:0", "a:1", "1:2:3", "1:5,1:6", "-1:3"):
        with pytest.raises(ValueError):
            parse_set_sizes(bad)


def _mechanism_args(argv):
    """The simulate config of ``simulate ARGV``: its mechanism and its data."""
    _, config, _ = cli.configure(["simulate", *argv])
    return config.mechanism, config.data


def test_auto_needs_the_ingest_side():
    """A job that has not resolved ``auto`` (the collector) gets a clear error;
    a resolved padding overrides ``--padding``; ``--coverage`` is the padding
    rule's for padded mechanisms, not passed to them."""
    chosen, data = _mechanism_args(["--mechanism", "pckv-ue", "--epsilon", "1", "--padding", "auto",
                                    "--coverage", "0.8"])
    with pytest.raises(ValueError, match="ingest side"):
        chosen.make(10)
    assert chosen.make(10, padding=3).l == 3
    chosen, data = _mechanism_args(["--mechanism", "privkv", "--epsilon", "1", "--padding", "auto"])
    with pytest.raises(ValueError, match="does not take padding"):
        chosen.make(10)
    assert resolve_padding(chosen, data, [], None, None).l is None          # nothing to resolve


def test_resolve_padding_on_a_loaded_dataset(capsys):
    data = _multi_data(2_000, 6, seed=1, probs=(0.5, 0.3, 0.2))
    hist = size_histogram(data.users)
    chosen, config = _mechanism_args(["--mechanism", "ks-ue", "--epsilon", "1", "--padding", "auto"])
    plan = resolve_padding(chosen, config, [], data, None)
    assert plan.l == choose_padding(hist) == 3 and plan.auto and plan.warning is None
    assert f"chose l = {plan.l}" in capsys.readouterr().out
    chosen, config = _mechanism_args(["--mechanism", "ks-ue", "--epsilon", "1"])  # the default: auto (issue 43)
    plan = resolve_padding(chosen, config, [], data, None)
    assert plan.l == 3 and plan.auto and plan.warning is None
    assert "the default padding (auto) chose l = 3" in capsys.readouterr().out
    chosen, config = _mechanism_args(["--mechanism", "ks-ue", "--epsilon", "1", "--padding", "1"])
    plan = resolve_padding(chosen, config, [], data, None)
    err = capsys.readouterr().err
    assert plan.l == 1 and err.startswith("WARNING:")
    assert f"truncates {truncated_users(hist, 1):,} of 2,000 users" in err and "would choose l = 3" in err
    plan = resolve_padding(*_mechanism_args(["--mechanism", "ks-ue", "--epsilon", "1", "--padding", "2",
                                             "--coverage", "0.75"]), [], data, None)
    assert plan.warning is None and capsys.readouterr().err == ""


# ------------------------------------------------------------- advise ----
def test_advise_chooses_l_from_set_sizes():
    out = advise_mod.advise(10**6, 100, 4.0, set_sizes=H)
    assert out["l"] == 3 and out["l_chosen"]
    assert out["padding"]["truncated_fraction"] == 0.0
    # the PCKV rule is applied at the chosen l
    assert out["recommendation"] == ("pckv-ue" if advise_mod.pckv_prefers_ue(100, 4.0, 3) else "pckv-grr")
    table = {row["l"]: row for row in out["padding_table"]}
    assert table[1]["truncated"] == 0.5 and table[2]["truncated"] == 0.2
    assert table[1]["frequency_se"] < table[2]["frequency_se"] < table[3]["frequency_se"]
    given = advise_mod.advise(10**6, 100, 4.0, 1, set_sizes=H)
    assert given["l"] == 1 and not given["l_chosen"] and given["padding"]["suggested"] == 3
    assert advise_mod.advise(10**6, 100, 4.0)["l"] == 1                  # no sizes: l = 1 as before
    with pytest.raises(ValueError, match="set sizes"):
        advise_mod.advise(10**6, 100, 4.0, "auto")


def test_advise_cli_with_set_sizes(capsys):
    assert cli.main(["advise", "--keys", "100", "--epsilon", "4", "--set-sizes", "1:500,2:300,3:200"]) == 0
    captured = capsys.readouterr()
    assert "padding: l = 3 (chosen" in captured.out and "n = 1,000," in captured.out
    assert captured.err == ""
    assert cli.main(["advise", "--users", "1000000", "--keys", "100", "--epsilon", "4",
                     "--set-sizes", "1:500,2:300,3:200", "--padding", "1"]) == 0
    captured = capsys.readouterr()
    assert "at l = 1: 500 users truncated (50.00%)" in captured.out
    assert captured.err.startswith("WARNING:") and "would choose l = 3" in captured.err
    assert cli.main(["advise", "--epsilon", "4"]) == 2                  # neither n/d nor data


# ------------------------------------------- ingest jobs, end to end -----
N_FILE_USERS, D_FILE = 12_000, 8


@pytest.fixture(scope="module")
def ratings_file(tmp_path_factory):
    """A JSONL ratings file of users rating 1-3 items, its dictionary, and
    the true set sizes, frequencies and means computed straight from it."""
    folder = tmp_path_factory.mktemp("multi")
    data = _multi_data(N_FILE_USERS, D_FILE, seed=7)
    u = data.users
    stars = np.round((u.values + 1) * 2 + 1).astype(int)          # 1..5 stars
    rows = [{"user": f"u{i}", "item": f"m{k}", "rating": int(r)}
            for i, k, r in zip(u.owners, u.keys, stars, strict=True)]
    path = folder / "ratings.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    keys = folder / "keys.txt"
    keys.write_text("\n".join(f"m{k}" for k in range(D_FILE)) + "\n")
    # the truth, from the rows alone
    per_user: dict[str, int] = {}
    holders = np.zeros(D_FILE)
    for r in rows:
        per_user[r["user"]] = per_user.get(r["user"], 0) + 1
        holders[int(r["item"][1:])] += 1
    sizes = np.array(list(per_user.values()))
    return {"path": path, "keys": keys, "sizes": sizes, "f": holders / len(sizes)}


def _estimates(path):
    by_key = {r["key"]: r for r in read_estimates(str(path))}
    keys = [f"m{k}" for k in range(D_FILE)]
    return (np.array([by_key[k]["frequency_raw"] for k in keys]), np.array([by_key[k]["frequency_se"] for k in keys]),
            np.array([by_key[k]["true_frequency"] for k in keys]))


def test_simulate_warns_about_truncation_and_auto_removes_the_bias(ratings_file, tmp_path, capsys):
    """The issue's scenario on a file where users rate 1-3 items.

    ``--padding 1`` (explicit l, given dictionary: the set sizes are measured
    inside the main job, the warning follows the run) names the truncated
    share and the l advise would choose, both equal to the truth computed
    from the file; its estimates are far (> 10 s.e.) below the truth.
    ``--padding auto`` (derived dictionary: the pre-pass measures the sizes)
    chooses choose_padding(true histogram) and every key is within 4 s.e."""
    sizes = ratings_file["sizes"]
    true_hist = size_histogram(sizes)
    truncated = int((sizes > 1).sum())
    common_args = ["--mechanism", "pckv-ue", "--epsilon", "4", "--dataset", str(ratings_file["path"]),
                   "--rating-range", "1,5", "--seed", "5", "--shards", "4"]

    out1 = tmp_path / "l1.jsonl"
    assert cli.main(["simulate", *common_args, "--padding", "1", "--key-dictionary", str(ratings_file["keys"]),
                     "--output", str(out1)]) == 0
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if line.startswith("WARNING: padding"))
    m = re.search(r"truncates ([\d,]+) of ([\d,]+) users \(([\d.]+)%\)", warning)
    assert (int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))) == (truncated, len(sizes))
    assert float(m.group(3)) == pytest.approx(100 * truncated / len(sizes), abs=0.005)
    assert f"would choose l = {choose_padding(true_hist)}" in warning and choose_padding(true_hist) == 3
    f_hat, se, f_true = _estimates(out1)
    assert np.allclose(f_true, ratings_file["f"])
    z1 = (f_hat - f_true) / se
    assert z1.min() < -10, z1                     # the old code's silent bias

    out_auto = tmp_path / "auto.jsonl"
    assert cli.main(["simulate", *common_args, "--padding", "auto", "--output", str(out_auto)]) == 0
    captured = capsys.readouterr()
    assert "WARNING" not in captured.err
    chosen = int(re.search(r"--padding auto chose l = (\d+)", captured.out).group(1))
    assert chosen == choose_padding(true_hist) == 3
    assert "padding=3" in captured.out                           # the mechanism that ran
    f_hat, se, f_true = _estimates(out_auto)
    z = (f_hat - f_true) / se
    assert np.all(np.abs(z) < Z_FEW), z


def test_advise_measures_a_ratings_file(ratings_file, capsys):
    assert cli.main(["advise", "--epsilon", "4", "--dataset", str(ratings_file["path"]), "--rating-range", "1,5",
                     "--shards", "2"]) == 0
    text = capsys.readouterr().out
    assert f"padding: l = {choose_padding(size_histogram(ratings_file['sizes']))} (chosen" in text
    assert f"n = {N_FILE_USERS:,}, d = {D_FILE}," in text


def test_perturb_auto_then_collect_reads_l_from_the_reports(ratings_file, tmp_path, capsys):
    reports = tmp_path / "r" / "R.avro"
    assert cli.main(["perturb", "--mechanism", "pckv-grr", "--epsilon", "4", "--input", str(ratings_file["path"]),
                     "--rating-range", "1,5", "--seed", "2", "--shards", "2", "--padding", "auto",
                     "--output", str(reports)]) == 0
    assert "chose l = 3" in capsys.readouterr().out
    collect = ["collect", "--mechanism", "pckv-grr", "--epsilon", "4", "--input", str(tmp_path / "r" / "R*.avro"),
               "--key-dictionary", str(tmp_path / "r" / "R.keys.txt"), "--output", str(tmp_path / "e.csv"),
               "--overwrite"]
    assert cli.main([*collect, "--padding", "auto"]) == 0
    assert "padding=3" in capsys.readouterr().out
    assert cli.main(collect) == 0                                  # no --padding: the reports' l (issue 43)
    assert "padding=3" in capsys.readouterr().out
    assert cli.main([*collect, "--padding", "1"]) == 2             # l = 1 does not match the reports
    assert "rerun collect" in capsys.readouterr().err
    pattern = str(tmp_path / "r" / "R*.avro")
    chosen = MechanismConfig("pckv-grr", 4.0, {"padding": "auto"})
    assert padding_from_reports(chosen, pattern, report_config(pattern)) == 3


def test_perturb_warns_after_the_run_with_an_explicit_l(ratings_file, tmp_path, capsys):
    assert cli.main(["perturb", "--mechanism", "ks-ue", "--epsilon", "2", "--input", str(ratings_file["path"]),
                     "--rating-range", "1,5", "--key-dictionary", str(ratings_file["keys"]), "--seed", "2",
                     "--shards", "2", "--padding", "2", "--output", str(tmp_path / "R.avro")]) == 0
    sizes = ratings_file["sizes"]
    assert f"truncates {int((sizes > 2).sum()):,} of {len(sizes):,} users" in capsys.readouterr().err


# ------------------------------------------------- truncation correction --
def test_kept_share_is_one_minus_the_lost_share():
    rng = np.random.default_rng(0)
    for _ in range(20):
        hist = rng.integers(0, 50, size=rng.integers(1, 12))
        for l in (1, 2, 5):
            expected = 1.0 - lost_pair_fraction(hist, l) if (hist * np.arange(len(hist))).sum() else 1.0
            assert kept_share(hist, l) == pytest.approx(expected)
    assert kept_share(np.array([0, 0, 0, 10]), 1) == pytest.approx(1 / 3)
    assert kept_share(np.array([4, 0.5, 0.5]), 1) == pytest.approx(1 / 1.5)     # estimated shares (KS-Adap)
    with pytest.raises(ValueError):
        kept_share(np.array([1, -1]), 1)


@pytest.mark.parametrize("name,l", [("ks-grr", 1), ("pckv-ue", 2), ("ks-ue", 3)])
def test_the_consistent_methods_keep_the_corrected_total(name, l):
    """Every user holds the same 12 of 60 keys: the kept share is l/12 and
    those keys' frequencies sit at the bound (1) that the truncation
    correction cuts at. Norm-Sub and the projection, within that bound,
    keep the total the reports measure, corrected (``frequency_total``,
    12 pairs per user within 4 s.e.). Norm-Sub to the total with the cut
    afterwards lost the mass the noise put above it (issue 43: KS-GRR on
    MovieLens at eps 1 kept 6.2 of the 113 measured)."""
    from kvldp.mechanisms.estimation.postprocess import postprocess_all

    d, held, n = 60, 12, 20_000
    rng = np.random.default_rng(3)
    users = UserBatch(np.arange(n + 1) * held, np.tile(np.arange(held), n), rng.uniform(-1, 1, n * held))
    data = InMemoryDataset("same-12", users, [f"m{k}" for k in range(d)])
    kept = kept_share(size_histogram(users), l)
    assert kept == pytest.approx(l / held)
    options = {"padding": l} if name != "ks-grr" else {"top": d}
    est = run_local(registry.make(name, d, 1.0, kept_share=kept, **options), data, seed=11).estimates
    for out in postprocess_all(est, ["norm-sub", "project"]):
        assert np.all(out.frequency <= 1.0)
        assert abs(out.frequency_total - held) < Z_FEW * out.frequency_total_se
        assert np.sum(out.frequency) == pytest.approx(out.frequency_total, rel=1e-9), out.postprocess


@pytest.mark.parametrize("name,l", [("pckv-ue", 1), ("pckv-grr", 2), ("ks-ue", 2), ("ks-grr", 1)])
def test_the_kept_share_corrects_the_truncation_bias(name, l):
    """Every user holds 3 pairs: the paper's estimate is f l/3 (for KS-GRR's
    one sampled pair, l = 1); divided by kept_share = l/3, every key's
    frequency is within 4 s.e. of the truth, where uncorrected the top key
    is > 10 s.e. below it. The output says so: status 'truncated', the l and
    the share in every record; the measured total is corrected with them."""
    from kvldp.mechanisms.estimation import truncation
    from kvldp.mechanisms.estimation.postprocess import postprocess
    from kvldp.schemas.records import estimate_records

    d = 10
    data = _multi_data(60_000, d, seed=5, probs=(0.0, 0.0, 1.0))
    kept = kept_share(size_histogram(data.users), l)
    assert kept == pytest.approx(l / 3)
    options = {"padding": l} if name != "ks-grr" else {"top": d}
    f, _ = run_local(registry.make(name, d, 4.0, **options), data, seed=11).true_values(d)
    for method in ("raw", "auto"):
        plain = postprocess(run_local(registry.make(name, d, 4.0, **options), data, seed=11).estimates, method)
        fixed = postprocess(run_local(registry.make(name, d, 4.0, kept_share=kept, **options), data,
                                      seed=11).estimates, method)
        z = (fixed.frequency_raw - f) / fixed.frequency_se
        assert np.all(np.abs(z) < Z_FEW), (method, z)
        assert ((plain.frequency_raw - f) / plain.frequency_se)[0] < -10
        assert np.allclose(fixed.frequency_raw, plain.frequency_raw / kept)
        assert np.allclose(fixed.frequency_se, plain.frequency_se / kept)
        assert set(fixed.frequency_status) == {"truncated"} and set(plain.frequency_status) == {"ok"}
        assert np.all(fixed.frequency_lo <= fixed.frequency) and np.all(fixed.frequency <= fixed.frequency_hi)
        assert np.all(fixed.frequency_hi <= 1.0)
        rec = estimate_records(fixed, [f"m{k}" for k in range(d)])[0]
        assert (rec["padding"], rec["kept_share"], rec["frequency_status"]) == (l, kept, "truncated")
        # the total the reports measure apart from the keys (dummy keys; KS-GRR's round 1) is corrected too:
        # 3 pairs per user, within 4 of its s.e.
        total = (fixed.frequency_total, fixed.frequency_total_se)
        assert total == pytest.approx((plain.frequency_total / kept, plain.frequency_total_se / kept))
        assert abs(total[0] - 3.0) < Z_FEW * total[1]
        assert (rec["frequency_total"], rec["frequency_total_se"]) == total
    with pytest.raises(ValueError, match="already"):
        truncation.corrected(fixed)


def test_ks_adap_estimates_the_kept_share_under_ldp():
    """Half the users hold 1 pair, half 3 (every key a candidate); at
    coverage 0.4 KS-Adap chooses l = 1, which keeps (0.5 + 0.5)/2 = 1/2 of
    the mass: its size round estimates that share (OLH over 0 … 2t), and the
    corrected frequencies add up to the true total within 5 %."""
    from kvldp.mechanisms.estimation.postprocess import postprocess

    d = 10
    data = _multi_data(200_000, d, seed=6, probs=(0.5, 0.0, 0.5))
    mech = registry.make("ks-adap", d, 4.0, top=d, coverage=0.4)
    result = run_local(mech, data, seed=3)
    state = result.state
    assert state.get("padding") == 1
    assert state.get("kept_share") == pytest.approx(0.5, abs=0.03)
    est = postprocess(result.estimates, "raw")
    f, _ = result.true_values(d)
    assert set(est.frequency_status) == {"truncated"}
    assert np.nansum(est.frequency_raw) == pytest.approx(f.sum(), rel=0.05)


def test_ingest_measures_the_kept_share_and_collect_reads_it(ratings_file, tmp_path, capsys):
    """perturb at an explicit l = 1 on the ratings file (sizes 1-3, derived
    dictionary: the sizes are known before the run) writes kept_share into
    the reports; collect reads it and marks the output; KS-GRR's one pair
    per user likewise (l = 1)."""
    sizes = ratings_file["sizes"]
    expected = kept_share(size_histogram(sizes), 1)
    for name, extra in (("pckv-grr", ["--padding", "1"]), ("ks-grr", ["--top", "10"])):
        reports = tmp_path / name / "R.avro"
        assert cli.main(["perturb", "--mechanism", name, "--epsilon", "4", "--input", str(ratings_file["path"]),
                         "--rating-range", "1,5", "--seed", "2", "--shards", "2", *extra,
                         "--output", str(reports)]) == 0
        assert f"{expected:.2%} of the pairs' frequency mass" in capsys.readouterr().out
        pattern = str(tmp_path / name / "R*.avro")
        assert report_config(pattern)["kept_share"] == pytest.approx(expected)
        out = tmp_path / f"{name}.csv"
        rounds = 2 if name == "ks-grr" else 1
        collect = ["collect", "--mechanism", name, "--epsilon", "4", "--input", pattern, *extra,
                   "--key-dictionary", str(tmp_path / name / "R.keys.txt"), "--output", str(out)]
        if rounds == 1:
            assert cli.main(collect) == 0
            assert f"truncated: each user reported one pair sampled from at most l = 1 of its pairs, which keeps " \
                   f"{expected:.2%}" in capsys.readouterr().out
            rows = read_estimates(str(out))
            assert {r["frequency_status"] for r in rows} == {"truncated"}
            assert [r["kept_share"] for r in rows] == pytest.approx([expected] * len(rows))
