"""The Beam-free core (``kvldp.mechanisms``, ``kvldp.datasets``) is pure NumPy (SPEC.md, base.py docstring).

* Importing every module of the core must not pull in Apache Beam,
  fastavro or sqlite3, so a device- or server-side client can use it alone
  (the device ledger's SQLite file is ``kvldp.storage``'s, issue 41).
* Client randomness comes only from explicit ``numpy.random.Generator``s
  (randomness.py): no module may call the global ``np.random.<fn>(`` state.
"""
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

# both packages must be loaded: the probe test reads them from sys.modules
import kvldp.datasets
import kvldp.mechanisms  # noqa: F401

CORE = ("kvldp.mechanisms", "kvldp.datasets")
ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(p for pkg in CORE for p in (ROOT / pkg.replace(".", "/")).rglob("*.py"))

FORBIDDEN_IMPORT = re.compile(r"^\s*(import\s+apache_beam|from\s+apache_beam\b)|fastavro|\bsqlite3\b", re.MULTILINE)
GLOBAL_RANDOM = re.compile(
    r"\b(?:np|numpy)\.random\.(seed|rand|random|choice|binomial|uniform|randint|randn)\s*\(")

# Runs in a fresh interpreter: a meta-path hook records any *attempt* to import
# the forbidden packages (even one that fails or is caught), then every module
# of the package is imported.
_PROBE = r"""
import importlib, json, pkgutil, sys

attempts = []

class Recorder:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("apache_beam", "fastavro", "sqlite3", "_sqlite3"):
            attempts.append(name)
        return None

sys.meta_path.insert(0, Recorder())
names = []
for pkg in ("kvldp.mechanisms", "kvldp.datasets"):
    names += [pkg] + [m.name for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({
    "imported": names,
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("apache_beam", "fastavro", "sqlite3")),
    "attempts": attempts,
}))
"""


def test_sources_found():
    """Guard: the scans below really look at the package's files."""
    names = {p.name for p in SOURCES}
    assert {"base.py", "randomness.py", "sampling.py", "oracles.py", "pckv.py", "synthetic.py", "files.py"} <= names


def test_importing_every_module_loads_no_beam_or_fastavro():
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {f"{pkg}.{m.name}" for pkg in CORE for m in pkgutil.iter_modules(sys.modules[pkg].__path__)}
    assert expected <= set(out["imported"])
    assert out["loaded"] == [], f"Beam/fastavro modules loaded: {out['loaded']}"
    assert out["attempts"] == [], f"imports of Beam/fastavro attempted: {out['attempts']}"


def test_patterns_catch_what_they_should():
    """Self-test of the regexes, so the scans below cannot pass vacuously."""
    for bad in ("import apache_beam as beam", "from apache_beam.io import ReadFromText",
                "import fastavro", "  from fastavro import reader", "import sqlite3"):
        assert FORBIDDEN_IMPORT.search(bad), bad
    for bad in ("np.random.seed(0)", "x = np.random.rand(3)", "numpy.random.choice(5, 2)",
                "np.random.binomial (10, .5)", "np.random.uniform(-1, 1)", "np.random.randint(3)",
                "np.random.randn(2)", "np.random.random()"):
        assert GLOBAL_RANDOM.search(bad), bad
    for ok in ("np.random.Generator(np.random.PCG64DXSM(ss))", "np.random.SeedSequence([1])",
               "rng.random(n)", "rng.choice(d, size=n)", "rng.uniform(-1.0, 1.0, d)"):
        assert not GLOBAL_RANDOM.search(ok), ok


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_source_has_no_beam_or_fastavro_import(path):
    hits = [m.group(0) for m in FORBIDDEN_IMPORT.finditer(path.read_text(encoding="utf-8"))]
    assert hits == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_source_uses_no_global_numpy_random_state(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    hits = [f"{path.name}:{i}: {line.strip()}" for i, line in enumerate(lines, 1) if GLOBAL_RANDOM.search(line)]
    assert hits == []


def test_the_command_imports_scipy_only_when_a_formula_needs_it():
    """``kvldp.mechanisms.special`` defers ``scipy.special`` (0.18 s of every
    command's start) to the first post-processing formula, which then works."""
    probe = ("import sys\nfrom kvldp.cli import commands\n"
             "before = sorted(m for m in sys.modules if m.split('.')[0] == 'scipy')\n"
             "from kvldp.mechanisms import special\nfrom kvldp.mechanisms.estimation import intervals\n"
             "print(before == [], round(intervals.critical_deviance(0.95), 4), special.ndtr(0.0),\n"
             "      'scipy.special' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "3.8415", "0.5", "True"]
