"""Choosing how far to follow empirical Bayes by estimates of the risk.

Empirical Bayes pulls every key towards the bulk of the others. Summed over
thousands of small keys that removes most of the noise, but the keys with
the largest true values are pulled too: at eps = 4 the posterior mean has a
larger MSE than the paper's estimate on the true top 50 (issue 43; it is
the Bayes rule, so even the posterior mean under the *true* prior does:
synthetic-multi, PCKV-GRR, eps 4, d = 1,000: top-50 MSE 3.5e-5 against the
paper's 2.5e-5, all keys 2.7e-6 against 9.2e-6). The output here is a
*limited translation* of the posterior mean towards the raw estimate
(Efron & Morris 1972): each key moves from its raw estimate ``x`` towards
its posterior mean ``delta`` by at most ``c`` standard errors,

    est_c = clip(x + clip(delta - x, -c sigma, c sigma), lo, hi),

``c = 0`` the paper's clipped estimate, ``c = inf`` the posterior mean. ``c``
is chosen from ``LIMITS`` (at most 0.5 for means, ``MEAN_LIMITS``, and where
the mechanism has no count model, ``MODEL_FREE_LIMITS``: below) by two
estimates of risk:

* all keys, Stein's unbiased risk estimate (Stein 1981), model-free: for
  ``x ~ N(theta, sigma^2)`` and an estimate ``x + g(x)``,
  ``SURE = sigma^2 + g^2 + 2 sigma^2 g'``: ``d est / dx`` is ``V / sigma^2``
  where the pull is not capped (Tweedie: ``d delta / dx = V / sigma^2``,
  ``V`` the posterior variance), 1 where it is capped, 0 where the estimate
  is clipped into ``[lo, hi]`` (``sure``).
* the top ``TOP_KEYS`` keys by their true frequency -- the keys a reader
  looks at first. No unbiased estimate exists for a set chosen by the
  truth; this one is the posterior expected loss under the fitted model:
  ``DRAWS`` joint draws of the frequencies from the keys' posteriors, each
  draw's top keys, each estimate's squared error there (``top_loss``).

A limit per key group (say, only the likely top keys) was tried and
dropped: a group chosen by the data is a function of ``x``, and SURE summed
over it is biased (the keys chosen for a large ``x`` are those whose noise
was large); it chose limits the truth showed were worse.

The chosen ``c`` has the smallest all-keys SURE among the limits whose
gain over the paper's is more than ``SURE_Z`` of its own standard errors
(per-key SURE is noisy; on MovieLens' 943 users, a few reports per key, an
unguarded choice was 1.16x the paper's over all keys) and whose
top-keys loss is at most ``TOP_MARGIN`` of the paper's estimate's (a margin
for the model's error: on synthetic-multi, PCKV-GRR eps 4, the model put
``c = 0.25`` 3 % below the paper on the top 50, the truth 0.2 % above);
``c = 0`` is always allowed, so neither estimate of risk is ever above the
paper's.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kvldp.mechanisms.estimation import consistency

LIMITS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, np.inf)
TOP_KEYS = 50           # the heavy hitters whose risk is bounded by the paper's
DRAWS = 200             # posterior draws the top keys' expected loss is averaged over
CANDIDATES = 2_000      # keys drawn: the largest posterior upper ends (no other key reaches the top)
SURE_Z = 2.0            # a limit's all-keys SURE gain must exceed this many of its own standard errors
# a mean's s.e. at or above this spans [-1, 1]: no risk choice, the posterior mean (PCKV-GRR at eps 1 has
# s.e. up to 124: they made every SURE noise and left the paper's mean, 1.8x the shrunk one's MSE)
INFORMATIVE_SE = 1.0
TOTAL_Z = 2.0           # a limit's sum within this many s.e. of the total (``mass``)
TOP_MARGIN = 0.95       # a limit is allowed if its top keys' loss is below this share of the paper's
# ... and not below this share: a model that claims to know the top keys 10x better than their own reports
# rests on the tail of a prior fitted to the same data, its least determined part (synthetic-multi,
# PrivKVM-VI eps 4: 2.7e-9 against the paper's 2.8e-3 at c = 2, where the truth was 1.7x the paper's)
TOP_FLOOR = 0.1
CLOSER_TOP_MARGIN = 0.8         # the margin of a limit whose sum is only closer to the total (``mass``)
MODEL_FREE_TOP_MARGIN = 0.8     # the margin without a count model (synthetic-multi, KS-GRR eps 4: the model
                                # put c = 0.75 at 0.95 of the paper's on the top 50, the truth at 1.4)
# Without a count model (KS-GRR, KS-Adap) the likelihood is a normal approximation, and the estimates
# carry a bias no report shows (one sampled pair per user: the kept-share correction is right only on
# average), under which SURE and the posterior losses both flatter the posterior (Clothing, KS-GRR eps 4,
# seeds 11-13: SURE 2.6e-5 at c = inf where the truth was 6.6e-4; top-50 MSE 1.4-1.8x the paper's).
# There each key moves at most 1 s.e.: top-50 MSE 0.75-0.92 of the paper's on those seeds, all keys 0.2.
MODEL_FREE_LIMITS = tuple(c for c in LIMITS if c <= 1.0)
# A mean moves at most 0.5 s.e., with or without a count model: Efron and Morris's (1972) limited
# translation, most of the Bayes gain at a risk for each key of at most (1 + c^2) = 1.25x the paper's.
# Uncapped, the normal prior of the means (whose true spread is flat and bounded) put the top keys' loss at
# c = 1.5-3 at 0.66 of the paper's where the truth was 1.04-1.17 (synthetic-multi, PCKV-UE and KS-UE eps 4).
# At c <= 1 the true top keys still lost on a population whose top keys have extreme means (synthetic-multi
# data seed 7, PCKV-UE eps 4, 8 noise seeds: 0.69-1.36x the paper's, mean 1.016; 10 of its 25 smallest top
# keys at |m| ~ 0.8); at c <= 0.5, 0.67-1.09 (mean 0.945), KS-UE's mean 0.81 -> 0.77, for all keys' means
# 0.378 -> 0.412 of the paper's (the issue-43 table, synthetic-multi eps 4, top-50 means: PCKV-UE 0.960 ->
# 0.918, KS-UE 0.987 -> 0.834; docs/defaults.md). The rest of it
# is the frequency posterior the mean's likelihood integrates over: it pulls such a key, reported among
# thousands of small ones, towards them (the 40th key: 0.002 for 0.0065), and at a smaller frequency its
# split tells less of its mean (flat prior: slope 0.68 on the truth, the paper's 0.86). Integrating over the
# frequency's own likelihood instead was measured and dropped: 1.15-1.24 -> 0.93-1.18 there, but MovieLens'
# sparse keys' means got worse (PrivKVM+ all keys 0.24-0.32 -> 1.01-1.03, F2M 0.25 -> 0.72). SURE over the 50
# keys with the largest frequency estimates is biased (a ratio mean's noise follows the frequency estimate
# that chose them: a loss of 3.7-6.9 +- 0.6-1.0 where the truth was a gain), over the true top 50 its s.e.
# is most of the paper's loss there: no group risk estimate of one run can choose the top keys' limit.
MEAN_LIMITS = tuple(c for c in LIMITS if c <= 0.5)
# Where only a candidate set is estimated (KS-Adap: frequencies and means of the 2t keys its first round
# chose), ``auto`` keeps the paper's estimates. The reports chose the set for its large estimates, and a
# prior fitted to it pulls its few truly heavy keys towards the noise chosen with them: MovieLens eps 1 had
# 0-3 of the true top 50 among 100 candidates, top-50 MSE of frequency 1.33x the paper's (1.31 at eps 4),
# and Clothing eps 1's popular, highly rated keys had their means pulled to the pool's (1.13x). Neither
# risk estimate saw it (both rest on that prior); a prior of the means on the keys' frequency rank (1.03x)
# and a SURE check over the likely top quarter did not remove it. KS-GRR estimates every key's frequency
# and is not affected.


@dataclasses.dataclass(frozen=True)
class Choice:
    """The chosen limit ``c`` and per limit tried (``LIMITS``, or
    ``MODEL_FREE_LIMITS``) the all-keys SURE,
    the top keys' posterior expected loss (``nan``: not measured) and the
    estimates' sum."""

    limit: float
    sure: tuple
    top: tuple
    sums: tuple


