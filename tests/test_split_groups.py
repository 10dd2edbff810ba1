"""Split deployment of the grouped protocols (KS-GRR, KS-Adap): every user
reports in exactly one round, whatever the seeds of the separate perturb
invocations (issue 15, finding 1: on 1349ffd each invocation drew its groups
from its own fresh seed, so about half the users reported twice).

User ``i`` rates only item ``i``, so a key is a user. The check is exact
on the perturbing side: a spy on ``Protocol.participants`` records whom each
round's perturb job actually perturbed (the local runner runs in this
process). The collector's own counts confirm it independently: every
candidate set holds every key (``--top d/2``) and eps is the largest kvldp
allows (30), so a GRR report names its sender with probability
1 - O(d e^-30), and an OLH report supports its sender's key with
probability p ~ 1/2 and no other key (the hash ``(a x + b) mod P`` is
injective below the prime ``P`` < ``g``, a perturbed value hits one of the
d hashes with probability d/g ~ 1e-11).
"""
from __future__ import annotations

import glob

import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.mechanisms import registry, sizing
from kvldp.mechanisms.protocol import Collection, Protocol
from kvldp.pipelines.split import read_broadcast
from kvldp.schemas import envelope

N_USERS = 240
EPS = 30.0


@pytest.fixture(scope="module")
def one_item_each(tmp_path_factory):
    """``user i`` rates ``item i`` only: d = n, and a key identifies a user."""
    path = tmp_path_factory.mktemp("ratings") / "ratings.csv"
    rng = np.random.default_rng(5)
    rows = [f"u{i:04d},i{i:04d},{r}" for i, r in enumerate(rng.integers(1, 6, N_USERS))]
    path.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    return str(path)


