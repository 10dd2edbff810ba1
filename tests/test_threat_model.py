"""docs/threat-model.md, enforced: after a real split run (perturb on a
ratings file with bad rows, then collect), nothing on the collector's side —
the files shipped to it, what collect writes, what either job prints or
logs — contains the run seed in any encoding, a raw rating row, a user id,
or an item id the published dictionary does not list. The ingest side's dead
letter does hold them (the positive control: the needles are findable)."""
from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

import fastavro
import numpy as np
import pytest

from dead_letters import dead_letter
from kvldp.cli import commands as cli
from kvldp.pipelines import run_seed

SEED = 0x9E3779B97F4A7C15F39CC0605CEDC834      # a 128-bit secret (must be >= 2^64)
PUBLISHED = [f"title-{k:02d}" for k in range(6)]
UNLISTED = ["unlisted-8c1f5e", "unlisted-d07a44"]       # rated, not in the public dictionary
USERS = [f"user-q7Zk-{u:03d}" for u in range(60)]
BAD_RATING = "917.25"                                   # outside --rating-range 1,5


def seed_encodings(seed: int) -> set[bytes]:
    """The seed as a log line or a file might carry it."""
    raw = seed.to_bytes(16, "big")
    texts = {str(seed), f"{seed:x}", f"{seed:X}", f"{seed:032x}", hex(seed),
             base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode(),
             base64.b64encode(raw[::-1]).decode(), raw.hex(), raw[::-1].hex()}
    return {t.encode() for t in texts} | {raw, raw[::-1]}


def ratings_rows() -> list[str]:
    rows = [f"{user},{PUBLISHED[(u + 2 * k) % len(PUBLISHED)]},{1 + (u * 7 + k) % 5}"
            for u, user in enumerate(USERS) for k in range(u % 3 + 1)]
    rows += [f"{USERS[3]},{UNLISTED[0]},4", f"{USERS[8]},{UNLISTED[1]},2",      # unknown items
             f"{USERS[5]},{PUBLISHED[1]},{BAD_RATING}",                         # out of range
             f"{USERS[9]},{PUBLISHED[2]}"]                                      # malformed
    return rows


def readable_forms(path: Path) -> list[bytes]:
    """A file's bytes, and for Avro its decoded records and metadata (blocks
    may be compressed, so the raw bytes alone would hide text)."""
    data = path.read_bytes()
    forms = [data]
    if path.suffix == ".avro":
        with path.open("rb") as fh:
            reader = fastavro.reader(fh)
            records = list(reader)
            forms.append(json.dumps({"meta": {k: v.decode("latin-1") if isinstance(v, bytes) else v
                                              for k, v in reader.metadata.items()},
                                     "records": records}, default=repr).encode())
            forms += [bytes(r[f]) for r in records for f in r if isinstance(r[f], bytes)]
    return forms


def leaks(blobs: dict[str, list[bytes]], needles: dict[str, set[bytes]]) -> list[str]:
    found = []
    for where, forms in blobs.items():
        for what, variants in needles.items():
            if any(v in form for v in variants for form in forms):
                found.append(f"{what} in {where}")
    return found


