"""The scheduled collection, run by a real Airflow (marker ``airflow``;
``.ci/run`` runs it): ``deploy/schedule/kvldp_collect_dag.py`` loads with no
import errors, one dated run turns that day's report files into that day's
estimates on the local runner, a rerun of the day overwrites them without
counting a report twice, and a day without reports fails its task with the
reason in the task log.

Airflow lives in its own virtualenv (it pins dependencies Beam conflicts
with): ``$KVLDP_AIRFLOW`` names its ``airflow`` executable; unset, the test
builds ``.airflow-venv`` in the repository with ``apache-airflow`` (about
a minute). kvldp runs from this interpreter's environment (``KVLDP_BIN``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvldp.cli import commands as cli
from kvldp.plots.tables import read_estimates

pytestmark = pytest.mark.airflow

ROOT = Path(__file__).resolve().parents[1]
AIRFLOW_VERSION = "3.3.2"
DAG_ID = "kvldp_daily_collect"
DAY, OTHER_DAY, MISSING_DAY = "2026-11-23", "2026-11-22", "2026-11-21"


@pytest.fixture(scope="module")
def airflow_bin() -> str:
    given = os.environ.get("KVLDP_AIRFLOW")
    if given:
        return given
    venv = ROOT / ".airflow-venv"
    exe = venv / "bin" / "airflow"
    if not exe.exists():
        subprocess.run([getattr(sys, "_base_executable", "python3"), "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", f"apache-airflow=={AIRFLOW_VERSION}"],
                       check=True, timeout=1200)
    return str(exe)


@pytest.fixture(scope="module")
def deployment(airflow_bin, tmp_path_factory):
    """An Airflow home (SQLite metadata DB) whose DAG folder is deploy/schedule,
    and a reports tree with two days of reports of different sizes."""
    base = tmp_path_factory.mktemp("airflow")
    reports, estimates = base / "reports", base / "estimates"
    users = {DAY: 3000, OTHER_DAY: 1700}
    for day, n in users.items():
        assert cli.main(["perturb", "--mechanism", "pckv-ue", "--epsilon", "4", "--users", str(n), "--keys", "8",
                         "--output", str(reports / day / "R.avro")]) == 0
    env = {**os.environ, "AIRFLOW_HOME": str(base / "home"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "deploy" / "schedule"),
           "KVLDP_BIN": str(Path(sys.executable).with_name("kvldp")), "KVLDP_REPORTS": str(reports),
           "KVLDP_ESTIMATES": str(estimates), "KVLDP_MECHANISM": "pckv-ue", "KVLDP_EPSILON": "4"}
    env.pop("KVLDP_BEAM_ARGS", None)
    subprocess.run([airflow_bin, "db", "migrate"], env=env, cwd=base, check=True, capture_output=True,
                   timeout=300)
    return {"airflow": airflow_bin, "env": env, "cwd": base, "estimates": estimates, "users": users}


def airflow(deployment, *args) -> subprocess.CompletedProcess:
    return subprocess.run([deployment["airflow"], *args], check=False, env=deployment["env"], cwd=deployment["cwd"],
                          capture_output=True, text=True, timeout=600)


DAGBAG = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[1])
print(json.dumps({"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": sorted(bag.dag_ids)}))
"""


def dag_bag(deployment, folder) -> dict:
    """What Airflow's own parser makes of a DAG folder (as the DAG processor would)."""
    python = str(Path(deployment["airflow"]).with_name("python"))
    done = subprocess.run([python, "-c", DAGBAG, str(folder)], env=deployment["env"], cwd=deployment["cwd"],
                          capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_dag_loads_without_import_errors(deployment, tmp_path):
    assert dag_bag(deployment, ROOT / "deploy" / "schedule") == {"errors": {}, "dags": [DAG_ID]}
    # the check can fail: the same DAG importing something its environment lacks
    broken = tmp_path / "broken_dag.py"
    broken.write_text((ROOT / "deploy" / "schedule" / "kvldp_collect_dag.py").read_text()
                      + "\nimport kvldp_not_installed_here\n")
    bag = dag_bag(deployment, tmp_path)
    assert bag["dags"] == [] and "No module named 'kvldp_not_installed_here'" in bag["errors"][str(broken)]


def test_a_dated_run_collects_that_day_and_a_rerun_replaces_it(deployment):
    out = deployment["estimates"] / DAY / "estimates.avro"
    runs = []
    for _ in range(2):
        done = airflow(deployment, "dags", "test", DAG_ID, DAY)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "new_state=success" in done.stdout + done.stderr
        runs.append(sorted(read_estimates(str(out)), key=lambda r: r["key"]))
    first, second = runs
    assert len(first) == 8
    assert {r["n_reports"] for r in first} == {deployment["users"][DAY]}       # that day's reports only, once
    assert second == first                                                      # a rerun replaces, never adds
    assert not (deployment["estimates"] / OTHER_DAY).exists()


def test_a_day_without_reports_fails_its_task_with_the_reason(deployment):
    done = airflow(deployment, "dags", "test", DAG_ID, MISSING_DAY)
    log = done.stdout + done.stderr
    assert done.returncode != 0
    assert f"no report files match '{deployment['env']['KVLDP_REPORTS']}/{MISSING_DAY}/R-*.avro'" in log
    assert "new_state=failed" in log
    assert not (deployment["estimates"] / MISSING_DAY).exists()
