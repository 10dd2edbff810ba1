"""Longitudinal (two-layer) mode of PCKV-UE, PCKV-GRR, KS-UE and KVUE.

A report is drawn in two layers (RAPPOR, Erlingsson et al. CCS 2014 §3.1;
L-GRR / L-OSUE, Arcolezi et al. 2021 §3-4):

1. **permanent** (``eps_inf``): the base mechanism at ``eps_inf`` -- its
   padding-and-sampling (or KVUE's key sample), ``Disc(v)`` and randomiser --
   drawn from the device's memoised uniforms (memo.py, permanent.py), so an
   unchanged state gives the same permanent report in every collection and any
   number ``T`` of reports of it reveal at most ``eps_inf``;
2. **instantaneous** (``eps_1 <= eps_inf``, fresh per collection): a mixture
   with a data-independent distribution (layers.py) solved so that one report
   loses at most ``eps_1``, and repeated reports are not equal.

``eps_1`` omitted (or ``= eps_inf``) is the **memoised single layer**: the
instantaneous layer keeps everything (``t = 1``).

The sampled key is part of the permanent layer: a fresh key per collection
would, over ``T`` collections, show the collector ``T`` samples of the key
set, a leak that no per-report ``eps`` accounts for. With it memoised, the
joint distribution of any number of reports of one state is a post-processing
of one permanent report (the exact audits enumerate ``T <= 4`` reports).

Estimation: one collection's reports are independent draws of the composed
channel (devices have independent secrets), which is the base mechanism's
channel with composed parameters, so the base estimator applies unchanged:

* PCKV-GRR, PCKV-UE, KS-UE: ``(a_c, b_c, p_c)`` of layers.py; exact
  ``Var f = l^2 [f pi (1 - pi) + (1 - f) b_c (1 - b_c)] / (n (a_c - b_c)^2)``,
  ``pi = a_c/l + b_c (1 - 1/l)`` (holders with ``|S| <= l``);
* KVUE: the composed state channel is GRR with ``p_c = e^eps_1/(e^eps_1+2)``,
  i.e. KVUE at ``eps_1``; given the ``M`` users who sampled a key,
  ``Var(f | M) = 4 [f q(1-q) + (1-f) p(1-p)]/(M (3p-1)^2) + f(1-f)(1/M - 1/n)``
  (``q = (1-p)/2``; the last term: which users sampled the key), and
  ``E[1/M] = (d/n)(1 + (d-1)/n)`` to second order for ``M ~ Bin(n, 1/d)``.

Means: the base estimators' ratio means with delta-method standard errors.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping

import numpy as np

from kvldp.mechanisms.base import Estimates, ReportBatch, UserBatch
from kvldp.mechanisms.kv import layers
from kvldp.mechanisms.kv.pckv import _PCKV, PCKVGRR, PCKVUE
from kvldp.mechanisms.kv.permanent import (
    instant_grr_pairs,
    instant_states,
    instant_ue,
    permanent_grr_pairs,
    permanent_states,
    permanent_ue,
)
from kvldp.mechanisms.kv.sun import KVUE
from kvldp.mechanisms.params import Options, option
from kvldp.mechanisms.privacy.accountant import LongitudinalBudget, Share
from kvldp.mechanisms.privacy.memo import DeviceKeys, config_digest
from kvldp.mechanisms.privacy.randomness import collection_generator
from kvldp.mechanisms.protocol import Mechanism, Protocol

SUPPORTED = ("pckv-ue", "pckv-grr", "ks-ue", "kvue")


def boolean(text) -> bool:
    """``true``/``false`` (also ``1``/``0``, ``yes``/``no``), for flags a
    template launcher passes as ``--name=value``."""
    value = str(text).strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ValueError(f"must be true or false, got {text!r}")


boolean.pattern = "^(true|false|1|0|yes|no)$"


@dataclasses.dataclass(frozen=True)
class LongitudinalOptions(Options):
    """The longitudinal mode of a job (``--longitudinal --eps-inf A --eps-1 B``)."""

    longitudinal: bool = option(False, f"repeated collections: memoised permanent reports (eps_inf over any number "
                                f"of reports of an unchanged state) and, with --eps-1, an instantaneous layer "
                                f"per report; for {', '.join(SUPPORTED)}", parse=boolean)
    eps_inf: float | None = option(None, "longitudinal: the budget of any number of reports of one state "
                                   "(default and must equal --epsilon)", low=0.0, low_open=True, parse=float)
    eps_1: float | None = option(None, "longitudinal: the budget of one report, <= eps_inf (default: eps_inf, "
                                 "the memoised single layer)", low=0.0, low_open=True, parse=float)
    second_layer: str = option(layers.SYMMETRIC, "longitudinal PCKV-UE/KS-UE: the instantaneous layer redraws a "
                               "position from the uniform ternary distribution (symmetric, the lower variance) "
                               "or from the permanent layer's background (sparse: reports as sparse as the "
                               "permanent ones, for very large domains)", choices=layers.SECOND_LAYERS, parse=str)

    def __post_init__(self):
        super().__post_init__()
        if not self.longitudinal and (self.eps_inf is not None or self.eps_1 is not None
                                      or self.second_layer != layers.SYMMETRIC):
            raise ValueError("--eps-inf, --eps-1 and --second-layer need --longitudinal")


class Longitudinal(Mechanism):
    """The two-layer mode of a base mechanism built at ``eps_inf``.

    ``keys`` (perturbing side only): the device secrets' derivation
    (memo.DeviceKeys); the collector builds the mechanism without them.
    ``collection``: the public id of this collection, which keys the
    instantaneous layer's noise."""

    permanent: Mechanism
    t: float

    def __init__(self, permanent: Mechanism, eps_1: float | None = None, keys: DeviceKeys | None = None,
                 collection: str = ""):
        self.permanent = permanent
        self.pair = LongitudinalBudget(permanent.epsilon, None if eps_1 is None else float(eps_1))
        self.eps_inf, self.eps_1 = self.pair.eps_inf, self.pair.eps_1
        super().__init__(permanent.d, self.eps_inf)
        self.name = permanent.name
        self.options_type = permanent.options_type
        self.keys, self.collection = keys, str(collection)
        self.cfg = config_digest({**permanent.config(), "layer": "permanent"})
        self.t = self.solve_mixing()
        self.composed = self.composed_mechanism()

    # -- the channel ----------------------------------------------------------
    def solve_mixing(self) -> float:
        """The instantaneous layer's keep probability ``t`` (layers.py)."""
        raise NotImplementedError

    def composed_mechanism(self) -> Mechanism:
        """The base mechanism whose channel equals one two-layer report's."""
        raise NotImplementedError

    def budget_shares(self) -> list[Share]:
        """Any number of reports of one state: ``eps_inf`` (one report: ``eps_1``)."""
        return [Share(0, "permanent", self.eps_inf)]

    def longitudinal_budget(self) -> LongitudinalBudget:
        return self.pair

    def config(self, round_index: int | None = None) -> Mapping:
        return {**self.permanent.config(), "longitudinal": True, "eps_inf": self.eps_inf, "eps_1": self.eps_1}

    def with_keys(self, keys: DeviceKeys, collection: str = "") -> Longitudinal:
        """This mechanism on the perturbing side: device keys and the collection."""
        out = copy.copy(self)
        out.keys, out.collection = keys, str(collection)
        return out

    @property
    def report_domain(self) -> int:
        return self.permanent.report_domain

    # -- client -----------------------------------------------------------------
    def permanent_reports(self, users: UserBatch) -> ReportBatch:
        """Every user's memoised permanent report (a function of its device
        secret, state and this configuration only)."""
        if self.keys is None:
            raise ValueError("the longitudinal mode perturbs with the devices' secrets: this mechanism was built "
                             "without them (collector side)")
        return self.draw_permanent(users, self.keys.streams(users, self.cfg))

    def state_fingerprints(self, users: UserBatch) -> np.ndarray:
        """``fp_u(S_u)`` per user (memo.py): the ledger's record of a state."""
        return self.keys.streams(users, self.cfg).fingerprints()

    def perturb(self, users: UserBatch, rng: np.random.Generator) -> ReportBatch:
        perm = self.permanent_reports(users)
        if self.t >= 1.0:
            return perm
        return self.draw_instant(perm, collection_generator(rng, self.collection))

    def draw_permanent(self, users, streams) -> ReportBatch:
        raise NotImplementedError

    def draw_instant(self, reports: ReportBatch, rng: np.random.Generator) -> ReportBatch:
        raise NotImplementedError

    # -- collector ----------------------------------------------------------------
    @property
    def counts_size(self) -> int:
        return self.composed.counts_size

    def accumulate(self, counts: np.ndarray, reports: ReportBatch) -> np.ndarray:
        return self.composed.accumulate(counts, reports)

    def estimate(self, counts: np.ndarray) -> Estimates:
        return dataclasses.replace(self.composed.estimate(counts), epsilon=self.eps_inf)

    def theoretical_variance(self, n: int, f, m):
        composed = self.composed.theoretical_variance(n, f, m)
        return self.frequency_variance(n, f), None if composed is None else composed[1]

    def frequency_variance(self, n: int, f) -> np.ndarray:
        raise NotImplementedError

    # -- exact distributions (audits; small domains) --------------------------
    def latent_weights(self, pairs) -> np.ndarray:
        """P(the permanent layer's input z) for a user holding ``pairs``."""
        raise NotImplementedError

    def permanent_matrix(self) -> np.ndarray:
        """``Q_1[z, y]``: P(permanent report y | input z)."""
        raise NotImplementedError

    def instant_matrix(self) -> np.ndarray:
        """``Q_2[y*, y]``: P(report y | permanent report y*)."""
        raise NotImplementedError

    def joint_output_probabilities(self, pairs, reports: int) -> np.ndarray:
        """Exact P(y_1, …, y_T) of ``T = reports`` reports of one unchanged
        state, flattened (``y_1`` most significant):
        ``sum_z w(z) sum_y* Q_1[z, y*] prod_t Q_2[y*, y_t]``."""
        Q2 = self.instant_matrix()
        H = Q2
        for _ in range(reports - 1):
            H = (H[:, :, None] * Q2[:, None, :]).reshape(len(Q2), -1)
        return self.latent_weights(pairs) @ (self.permanent_matrix() @ H)

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        return self.joint_output_probabilities(pairs, 1)


