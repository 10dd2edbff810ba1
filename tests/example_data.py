"""``examples/ratings.csv`` for tests, as a copy outside the checkout: a
job's default dead letter goes beside its input (``kvldp-rejected/``), and
the suite writes nothing into the checkout (``conftest.py`` checks)."""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "ratings.csv"


@functools.cache
def example_ratings() -> str:
    """The copy, made once per test process and removed when it exits."""
    directory = tempfile.mkdtemp(prefix="kvldp-example-")
    atexit.register(shutil.rmtree, directory, True)
    return shutil.copy(EXAMPLE, directory)
