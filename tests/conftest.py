"""Shared pytest configuration: the ``slow`` marker.

Tests marked ``@pytest.mark.slow`` are skipped unless ``--runslow`` is given
(or ``KVLDP_RUN_SLOW=1`` is set), so the default run stays fast.
"""
import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run tests marked @pytest.mark.slow")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long statistical checks, run only with --runslow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow") or os.environ.get("KVLDP_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: needs --runslow (or KVLDP_RUN_SLOW=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
