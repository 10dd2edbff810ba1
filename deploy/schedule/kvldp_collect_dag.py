"""Airflow DAG ``kvldp_daily_collect``: every night, that day's report files
become that day's estimates.

Clients (or ingest jobs) deliver a day's reports to
``$KVLDP_REPORTS/YYYY-MM-DD/R-*.avro`` with the key dictionary ``R.keys.txt``
beside them; the DAG runs ``kvldp collect`` over exactly that day's files and
writes ``$KVLDP_ESTIMATES/YYYY-MM-DD/estimates.avro`` (local paths or
``gs://``). kvldp runs from its own environment (``$KVLDP_BIN``): Airflow
and Beam pin conflicting dependencies, so they live in separate virtualenvs.

- **Idempotent.** A day's run reads only that day's directory and replaces
  that day's estimates (``--overwrite``: written to a temporary file and
  renamed), so rerunning or backfilling a day replaces it and never counts a report
  twice; estimates live outside the reports' tree, so no run reads another's
  output.
- **A missing day fails loudly.** ``kvldp collect`` exits 2 with ``no
  report files match …`` naming the day's pattern, and the task fails with
  that line in its log; no empty estimates are written.
- **Any runner.** ``$KVLDP_BEAM_ARGS`` is appended to the command, e.g.
  ``--runner DataflowRunner --project P --region R --temp_location
  gs://B/tmp --setup_file /opt/kvldp/setup.py``; empty means the local runner.

Environment (of the Airflow workers): ``KVLDP_BIN`` (default ``kvldp``),
``KVLDP_REPORTS``, ``KVLDP_ESTIMATES``, ``KVLDP_MECHANISM`` (default
``pckv-ue``), ``KVLDP_EPSILON`` (default ``4``), ``KVLDP_BEAM_ARGS``.
``tests/test_airflow.py`` loads this file into a real Airflow and runs one
dated collection twice.
"""
from __future__ import annotations

import os
import shlex

import pendulum
from airflow import DAG
from airflow.providers.standard.operators.bash import BashOperator

DAY = "{{ ds }}"                    # the logical date the run collects


def collect_command(env=os.environ) -> str:
    kvldp = shlex.quote(env.get("KVLDP_BIN", "kvldp"))
    reports = env.get("KVLDP_REPORTS", "/data/kvldp/reports").rstrip("/")
    estimates = env.get("KVLDP_ESTIMATES", "/data/kvldp/estimates").rstrip("/")
    day_reports, day_estimates = f"{reports}/{DAY}", f"{estimates}/{DAY}"
    flags = [
        "collect",
        "--mechanism", env.get("KVLDP_MECHANISM", "pckv-ue"),
        "--epsilon", env.get("KVLDP_EPSILON", "4"),
        "--input", f"{day_reports}/R-*.avro",
        "--key-dictionary", f"{day_reports}/R.keys.txt",
        "--output", f"{day_estimates}/estimates.avro",
        "--overwrite",              # a rerun or backfill of a day replaces that day's estimates, by design
        *shlex.split(env.get("KVLDP_BEAM_ARGS", "")),
    ]
    # no mkdir: Beam's sink creates the day's directory, and only once there is something to write
    return f"exec {kvldp} {' '.join(shlex.quote(f) for f in flags)}"


with DAG(
    dag_id="kvldp_daily_collect",
    description="kvldp collect: a day's LDP reports -> that day's estimates",
    schedule="30 2 * * *",                       # 02:30 UTC, after the day's uploads have landed
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 0},                 # a missing day is an operator's problem, not a transient one
    tags=["kvldp", "ldp"],
) as dag:
    BashOperator(task_id="collect", bash_command=collect_command())