@pytest.fixture
def raw_side(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    rows = ratings_rows()
    (raw / "ratings.csv").write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    (raw / "catalogue.txt").write_text("\n".join(PUBLISHED) + "\n")
    return raw, rows


@pytest.mark.parametrize("mechanism, rounds", [("pckv-ue", 1), ("privkvm", 2)])
def test_nothing_secret_or_raw_reaches_the_collector(tmp_path, raw_side, capfd, caplog, monkeypatch, mechanism,
                                                     rounds):
    raw, rows = raw_side
    reports, collector = tmp_path / "reports", tmp_path / "collector"
    reports.mkdir()
    collector.mkdir()
    monkeypatch.setenv(run_seed.SEED_ENV, f"{SEED:032x}")      # a real run's seed: not on the command line
    caplog.set_level(logging.INFO)
    mech = ["--mechanism", mechanism, "--epsilon", "2"] + (["--rounds", str(rounds)] if rounds > 1 else [])
    logs = {"perturb": b"", "collect": b""}
    for r in range(1, rounds + 1):
        tail = ["--round", str(r)] + (["--broadcast", str(collector / f"est{r - 1}.avro.broadcast.avro")]
                                      if r > 1 else [])
        assert cli.main(["perturb", *mech, "--input", str(raw / "ratings.csv"), "--rating-range", "1,5",
                         "--key-dictionary", str(raw / "catalogue.txt"), "--shards", "2",
                         "--output", str(reports / f"R{r}.avro"), *tail]) == 0
        out, err = capfd.readouterr()
        logs["perturb"] += (out + err).encode()
        assert cli.main(["collect", *mech, "--input", str(reports / f"R{r}-*.avro"),
                         "--key-dictionary", str(reports / f"R{r}.keys.txt"),
                         "--output", str(collector / f"est{r}.avro"), *tail]) == 0
        out, err = capfd.readouterr()
        logs["collect"] += (out + err).encode()
    logs["log records"] = "\n".join(r.getMessage() for r in caplog.records).encode()

    shipped = sorted(p for d in (reports, collector) for p in d.rglob("*") if p.is_file())
    assert {p.name for p in reports.iterdir()} >= {"R1.keys.txt", "R1-00000.avro"}
    blobs = {str(p.relative_to(tmp_path)): readable_forms(p) for p in shipped}
    blobs.update({f"the {job} output": [text] for job, text in logs.items()})
    needles = {"the seed": seed_encodings(SEED),
               "a raw rating row": {row.encode() for row in rows},
               "a user id": {u.encode() for u in USERS},
               "an unpublished item id": {i.encode() for i in UNLISTED},
               "a rejected rating": {BAD_RATING.encode()}}
    assert leaks(blobs, needles) == []

    # Positive control: the same needles are found where raw data belongs.
    dead = dead_letter(raw, "R1")
    found = leaks({"dead letter": [dead.read_bytes()]}, needles)
    assert found == ["a user id in dead letter", "an unpublished item id in dead letter",
                     "a rejected rating in dead letter"]
    assert sorted(leaks({"input": [(raw / "ratings.csv").read_bytes()]}, needles)) == [
        "a raw rating row in input", "a rejected rating in input", "a user id in input",
        "an unpublished item id in input"]


def test_the_seed_encodings_catch_a_printed_seed():
    """The scan is not vacuous: each way a program might print the seed is caught."""
    for text in (f"seed={SEED}", f"key {SEED:#x}", base64.b64encode(SEED.to_bytes(16, "big")).decode()):
        assert leaks({"log": [text.encode()]}, {"the seed": seed_encodings(SEED)}) == ["the seed in log"]


def test_perturb_refuses_a_dead_letter_beside_the_reports(raw_side, tmp_path, capsys):
    raw, _ = raw_side
    code = cli.main(["perturb", "--mechanism", "pckv-ue", "--epsilon", "2", "--input", str(raw / "ratings.csv"),
                     "--rating-range", "1,5", "--key-dictionary", str(raw / "catalogue.txt"),
                     "--output", str(tmp_path / "R.avro"), "--dead-letter", str(tmp_path / "rejected.jsonl")])
    assert code == 2
    assert "must not travel with what the collector receives" in capsys.readouterr().err
    assert not any(p.suffix == ".avro" for p in tmp_path.iterdir())


def test_perturb_without_a_dictionary_warns_that_it_publishes_the_items(raw_side, tmp_path, capsys):
    raw, _ = raw_side
    assert cli.main(["perturb", "--mechanism", "pckv-grr", "--epsilon", "2", "--input", str(raw / "ratings.csv"),
                     "--rating-range", "1,5", "--output", str(tmp_path / "rep" / "R.avro")]) == 0
    err = capsys.readouterr().err
    assert "publishes every item id anyone rated" in err
    names = (tmp_path / "rep" / "R.keys.txt").read_text().split()
    assert set(UNLISTED) <= set(names)          # what the warning is about
    assert dead_letter(raw, "R").exists()


def secret_encodings(secret: bytes) -> set[bytes]:
    """16 secret bytes as a file or a log might carry them."""
    number = int.from_bytes(secret, "big")
    texts = {secret.hex(), secret.hex().upper(), base64.b64encode(secret).decode(), str(number), f"{number:x}"}
    return {t.encode() for t in texts} | {secret, secret[::-1]}


def test_longitudinal_ledger_and_device_secrets_never_reach_the_collector(tmp_path, raw_side, capfd, caplog,
                                                                          monkeypatch):
    """Two scheduled collections with memoised two-layer reports and a ledger:
    every file shipped to the collector and everything either job prints is
    free of the run seed, the memoisation master and its derived keys, every
    device secret, and the ledger (its file, rows, device ids, fingerprints)."""
    import sqlite3

    from kvldp.mechanisms.privacy.memo import DeviceKeys, kdf, master_from_seed, user_uid

    raw, rows = raw_side
    reports, collector, private = tmp_path / "reports", tmp_path / "collector", tmp_path / "private"
    for d in (reports, collector, private):
        d.mkdir()
    ledger = private / "ledger.sqlite"
    monkeypatch.setenv(run_seed.SEED_ENV, f"{SEED:032x}")
    caplog.set_level(logging.INFO)
    mech = ["--mechanism", "pckv-ue", "--epsilon", "2", "--longitudinal", "--eps-1", "0.5"]
    logs = b""
    for c in (1, 2):
        assert cli.main(["perturb", *mech, "--input", str(raw / "ratings.csv"), "--rating-range", "1,5",
                         "--key-dictionary", str(raw / "catalogue.txt"), "--shards", "2",
                         "--output", str(reports / f"R{c}.avro"), "--collection-id", f"{c:032x}",
                         "--ledger", str(ledger), "--period-budget", "4", "--period", "30d",
                         "--collection-time", f"2026-05-0{c}T00:00:00"]) == 0
        assert cli.main(["collect", *mech, "--input", str(reports / f"R{c}-*.avro"),
                         "--key-dictionary", str(reports / f"R{c}.keys.txt"),
                         "--output", str(collector / f"est{c}.avro")]) == 0
        out, err = capfd.readouterr()
        logs += (out + err).encode()
    logs += "\n".join(r.getMessage() for r in caplog.records).encode()

    master = master_from_seed(SEED)
    secrets = {bytes(s) for s in DeviceKeys(master).device_secrets(user_uid(USERS)).astype(">u8").view(np.uint8)
               .reshape(-1, 16)} | {bytes(s) for s in DeviceKeys(master).device_secrets(user_uid(USERS))
                                    .view(np.uint8).reshape(-1, 16)}
    with sqlite3.connect(ledger) as db:
        spends = db.execute("SELECT device, fingerprint FROM spends").fetchall()
    assert len(spends) == 2 * len(USERS)
    needles = {"the seed": seed_encodings(SEED),
               "the memoisation master": secret_encodings(master),
               "a derived memo key": secret_encodings(kdf(master, b"permutation")) | secret_encodings(
                   kdf(master, b"device")),
               "a device secret": {v for s in secrets for v in secret_encodings(s)},
               "the ledger": {b"SQLite format 3", b"CREATE TABLE", str(ledger).encode(), ledger.name.encode()},
               "a ledger device id": {str(d).encode() for d, _ in spends} | {
                   int(d).to_bytes(8, "big", signed=True) for d, _ in spends},
               "a state fingerprint": {str(f).encode() for _, f in spends},
               "a raw rating row": {row.encode() for row in rows},
               "a user id": {u.encode() for u in USERS}}
    shipped = sorted(p for d in (reports, collector) for p in d.rglob("*") if p.is_file())
    blobs = {str(p.relative_to(tmp_path)): readable_forms(p) for p in shipped}
    blobs["the jobs' output"] = [logs]
    assert leaks(blobs, needles) == []
    # Positive control: the ledger holds what the scan looks for.
    found = leaks({"ledger": [ledger.read_bytes()]}, needles)
    assert "the ledger in ledger" in found and "a ledger device id in ledger" in found
