"""``gs://`` end to end: the ``kvldp`` jobs read and write Cloud Storage
through Beam's ``FileSystems``, against a local GCS emulator on 127.0.0.1.

The real Google host is never contacted (DESIGN.md, "Beam facts"):

* the emulator is ``gcp-storage-emulator`` (pure Python, in-process thread,
  in-memory storage; the ``test`` extra installs it), on a free loopback port;
* ``STORAGE_EMULATOR_HOST`` points google-cloud-storage at it: with that
  variable set, ``storage.Client`` uses it as the endpoint and anonymous
  credentials;
* Beam 2.77's ``gcsio.create_storage_client`` first asks
  ``auth.get_service_credentials``, which runs ``google.auth.default`` (with
  retries, and a probe of the GCE metadata server) once per process and
  caches the answer. The test presets that cache to "no credentials", so
  Beam takes its own anonymous branch
  (``storage.Client.create_anonymous_client()``), which honours the
  emulator variable;
* a guard on ``socket.getaddrinfo`` refuses, and records, any host name
  other than the loopback for the duration of each test.
"""
from __future__ import annotations

import json
import logging
import socket
import threading

import pytest

pytest.importorskip(
    "gcp_storage_emulator.server",
    reason="gcp-storage-emulator is not installed (pip install -e '.[test]'); "
           "the gs:// tests need a local GCS emulator and never use the real service")

from apache_beam.internal.gcp import auth
from apache_beam.io.filesystems import FileSystems
from gcp_storage_emulator.server import create_server
from google.cloud import storage

from kvldp.cli import commands as cli
from kvldp.plots.tables import read_estimates

BUCKET = "bucket"
ITEMS = [f"m{k}" for k in range(5)]
N_USERS = 30
GOOD_ROWS = [(f"u{j:02d}", ITEMS[(j + t) % len(ITEMS)], 1 + (j + 2 * t) % 5)
             for j in range(N_USERS) for t in range(3)]          # 3 distinct items per user
BAD_ROWS = ["x,m1",          # 2 fields, header has 3
            "y,m2,11",       # outside the declared rating range [1, 5]
            "z,m3,abc",      # rating is not a number
            ",m4,3"]         # missing user
CSV_TEXT = "user,item,rating\n" + "".join(f"{u},{i},{r}\n" for u, i, r in GOOD_ROWS) + "\n".join(BAD_ROWS) + "\n"
MECH = ["--mechanism", "pckv-grr", "--epsilon", "2"]
DATA = ["--rating-range", "1,5", "--seed", "1"]
LOOPBACK = {"127.0.0.1", "localhost", "::1", "", None}
START_TIMEOUT_S = 10.0


class NetworkBlocked(RuntimeError):
    """Raised by the guard; not an OSError, so no HTTP client retries it."""