class _LongitudinalPCKV(Longitudinal):
    """Shared by the PCKV-shaped bases: composed parameters, exact variance."""

    permanent: _PCKV

    def composed_channel(self) -> layers.Channel:
        raise NotImplementedError

    def composed_mechanism(self) -> _PCKV:
        out = copy.copy(self.permanent)
        out.params = self.composed_channel().params(self.permanent.d, self.permanent.l)
        return out

    def frequency_variance(self, n: int, f) -> np.ndarray:
        P, l = self.composed.params, self.permanent.l
        f = np.asarray(f, dtype=np.float64)
        pi = P.a / l + P.b * (1 - 1 / l)
        return l * l * (f * pi * (1 - pi) + (1 - f) * P.b * (1 - P.b)) / (n * (P.a - P.b) ** 2)

    def latent_weights(self, pairs) -> np.ndarray:
        return self.permanent.sampling_distribution(pairs).ravel()      # z = 2k + (x > 0)


class LongitudinalPCKVGRR(_LongitudinalPCKV):
    """PCKV-GRR + GRR over the ``2 d'`` pairs (L-GRR over pairs)."""

    permanent: PCKVGRR

    def solve_mixing(self) -> float:
        P = self.permanent.params
        return layers.grr_pairs_mixing(layers.of(P), P.l, P.d_prime, self.eps_1, self.eps_inf)

    def composed_channel(self) -> layers.Channel:
        return layers.mix_grr_pairs(layers.of(self.permanent.params), self.t, self.permanent.params.d_prime)

    def draw_permanent(self, users, streams) -> ReportBatch:
        return permanent_grr_pairs(users, self.permanent.params, streams)

    def draw_instant(self, reports, rng) -> ReportBatch:
        return instant_grr_pairs(reports, self.permanent.params.d_prime, self.t, rng)

    def permanent_matrix(self) -> np.ndarray:
        P = self.permanent.params
        outs = self.permanent.all_outputs()              # (key, sign), key-major, sign -1 then +1
        z_key, z_x = np.repeat(np.arange(P.d_prime), 2), np.tile([-1, 1], P.d_prime)
        same_key = outs[None, :, 0] == z_key[:, None]
        kept = np.where(outs[None, :, 1] == z_x[:, None], P.a * P.p, P.a * (1 - P.p))
        return np.where(same_key, kept, P.b / 2)

    def instant_matrix(self) -> np.ndarray:
        width = 2 * self.permanent.params.d_prime
        return self.t * np.eye(width) + (1 - self.t) / width


