"""kvldp on Beam without its gcp extra (the base install, ``setup.py``).

Importing Beam imports every client its gcp extra brings, so the base
install leaves the extra out (0.45 s of each command's start) and asks for
it where it is needed: Pub/Sub and the Dataflow runner. These tests run in
this environment, which has the extra (the suite covers Pub/Sub), with its
modules made unimportable, as they are in a base install.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# the import names of what apache-beam[gcp] adds beyond google-cloud-storage (a base dependency) and its
# own dependencies (google-api-core, google-auth, google-cloud-core); "google.cloud.bigquery" also hides
# google.cloud.bigquery_storage(_v1), and so on
EXTRA_ONLY = ("apitools", "google_auth_httplib2", "google.cloud.datastore", "google.cloud.pubsub",
              "google.cloud.resourcemanager", "google.cloud.dataflow", "google.cloud.bigquery", "google.cloud.bigtable",
              "google.cloud.devtools", "google.cloud.spanner", "google.cloud.dlp", "google.cloud.kms",
              "google.cloud.language", "google.cloud.secretmanager", "google.cloud.videointelligence",
              "google.cloud.vision", "google.cloud.recommendationengine", "google.cloud.aiplatform", "vertexai",
              "google.cloud.sql", "pytds", "pg8000", "pymysql", "orjson")

PROBE = textwrap.dedent("""
    import sys
    BLOCKED = {blocked!r}

    class BaseInstall:
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith((b + ".", b + "_")) for b in BLOCKED):
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, BaseInstall())
    from kvldp.runtime.start import main      # the kvldp command
    sys.exit(main(sys.argv[1:]))
""").format(blocked=EXTRA_ONLY)


def _kvldp(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=False)


def test_a_base_install_runs_a_job_without_a_word_about_bigquery(tmp_path):
    out = _kvldp("simulate", "--mechanism", "pckv-grr", "--epsilon", "2", "--users", "2000", "--keys", "10",
                 "--seed", "1", "--output", str(tmp_path / "e.jsonl"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "e.jsonl").stat().st_size > 0
    assert "apitools" not in out.stderr and "bigquery" not in out.stderr.lower(), out.stderr


def test_the_probe_really_hides_the_extra():
    """Guard: here Beam imports the extra's clients; under the probe it cannot,
    and ``gs://`` still has its filesystem (google-cloud-storage is a base dependency)."""
    check = ("import sys, apache_beam\nfrom apache_beam.io.filesystems import FileSystems\n"
             "print(any(m.split('.')[0] == 'apitools' or m.startswith('google.cloud.bigquery') for m in sys.modules),"
             " type(FileSystems.get_filesystem('gs://bucket/x')).__name__)\n")
    plain = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    probe = PROBE.split("from kvldp.runtime.start import main")[0] + check
    hidden = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert plain.stdout.split() == ["True", "GCSFileSystem"]
    assert hidden.stdout.split() == ["False", "GCSFileSystem"]


@pytest.mark.parametrize("argv, use", [
    (["stream", "--mechanism", "pckv-ue", "--epsilon", "4", "--subscription", "projects/my-proj/subscriptions/reports",
      "--keys", "5", "--window", "60s", "--output-dir", "OUT"], "Pub/Sub"),
    (["simulate", "--mechanism", "pckv-grr", "--epsilon", "2", "--users", "100", "--keys", "5", "--seed", "1",
      "--output", "OUT/e.jsonl", "--runner", "DataflowRunner"], "the Dataflow runner"),
])
def test_what_needs_the_gcp_extra_says_so_before_any_job(tmp_path, argv, use):
    out = _kvldp(*[a.replace("OUT", str(tmp_path)) for a in argv])
    assert out.returncode == 2
    assert f"{use} needs Beam's gcp extra" in out.stderr and "pip install 'kvldp[gcp]'" in out.stderr, out.stderr
    assert not any(tmp_path.iterdir())