def limited(x, post_mean, sd, c: float) -> np.ndarray:
    """``x`` moved towards ``post_mean`` by at most ``c sd`` (unclipped)."""
    return x + np.clip(post_mean - x, -c * sd, c * sd)


def sure(x, var, post_mean, post_var, c: float, lo: float, hi: float) -> np.ndarray:
    """Per-key SURE of ``est_c``: ``sigma^2 + (est - x)^2 + 2 sigma^2 (d est / dx - 1)``
    with ``d est / dx`` 0 where clipped into ``[lo, hi]``, 1 where the pull is
    capped at ``c sigma`` (``c = 0``: everywhere), else ``V / sigma^2``."""
    sd = np.sqrt(var)
    pull = post_mean - x
    moved = x + np.clip(pull, -c * sd, c * sd)
    est = np.clip(moved, lo, hi)
    slope = np.where((moved < lo) | (moved > hi), 0.0, np.where(np.abs(pull) >= c * sd, 1.0, post_var / var))
    return var + (est - x) ** 2 + 2.0 * var * (slope - 1.0)


def posterior_draws(grid: np.ndarray, weights: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
    """``(draws, keys)`` values of ``grid`` drawn from each row of ``weights``
    (inverse-CDF sampling, every key independently)."""
    rows, width = weights.shape
    cdf = np.cumsum(weights, axis=1)
    cdf /= cdf[:, -1:]
    # one searchsorted for every row: row k's CDF and draws shifted into [k, k + 1]
    offset = np.arange(rows, dtype=np.float64)[:, None]
    flat = np.searchsorted((cdf + offset).ravel(), (rng.random((rows, draws)) + offset).ravel())
    index = np.clip(flat.reshape(rows, draws) - np.arange(rows)[:, None] * width, 0, width - 1)
    return grid[index].T


def top_loss(candidates: list[np.ndarray], draws: np.ndarray, truth_draws: np.ndarray | None = None,
             top: int = TOP_KEYS, post_var: np.ndarray | None = None) -> np.ndarray:
    """Posterior expected MSE of each candidate estimate over the top ``top``
    keys by frequency: ``draws`` (draws x keys) are joint posterior draws of
    the frequencies, which choose each draw's top keys; the loss is against
    ``truth_draws`` (default ``draws``: the frequency itself), or, for a
    mean, against its posterior mean ``truth_draws`` (one row) plus its
    posterior variance ``post_var``."""
    top = min(top, draws.shape[1])
    chosen = np.argpartition(-draws, top - 1, axis=1)[:, :top]
    out = []
    for est in candidates:
        if truth_draws is None:
            err = (est[chosen] - np.take_along_axis(draws, chosen, axis=1)) ** 2
        else:
            err = (est[chosen] - truth_draws[chosen]) ** 2 + post_var[chosen]
        # a mean's top keys may all lack an estimate (a split KS-Adap run): not measured, nan
        out.append(float(np.nanmean(err)) if np.isfinite(err).any() else np.nan)
    return np.array(out)


@dataclasses.dataclass(frozen=True)
class TopKeys:
    """What the top keys' loss is measured on: ``positions`` of the drawn
    keys among the estimates, ``draws`` (draws x drawn keys) of their
    frequencies; for a mean, ``mean``/``var`` its posterior at them (else
    the loss is against the drawn frequencies themselves)."""

    positions: np.ndarray
    draws: np.ndarray
    mean: np.ndarray | None = None
    var: np.ndarray | None = None

    def loss(self, est: np.ndarray) -> float:
        return float(top_loss([est[self.positions]], self.draws, self.mean, post_var=self.var)[0])


def choose_limit(x, var, post_mean, post_var, lo: float, hi: float, top: TopKeys | None = None, clipped=None,
                 total=None, limits=LIMITS, margin: float = TOP_MARGIN) -> tuple[np.ndarray, Choice]:
    """The estimates ``est_c`` of the chosen ``c`` (module doc). ``x`` the
    unbiased raw estimates, ``var`` their noise variances, ``post_mean`` and
    ``post_var`` a posterior's; ``top`` where the top keys' expected loss
    is measured (``None``: all keys only); ``clipped`` (default
    ``clip(x, lo, hi)``) the paper's output, ``c = 0``; ``total``:
    ``(T, se)``, an unbiased estimate of the estimates' sum (``fit_total``:
    PCKV's and KS-UE's dummy keys, KS-GRR's round 1, else the sum of the
    raw estimates), whose mass a
    limit's estimates must keep (``mass``): a posterior whose
    prior collapsed towards 0 (KS-GRR at eps 1: every key ~0 where the raw
    sum says 1.2 +- 0.4) is refused however small its estimated risks;
    ``limits``: the limits tried, 0 first; ``margin``: the top keys'
    (``believable``). One limit at a time: memory stays
    a few arrays of the keys' length."""
    x, var, post_mean, post_var = (np.asarray(a, dtype=np.float64) for a in (x, var, post_mean, post_var))
    paper = np.array(np.clip(x, lo, hi) if clipped is None else clipped, dtype=np.float64)
    usable = np.isfinite(x) & np.isfinite(var) & (var > 0) & np.isfinite(post_mean) & np.isfinite(post_var)
    if not usable.any():
        return paper, Choice(0.0, (), (), ())
    xs, vs, ms, pvs = x[usable], var[usable], post_mean[usable], post_var[usable]
    sd = np.sqrt(vs)
    base = sure(xs, vs, ms, pvs, 0.0, lo, hi)
    all_keys, top_keys, sums = [], [], []
    scale = ((hi - lo) / 2) ** 2          # a top-keys loss this large: the reports say nothing about them
    # the best limit whose sum is within the total's bounds, and the best of those only closer than the
    # paper's (``mass``): the second counts only where no limit but 0 is in the first
    best = {"within": (0, paper), "closer": (0, paper)}
    for i, c in enumerate(limits):      # limits[0] = 0: the paper's, against which the others are checked
        est = paper
        if c != 0.0:
            est = paper.copy()
            est[usable] = np.clip(limited(xs, ms, sd, c), lo, hi)
        gain = base - sure(xs, vs, ms, pvs, c, lo, hi) if c != 0.0 else np.zeros_like(base)
        # the gain's own noise: a sum of per-key terms, independent across keys
        sure_noise = float(np.sqrt(len(gain)) * np.std(gain)) if len(gain) > 1 else np.inf
        all_keys.append(float(np.sum(base) - np.sum(gain)))
        top_keys.append(np.nan if top is None else top.loss(est))
        sums.append(float(np.sum(est)))
        if i and not np.sum(gain) > SURE_Z * sure_noise:
            continue
        for kind, m in (("within", margin), ("closer", min(margin, CLOSER_TOP_MARGIN))) if i else ():
            if (believable(top_keys[-1], top_keys[0], m, scale) and mass(sums[-1], sums[0], total, kind)
                    and all_keys[-1] < all_keys[best[kind][0]]):
                best[kind] = i, est
    chosen, est = best["within"] if best["within"][0] else best["closer"]
    return est, Choice(limits[chosen], tuple(all_keys), tuple(top_keys), tuple(sums))


def keep_total(est: np.ndarray, total, top: TopKeys | None = None, raw=None, sd_at_zero=None,
               margin: float = 1.0, upper: float = 1.0) -> np.ndarray:
    """``est`` (in ``[0, upper]``: ``upper`` a key's bound, ``kappa`` before
    the truncation correction) made consistent with ``total = (T, se)``, an
    unbiased estimate of its sum: where ``sum est`` is above
    ``T + TOTAL_Z se`` -- the paper's clipped output (``c = 0``), whose
    sum the many small keys' noise raised to 0 inflates (MovieLens: F2M,
    KVUE, KVOH and the PrivKV family, 2-7 s.e. above the total) -- Norm-Sub
    to ``max(T, 0)`` (Wang et al., NDSS 2020, §IV-C: ``max(est - delta, 0)``,
    the Euclidean projection onto the frequencies with that sum).

    The shift is a bias of every key. Where no ``raw`` estimate is told
    from 0 (Base-Cut's test with Bonferroni's correction, ``sd_at_zero``
    their s.d. at 0) every key is noise and so is the mass the clipping
    added: Norm-Sub always (MovieLens, F2M eps 1: top-50 MSE 0.25-0.27 of
    the paper's). Where some are, the shift may be a large bias of precise
    top keys: only if it does not raise the top keys' modelled loss
    (``top``; Norm-Sub cost the top 50 of synthetic-multi at eps 4: PCKV-UE
    1.10-1.13x the paper's, KS-UE 1.11-1.20x, PCKV-GRR 1.19-1.28x) -- by
    ``margin`` of it without a count model, whose normal likelihood flatters
    the shift (synthetic-multi, KS-GRR eps 4: modelled 1.00-1.06x over six
    seeds; taken at <= 1, 1.04x over three runs; ``MODEL_FREE_TOP_MARGIN``) -- and
    to ``T`` only where ``T`` is told from 0 (``T > TOTAL_Z se``); else only
    down to the nearest consistent sum, ``T + TOTAL_Z se`` (the Euclidean
    projection onto the frequencies summing to at most that, which holds
    the truth's: no key moves away from it). To a ``T`` below 0 it zeroed
    keys the reports tell from 0, which a model whose prior collapsed to 0
    thought perfect (synthetic-multi, eps 4, T = -0.5 +- 1.4: F2M 2.2x,
    PrivKVM-VI 3.0x).

    ``total`` must not come from estimates a round chose (KS-GRR's raw
    sum: its non-candidates' estimates, chosen for being small, sum too
    low -- MovieLens, eps 4: -171 +- 59 where the truth is 106 -- and
    Norm-Sub to it zeroed every key); ``fit_total`` gives KS-GRR's share of
    users with a pair instead."""
    # the output's sum: what is above the bound is cut by the truncation correction
    if total is None or not len(est) or not np.sum(np.minimum(est, upper)) > total[0] + TOTAL_Z * total[1]:
        return est
    if raw is not None and not np.any(consistency.base_cut(raw, sd_at_zero) > 0):
        return consistency.norm_sub(est, max(total[0], 0.0), upper)   # no key told from 0
    # a total told from 0 is the target; one that is not cannot overrule the keys that are: the nearest sum
    cap = total[0] if total[0] > TOTAL_Z * total[1] else total[0] + TOTAL_Z * total[1]
    if not cap > 0:
        return est                      # keys told from 0, a total that says none is
    consistent = consistency.norm_sub(est, cap, upper)
    return consistent if top is None or top.loss(consistent) <= margin * top.loss(est) else est


def believable(loss_c: float, loss_paper: float, margin: float = TOP_MARGIN, scale: float = np.inf) -> bool:
    """Whether the modelled top keys' loss ``loss_c`` of a limit allows it:
    at most ``margin`` of the paper's ``loss_paper``, and not below
    ``TOP_FLOOR`` of it where the paper's estimates tell the top keys at all
    (``loss_paper`` below ``scale``, the square of half the range: where
    the paper's error is larger -- PCKV-GRR, 30,000 users over 100,000
    keys: 1.3 -- the posterior does know them far better than their
    reports); ``nan`` (not measured) allows."""
    if np.isnan(loss_c) or np.isnan(loss_paper):
        return True
    floor = TOP_FLOOR * loss_paper if loss_paper < scale else 0.0
    return floor <= loss_c <= margin * loss_paper


def mass(total_c: float, total_paper: float, total, kind: str = "within") -> bool:
    """Whether a limit's estimates, summing to ``total_c``, keep the mass
    ``total = (T, se)`` (always, without a ``total``): never below
    ``T - TOTAL_Z se`` (a prior collapsed towards 0); ``within``: not above
    ``T + TOTAL_Z se`` either; ``closer``: or above it, but below the
    paper's output's sum ``total_paper`` -- clipping the many small keys'
    noise into ``[0, 1]`` inflates that (Clothing, KS-GRR eps 4: 6.0 where
    its raw sum was 1.5 +- 0.2), and a limit that pulls it down is closer, not
    worse. ``choose_limit`` takes a ``closer`` limit only where no limit is
    ``within``, and with the top keys' margin ``CLOSER_TOP_MARGIN`` (on
    MovieLens' PrivKV family at eps 1, a small limit closer to the total
    that the model put at 0.95 of the paper's on the top 50 was 1.016x)."""
    if total is None:
        return True
    low, high = total[0] - TOTAL_Z * total[1], total[0] + TOTAL_Z * total[1]
    return total_c >= low and (total_c <= high or (kind == "closer" and total_c <= total_paper))


# -- what a post-processing fit (postprocess._Fit) gives the choice ----------

DRAW_SEED = 43          # the top keys' posterior draws: a decision of the collector's, not privacy noise


def fit_draws(fit):
    """``(keys, draws)``: ``DRAWS`` joint posterior draws of the frequencies
    of the ``CANDIDATES`` keys of ``fit`` with the largest posterior upper
    ends (mean + 3 s.d.; the only keys that can reach the top), drawn once
    per fit (``fit.top_draws`` keeps them) with a fixed seed (a rerun gives
    the same estimates)."""
    index = np.flatnonzero(fit.eb)
    mean, var = fit.frequency_posterior_mean(), fit.frequency_posterior_var()
    keys = index[np.argsort(-(mean + 3 * np.sqrt(var)), kind="stable")[:CANDIDATES]]
    return keys, posterior_draws(fit.frequency_grid(), fit.frequency_weights(keys), DRAWS,
                                 np.random.default_rng(DRAW_SEED))


def fit_top_keys(fit, index: np.ndarray, post_mean=None, post_var=None) -> TopKeys:
    """Where the top keys' loss of estimates of the keys ``index`` is
    measured: of their frequencies, or with ``post_mean`` and ``post_var``
    (of ``index``) of their means."""
    keys, draws = fit.top_draws
    positions = np.full(fit.est.d, -1)
    positions[index] = np.arange(len(index))
    at = positions[keys]
    if post_mean is None:         # every drawn key has a frequency estimate
        return TopKeys(at, draws)
    held = at >= 0                # a drawn key without a mean estimate: no loss (nan)
    return TopKeys(np.where(held, at, 0), draws, np.where(held, post_mean[at], np.nan),
                   np.where(held, post_var[at], np.nan))


def fit_total(fit, out: np.ndarray, eb: np.ndarray) -> tuple[float, float]:
    """``(T, se)`` the keys of ``eb`` sum to: a total measured apart from
    the keys (``Estimates.frequency_total``: PCKV's and KS-UE's dummy keys, KS-GRR's
    users without a pair) less the other keys' output, else the sum of
    their raw estimates with its standard error."""
    if fit.est.frequency_total is not None:
        total, se = consistency.measured_total(fit.est)
        return total - float(np.nansum(out[~eb])), se
    se = np.asarray(fit.est.frequency_se, dtype=np.float64)[eb]
    return float(np.sum(fit.raw()[eb])), float(np.sqrt(np.nansum(se ** 2)))
