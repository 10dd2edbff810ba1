"""Stock Beam underneath (issue 38): importing kvldp changes nothing of
Beam's or of the process, a tuned local job puts back everything it
replaced, and tuned and stock jobs give the same estimates.

The import check runs in fresh interpreters: the first lists the Beam
modules that importing every kvldp module loads; the second imports those
modules alone, takes a snapshot of every attribute of every Beam module and
of every class Beam defines, of the logging tree, the garbage collector,
warnings, signal handlers, the environment, Beam's coder registry and the
C heap calls, then imports every kvldp module, runs one tuned local job,
and compares. Replacing any function of Beam's at import -- as kvldp did up
to 171d51c -- fails it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from kvldp.mechanisms import registry
from kvldp.runtime import tweaks

MODULES = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    import kvldp
    names = sorted(m.name for m in pkgutil.walk_packages(kvldp.__path__, "kvldp.")
                   if m.name != "kvldp.__main__")
    for name in names:
        importlib.import_module(name)
    beam = sorted(m for m in sys.modules if m == "apache_beam" or m.startswith("apache_beam."))
    print(json.dumps({"kvldp": names, "beam": beam}))
""")

SNAPSHOT = textwrap.dedent("""
    import copyreg, gc, importlib, json, logging, os, signal, sys, types, warnings

    heap_calls = []
    def audit(event, args):
        if event == "ctypes.dlsym" and str(args[-1]) in ("mallopt", "malloc_trim"):
            heap_calls.append(str(args[-1]))
    sys.addaudithook(audit)

    listed = json.loads(sys.argv[1])
    for name in listed["beam"]:
        try:
            importlib.import_module(name)
        except Exception:
            pass

    def code(value):
        # code (a function, class, method, module), not data a job may update
        return callable(value) or isinstance(value, (classmethod, staticmethod, property, types.ModuleType))

    def beam_state():
        out = {}
        for name, module in list(sys.modules.items()):
            if not (name == "apache_beam" or name.startswith("apache_beam.")) or module is None:
                continue
            for attr, value in list(vars(module).items()):
                out[f"{name}.{attr}"] = [id(value), code(value)]
                if isinstance(value, type) and value.__module__ == name:
                    for member, inner in list(vars(value).items()):
                        out[f"{name}.{attr}.{member}"] = [id(inner), code(inner)]
        return out

    def logging_state():
        loggers = {"": logging.getLogger()}
        loggers.update({k: v for k, v in logging.Logger.manager.loggerDict.items() if isinstance(v, logging.Logger)})
        return {name: [lg.level, [id(h) for h in lg.handlers], [id(f) for f in lg.filters], lg.propagate,
                       lg.disabled] for name, lg in loggers.items()}

    def process_state():
        from apache_beam.coders import typecoders
        return {
            "gc": [gc.isenabled(), list(gc.get_threshold()), gc.get_freeze_count()],
            "sys": [sys.getrecursionlimit(), sys.getswitchinterval(), [id(f) for f in sys.meta_path],
                    [id(h) for h in sys.path_hooks], id(sys.excepthook), id(sys.displayhook),
                    sys.gettrace() is None, sys.getprofile() is None],
            "warnings": [repr(f) for f in warnings.filters],
            "signals": {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)},
            "environ": dict(os.environ),
            "copyreg": sorted(map(repr, copyreg.dispatch_table)),
            "coders": {repr(k): id(v) for k, v in typecoders.registry._coders.items()},
            "heap_calls": list(heap_calls),
        }

    def snapshot():
        return {"beam": beam_state(), "logging": logging_state(), "process": process_state()}

    before = snapshot()
    for name in listed["kvldp"]:
        importlib.import_module(name)
    after_import = snapshot()

    import apache_beam as beam
    from kvldp.runtime.jobs import make_pipeline
    p = make_pipeline([])
    runner_kind = type(p.runner).__name__
    (p | beam.Create(range(10)) | beam.Map(lambda x, s: x + s, beam.pvalue.AsSingleton(p | "S" >> beam.Create([1])))
       | beam.CombineGlobally(sum))
    p.run().wait_until_finish()
    after_job = snapshot()

    from apache_beam.coders import typecoders
    kvldp_coders = sorted(repr(k) for k in typecoders.registry._coders
                          if getattr(k, "__module__", "").startswith("kvldp"))
    print(json.dumps({"before": before, "after_import": after_import, "after_job": after_job,
                      "runner": runner_kind, "kvldp_coders": kvldp_coders}))
""")


