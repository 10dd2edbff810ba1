"""F2M, KVUE and KVOH: Sun et al. 2019 §IV (``shared/papers/sun2019-…``),
KVUE = "state encoding" of Sun et al. 2021 (``…zh.txt``); SPEC.md §2.

All three sample one key ``j`` uniformly per user (as PrivKV) and report a
small symbol about the user's canonical pair for ``j``. With ``M`` reports
for a key, each mechanism estimates the state counts ``N_0`` (``<1,-1>``),
``N_1`` (``<0,0>``) and ``N_2`` (``<1,+1>``) among those ``M`` users; then
``f = (N_2 + N_0)/M`` and ``m = (N_2 - N_0)/(N_2 + N_0)`` (**erratum**: the
paper's ``N_A - N_B`` has the sign backwards).

* **F2M** (Alg. 3): key bit by RR with ``eps1``, value bit ``VPP(v, eps2)``
  if the user holds ``j`` else ``VPP(v_default, eps2)``; ``eps1 = eps2 = eps/2``
  (**choice**: the paper leaves the split to the caller).
  ``f = (f' - (1-p1))/(2p1 - 1)``, ``m_all = (M+ - M-)/(M (2p2 - 1))`` over
  all value bits (**erratum**: the paper writes ``eps`` for ``eps2``),
  ``m = (m_all - (1 - f) v_default)/f``. Symbol ``±(1 + key bit)``.
* **KVUE**: GRR over the 3 states, ``p = e^eps/(e^eps + 2)``;
  ``N_s = (2 M_s - (1-p) M)/(3p - 1)``, exact
  ``Var N_s = 4[N_s p(1-p) + (M - N_s) q(1-q)]/(3p-1)^2``, ``q = (1-p)/2``.
  Symbol ``state - 1``.
* **KVOH**: one-hot of the state in 3 bits, each by RR with ``eps/2``;
  ``N_s = ((e^(eps/2)+1) M_s - M)/(e^(eps/2) - 1)``,
  ``Var N_s = M e^(eps/2)/(e^(eps/2) - 1)^2`` (exact: the UE is symmetric).
  Symbol: the 3-bit mask.

Post-processing: state counts clipped into ``[0, M]`` (PrivKV's clipping),
ratios into ``[0, 1]`` / ``[-1, 1]``; the raw values are reported too (the
ratio means are heavy-tailed when few users hold a key). Standard errors of
``f`` and ``m``: delta method over each key's multinomial of symbols, at the
symbol distribution the mechanism gives for the estimates clipped into
``[0, 1]`` x ``[-1, 1]`` (``symbol_probabilities``): never 0, also where a
symbol was not observed. A key without reports has null estimates; a mean
is null where the estimated frequency is <= 0.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from kvldp.mechanisms.base import Estimates, ReportBatch, UserBatch, with_statuses
from kvldp.mechanisms.estimation.countmodel import CountModel
from kvldp.mechanisms.estimation.variance import mixture_probabilities, multinomial_delta_variance
from kvldp.mechanisms.frequency.sampling import discretise, uniform_key_sampling
from kvldp.mechanisms.frequency.symbols import accumulate_symbols, symbol_stack
from kvldp.mechanisms.kv.privkv import rr_keep
from kvldp.mechanisms.params import Options, option
from kvldp.mechanisms.privacy.accountant import Share
from kvldp.mechanisms.protocol import Mechanism


def states_of(held: np.ndarray, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """State of the canonical pair: ``key_bit * Disc(v) + 1`` in ``{0, 1, 2}``."""
    return np.where(held, discretise(values, rng) + 1, 1).astype(np.int64)


def ratio_estimates(N0, N2, M, clip: bool):
    """``(f, m)`` from the state counts of holders with -1 / +1."""
    if clip:
        N0, N2 = np.clip(N0, 0, M), np.clip(N2, 0, M)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(M > 0, (N2 + N0) / M, 0.0)
        m = np.where(N2 + N0 != 0, (N2 - N0) / (N2 + N0), 0.0)
    return f, m


class _StateMechanism(Mechanism):
    """Shared shape: sampled key ``j``, per-key symbol counts, ratio estimates."""

    symbols: tuple[int, ...]

    @property
    def counts_size(self) -> int:
        return 1 + len(self.symbols) * self.d

    def accumulate(self, counts: np.ndarray, reports: ReportBatch) -> np.ndarray:
        return accumulate_symbols(counts, reports, self.d, self.symbols)

    def stack(self, counts: np.ndarray) -> np.ndarray:
        return symbol_stack(counts, self.d, len(self.symbols))

    def state_counts(self, stack: np.ndarray):
        """Unbiased ``(N_0, N_1, N_2, M)`` per key from the symbol counts."""
        raise NotImplementedError

    def _f(self, stack, clip=False):
        N0, _, N2, M = self.state_counts(stack)
        return ratio_estimates(N0, N2, M, clip)[0]

    def _m(self, stack, clip=False):
        N0, _, N2, M = self.state_counts(stack)
        return ratio_estimates(N0, N2, M, clip)[1]

    def model_probabilities(self, f, m) -> np.ndarray:
        """``(c, d)`` symbol distribution of a key's reports for frequency
        ``f`` and mean ``m`` (clipped into ``[0, 1]``, ``[-1, 1]``)."""
        return mixture_probabilities(f, m, self.symbol_probabilities(2, 0), self.symbol_probabilities(0, 0),
                                     self.symbol_probabilities(1, 0))

    def estimate(self, counts: np.ndarray) -> Estimates:
        stack = self.stack(counts)
        M = stack.sum(axis=0)
        f, m = self._f(stack, clip=True), self._m(stack, clip=True)
        f_raw = np.where(M > 0, self._f(stack), np.nan)
        with np.errstate(invalid="ignore"):
            not_positive = ~(f_raw > 0)
        m_raw = np.where((f_raw == 0) | np.isnan(f_raw), np.nan, self._m(stack))      # 0/0 where f = 0
        probs = self.model_probabilities(f_raw, m_raw)
        return with_statuses(
            np.clip(f, 0.0, 1.0), np.clip(m, -1.0, 1.0), f_raw, m_raw,
            np.sqrt(multinomial_delta_variance(self._f, stack, probs)),
            np.sqrt(multinomial_delta_variance(self._m, stack, probs)),
            n_reports=int(counts[0]), mechanism=self.name, epsilon=self.epsilon,
            no_reports=M == 0, mean_not_estimable=not_positive, count_model=self.count_model(stack))

    # symbols counted by the frequency estimator and the "+1" one among them (None: no such split)
    present_symbols: tuple[int, ...] | None = None
    plus_symbol: int | None = None

    def count_model(self, stack: np.ndarray) -> CountModel:
        """The ``M_k`` users who sampled key ``k`` report a symbol by their
        state: ``symbol_probabilities(2 | 0 | 1)`` for a holder with ``+1`` /
        ``-1`` / a non-holder; the estimators unclipped."""
        return CountModel(stack, self.symbol_probabilities(2, 0), self.symbol_probabilities(0, 0),
                          self.symbol_probabilities(1, 0), self._f, self._m, present=self.present_symbols,
                          plus=self.plus_symbol)

    def symbol_probabilities(self, state: int, j: int) -> np.ndarray:
        """P(symbol | the user's state for key ``j``), over ``self.symbols``."""
        raise NotImplementedError

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        """Exact distribution of ``(j, symbol)`` (``j``-major) for a user holding
        ``pairs`` with values at the vertices ``±1`` (privacy audits)."""
        held = dict(pairs)
        out = []
        for j in range(self.d):
            if j in held:
                up = (1 + held[j]) / 2
                probs = up * self.symbol_probabilities(2, j) + (1 - up) * self.symbol_probabilities(0, j)
            else:
                probs = self.symbol_probabilities(1, j)
            out.append(probs / self.d)
        return np.concatenate(out)


class KVUE(_StateMechanism):
    """KVUE / state encoding: GRR over the 3 states of the sampled pair."""

    name = "kvue"
    symbols = (-1, 0, 1)          # state - 1
    present_symbols, plus_symbol = (0, 2), 2      # the held states; <1,+1>

    def __init__(self, d: int, epsilon: float):
        super().__init__(d, epsilon)
        e = math.exp(self.epsilon)
        self.p = e / (e + 2.0)
        self.q = 1.0 / (e + 2.0)

    def perturb(self, users: UserBatch, rng: np.random.Generator) -> ReportBatch:
        n = users.n_users
        j, held, values = uniform_key_sampling(users, self.d, rng)
        s = states_of(held, values, rng)
        keep = rng.random(n) < self.p
        shift = rng.integers(1, 3, size=n)            # one of the two other states
        out = np.where(keep, s, (s + shift) % 3)
        return ReportBatch(np.arange(n + 1), j, (out - 1).astype(np.int8), users.batch_id)

    def state_counts(self, stack):
        M = stack.sum(axis=0)
        N = [(2 * stack[s] - (1 - self.p) * M) / (3 * self.p - 1) for s in range(3)]
        return N[0], N[1], N[2], M

    def state_count_variance(self, M, N_s):
        """Exact variance of ``N_s*`` (SPEC.md §2; Sun et al.'s Eq. (5) is its
        ``N_s << M`` limit ``M (e^eps + 1)/(e^eps - 1)^2``)."""
        p, q = self.p, (1 - self.p) / 2
        return 4 * (N_s * p * (1 - p) + (M - N_s) * q * (1 - q)) / (3 * p - 1) ** 2

    def symbol_probabilities(self, state, j):
        out = np.full(3, self.q)
        out[state] = self.p
        return out


class KVOH(_StateMechanism):
    """KVOH: one-hot of the state in 3 bits, symmetric UE with ``eps/2`` per bit."""

    name = "kvoh"
    symbols = tuple(range(8))     # bit s of the mask = bit s of the one-hot vector

    def __init__(self, d: int, epsilon: float):
        super().__init__(d, epsilon)
        self.p = rr_keep(self.epsilon / 2)

    def perturb(self, users: UserBatch, rng: np.random.Generator) -> ReportBatch:
        n = users.n_users
        j, held, values = uniform_key_sampling(users, self.d, rng)
        s = states_of(held, values, rng)
        onehot = (np.arange(3)[None, :] == s[:, None])
        flip = rng.random((n, 3)) >= self.p
        bits = onehot ^ flip
        mask = bits @ np.array([1, 2, 4])
        return ReportBatch(np.arange(n + 1), j, mask.astype(np.int8), users.batch_id)

    def bit_counts(self, stack):
        """``M_s``: reports with bit ``s`` set, per key."""
        masks = np.arange(8)
        return [stack[(masks >> s) & 1 == 1].sum(axis=0) for s in range(3)]

    def state_counts(self, stack):
        M = stack.sum(axis=0)
        e = math.exp(self.epsilon / 2)
        N = [((e + 1) * Ms - M) / (e - 1) for Ms in self.bit_counts(stack)]
        return N[0], N[1], N[2], M

    def state_count_variance(self, M, N_s=None):
        """Exact: ``M e^(eps/2)/(e^(eps/2) - 1)^2`` whatever ``N_s``."""
        e = math.exp(self.epsilon / 2)
        return M * e / (e - 1) ** 2

    def symbol_probabilities(self, state, j):
        probs = np.empty(8)
        for mask in range(8):
            bits = [(mask >> s) & 1 for s in range(3)]
            probs[mask] = np.prod([self.p if b == (s == state) else 1 - self.p for s, b in enumerate(bits)])
        return probs


@dataclasses.dataclass(frozen=True)
class F2MOptions(Options):
    default_value: float = option(1.0, "F2M: the value reported for keys a user lacks", low=-1.0, high=1.0,
                                  parse=float)


class F2M(_StateMechanism):
    """F2M: key bit and value bit perturbed separately (Alg. 3)."""

    name = "f2m"
    options_type = F2MOptions
    symbols = (-2, -1, 1, 2)      # value * (1 + key_bit)
    present_symbols, plus_symbol = (0, 3), 3      # key bit 1; with value +1

    def __init__(self, d: int, epsilon: float, default_value: float = 1.0):
        super().__init__(d, epsilon)
        if not -1.0 <= default_value <= 1.0:
            raise ValueError(f"the default value must be in [-1, 1], got {default_value}")
        self.default_value = float(default_value)
        self.p1 = rr_keep(self.ledger.round_epsilon(0, "key"))
        self.p2 = rr_keep(self.ledger.round_epsilon(0, "value"))

    def budget_shares(self) -> list[Share]:
        """Alg. 3: ``eps1 = eps2 = eps/2`` on the key bit and the value bit."""
        return [Share(0, "key", self.epsilon / 2), Share(0, "value", self.epsilon / 2)]

    def config(self, round_index: int | None = None) -> Mapping:
        return {**super().config(), "default_value": self.default_value}

    def perturb(self, users: UserBatch, rng: np.random.Generator) -> ReportBatch:
        n = users.n_users
        j, held, values = uniform_key_sampling(users, self.d, rng)
        key_bit = np.where(rng.random(n) < self.p1, held, ~held)
        x = discretise(np.where(held, values, self.default_value), rng)
        v = np.where(rng.random(n) < self.p2, x, -x)
        return ReportBatch(np.arange(n + 1), j, (v * (1 + key_bit)).astype(np.int8), users.batch_id)

    def _f(self, stack, clip=False):
        M = stack.sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            f_prime = np.where(M > 0, (stack[0] + stack[3]) / M, 0.0)
        f = (f_prime - (1 - self.p1)) / (2 * self.p1 - 1)
        return np.clip(f, 0.0, 1.0) if clip else f

    def _m(self, stack, clip=False):
        M = stack.sum(axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            m_all = np.where(M > 0, (stack[2] + stack[3] - stack[0] - stack[1]) / (M * (2 * self.p2 - 1)), 0.0)
            f = self._f(stack)
            if clip:   # at least one holder: N = f M clipped into [1, M]
                f = np.clip(f, np.minimum(1.0, 1.0 / np.maximum(M, 1)), 1.0)
            return np.where(f != 0, (m_all - (1 - f) * self.default_value) / f, 0.0)

    def symbol_probabilities(self, state, j):
        held = state != 1
        up = 1.0 if state == 2 else 0.0 if state == 0 else (1 + self.default_value) / 2
        key1 = self.p1 if held else 1 - self.p1
        plus = up * self.p2 + (1 - up) * (1 - self.p2)
        # symbols (-2, -1, 1, 2): (key1, -), (key0, -), (key0, +), (key1, +)
        return np.array([key1 * (1 - plus), (1 - key1) * (1 - plus), (1 - key1) * plus, key1 * plus])

