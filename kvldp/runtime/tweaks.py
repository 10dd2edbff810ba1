"""Which of kvldp's runtime tweaks apply here, and the one way a tweak is applied.

A *tweak* is anything kvldp does to Beam or to the process beyond Beam's
public API: an attribute of a Beam module replaced while a job runs, a
method of Beam's runner overridden, the C heap or the garbage collector
set up. Every one is listed in ``TWEAKS`` with what it replaces, what it
was measured to save, and the Beam releases it was tested on. A tweak
applies only

* around a job on kvldp's own in-process runner (``LocalRunner``) or the
  ``kvldp`` command's start for such a job -- never at import, never on
  Flink, Dataflow or another runner, never in a user's own pipeline that
  uses kvldp's transforms;
* on a Beam release it was tested on (``Tweak.tested``; a tweak of the
  process alone names none);
* unless ``KVLDP_STOCK_BEAM=1``: then none applies, and the job runs on
  Beam's own ``FnApiRunner`` exactly as Beam ships it.

``KVLDP_BEAM_TWEAKS=a,b`` applies only the named ones (``none``: none), to
measure one against the others; kvldp's runs never need it.

A job that runs without tweaks says so once, on the ``kvldp.runtime``
logger (INFO), with the reason.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import logging
import os
import threading

STOCK_ENV = "KVLDP_STOCK_BEAM"
SELECT_ENV = "KVLDP_BEAM_TWEAKS"
LOG = logging.getLogger("kvldp.runtime")


@dataclasses.dataclass(frozen=True)
class Tweak:
    """One tweak: its name, what of Beam's (or the process's) it replaces,
    the gain measured for it, and the Beam releases it was tested on
    (empty: it touches no Beam internal)."""

    name: str
    replaces: str
    gain: str
    tested: tuple[str, ...]


# Beam releases CI runs the tuned local runner on: setup.py's floor and its newest (``.ci/run``).
TESTED_BEAM = ("2.62.0", "2.77.0")

# Gains: what a 10^6-user job (d = 100, eps = 4) took without the tweak and with every other one, against
# all of them (``KVLDP_BEAM_TWEAKS``), on apache-beam 2.77.0, 2 cores: the median over fresh processes of each
# run's difference from the full set's run of the same round, interleaved (7 rounds; 21 where 7 disagreed),
# and the time Beam spent in the replaced function, instrumented. Kept: those that save >= 5 % of such a job
# on the graph they target (one round, F2M/PCKV-GRR; ten rounds, PrivKVM+). Dropped in issue 38: the short
# type-hint origins (+1, +3, +2 % in 7 rounds; -2, 0 % in 21) and the side-input weigher (<= 1 %).
TWEAKS = (
    Tweak("option_views", "PipelineOptions.view_as: one view per options class (runtime/options.py), where Beam "
          "builds an argparse parser and parses the flags again on each of ~340 calls a job",
          "F2M +43 ms (+33 %), PCKV-GRR +69 ms (+40 %), PrivKVM+ +238 ms (+82 %) without it", TESTED_BEAM),
    Tweak("sparse_bundles", "FnApiRunner._get_bundle_manager: a stage whose input sits in one partition runs on "
          "one worker, a stage without input nowhere (runtime/local_runner.py)",
          "F2M +9 ms (+7 %), PCKV-GRR +37 ms (+21 %), PrivKVM+ +339 ms (+117 %: nine rounds after its stop) "
          "without it", TESTED_BEAM),
    Tweak("inline_bundle_setup", "bundle_processor.concurrent and statesampler.StateSampler: a stage's operator "
          "tree built on the worker's thread, a state sampler without its thread (runtime/bundle_setup.py)",
          "F2M +35 ms (+26 %), PCKV-GRR +22 ms (+13 %) without it", TESTED_BEAM),
    Tweak("memo_dofn_specs", "userstate.get_dofn_specs: memoised per DoFn class (runtime/dofn_specs.py)",
          "F2M +15 ms (+11 %), PrivKVM+ +26 ms (+9 %) without it; in Beam's function 7 -> 23 ms (F2M), "
          "13 -> 80 ms (PrivKVM+)", TESTED_BEAM),
    Tweak("memo_argspecs", "core.get_function_args_defaults: memoised per function (runtime/argspecs.py)",
          "F2M +22 ms (+17 %), PrivKVM+ +36 ms (+12 %) without it; in Beam's function 3.5 -> 11 ms (F2M), "
          "4 -> 30 ms (PrivKVM+)", TESTED_BEAM),
    Tweak("memo_yield_check", "core._check_fn_use_yield_and_return: memoised per code object "
          "(runtime/yield_check.py)", "PrivKVM+ +23 ms (+9 %, 21 rounds) without it; in Beam's function "
          "5 -> 26 ms (74 ParDos of a dozen functions); nothing for a one-round graph", TESTED_BEAM),
    Tweak("zlib_pickles", "pickler.dumps/loads: zlib where Beam compresses with bz2 at level 9 "
          "(runtime/pickles.py)", "F2M +13 ms (+10 %), PrivKVM+ +20 ms (+8 %) without it (21 rounds); in "
          "Beam's functions 27 -> 33 ms (F2M), 37 -> 70 ms (PrivKVM+)", TESTED_BEAM),
    Tweak("gc_freeze", "the cyclic garbage collector: what the imports made frozen once (gc.freeze) at the "
          "command's start (runtime/process.py)",
          "F2M +117 ms (+89 %), PCKV-GRR +98 ms (+57 %), PrivKVM+ +107 ms (+37 %) without it", ()),
    Tweak("heap", "glibc's malloc: one arena, fixed mmap and trim thresholds, the free heap trimmed after each "
          "job (runtime/process.py)", "memory, not time: KS-UE at d = 10^6 (10^4 users) peaks at 791-799 MB "
          "with it, 906-956 MB without; at d = 100, 10^6 users, no time gained (F2M -9 ms, PrivKVM+ -9 ms)", ()),
)

TWEAK_NAMES = tuple(t.name for t in TWEAKS)


def runs_locally(argv) -> bool:
    """Whether a ``kvldp`` command line runs its jobs on kvldp's in-process
    runner: no ``--runner``, no ``--streaming``, not the continuous collector."""
    argv = list(argv)
    if argv[:1] == ["stream"]:
        return False
    return not any(a in ("--runner", "--streaming") or a.startswith(("--runner=", "--streaming=")) for a in argv)


def beam_version() -> str:
    """The installed apache-beam release, read without importing Beam."""
    return importlib.metadata.version("apache-beam")


def _selected() -> frozenset[str]:
    chosen = os.environ.get(SELECT_ENV, "").strip()
    if not chosen:
        return frozenset(TWEAK_NAMES)
    if chosen == "none":
        return frozenset()
    names = frozenset(n.strip() for n in chosen.split(",") if n.strip())
    unknown = sorted(names - set(TWEAK_NAMES))
    if unknown:
        raise ValueError(f"{SELECT_ENV} names no tweak {', '.join(unknown)}; the tweaks: {', '.join(TWEAK_NAMES)}")
    return names


def stock_forced() -> bool:
    return os.environ.get(STOCK_ENV, "").strip() not in ("", "0")


def active(version: str | None = None) -> frozenset[str]:
    """The tweaks a local job applies here: none with ``KVLDP_STOCK_BEAM=1``,
    else the selected ones tested on this Beam (or touching none of it)."""
    if stock_forced():
        return frozenset()
    version = version or beam_version()
    return frozenset(t.name for t in TWEAKS if t.name in _selected() and (not t.tested or version in t.tested))


def stock_reason(version: str | None = None) -> str | None:
    """Why a local job runs without any tweak of Beam's (None: it has some)."""
    if stock_forced():
        return f"{STOCK_ENV}=1"
    version = version or beam_version()
    if version not in TESTED_BEAM:
        return (f"apache-beam {version} is not a release the local runner's tuning was tested on "
                f"({', '.join(TESTED_BEAM)})")
    if not any(t.tested and t.name in active(version) for t in TWEAKS):
        return f"{SELECT_ENV} selects none of Beam's tweaks"
    return None


_noted: set[str] = set()


def note_stock(reason: str) -> None:
    """Say once per process per reason that a job runs on stock Beam."""
    if reason not in _noted:
        _noted.add(reason)
        LOG.info("kvldp: stock Beam %s: %s", beam_version(), reason)


class Swap:
    """Attributes of Beam's modules replaced while at least one job that
    asked for them runs, and Beam's own put back when the last such job
    ends (jobs may overlap: a test runs one while another runs).

    ``replacements``: ``(owner, attribute, ours)``; Beam's value is read
    when the first job starts, so whatever Beam holds then comes back."""

    def __init__(self, *replacements):
        self._replacements = replacements
        self._saved: list = []
        self._users = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def applied(self):
        with self._lock:
            if not self._users:
                self._saved = [(owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name))
                               for owner, name, _ in self._replacements]
                for owner, name, ours in self._replacements:
                    setattr(owner, name, ours)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if not self._users:
                    for owner, name, beams in self._saved:
                        setattr(owner, name, beams)
                    self._saved = []

    @property
    def in_use(self) -> bool:
        return self._users > 0
