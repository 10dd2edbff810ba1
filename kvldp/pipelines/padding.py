"""The padding length on the ingest side: ``--padding auto`` and the
truncation warning (the math is ``mechanisms/frequency/padding.py``).

A padded mechanism (PCKV-UE, PCKV-GRR, KS-UE) under-counts every user with
more than ``l`` pairs: each of their pairs is reported w.p. ``1/|S|`` and the
estimator scales by ``l``, so their keys' frequencies come out scaled by
``l/|S|``. Only a job that holds the raw data can see the set sizes: the
ingest side (``simulate``, ``perturb``). The collector never can, and takes
``l`` from the reports' configuration.

* ``--padding auto``, also the default (issue 43: a fixed default of
  ``l = 1`` counted each of MovieLens' users once, a 100-fold
  underestimate of the pairs' mass): the ingest side measures the set-size histogram and
  picks the smallest ``l`` covering ``--coverage`` (0.9) of the users
  (KSKV §4.3's rule, ``choose_padding``). The chosen ``l`` is a
  data-dependent public parameter: it is written into every report's
  configuration and computed from raw data *outside* the epsilon guarantee,
  which covers the reports given ``l`` (the run prints so). To keep ``l``
  out of the data, give it (``--padding l``); to estimate it under LDP,
  spend a budget share on the sizes as KS-Adap does.
* An explicit (or defaulted) ``l`` that truncates more than ``1 - coverage``
  of the users prints ``WARNING:`` on stderr with the truncated share and
  the ``l`` that ``kvldp advise`` / ``auto`` would choose.

Where the histogram comes from (each source read at most once extra):

* clothing, movielens-100k (loaded in memory): from the loaded users, free;
  an explicit ``l`` is checked before the run.
* synthetic-*: ``auto`` generates the batches in this process before the
  run (uu/gg: milliseconds; multi: ~10 s per 10^6 users); an explicit ``l``
  is checked in the main job and warned about after the run.
* a ratings file without ``--key-dictionary``: the pre-pass that derives the
  dictionary measures the sizes too, at no extra cost (``sources.
  derive_dictionary_and_sizes``); both ``auto`` and an explicit ``l`` are
  settled before the run.
* a ratings file with ``--key-dictionary``: ``auto`` runs one pre-pass over
  the files; an explicit ``l`` is checked in the main job and warned about
  after the run (no extra pass for the common case).

"In the main job" is a ``CombineGlobally`` of one ``np.bincount`` per user
batch written to a scratch file (``sources.write_size_histogram``).
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

import apache_beam as beam
import numpy as np

from kvldp.datasets import Dataset, InMemoryDataset
from kvldp.mechanisms.frequency.padding import (
    DEFAULT_COVERAGE,
    PaddingCheck,
    check_padding,
    choose_padding,
    kept_share,
    merge_histograms,
    size_histogram,
)
from kvldp.mechanisms.params import AUTO
from kvldp.pipelines import sources
from kvldp.pipelines.mechanism_config import MechanismConfig
from kvldp.pipelines.sources import DataConfig
from kvldp.runtime import jobs as runner


def parse_set_sizes(text: str) -> np.ndarray:
    """``"1:500,2:300,3:200"`` (size:users, sizes >= 0) -> histogram."""
    hist: dict[int, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            size, users = (int(x) for x in part.split(":"))
        except ValueError:
            raise ValueError(f"--set-sizes takes 'size:users,…' (e.g. 1:500,2:300), got {part!r}") from None
        if size < 0 or users < 0:
            raise ValueError(f"--set-sizes needs sizes and counts >= 0, got {part!r}")
        if size in hist:
            raise ValueError(f"--set-sizes names size {size} twice")
        hist[size] = users
    if not hist or sum(hist.values()) == 0:
        raise ValueError("--set-sizes names no users")
    out = np.zeros(max(hist) + 1, dtype=np.int64)
    for size, users in hist.items():
        out[size] = users
    return out


def data_set_sizes(data: DataConfig, beam_args: Sequence[str], dataset: Dataset | None,
                   dictionary: Sequence[str] | None) -> np.ndarray:
    """The set-size histogram of the users the job will perturb (ingest side:
    it reads raw data). Built-in datasets in this process; ratings files by
    a pre-pass job with ``dictionary``."""
    if dataset is not None:
        if isinstance(dataset, InMemoryDataset):
            return size_histogram(dataset.users)
        return merge_histograms(size_histogram(b) for b in dataset.batches(data.histogram_batch))
    return sources.users_prepass(data, beam_args, dictionary, size_histogram, "SetSizes")


def describe_sizes(hist: np.ndarray) -> str:
    n = int(hist.sum())
    sizes = np.arange(len(hist))
    mean = float((hist * sizes).sum() / n) if n else 0.0
    return f"{n:,} users, {mean:.2f} pairs each on average, at most {int(np.flatnonzero(hist)[-1]) if n else 0}"


_WARNED: set[str] = set()


def warn_truncation(check: PaddingCheck, out=None) -> str:
    """Print (stderr) and return the warning for a padding that truncates
    more than ``1 - coverage`` of the users: once per process for the same
    text (an evaluate worker runs the same data's cells again and again)."""
    out = out or sys.stderr
    capped = check.suggested <= check.l
    text = (f"WARNING: padding l = {check.l} truncates {check.truncated_users:,} of {check.n_users:,} users "
            f"({check.truncated_fraction:.2%}) who hold more than {check.l} pair{'s' if check.l > 1 else ''}: "
            f"each of their pairs is reported w.p. 1/|S| and scaled by l, so their keys' frequencies come out "
            f"times l/|S| (too low); {check.lost_pair_fraction:.2%} of all pairs' frequency mass is lost. ")
    if capped:
        text += (f"The coverage rule stops at its cap, l = {check.suggested} (sizes reach {check.largest_size}; "
                 f"a larger l drowns every pair in dummies): expect this bias, or use a mechanism that samples "
                 f"a key uniformly (privkv, kvue, f2m, …), which does not truncate.")
    else:
        text += (f"kvldp advise would choose l = {check.suggested} (covers {check.suggested_covers:.2%} of the "
                 f"users, coverage {check.coverage:g}): rerun with --padding {check.suggested} or --padding auto.")
    if text not in _WARNED:
        _WARNED.add(text)
        print(text, file=out)
    return text


@dataclasses.dataclass
class PaddingPlan:
    """The padding of one ingest job: ``l`` (``None``: the mechanism takes
    none), how it was set, and the set sizes when known before the run."""

    l: int | None
    auto: bool = False
    coverage: float = DEFAULT_COVERAGE
    histogram: np.ndarray | None = None
    pending: str | None = None          # scratch .npy of the main job's histogram
    check: PaddingCheck | None = None
    warning: str | None = None
    kept_share: float | None = None     # written into the reports when the sizes are known before the run

    def attach(self, users: beam.PCollection, beam_args: Sequence[str]):
        """Measure the set sizes in the main job when they are not known yet."""
        if self.l is not None and self.histogram is None:
            self.pending = runner.scratch_path(beam_args, "set_sizes.npy")
            sources.write_size_histogram(users, self.pending)

    def after_run(self):
        """Read the main job's histogram and warn if ``l`` truncated too many."""
        if self.pending is not None and self.histogram is None:
            self.histogram = runner.read_array(self.pending)
            self.inspect()

    def inspect(self):
        self.check = check_padding(self.histogram, self.l, self.coverage)
        if self.check.too_small:
            self.warning = warn_truncation(self.check)

    def summary(self) -> dict | None:
        if self.l is None and self.kept_share is None:
            return None
        out = {"padding": self.l, "auto": self.auto, "coverage": self.coverage, "kept_share": self.kept_share}
        if self.check is not None:
            out.update(dataclasses.asdict(self.check), warned=self.warning is not None)
        return out


def resolve_padding(mechanism: MechanismConfig, data: DataConfig, beam_args: Sequence[str],
                    dataset: Dataset | None, dictionary: Sequence[str] | None,
                    set_sizes: np.ndarray | None = None, out=None) -> PaddingPlan:
    """The ingest side's padding: ``--padding auto`` chosen from the data's
    set sizes (printed with the reason), else the given or the dataset's
    default ``l``, checked against the set sizes when they are known
    (``set_sizes``: a histogram a pre-pass already measured).

    Call ``plan.attach(users, beam_args)`` while building the main job and
    ``plan.after_run()`` after it, so that an unchecked ``l`` is checked
    there; pass ``plan.l`` to ``mechanism.make(…, padding=plan.l)``.
    For a mechanism without padding the plan is empty and ``--padding`` is
    left for ``mechanism.make`` to reject."""
    out = out or sys.stdout
    if not mechanism.takes("padding"):
        return one_pair_plan(mechanism, data, beam_args, dataset, dictionary, set_sizes, out)
    coverage = DEFAULT_COVERAGE if mechanism.get("coverage") is None else float(mechanism.get("coverage"))
    if not 0 < coverage <= 1:
        raise ValueError(f"--coverage must be in (0, 1], got {coverage}")
    if mechanism.get("padding") in (AUTO, None):      # auto by default: the ingest side sees the set sizes
        hist = set_sizes if set_sizes is not None else data_set_sizes(data, beam_args, dataset, dictionary)
        plan = PaddingPlan(choose_padding(hist, coverage), True, coverage, hist)
        check = check_padding(hist, plan.l, coverage)
        rest = (f"; the other {check.truncated_fraction:.2%} are truncated, {check.lost_pair_fraction:.2%} of "
                f"the pairs' mass lost" if check.truncated_users else "")
        why = (f"the smallest l with at least {coverage:.0%} of the users holding <= l pairs "
               f"({check.suggested_covers:.2%} do{rest}" if not check.too_small else
               f"the cap: only {check.suggested_covers:.2%} of the users hold <= {plan.l} pairs "
               f"(the rule wants {coverage:.0%}")
        how = "--padding auto" if mechanism.get("padding") == AUTO else "the default padding (auto)"
        print(f"padding: {how} chose l = {plan.l}, {why}; {describe_sizes(hist)}). l is computed from "
              f"the raw data by the ingest side: a public parameter outside the epsilon guarantee (give --padding l "
              f"to fix it instead).", file=out)
        plan.inspect()                   # warns only when the cap keeps l below the coverage
        return with_kept_share(plan, mechanism, out)
    l = mechanism.get("padding")
    hist = set_sizes
    if hist is None and isinstance(dataset, InMemoryDataset):
        hist = size_histogram(dataset.users)
    plan = PaddingPlan(int(l), False, coverage, hist)
    if hist is not None:
        plan.inspect()
    return with_kept_share(plan, mechanism, out)


def with_kept_share(plan: PaddingPlan, mechanism: MechanismConfig, out) -> PaddingPlan:
    """``plan`` with the truncation correction's kept share when the set
    sizes are known before the run (``--kept-share`` given: as given)."""
    if plan.histogram is None or not mechanism.takes("kept_share") or mechanism.get("kept_share") is not None:
        return plan
    plan.kept_share = kept_share(plan.histogram, plan.l)
    if plan.kept_share < 1:
        print(f"padding: l = {plan.l} keeps {plan.kept_share:.2%} of the pairs' frequency mass; the collector divides "
              f"the frequencies by that share (status 'truncated'), a public parameter from the same set sizes.",
              file=out)
    return plan


def one_pair_plan(mechanism: MechanismConfig, data: DataConfig, beam_args: Sequence[str], dataset: Dataset | None,
                  dictionary: Sequence[str] | None, set_sizes: np.ndarray | None, out) -> PaddingPlan:
    """KS-GRR's users report one sampled pair each (padding ``l = 1``
    without dummies): the share of the mass that keeps, from the set sizes
    (one pre-pass for a ratings file with a dictionary)."""
    if not mechanism.takes("kept_share") or mechanism.get("kept_share") is not None:
        return PaddingPlan(None)
    hist = set_sizes if set_sizes is not None else data_set_sizes(data, beam_args, dataset, dictionary)
    plan = PaddingPlan(None, histogram=hist, kept_share=kept_share(hist, 1))
    if plan.kept_share < 1:
        print(f"one pair per user: {mechanism.name}'s users report one of their pairs, {plan.kept_share:.2%} of "
              f"the pairs' frequency mass ({describe_sizes(hist)}); the collector divides the frequencies by "
              f"that share (status 'truncated'), a public parameter computed from the raw set sizes outside the "
              f"epsilon guarantee (--kept-share 1 to keep the paper's estimate).", file=out)
    return plan


def kept_share_from_reports(mechanism: MechanismConfig, config: dict) -> float | None:
    """The collector's kept share: the reports' (``None`` when they name
    none, or ``--kept-share`` restates it)."""
    if not mechanism.takes("kept_share") or mechanism.get("kept_share") is not None:
        return None
    found = config.get("kept_share")
    return None if found is None else float(found)


def padding_from_reports(mechanism: MechanismConfig, reports: str, config: dict) -> int | None:
    """The collector's padding: with ``--padding auto`` or none given, the
    ``l`` the perturbing side chose, read from ``config``, the
    configuration stored with the report files ``reports`` (as IOH's keys
    are); ``None`` otherwise, which leaves ``--padding`` as given (reports
    naming no padding and no ``--padding``: ``mechanism.make``'s default,
    1)."""
    given = mechanism.get("padding")
    if given not in (AUTO, None) or not mechanism.takes("padding"):
        return None
    found = config.get("padding")
    if found is None:
        if given == AUTO:
            raise ValueError(f"--padding auto: the reports {reports} name no padding; give --padding l")
        return None
    return int(found)