class LongitudinalUE(_LongitudinalPCKV):
    """PCKV-UE / KS-UE + per-position redraw (layers.py: ``symmetric`` or ``sparse``)."""

    permanent: PCKVUE

    def __init__(self, permanent: PCKVUE, eps_1: float | None = None, keys: DeviceKeys | None = None,
                 collection: str = "", second_layer: str = layers.SYMMETRIC):
        self.rho = layers.ue_redraw(layers.of(permanent.params), second_layer)
        self.second_layer = second_layer
        super().__init__(permanent, eps_1, keys, collection)

    def config(self, round_index: int | None = None) -> Mapping:
        return {**super().config(round_index), "second_layer": self.second_layer}

    def solve_mixing(self) -> float:
        P = self.permanent.params
        return layers.ue_mixing(layers.of(P), P.l, self.rho, self.eps_1, self.eps_inf)

    def composed_channel(self) -> layers.Channel:
        return layers.mix_ue(layers.of(self.permanent.params), self.t, self.rho)

    def draw_permanent(self, users, streams) -> ReportBatch:
        return permanent_ue(users, self.permanent.params, streams)

    def draw_instant(self, reports, rng) -> ReportBatch:
        return instant_ue(reports, self.permanent.params.d_prime, self.t, self.rho, rng)

    def permanent_matrix(self) -> np.ndarray:
        P = self.permanent.params
        ys = self.permanent.all_outputs().astype(np.float64)      # (3^d', d')
        other = np.where(ys == 0, 1 - P.b, P.b / 2)
        prod_other = np.prod(other, axis=1)
        rows = []
        for k in range(P.d_prime):
            for x in (-1, 1):
                own = np.where(ys[:, k] == 0, 1 - P.a, np.where(ys[:, k] == x, P.a * P.p, P.a * (1 - P.p)))
                rows.append(prod_other / other[:, k] * own)
        return np.array(rows)

    def instant_matrix(self) -> np.ndarray:
        # symbols in all_outputs' order (-1, 0, +1); positions independent: a Kronecker power
        bg = np.array([self.rho / 2, 1 - self.rho, self.rho / 2])
        one = self.t * np.eye(3) + (1 - self.t) * bg[None, :]
        out = np.ones((1, 1))
        for _ in range(self.permanent.params.d_prime):
            out = np.kron(out, one)
        return out


