"""Shared pytest configuration: registers the ``slow`` marker.

pytest.ini deselects slow tests by default (``-m "not slow"``); run them with
``python -m pytest -m slow``.
"""


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long statistical sweeps (run with: pytest -m slow)")