def protocol_args(name: str) -> list[str]:
    return ["--mechanism", name, "--epsilon", str(EPS), "--top", str(N_USERS // 2)]


@pytest.fixture
def perturbed(monkeypatch):
    """``{round index: keys (= users) the perturbing side perturbed}``."""
    seen: dict[int, list] = {}
    real = Protocol.participants
    probe = Collection.from_seed(sizing.PROBE_SEED).id      # the batch sizing's synthetic probe users: not the run's

    def spy(self, round_index, users, state, *rest):
        mine = real(self, round_index, users, state, *rest)
        if state.collection is None or state.collection.id != probe:
            seen.setdefault(round_index, []).append(mine.keys.copy())
        return mine

    monkeypatch.setattr(Protocol, "participants", spy)
    return seen


def indicator(keys_lists) -> np.ndarray:
    keys = np.concatenate(keys_lists) if keys_lists else np.zeros(0, np.int64)
    return np.bincount(keys, minlength=N_USERS)


def run_rounds(tmp_path, name: str, ratings: str, extra=()) -> list[str]:
    """Every round as its own perturb (no --seed: a fresh seed each time) and
    collect; returns the report prefixes, round by round."""
    args = protocol_args(name)
    rounds = registry.make(name, N_USERS, EPS, top=N_USERS // 2).max_rounds
    broadcast, prefixes = [], []
    for r in range(1, rounds + 1):
        prefix = str(tmp_path / f"r{r}" / "R")
        assert cli.main(["perturb", *args, "--input", ratings, "--rating-range", "1,5", "--round", str(r),
                         *broadcast, *extra, "--output", prefix + ".avro"]) == 0
        est = str(tmp_path / f"est{r}.jsonl")
        assert cli.main(["collect", *args, "--round", str(r), *broadcast, "--input", prefix + "-*.avro",
                         "--key-dictionary", prefix + ".keys.txt", "--output", est]) == 0
        broadcast = ["--broadcast", est + ".broadcast.avro"]
        prefixes.append(prefix)
    return prefixes


def round_counts(proto, round_index: int, prefix: str) -> np.ndarray:
    """The collector's count array of one round, from its report files."""
    counts = proto.new_round_counts(round_index)
    for path in sorted(glob.glob(prefix + "-*.avro")):
        with open(path, "rb") as fh:
            for batch in envelope.ReportContainer(fh).batches(proto, round_index):
                proto.accumulate_round(round_index, counts, batch)
    return counts


def key_reporters(proto, round_index: int, prefix: str, tmp_path) -> np.ndarray:
    """Indicator over keys (= users) of who reported in a key-revealing round."""
    counts = round_counts(proto, round_index, prefix)
    if round_index == 0:                                  # OLH over the keys (+ "no pair")
        return counts[1:1 + proto.d]
    names = [f"i{i:04d}" for i in range(proto.d)]
    state = read_broadcast(str(tmp_path / f"est{round_index}.jsonl.broadcast.avro"), names, proto)
    rank = state.broadcast.astype(np.int64)
    assert np.all(rank >= 0), "every key must be a candidate for the exact check"
    width = (len(counts) - 1) // 2
    per_rank = counts[1:1 + width] + counts[1 + width:]
    return per_rank[rank]


def per_user_epsilon(proto, reported: list[np.ndarray]) -> np.ndarray:
    """Each user's spend under the ledger: the round budget of every round it reported in."""
    return sum(flags * proto.ledger.round_epsilon(r) for r, flags in enumerate(reported))


def test_split_ks_grr_without_seed_every_user_reports_once(tmp_path, one_item_each, perturbed):
    proto = registry.make("ks-grr", N_USERS, EPS, top=N_USERS // 2)
    r1, r2 = run_rounds(tmp_path, "ks-grr", one_item_each)
    rounds = [indicator(perturbed.get(r, [])) for r in range(proto.max_rounds)]
    overlap = np.flatnonzero(rounds[0] * rounds[1])
    assert len(overlap) == 0, f"{len(overlap)} of {N_USERS} users reported in both rounds"
    np.testing.assert_array_equal(rounds[0] + rounds[1], 1)         # everyone exactly once
    assert 0 < rounds[0].sum() < N_USERS
    np.testing.assert_allclose(per_user_epsilon(proto, rounds), EPS)
    assert proto.ledger.spent() == pytest.approx(EPS)
    # the collector's view agrees: report counts, GRR senders, OLH-supported senders
    assert [int(round_counts(proto, r, prefix)[0]) for r, prefix in enumerate((r1, r2))] == \
        [int(x.sum()) for x in rounds]
    np.testing.assert_array_equal(key_reporters(proto, 1, r2, tmp_path), rounds[1])
    supported = key_reporters(proto, 0, r1, tmp_path)
    assert np.all(supported <= rounds[0]) and supported.sum() > 0


def test_split_ks_adap_without_seed_every_user_reports_once(tmp_path, one_item_each, perturbed):
    proto = registry.make("ks-adap", N_USERS, EPS, top=N_USERS // 2)
    prefixes = run_rounds(tmp_path, "ks-adap", one_item_each)
    rounds = [indicator(perturbed.get(r, [])) for r in range(proto.max_rounds)]
    np.testing.assert_array_equal(sum(rounds), 1)                      # everyone exactly once
    assert min(x.sum() for x in rounds) > 0
    np.testing.assert_allclose(per_user_epsilon(proto, rounds), EPS)
    assert proto.ledger.spent() == pytest.approx(EPS)
    assert [int(round_counts(proto, r, prefix)[0]) for r, prefix in enumerate(prefixes)] == \
        [int(x.sum()) for x in rounds]
    # a round-3 report at a candidate names its sender (with l dummies, a user
    # reports its own pair w.p. 1/l, so with l = 1 every sender is named)
    named = key_reporters(proto, 2, prefixes[2], tmp_path)
    names = [f"i{i:04d}" for i in range(N_USERS)]
    l = read_broadcast(str(tmp_path / "est2.jsonl.broadcast.avro"), names, proto).get("padding")
    assert np.all(named <= rounds[2]) and named.sum() > 0
    if l == 1:
        np.testing.assert_array_equal(named, rounds[2])


def test_later_round_refuses_another_collection(tmp_path, one_item_each, capsys):
    """Round 2 keeps round 1's groups or does not run: a pinned
    --collection-id, a --seed or a batching that disagree with round 1 are
    refused by perturb, and reports of another collection by collect."""
    args = [*protocol_args("ks-grr"), "--rating-range", "1,5"]
    a, b = Collection.from_seed(1).id, Collection.from_seed(2).id
    for tag, cid in (("a", a), ("b", b)):
        prefix = str(tmp_path / f"{tag}1" / "R")
        assert cli.main(["perturb", *args, "--input", one_item_each, "--collection-id", cid,
                         "--output", prefix + ".avro"]) == 0
        assert cli.main(["collect", *protocol_args("ks-grr"), "--input", prefix + "-*.avro",
                         "--key-dictionary", prefix + ".keys.txt", "--output", str(tmp_path / f"{tag}.jsonl")]) == 0
    keys = str(tmp_path / "a1" / "R.keys.txt")
    bcast_a, bcast_b = str(tmp_path / "a.jsonl.broadcast.avro"), str(tmp_path / "b.jsonl.broadcast.avro")
    r2 = ["perturb", *args, "--input", one_item_each, "--round", "2", "--broadcast", bcast_a]
    capsys.readouterr()
    assert cli.main([*r2, "--collection-id", b, "--output", str(tmp_path / "x" / "R.avro")]) != 0
    assert "not round 1's" in capsys.readouterr().err
    assert cli.main([*r2, "--seed", "9", "--output", str(tmp_path / "x" / "R.avro")]) != 0
    assert "--seed differs" in capsys.readouterr().err
    assert cli.main([*r2, "--shards", "3", "--output", str(tmp_path / "x" / "R.avro")]) != 0
    assert "batched users" in capsys.readouterr().err
    assert not glob.glob(str(tmp_path / "x" / "R-*.avro"))
    # round-2 reports made under collection b, collected as the continuation of a
    prefix = str(tmp_path / "b2" / "R")
    assert cli.main(["perturb", *args, "--input", one_item_each, "--round", "2", "--broadcast", bcast_b,
                     "--output", prefix + ".avro"]) == 0
    capsys.readouterr()
    assert cli.main(["collect", *protocol_args("ks-grr"), "--round", "2", "--broadcast", bcast_a,
                     "--input", prefix + "-*.avro", "--key-dictionary", keys,
                     "--output", str(tmp_path / "mixed.jsonl")]) != 0
    err = capsys.readouterr().err
    assert f"perturbed under collection {b}" in err and a in err


def test_round_one_reports_of_two_collections_are_refused(tmp_path, one_item_each, capsys):
    """Round 1's reports define the collection: files of two collections in
    one input are refused before any compute, not averaged together."""
    args = [*protocol_args("ks-grr"), "--rating-range", "1,5"]
    for cid in (Collection.from_seed(3).id, Collection.from_seed(4).id):
        assert cli.main(["perturb", *args, "--input", one_item_each, "--collection-id", cid, "--shards", "2",
                         "--output", str(tmp_path / cid / "R.avro")]) == 0
    capsys.readouterr()
    assert cli.main(["collect", *protocol_args("ks-grr"), "--input", str(tmp_path / "*" / "R-*.avro"),
                     "--keys", str(N_USERS), "--output", str(tmp_path / "est.jsonl")]) != 0
    assert "collection" in capsys.readouterr().err
