"""PrivKVM (c real rounds, Alg. 5) and PrivKVM+ (adaptive rounds, Alg. 6).

Ye et al. 2019 §V; SPEC.md §1. Every round is an LPP round
(``privkv.lpp_perturb``) of the *same* users; what links rounds is the
collector's broadcast of per-key means ``m^(r)``, which users lacking the
sampled key use as their fake value ``m~`` in round ``r+1``.

* **PrivKVM**, budget PBA: ``eps1 = eps2 = eps/2``; the key budget is all
  spent in round 1 (later rounds' key bits are fair coins, ``p1 = 1/2``), the
  value budget is split evenly, ``eps/(2c)`` per round. Round 1 uses a
  uniform ``m~`` (= PrivKV). Output: ``f^(1)`` and ``m^(c)``. Theorem 5.3:
  ``E[m^(r)] = theta_r E[m^(r-1)] + (1 - theta_r) m`` with
  ``theta_r = (f p_r - f - p_r + 1)/(2 f p_r - f - p_r + 1)``.
* **PrivKVM+**, budget PBAt(t): round ``r`` spends ``1/t`` of the remaining
  budget, half on keys and half on values (**choice**, SPEC.md). ``m~ = 1``
  initially; after each round ``F = A0 - mean_k |m^(r)_k - m~_k|``; stop
  when ``F >= 0`` or after ``max_rounds``. Output: round 1's frequency and the
  last round's mean; the state records rounds run and budget spent.

Both means are **biased** (Theorem 5.3: the fake values of non-holders pull
``E[m^(c)]`` towards the broadcast), and a round's multinomial s.e. ignores
the noise every earlier round's broadcast carries into it (measured: its
square is 0.15-0.6 of the real variance over repeats). They carry no
standard error (``mean_status = "biased"``); the frequency's (round 1's) is
exact. The broadcast is the paper's clipped mean (0 where a round had no key
bit of 1), even where the published mean is null (frequency <= 0).
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping

import numpy as np

from kvldp.mechanisms.base import (
    STATUS_NO_REPORTS,
    STATUS_OK,
    ReportBatch,
    UserBatch,
    validated_domain,
    with_statuses,
)
from kvldp.mechanisms.estimation.countmodel import CountModel
from kvldp.mechanisms.kv.privkv import (
    FAKE_UNIFORM,
    lpp_accumulate,
    lpp_frequency,
    lpp_frequency_variance,
    lpp_output_probabilities,
    lpp_perturb,
    lpp_split,
    privkv_mean,
    rr_keep,
)
from kvldp.mechanisms.params import Options, option, rounds_option
from kvldp.mechanisms.privacy.accountant import Accountant, Share
from kvldp.mechanisms.protocol import Protocol, ProtocolState


def expected_mean_recursion(m: np.ndarray, f: np.ndarray, key_p: list[float], m_tilde0) -> np.ndarray:
    """Theorem 5.3's closed form: ``E[m^(c)]`` after rounds with key keep
    probabilities ``key_p`` starting from ``E[m~] = m_tilde0``."""
    out = np.asarray(m_tilde0, dtype=np.float64) * np.ones_like(np.asarray(m, dtype=np.float64))
    for p in key_p:
        theta = (f * p - f - p + 1.0) / (2.0 * f * p - f - p + 1.0)
        out = theta * out + (1.0 - theta) * m
    return out


def _raw_frequency(stack: np.ndarray, p1: float) -> np.ndarray:
    return lpp_frequency(stack, p1)[0]


class _LPPRounds(Protocol):
    """Shared round mechanics: per-round (p1, p2), LPP reports, Alg. 4 means."""

    broadcast_kind = "fake_value"

    def __init__(self, d: int, epsilon: float, max_rounds: int):
        self.d, self.epsilon = validated_domain(d, epsilon)
        if int(max_rounds) != max_rounds or max_rounds < 1:
            raise ValueError(f"the number of rounds must be a whole number >= 1, got {max_rounds}")
        self.max_rounds = int(max_rounds)
        self.ledger = Accountant.of(self.epsilon, self.shares())
        self.key_eps = [self.ledger.round_epsilon(r, "key") for r in range(self.max_rounds)]
        self.value_eps = [self.ledger.round_epsilon(r, "value") for r in range(self.max_rounds)]

    def shares(self) -> list[Share]:
        raise NotImplementedError

    def p1(self, r: int) -> float:
        return rr_keep(self.key_eps[r])

    def p2(self, r: int) -> float:
        return rr_keep(self.value_eps[r])

    def initial_fake(self):
        raise NotImplementedError

    def fake(self, r: int, state: ProtocolState):
        return self.initial_fake() if r == 0 else state.broadcast

    def perturb_round(self, round_index, users: UserBatch, rng, state: ProtocolState) -> ReportBatch:
        if state.stopped:
            return self.empty_reports(round_index, users.batch_id)
        return lpp_perturb(users, self.d, self.p1(round_index), self.p2(round_index),
                           self.fake(round_index, state), rng)

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        """LPP's report distribution with round ``round_index``'s budget and fake values."""
        return lpp_output_probabilities(pairs, self.d, self.p1(round_index), self.p2(round_index),
                                        self.fake(round_index, state))

    def round_counts_size(self, round_index: int) -> int:
        return 1 + 3 * self.d

    def accumulate_round(self, round_index, counts, reports) -> np.ndarray:
        return lpp_accumulate(counts, reports, self.d)

    def round_estimates(self, r: int, state: ProtocolState, counts: np.ndarray):
        """``(estimates, broadcast)`` after round ``r``. Round 1: frequency
        and mean by Alg. 4. Later rounds: the mean is this round's; the
        frequency (and its statuses) is carried from round 1. The broadcast is
        the paper's clipped mean, a number for every key."""
        stack = lpp_split(counts, self.d)
        p2 = self.p2(r)
        M, N = stack.sum(axis=0), stack[0] + stack[1]
        paper = np.clip(privkv_mean(stack, p2, clip=True), -1.0, 1.0)
        m_raw = np.where(N > 0, privkv_mean(stack, p2, clip=False), np.nan)
        if r == 0:
            f_raw, _ = lpp_frequency(stack, self.p1(0))
            f, f_se = np.clip(f_raw, 0.0, 1.0), np.sqrt(lpp_frequency_variance(f_raw, M, self.p1(0)))
            n_reports, f_status, m_status = int(counts[0]), None, None
        else:
            prev = state.estimates
            f, f_raw, f_se, n_reports = prev.frequency, prev.frequency_raw, prev.frequency_se, prev.n_reports
            f_status = prev.frequency_status
            m_status = np.where((f_status == STATUS_NO_REPORTS) | (M == 0), STATUS_NO_REPORTS, STATUS_OK)
        with np.errstate(invalid="ignore"):
            not_positive = ~(f_raw > 0)
        model = self.round_model(r, state, stack)
        if r > 0:        # a later round adds to round 1's model; without it (no estimates carried) there is none
            first = state.estimates.count_model if state.estimates is not None else None
            model = first.with_round(model) if first is not None else None
        est = with_statuses(f, paper, f_raw, m_raw, f_se, np.full(self.d, np.nan), n_reports=n_reports,
                            mechanism=self.name, epsilon=self.epsilon, no_reports=M == 0 if r == 0 else None,
                            mean_not_estimable=not_positive, mean_biased=True,
                            frequency_status=f_status, mean_status=m_status, count_model=model)
        return est, paper

    def round_counts(self, est) -> np.ndarray | None:
        """``(3 + 4 (rounds - 1), d)``: the counts behind ``est``'s model of
        the rounds (``round_model``), for the broadcast file
        (``broadcast.avsc``'s ``round_counts``): round 1's three counts, then
        per later round its fake value (the broadcast it was built from) and
        its three counts."""
        model = est.count_model
        if model is None:
            return None
        parts = [model.counts]
        for later in model.later_rounds:
            parts += [np.asarray(later.fake, dtype=np.float64)[None, :], later.counts]
        return np.concatenate(parts, axis=0)

    def model_from_round_counts(self, chain: np.ndarray) -> CountModel:
        """Inverse of :meth:`round_counts`."""
        chain = np.asarray(chain, dtype=np.float64)
        if chain.shape[0] < 3 or (chain.shape[0] - 3) % 4 or chain.shape[0] > 3 + 4 * (self.max_rounds - 1) \
                or chain.shape[1] != self.d or not np.all(np.isfinite(chain)):
            raise ValueError(f"broadcast: round_counts of {chain.shape[0]} values per key is not 3 + 4 per "
                             f"later round of {self.name} (at most {self.max_rounds} rounds)")
        if np.any(chain[:3] < 0) or np.any(np.abs(chain[3::4]) > 1) or \
                any(np.any(chain[r + 1:r + 4] < 0) for r in range(3, chain.shape[0], 4)):
            raise ValueError("broadcast: round_counts holds a negative count or a fake value outside [-1, 1]")
        model = self._model(0, self.initial_fake(), chain[:3])
        for i, r in enumerate(range(3, chain.shape[0], 4), start=1):
            model = model.with_round(self._model(i, chain[r], chain[r + 1:r + 4]))
        return model

    def round_model(self, r: int, state: ProtocolState, stack: np.ndarray) -> CountModel:
        return self._model(r, self.fake(r, state), stack)

    def _model(self, r: int, fake, stack: np.ndarray) -> CountModel:
        """Round ``r``'s LPP count model (``privkv._LPPMechanism.count_model``)
        with this round's ``(p1, p2)`` and fake values: round 1's initial
        (uniform, or 1), later rounds' the broadcast mean of each key (after
        ``Disc``, ``+1`` w.p. ``(1 + m~)/2``). Chained by ``with_round``, the
        rounds' value counts give the means a likelihood that models the
        bias Theorem 5.3 describes, so post-processing corrects it."""
        p1, p2 = self.p1(r), self.p2(r)
        up = np.full(self.d, 0.5) if isinstance(fake, str) else (1.0 + np.asarray(fake, dtype=np.float64)) / 2.0
        fake_plus = up * p2 + (1.0 - up) * (1.0 - p2)
        return CountModel(stack, [p1 * p2, p1 * (1 - p2), 1 - p1], [p1 * (1 - p2), p1 * p2, 1 - p1],
                          np.stack([(1 - p1) * fake_plus, (1 - p1) * (1 - fake_plus), np.full(self.d, p1)]),
                          functools.partial(_raw_frequency, p1=p1), functools.partial(privkv_mean, p2=p2, clip=False),
                          present=(0, 1), plus=0,
                          # a later round's total is never read (its key bits may be fair coins: no estimator)
                          total=None if r == 0 else 0.0, total_variance=None if r == 0 else 0.0,
                          fake=None if isinstance(fake, str) else np.array(fake, dtype=np.float64))