class LongitudinalKVUE(Longitudinal):
    """KVUE + GRR over the 3 states: L-GRR on the state of the memoised key."""

    permanent: KVUE

    def solve_mixing(self) -> float:
        return layers.grr_mixing(3, self.eps_1, self.eps_inf)

    def composed_mechanism(self) -> KVUE:
        return KVUE(self.d, self.eps_1)

    def draw_permanent(self, users, streams) -> ReportBatch:
        return permanent_states(users, self.d, self.permanent.p, streams)

    def draw_instant(self, reports, rng) -> ReportBatch:
        return instant_states(reports, self.t, rng)

    def frequency_variance(self, n: int, f) -> np.ndarray:
        p = self.composed.p
        q = (1 - p) / 2
        f = np.asarray(f, dtype=np.float64)
        inv_m = self.d / n * (1 + (self.d - 1) / n)
        per_report = 4 * (f * q * (1 - q) + (1 - f) * p * (1 - p)) / (3 * p - 1) ** 2 + f * (1 - f)
        return inv_m * per_report - f * (1 - f) / n

    def latent_weights(self, pairs) -> np.ndarray:
        held = dict(pairs)
        w = np.zeros((self.d, 3))
        for j in range(self.d):
            if j in held:
                w[j] = [(1 - held[j]) / 2, 0.0, (1 + held[j]) / 2]
            else:
                w[j, 1] = 1.0
        return w.ravel() / self.d                      # z = 3 j + state

    def permanent_matrix(self) -> np.ndarray:
        p, q = self.permanent.p, self.permanent.q
        return np.kron(np.eye(self.d), q + (p - q) * np.eye(3))

    def instant_matrix(self) -> np.ndarray:
        return np.kron(np.eye(self.d), self.t * np.eye(3) + (1 - self.t) / 3)


def longitudinal(permanent: Protocol, eps_1: float | None = None, keys: DeviceKeys | None = None,
                 collection: str = "", second_layer: str = layers.SYMMETRIC) -> Longitudinal:
    """The two-layer mode of ``permanent`` (a base mechanism built at
    ``eps_inf``): PCKV-UE, PCKV-GRR, KS-UE or KVUE."""
    if isinstance(permanent, PCKVUE):                     # KS-UE is one too
        return LongitudinalUE(permanent, eps_1, keys, collection, second_layer)
    if second_layer != layers.SYMMETRIC:
        raise ValueError(f"--second-layer is PCKV-UE's and KS-UE's, not {permanent.name}'s")
    if isinstance(permanent, PCKVGRR):
        return LongitudinalPCKVGRR(permanent, eps_1, keys, collection)
    if isinstance(permanent, KVUE):
        return LongitudinalKVUE(permanent, eps_1, keys, collection)
    raise ValueError(f"the longitudinal mode is implemented for {', '.join(SUPPORTED)}, not {permanent.name}")
