"""The mechanism a job runs: ``MechanismConfig`` (the registered name, the
budget, the options given, IOH's chosen keys, the longitudinal mode), built
once from the command line's flags (``kvldp.cli.mechanism_args``) or from
Python, and IOH's keys resolved against the data."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from kvldp.datasets import Dataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import validated_domain
from kvldp.mechanisms.kv.longitudinal import SUPPORTED, LongitudinalOptions, longitudinal
from kvldp.mechanisms.params import AUTO
from kvldp.mechanisms.privacy.accountant import LongitudinalBudget, exact
from kvldp.pipelines.sources import DataConfig, key_frequencies

AUTO_PADDING = AUTO


# Options that also serve the job when the mechanism does not take them:
# --top sets the accuracy summary's top-t set, --coverage the choice of
# --padding auto. They are passed to a mechanism only if it declares them.
JOB_ROLES = ("top", "coverage")


@dataclasses.dataclass(frozen=True)
class MechanismConfig:
    """The mechanism a job runs, as the command line chose it: the registered
    ``name``, the total budget ``epsilon``, the option flags given
    (``options``: field name -> parsed value, only those given; ``padding``
    may still be ``auto``), IOH's keys by name (``ioh_keys``) or by rank
    (``ioh_top``). The typed ``Options`` need what only the job learns (the
    resolved padding, IOH's keys as indices): ``typed``/``make`` take them."""

    name: str
    epsilon: float
    options: dict = dataclasses.field(default_factory=dict)
    ioh_keys: tuple[str, ...] | None = None
    ioh_top: int | None = None
    longitudinal: LongitudinalOptions | None = None      # the two-layer / memoised mode

    def __post_init__(self):
        registry.factory(self.name)                        # an unknown name fails here, with the choices
        validated_domain(1, self.epsilon)                  # a bad budget too, before any pre-pass reads data
        if self.longitudinal is not None:
            lon = self.longitudinal
            if self.name not in SUPPORTED:
                raise ValueError(f"--longitudinal is implemented for {', '.join(SUPPORTED)}, not {self.name}")
            if lon.eps_inf is not None and exact(lon.eps_inf) != exact(self.epsilon):
                raise ValueError(f"--eps-inf {lon.eps_inf:g} differs from --epsilon {self.epsilon:g}: in the "
                                 "longitudinal mode --epsilon is eps_inf, the budget of any number of reports "
                                 "of one state")
            LongitudinalBudget(self.epsilon, lon.eps_1)
        unknown = set(self.options) - set(registry.option_names())
        if unknown:
            raise ValueError(f"no mechanism option {sorted(unknown)}")
        object.__setattr__(self, "options", {k: v for k, v in self.options.items() if v is not None})
        if self.ioh_keys is not None:
            object.__setattr__(self, "ioh_keys", tuple(self.ioh_keys))

    @classmethod
    def from_args(cls, args, name: str | None = None, epsilon: float | None = None) -> MechanismConfig:
        """The flags of ``add_mechanism_args`` (a sweep passes each cell's
        ``name`` and ``epsilon``, see ``for_cell``)."""
        options = {option: getattr(args, option, None) for option in registry.option_names() if option != "ioh_keys"}
        names = getattr(args, "ioh_keys", None)
        # the longitudinal mode: none given, or --longitudinal=false, is the plain mechanism
        given = {f: getattr(args, f, None) for f in LongitudinalOptions.field_names()}
        given = {f: v for f, v in given.items() if v is not None}
        lon = LongitudinalOptions(**given) if given else None
        return cls(name or args.mechanism, args.epsilon if epsilon is None else epsilon, options,
                   tuple(k.strip() for k in names.split(",") if k.strip()) if names else None,
                   getattr(args, "ioh_top", None), lon if lon is not None and lon.longitudinal else None)

    @property
    def declared(self) -> set[str]:
        return set(registry.options_of(self.name))

    def takes(self, option: str) -> bool:
        return option in self.declared

    def get(self, option: str):
        """The value given for ``option`` (``None``: not given)."""
        return self.options.get(option)

    def for_cell(self, name: str, epsilon: float, **job_options) -> MechanismConfig:
        """This configuration for another mechanism of a sweep: the options
        ``name`` declares (and the job's ``JOB_ROLES``) are kept, the others
        cleared, so one sweep can mix mechanisms; ``job_options`` override."""
        keep = set(registry.options_of(name)) | set(JOB_ROLES)
        options = {k: v for k, v in {**self.options, **job_options}.items() if k in keep}
        ioh = "ioh_keys" in keep
        return MechanismConfig(name, epsilon, options, self.ioh_keys if ioh else None, self.ioh_top if ioh else None)

    def typed(self, ioh_keys: Sequence[int] | None = None, padding: int | None = None,
              kept_share: float | None = None):
        """The typed options of the mechanism.

        ``ioh_keys``: IOH's chosen keys as dictionary indices;
        ``padding``: the resolved padding length, overriding ``--padding``
        (``pipelines.padding.resolve_padding`` turns ``auto`` into a number
        on the ingest side; a job that has not resolved ``auto`` gets a clear
        error); ``kept_share``: the share of the pairs' mass the sampling
        keeps, measured by the ingest side or read from the reports, unless
        ``--kept-share`` gives it. Every other option given that the
        mechanism does not declare is an error."""
        declared = self.declared
        given = {k: v for k, v in self.options.items() if k in declared or k not in JOB_ROLES}
        given["ioh_keys"] = ioh_keys
        if padding is not None:
            given["padding"] = padding
        if kept_share is not None and "kept_share" in declared and given.get("kept_share") is None:
            given["kept_share"] = kept_share
        if given.get("padding") == AUTO and "padding" in declared:
            raise ValueError("--padding auto is chosen from the raw data by the ingest side (simulate, perturb); "
                             "this job cannot see the data: give l explicitly (collect: the reports' padding)")
        return registry.options(self.name, **given)

    def make(self, d: int, dataset: Dataset | None = None, ioh_keys: Sequence[int] | None = None,
             padding: int | None = None, kept_share: float | None = None):
        """The registered mechanism with its typed options (the dataset's
        padding by default; ``kept_share``: see ``typed``)."""
        if padding is None and self.get("padding") is None and self.takes("padding"):
            padding = dataset.default_padding if dataset is not None else 1
        base = registry.make(self.name, d, self.epsilon, self.typed(ioh_keys, padding, kept_share))
        if self.longitudinal is None:
            return base
        return longitudinal(base, self.longitudinal.eps_1, second_layer=self.longitudinal.second_layer)

    def takes_ioh_keys(self) -> bool:
        return self.takes("ioh_keys")


def named_keys(wanted: Sequence[str], key_names: Sequence[str]) -> list[int]:
    """Key names -> their indices in the dictionary ``key_names``."""
    index = {k: i for i, k in enumerate(key_names)}
    unknown = [k for k in wanted if k not in index]
    if unknown:
        raise ValueError(f"IOH keys {unknown} are not in the key dictionary")
    return [index[k] for k in wanted]


def resolve_ioh_keys(mechanism: MechanismConfig, data: DataConfig, beam_args, key_names,
                     dataset: Dataset | None, dictionary) -> list[int] | None:
    """IOH's chosen keys: ``--ioh-keys`` by name, else the ``--ioh-top`` most
    frequent ones (counted on the ingest side, over ``data``); ``None`` for
    other mechanisms (which reject the flags)."""
    if not mechanism.takes_ioh_keys():
        if mechanism.ioh_keys or mechanism.ioh_top:
            raise ValueError(f"{mechanism.name} does not take --ioh-keys/--ioh-top")
        return None
    if mechanism.ioh_keys:
        return named_keys(mechanism.ioh_keys, key_names)
    top = mechanism.ioh_top or min(5, len(key_names))
    freq = key_frequencies(data, beam_args, dataset, dictionary)
    return [int(k) for k in np.argsort(-freq, kind="stable")[:top]]
