"""Shared pytest configuration: registers the ``slow`` marker; every test
runs in its own empty working directory (jobs write their default outputs
there, never into the checkout).

pytest.ini deselects slow tests by default (``-m "not slow"``); run them with
``python -m pytest -m slow``.
"""

import os
import sys
import tempfile

import pytest

# Hypothesis keeps its example database and caches in ./.hypothesis: outside the checkout, per run
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", tempfile.mkdtemp(prefix="kvldp-hypothesis-"))


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long statistical sweeps (run with: pytest -m slow)")


# The suite writes only under its temporary directories (issue 39, item 11):
# the checkout's files are listed when the session starts and again when it
# ends (in the controller under pytest-xdist), and any new one fails the run.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_OURS = {".git", "__pycache__", ".pytest_cache", ".ruff_cache", "build", "dist"}
_NOT_OURS_PREFIXES = (".venv", ".airflow-venv", os.path.join("deploy", "flink", ".cache"),
                      os.path.join("deploy", "kafka", ".cache"))   # the caches of flink.sh and kafka.sh


def _checkout_files() -> set[str]:
    found = set()
    for directory, subdirs, files in os.walk(_ROOT):
        relative = os.path.relpath(directory, _ROOT)
        subdirs[:] = [d for d in subdirs if d not in _NOT_OURS and not d.endswith(".egg-info")
                      and not os.path.normpath(os.path.join(relative, d)).startswith(_NOT_OURS_PREFIXES)]
        found.update(os.path.normpath(os.path.join(relative, f)) for f in files)
    return found


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):
        session.config._kvldp_checkout = _checkout_files()


def pytest_sessionfinish(session, exitstatus):
    before = getattr(session.config, "_kvldp_checkout", None)
    if before is None:
        return
    new = sorted(_checkout_files() - before)
    if new:
        print(f"\nthe tests wrote into the checkout: {', '.join(new[:10])}", file=sys.stderr)
        session.exitstatus = 1