def _python(code: str, *args, env=None) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], check=False, capture_output=True, text=True, timeout=300,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _changed(before: dict, after: dict, allowed=lambda key: False) -> list:
    return sorted(k for k in before if k in after and before[k] != after[k] and not allowed(k))


@pytest.fixture(scope="module")
def states():
    listed = _python(MODULES)
    assert len(listed["kvldp"]) > 100 and "apache_beam.runners.worker.bundle_processor" in listed["beam"]
    return _python(SNAPSHOT, json.dumps(listed))


def test_importing_every_kvldp_module_leaves_beams_functions_as_beams(states):
    changed = _changed(states["before"]["beam"], states["after_import"]["beam"])
    assert not changed, f"kvldp's import replaced Beam's: {changed[:20]}"


def test_importing_kvldp_leaves_logging_gc_and_the_process_as_they_were(states):
    before, after = states["before"], states["after_import"]
    assert _changed(before["logging"], after["logging"]) == []
    new_loggers = sorted(set(after["logging"]) - set(before["logging"]))
    assert all(name == "kvldp" or name.startswith("kvldp.") for name in new_loggers), new_loggers
    for name in new_loggers:            # kvldp's own loggers: created, never configured on import
        level, handlers, filters, propagate, disabled = after["logging"][name]
        assert (level, handlers, filters, propagate, disabled) == (0, [], [], True, False), name
    for part in ("gc", "sys", "warnings", "signals", "environ", "copyreg", "heap_calls"):
        assert before["process"][part] == after["process"][part], part
    assert after["process"]["heap_calls"] == []


def test_kvldp_registers_coders_for_its_own_types_only(states):
    before, after = states["before"]["process"]["coders"], states["after_import"]["process"]["coders"]
    assert all(before[k] == after[k] for k in before), "a coder Beam had was replaced"
    added = set(after) - set(before)
    assert added and set(states["kvldp_coders"]) == added, sorted(added - set(states["kvldp_coders"]))


def test_a_tuned_local_job_puts_back_everything_it_replaced(states):
    assert states["runner"] == "LocalRunner"
    before, after = states["after_import"]["beam"], states["after_job"]["beam"]
    changed = _changed(before, after, allowed=lambda key: not (before[key][1] or after[key][1]))
    assert not changed, f"a local job left Beam's replaced: {changed[:20]}"


def test_stock_means_beams_own_runner_and_nothing_applied(monkeypatch):
    monkeypatch.setenv(tweaks.STOCK_ENV, "1")
    assert tweaks.active() == frozenset() and tweaks.stock_reason() == f"{tweaks.STOCK_ENV}=1"
    monkeypatch.setenv(tweaks.STOCK_ENV, "0")
    assert tweaks.active()
    monkeypatch.delenv(tweaks.STOCK_ENV)
    monkeypatch.setenv(tweaks.SELECT_ENV, "gc_freeze,not_a_tweak")
    with pytest.raises(ValueError, match="not_a_tweak"):
        tweaks.active()


def test_every_tweak_names_what_it_replaces_and_where_it_was_tested():
    for tweak in tweaks.TWEAKS:
        assert tweak.replaces and tweak.gain and "GAIN" not in tweak.gain, tweak.name
        assert set(tweak.tested) <= set(tweaks.TESTED_BEAM)
    assert tweaks.beam_version() in tweaks.TESTED_BEAM or tweaks.stock_reason() is not None


def _estimates(tmp_path, mechanism: str, stock: bool, monkeypatch) -> bytes:
    from kvldp.cli import commands as cli
    if stock:
        monkeypatch.setenv(tweaks.STOCK_ENV, "1")
    else:
        monkeypatch.delenv(tweaks.STOCK_ENV, raising=False)
    out = tmp_path / f"{mechanism}-{'stock' if stock else 'tuned'}.jsonl"
    code = cli.main(["simulate", "--mechanism", mechanism, "--epsilon", "2", "--users", "3000", "--keys", "8",
                     "--dataset", "synthetic-multi", "--seed", "7", "--postprocess", "raw", "--output", str(out),
                     *(["--ioh-top", "3"] if mechanism.startswith("ioh") else [])])
    assert code == 0
    return out.read_bytes()


@pytest.mark.parametrize("mechanism", registry.names())
def test_tuned_and_stock_jobs_give_identical_estimates(mechanism, tmp_path, monkeypatch, capsys):
    tuned = _estimates(tmp_path, mechanism, False, monkeypatch)
    stock = _estimates(tmp_path, mechanism, True, monkeypatch)
    assert tuned == stock and len(tuned) > 100