@pytest.fixture
def gcs(monkeypatch):
    """A fresh emulator with bucket ``gs://bucket``; yields a storage client on it."""
    logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)  # one WARNING per response otherwise
    server = create_server("127.0.0.1", 0, in_memory=True)
    api = server._api                      # the HTTP server's thread (Server.start waits without a bound)
    api.daemon = True                      # never keeps the interpreter alive
    api.start()
    try:
        if not api.is_running.wait(START_TIMEOUT_S):
            pytest.fail(f"GCS emulator did not start within {START_TIMEOUT_S} s")
        host, port = api._httpd.server_address[:2]
        assert host == "127.0.0.1"
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        for var in ("NO_PROXY", "no_proxy"):          # a CI proxy must not see emulator traffic
            monkeypatch.setenv(var, "127.0.0.1,localhost")
        # Beam: "no credentials" already looked up -> the anonymous client.
        monkeypatch.setattr(auth._Credentials, "_credentials_init", True)
        monkeypatch.setattr(auth._Credentials, "_credentials", None)

        refused: list[str] = []
        real_getaddrinfo = socket.getaddrinfo

        def loopback_only(host, *args, **kwargs):
            name = host.decode() if isinstance(host, bytes) else host
            if name not in LOOPBACK and not str(name).startswith("127."):
                refused.append(str(name))
                raise NetworkBlocked(f"test_gcs: refusing to resolve {name!r}; only the emulator may be used")
            return real_getaddrinfo(host, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", loopback_only)
        client = storage.Client.create_anonymous_client()
        client.create_bucket(BUCKET)
        yield client
        assert refused == [], f"something tried to reach {refused}"
    finally:
        server.stop()                                   # shutdown() + server_close()
        threading.Thread.join(api, timeout=5)
        assert not api.is_alive(), "GCS emulator thread did not stop"


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The same simulation over a local copy of the ratings: the gs:// runs must match it."""
    d = tmp_path_factory.mktemp("local")
    (d / "ratings.csv").write_text(CSV_TEXT)
    out = d / "est.jsonl"
    assert cli.main(["simulate", *MECH, "--dataset", str(d / "ratings.csv"), *DATA, "--output", str(out)]) == 0
    return {r["key"]: r for r in read_estimates(str(out))}


def _upload_ratings(client):
    client.bucket(BUCKET).blob("ratings.csv").upload_from_string(CSV_TEXT, content_type="text/csv")


def _names(client, prefix=""):
    return sorted(b.name for b in client.list_blobs(BUCKET, prefix=prefix))


def _lines(client, name):
    return [x for x in client.bucket(BUCKET).blob(name).download_as_text().splitlines() if x.strip()]


def _dead_letter(client, stem):
    """The one dead letter ``kvldp-rejected/STEM.RUNID.rejected.jsonl`` of a run, as lines."""
    found = [b.name for b in client.list_blobs(BUCKET, prefix=f"kvldp-rejected/{stem}.")
             if b.name.endswith(".rejected.jsonl")]
    assert len(found) == 1, found
    return _lines(client, found[0])


def _row_summary(text):
    line = next(x for x in text.splitlines() if x.startswith("rows read"))
    return tuple(int(t) for t in line.split() if t.isdigit()), line


def test_simulate_reads_and_writes_gs(gcs, local_reference, capsys):
    _upload_ratings(gcs)
    capsys.readouterr()
    assert cli.main(["simulate", *MECH, "--dataset", f"gs://{BUCKET}/ratings.csv", *DATA,
                     "--output", f"gs://{BUCKET}/out/est.jsonl"]) == 0
    (read, acc, rej), line = _row_summary(capsys.readouterr().out)
    assert (read, acc, rej) == (len(GOOD_ROWS) + len(BAD_ROWS), len(GOOD_ROWS), len(BAD_ROWS)), line
    # Exactly the estimates in the output directory (no beam-temp leftovers); the
    # rejected rows stay beside the raw ratings.
    assert _names(gcs, "out/") == ["out/est.jsonl"]
    assert FileSystems.exists(f"gs://{BUCKET}/out/est.jsonl")
    est = [json.loads(x) for x in _lines(gcs, "out/est.jsonl")]
    assert sorted(r["key"] for r in est) == ITEMS
    assert {r["n_reports"] for r in est} == {N_USERS}
    dead = [json.loads(x) for x in _dead_letter(gcs, "est.jsonl")]
    assert len(dead) == len(BAD_ROWS)
    assert {d["source"] for d in dead} == {f"gs://{BUCKET}/ratings.csv"}
    reasons = " | ".join(sorted(d["reason"] for d in dead))
    for part in ("2 fields", "outside the declared rating range", "not a number", "missing user"):
        assert part in reasons, reasons
    # Read back through Beam's FileSystems, identical to the local run with the same seed.
    got = {r["key"]: r for r in read_estimates(f"gs://{BUCKET}/out/est.jsonl")}
    assert got.keys() == local_reference.keys()
    for k, ref in local_reference.items():
        for field in ("frequency", "mean", "true_frequency", "true_mean", "n_reports"):
            assert got[k][field] == ref[field], (k, field)


def test_perturb_then_collect_through_gs(gcs, local_reference, capsys):
    _upload_ratings(gcs)
    assert cli.main(["perturb", *MECH, "--dataset", f"gs://{BUCKET}/ratings.csv", *DATA,
                     "--output", f"gs://{BUCKET}/rep/R.avro"]) == 0
    (_, acc, rej), line = _row_summary(capsys.readouterr().out)
    assert (acc, rej) == (len(GOOD_ROWS), len(BAD_ROWS)), line
    names = _names(gcs, "rep/")
    reports = [n for n in names if n.startswith("rep/R-") and n.endswith(".avro")]
    assert reports and set(names) == {*reports, "rep/R.keys.txt", "rep/R.manifest.json"}, names  # nothing raw
    assert _lines(gcs, "rep/R.keys.txt") == ITEMS
    assert len(_dead_letter(gcs, "R")) == len(BAD_ROWS)

    assert cli.main(["collect", *MECH, "--input", f"gs://{BUCKET}/rep/R*.avro",
                     "--key-dictionary", f"gs://{BUCKET}/rep/R.keys.txt",
                     "--output", f"gs://{BUCKET}/est.csv"]) == 0
    assert f"{N_USERS} reports collected" in capsys.readouterr().out
    assert "est.csv" in _names(gcs)
    got = {r["key"]: r for r in read_estimates(f"gs://{BUCKET}/est.csv")}
    assert sorted(got) == ITEMS
    # The split deployment over gs:// gives the simulation's estimates (same seed, same batches).
    for k, ref in local_reference.items():
        assert got[k]["n_reports"] == N_USERS
        assert got[k]["frequency"] == pytest.approx(ref["frequency"], rel=1e-12)
        assert got[k]["mean"] == pytest.approx(ref["mean"], rel=1e-12, abs=1e-15)
        assert got[k]["true_frequency"] is None          # the collector never knows the truth