@dataclasses.dataclass(frozen=True)
class PrivKVMOptions(Options):
    rounds: int = rounds_option(3)


class PrivKVM(_LPPRounds):
    """PrivKVM with ``c`` real rounds (PBA budget)."""

    name = "privkvm"
    options_type = PrivKVMOptions

    def __init__(self, d: int, epsilon: float, rounds: int = 3):
        super().__init__(d, epsilon, rounds)

    def shares(self) -> list[Share]:
        c = self.max_rounds
        out = [Share(0, "key", self.epsilon / 2)]
        out += [Share(r, "value", self.epsilon / (2 * c)) for r in range(c)]
        return out

    def initial_fake(self):
        return FAKE_UNIFORM

    def advance(self, round_index, state, counts) -> ProtocolState:
        est, paper = self.round_estimates(round_index, state, counts)
        return ProtocolState(round_index + 1, paper, round_index + 1 >= self.max_rounds,
                             self.ledger.spent(rounds=range(round_index + 1)), est)


@dataclasses.dataclass(frozen=True)
class PrivKVMPlusOptions(Options):
    t: float = option(2.0, "PrivKVM+: PBAt's t (round r spends 1/t of what is left)", low=1.0, low_open=True,
                      parse=float)
    a0: float = option(0.2, "PrivKVM+: cost A0 of one more round", low=0.0, parse=float)
    max_rounds: int = option(10, "PrivKVM+: at most this many rounds", low=1, whole=True, parse=int)


