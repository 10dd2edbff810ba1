"""The perturbing side across collections: device secrets for the
longitudinal mode and the privacy ledger (``--ledger --period-budget E
--period 30d``) of ``perturb`` and ``publish``.

Both are secrets or per-user records of the perturbing side: nothing here is
written beside the reports, into their configuration or manifest, or printed
beyond counts.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time

from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, StandardOptions

from kvldp.cli.units import parse_duration
from kvldp.mechanisms.kv.longitudinal import Longitudinal
from kvldp.mechanisms.privacy.memo import DeviceKeys
from kvldp.storage.ledger import LedgerGate, Policy, PrivacyLedger

DEFAULT_PERIOD = "30d"
IN_PROCESS_RUNNERS = (None, "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


@dataclasses.dataclass(frozen=True)
class LedgerConfig:
    """``path`` (``None``: no ledger), ``budget`` (``None``: record only),
    ``period`` in seconds, the collection's time in ms (``None``: now)."""

    path: str | None = None
    budget: float | None = None
    period: float = parse_duration(DEFAULT_PERIOD)
    at_ms: int | None = None

    def __post_init__(self):
        if self.path is None and self.budget is not None:
            raise ValueError("--period-budget needs --ledger (the file that remembers what users spent)")
        if self.period <= 0:
            raise ValueError("--period must be > 0")

    @classmethod
    def from_args(cls, args) -> LedgerConfig:
        return cls(getattr(args, "ledger", None), getattr(args, "period_budget", None),
                   getattr(args, "period", parse_duration(DEFAULT_PERIOD)), getattr(args, "collection_time", None))

    def check_place(self, reports_prefix: str):
        """The ledger must not travel with the reports."""
        if self.path and os.path.dirname(os.path.abspath(self.path)) == os.path.dirname(
                os.path.abspath(reports_prefix)):
            raise ValueError(f"--ledger {self.path} is beside the reports {reports_prefix}-*: the ledger names "
                             "users and when they reported, and must stay on the perturbing side; put it elsewhere")

    def gate(self, mechanism, seed: int, collection: str, beam_args) -> LedgerGate | None:
        if self.path is None:
            return None
        options = PipelineOptions(list(beam_args))
        runner = options.view_as(StandardOptions).runner
        loopback = options.view_as(PortableOptions).environment_type == "LOOPBACK"
        if runner not in IN_PROCESS_RUNNERS and not loopback:
            raise ValueError(f"--ledger is a local file the perturbing workers update: runner {runner} runs them "
                             "elsewhere (use the local runner, or Flink with --environment_type LOOPBACK)")
        at = (self.at_ms if self.at_ms is not None else time.time() * 1000) / 1000.0
        policy = Policy(collection, at, mechanism.epsilon, self.period, self.budget)
        return LedgerGate(self.path, policy, DeviceKeys.from_seed(seed), isinstance(mechanism, Longitudinal))


def needs_stable_ids(mechanism, gate=None) -> bool:
    """Whether a job's users need their stable ids: the longitudinal mode
    derives each device's secret from it, the ledger charges it."""
    return isinstance(mechanism, Longitudinal) or gate is not None


def perturbing_side(mechanism, seed: int, collection: str):
    """The mechanism as the perturbing side runs it: a longitudinal one gets
    the device keys derived from the run seed and the collection id."""
    if isinstance(mechanism, Longitudinal):
        return mechanism.with_keys(DeviceKeys.from_seed(seed), collection)
    return mechanism


def warn_unless_persistent(mechanism, seed_origin: str | None, out=None):
    """The longitudinal mode recognises an unchanged state only under the same
    device secrets, i.e. the same run seed in every collection."""
    if isinstance(mechanism, Longitudinal) and seed_origin in (None, "fresh"):
        print("WARNING: --longitudinal with a fresh run seed: the device secrets are new, so the next collection "
              "cannot recognise unchanged states (each costs eps_inf again); give every collection the same "
              "--seed-file or $KVLDP_SEED", file=out or sys.stderr)


def warn_unless_stable(mechanism, derived_dictionary: bool, padding_auto: bool, out=None):
    """The permanent layer's configuration is part of every memo key (memo.py's
    ``cfg`` and the key indices of ``c(S)``): a key dictionary derived from this
    run's ratings (it grows with new items and renumbers keys) or a padding
    chosen from this run's set sizes can change between collections, and then
    every state is new again (the ledger charges eps_inf again: still sound,
    but the bound over time is gone)."""
    if not isinstance(mechanism, Longitudinal):
        return
    unstable = [what for what, flag in (("the key dictionary is derived from this run's ratings (pass the same "
                                         "--key-dictionary every collection)", derived_dictionary),
                                        ("--padding auto measures this run's set sizes (fix --padding)",
                                         padding_auto)) if flag]
    if unstable:
        print(f"WARNING: --longitudinal recognises an unchanged state only under the same configuration in every "
              f"collection, but {'; '.join(unstable)}: if it changes, every state is new (costs eps_inf again)",
              file=out or sys.stderr)


def print_ledger_summary(gate: LedgerGate | None, out=None) -> dict | None:
    """Who reported and who sat the collection out (never silently)."""
    if gate is None:
        return None
    with PrivacyLedger(gate.path) as ledger:
        summary = ledger.collection_summary(gate.policy.collection)
    policy = gate.policy
    limit = (f"period budget {policy.budget:g} over {policy.period / 86400:g} d" if policy.budget is not None
             else "no period budget")
    repeat = " (a state reported before costs 0)" if gate.memoised else ""
    print(f"ledger: collection {policy.collection}: {summary['reported']} users reported, {summary['sat_out']} "
          f"sat it out ({limit}; they sent nothing); eps charged this collection: "
          f"{summary['epsilon_charged']:.6g}{repeat}", file=out or sys.stdout)
    if summary["sat_out"]:
        print(f"WARNING: {summary['sat_out']} users sat collection {policy.collection} out: reporting would have "
              f"exceeded their {limit}; the estimates are over the {summary['reported']} who reported",
              file=sys.stderr)
    return summary
