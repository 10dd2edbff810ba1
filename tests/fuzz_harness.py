"""What every fuzzing test of issue 42 shares: the budget, the campaign
runner, and the one property of a refusal.

Every case ends in one of three ways: accepted (and counted), a one-line
``ValueError``/``FileNotFoundError`` naming the input and what is wrong
(what the command prints as ``kvldp …: error: …``), or a dead letter with
its reason. Anything else -- another exception, a message without the
file's name, a traceback's worth of lines, a case slower than ``SLOW_CASE``
seconds -- fails the test, and Hypothesis shrinks it to a minimal input.

Budget: ``DEFAULT_CASES`` per parser in the default suite (derandomised:
the same cases every run); the campaign (marker ``slow``) runs
``KVLDP_FUZZ_CASES`` per parser (default ``CAMPAIGN_CASES``) and, with
``KVLDP_FUZZ_SUMMARY`` set, appends each parser's tally to that JSON file
(the reliability table of docs/reliability.md is read from it).
"""
from __future__ import annotations

import collections
import json
import os
import resource
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings

from kvldp.transforms.context import ElementError

DEFAULT_CASES = 200
CAMPAIGN_CASES = int(os.environ.get("KVLDP_FUZZ_CASES", "20000"))
SLOW_CASE = 5.0          # seconds: a case slower than this is a hang
MEMORY_BUDGET = 512 << 20     # bytes the process's peak may grow by over a whole campaign


def refusal(err: BaseException, *names: str) -> str:
    """Assert ``err`` is a refusal an operator can act on: a ``ValueError``
    or ``FileNotFoundError`` of one line naming one of ``names``; its
    first words (the kind of refusal) for the tally."""
    if isinstance(err, ElementError):           # a worker's error: its cause is what the operator reads
        assert any(name in str(err) for name in names), f"names none of {names}: {err}"
        err = err.__cause__
    assert isinstance(err, (ValueError, FileNotFoundError)), f"{type(err).__name__}: {err}"
    text = str(err).strip()
    assert text and "\n" not in text, f"not one line: {text!r}"
    assert any(name in text for name in names), f"names none of {names}: {text!r}"
    return "refused"


def campaign(strategy, check, cases: int, parser: str) -> collections.Counter:
    """Run ``check(case)`` over ``cases`` drawn from ``strategy``; ``check``
    returns its outcome's name ("accepted", "refused", "dead letter", …).
    Returns the tally of outcomes (and records it, see the module doc)."""
    tally: collections.Counter = collections.Counter()

    @settings(max_examples=cases, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(case):
        start = time.perf_counter()
        outcome = check(case)
        took = time.perf_counter() - start
        assert took < SLOW_CASE, f"a case took {took:.1f} s"
        tally[outcome] += 1

    start, peak = time.perf_counter(), _peak_bytes()
    run()
    _record(parser, tally, time.perf_counter() - start)
    grew = _peak_bytes() - peak
    assert grew < MEMORY_BUDGET, f"the peak memory grew by {grew >> 20} MiB over the campaign"
    return tally


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: KiB


def _record(parser: str, tally: collections.Counter, seconds: float) -> None:
    path = os.environ.get("KVLDP_FUZZ_SUMMARY")
    if not path:
        return
    summary = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    summary[parser] = {"cases": sum(tally.values()), "outcomes": dict(tally), "seconds": round(seconds, 1)}
    Path(path).write_text(json.dumps(summary, indent=1, sort_keys=True))