class PrivKVMPlus(_LPPRounds):
    """PrivKVM+ (PBAt budget, data-dependent number of rounds)."""

    name = "privkvm-plus"
    options_type = PrivKVMPlusOptions

    def __init__(self, d: int, epsilon: float, t: float = 2.0, a0: float = 0.2, max_rounds: int = 10):
        if not t > 1.0:
            raise ValueError(f"PBAt needs t > 1, got {t}")
        if not a0 >= 0.0:
            raise ValueError(f"A0 must be >= 0, got {a0}")
        self.t, self.a0 = float(t), float(a0)
        super().__init__(d, epsilon, max_rounds)

    def config(self, round_index=None) -> Mapping:
        return {**super().config(round_index), "t": self.t, "a0": self.a0}

    def shares(self) -> list[Share]:
        out, remaining = [], self.epsilon
        for r in range(self.max_rounds):
            spend = remaining / self.t
            out += [Share(r, "key", spend / 2), Share(r, "value", spend / 2)]
            remaining -= spend
        return out

    def initial_fake(self):
        return np.ones(self.d)

    def advance(self, round_index, state, counts) -> ProtocolState:
        if state.stopped:
            return state
        est, paper = self.round_estimates(round_index, state, counts)
        used = self.initial_fake() if round_index == 0 else state.broadcast
        F = self.a0 - float(np.mean(np.abs(paper - used)))
        stop = F >= 0.0 or round_index + 1 >= self.max_rounds
        return ProtocolState(round_index + 1, paper, stop,
                             self.ledger.spent(rounds=range(round_index + 1)), est)

