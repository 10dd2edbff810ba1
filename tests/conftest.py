"""Shared pytest configuration: registers the ``slow`` marker; every test
runs in its own empty working directory (jobs write their default outputs
there, never into the checkout).

pytest.ini deselects slow tests by default (``-m "not slow"``); run them with
``python -m pytest -m slow``.
"""

import pytest


@pytest.fixture(autouse=True)
def _own_working_directory(tmp_path_factory, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long statistical sweeps (run with: pytest -m slow)")
