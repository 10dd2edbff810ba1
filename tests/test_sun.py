"""F2M, KVUE and KVOH (SPEC.md §2; Sun et al. 2019 §IV, Alg. 3-5, Eqs.
(2)-(7); KVUE = "state encoding" of Sun et al. 2021 §4.2): exact privacy
audits, the client's report distribution, the state-count estimators and
their exact variances, and the two errata (the sign of ``m`` and ``eps2``
in F2M's ``m_all``).

Notation (SPEC.md): state ``<1,-1> -> 0``, ``<0,0> -> 1``, ``<1,+1> -> 2``.
Every mechanism samples a key ``j`` uniformly; ``M`` = reports for a key,
``N_s`` = how many of those ``M`` users are in state ``s``.

Statistical checks run a mechanism many times on *fixed* users with fresh
perturbation seeds. Bands are 4.5 s.e. (Bonferroni over <= ~12 keys/cells:
P(|z| > 4.5) = 7e-6 per check). Expectations and variances are written out
from the papers in this file, never read back from the code under test.
"""
import functools
import math

import numpy as np
import pytest

from kvldp.mechanisms.base import ReportBatch, UserBatch
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.truth import truth_counts, truth_from_counts
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.randomness import batch_rng
from kvldp.mechanisms.registry import make
from kvldp.mechanisms.sun import F2M, KVOH, KVUE, ratio_estimates, states_of
from ldp_audit import all_users, check_vertex_argument, log_worst_ratio

Z = 4.5


def keep(eps):
    """Randomised response keep probability e^eps/(e^eps+1), written out."""
    return math.exp(eps) / (math.exp(eps) + 1)


def users_from_states(states):
    """Users whose discretisation is deterministic: state 2 -> holds the key
    with value +1, 0 -> value -1, 1 -> does not hold it (Disc(+-1) = +-1)."""
    states = np.asarray(states)
    held = states != 1
    owner, keys = np.nonzero(held)                 # row-major: keys sorted per user
    values = (states[owner, keys] - 1).astype(np.float64)
    return UserBatch(np.concatenate([[0], np.cumsum(held.sum(axis=1))]), keys, values)


def identical_users(pairs, n):
    keys = np.tile([k for k, _ in pairs], n).astype(np.int64)
    values = np.tile([v for _, v in pairs], n).astype(np.float64)
    return UserBatch(np.arange(n + 1) * len(pairs), keys, values)


# ---- the papers' estimators, written out ---------------------------------
def kvue_states_by_hand(stack, eps):
    """Eq. (4): N_s* = (2 M_s - (1 - p) M)/(3p - 1), p = e^eps/(e^eps + 2);
    KVUE's symbol is state - 1, so row s of the stack counts state s."""
    p = math.exp(eps) / (math.exp(eps) + 2)
    M = stack.sum(axis=0)
    return [(2 * stack[s] - (1 - p) * M) / (3 * p - 1) for s in range(3)], M


def kvoh_states_by_hand(stack, eps):
    """§IV-C: N_i* = ((e^(eps/2) + 1) M_i - N)/(e^(eps/2) - 1), M_i = number
    of reports with bit i set; KVOH's symbol is the 3-bit mask (bit s = state s)."""
    e = math.exp(eps / 2)
    M = stack.sum(axis=0)
    masks = np.arange(8)
    Ms = [stack[((masks >> s) & 1) == 1].sum(axis=0) for s in range(3)]
    return [((e + 1) * m - M) / (e - 1) for m in Ms], M


def f2m_by_hand(stack, eps1, eps2, default=1.0, m_all_eps=None):
    """Alg. 3 + Eq. (2). Symbols (-2, -1, 1, 2) = value * (1 + key bit).
    f = (f' - (1 - p1))/(2 p1 - 1) with f' the share of key bits 1;
    m_all = (e^eps2 + 1)/(e^eps2 - 1) (M1 - M_1)/(M1 + M_1) (SPEC erratum:
    the paper prints eps; ``m_all_eps`` overrides it to show the paper's
    version); m = (m_all - (1 - f) v_default)/f."""
    p1 = keep(eps1)
    M = stack.sum(axis=0)
    f = ((stack[0] + stack[3]) / M - (1 - p1)) / (2 * p1 - 1)
    e2 = math.exp(eps2 if m_all_eps is None else m_all_eps)
    M1, M_1 = stack[2] + stack[3], stack[0] + stack[1]
    m_all = (e2 + 1) / (e2 - 1) * (M1 - M_1) / (M1 + M_1)
    return f, (m_all - (1 - f) * default) / f


def z_scores(samples, truth):
    """(mean over repeats - truth) / (empirical s.d. / sqrt(R))."""
    samples = np.asarray(samples, dtype=np.float64)
    se = samples.std(axis=0, ddof=1) / math.sqrt(samples.shape[0])
    return (samples.mean(axis=0) - truth) / se


# =====================================================================
# 1. Exact privacy audits by enumeration
# =====================================================================
# Only vertex values v in {-1, +1} are needed: output_probabilities is affine
# in each held value (Disc(v) = +1 w.p. (1+v)/2, checked below), so a user
# with interior values has a convex combination of vertex users' output
# distributions, and a ratio of two convex combinations never exceeds the
# largest ratio between their components. The empty key set is one of the
# 3^d users enumerated.



def audit(mech):
    """ln of the worst P(y|S)/P(y|S') over all pairs of users and outputs y."""
    P = np.array([mech.output_probabilities(u) for u in all_users(mech.d)])
    assert P.shape == (3 ** mech.d, mech.d * len(mech.symbols))
    return log_worst_ratio(P)


EPSILONS = (0.5, 1.0, 2.0, 4.0)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_audit_is_exactly_epsilon(cls, eps, d):
    """KVUE: GRR over 3 states, worst ratio p/q = e^eps (Theorem 3).
    KVOH: two bits of the one-hot differ, each RR at eps/2: e^eps.
    F2M with eps1 = eps2 = eps/2 and v_default = 1: a holder of <j, -1> vs a
    non-holder (whose fake value is +1) on output (key bit 0, value +1):
    p1 p2 / ((1-p1)(1-p2)) = e^(eps1+eps2) = e^eps. The bound is attained
    and never exceeded."""
    mech = cls(d, eps)
    a = audit(mech)
    assert a <= eps + 1e-9
    assert a == pytest.approx(eps, rel=1e-9)


@pytest.mark.parametrize("eps", EPSILONS)
def test_f2m_splits_the_budget_evenly(eps):
    mech = F2M(3, eps)
    assert mech.p1 == pytest.approx(keep(eps / 2), rel=1e-15)
    assert mech.p2 == pytest.approx(keep(eps / 2), rel=1e-15)


@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_f2m_audit_with_other_defaults(eps):
    """v_default = -1 is a vertex as well (a holder of +1 vs a non-holder on
    (key 0, -1) attains e^eps); an interior default (0.3) gives a non-holder
    a value bit strictly between the holders' and the worst ratio is
    strictly inside the budget -- the audit tells these apart."""
    assert audit(F2M(3, eps, default_value=-1.0)) == pytest.approx(eps, rel=1e-9)
    inner = audit(F2M(3, eps, default_value=0.3))
    assert inner < eps - 1e-3, inner


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_audit_catches_wrong_probabilities(eps):
    """Plausible wrong variants are caught: KVOH with eps (not eps/2) per bit
    audits at 2 eps; KVUE with the binary RR keep probability e^eps/(e^eps+1)
    and the rest split over the two other states audits at eps + ln 2."""
    kvoh = KVOH(3, eps)
    kvoh.p = keep(eps)
    assert audit(kvoh) == pytest.approx(2 * eps, rel=1e-9)
    kvue = KVUE(3, eps)
    kvue.p = keep(eps)
    kvue.q = (1 - kvue.p) / 2
    assert audit(kvue) == pytest.approx(eps + math.log(2), rel=1e-9)


@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_output_probabilities_affine_in_values(cls):
    """The vertex argument's premise; fractional users stay within budget."""
    check_vertex_argument(cls(3, 1.0), 1.0, users_per_size=4)


def test_symbol_probabilities_by_hand():
    """The per-state symbol distributions of Eq. (3), Eq. (7) and Alg. 3."""
    eps = 1.3
    e = math.exp(eps)
    kvue = KVUE(4, eps)
    for s in range(3):
        want = np.full(3, 1 / (e + 2))
        want[s] = e / (e + 2)
        np.testing.assert_allclose(kvue.symbol_probabilities(s, 0), want, rtol=1e-14)
    kvoh, p = KVOH(4, eps), keep(eps / 2)
    for s in range(3):
        for mask in range(8):
            want = np.prod([p if ((mask >> b) & 1) == (b == s) else 1 - p for b in range(3)])
            assert kvoh.symbol_probabilities(s, 0)[mask] == pytest.approx(want, rel=1e-14)
    f2m, p1, p2 = F2M(4, eps, default_value=0.4), keep(eps / 2), keep(eps / 2)
    up = {0: 0.0, 1: 0.7, 2: 1.0}                       # P(Disc = +1): v = -1, default 0.4, +1
    for s in range(3):
        k1 = p1 if s != 1 else 1 - p1
        plus = up[s] * p2 + (1 - up[s]) * (1 - p2)
        want = [k1 * (1 - plus), (1 - k1) * (1 - plus), (1 - k1) * plus, k1 * plus]   # -2, -1, +1, +2
        np.testing.assert_allclose(f2m.symbol_probabilities(s, 0), want, rtol=1e-14)


# =====================================================================
# 2. perturb draws the audited distribution
# =====================================================================
PERTURB_USERS = [[(0, 0.5), (2, -1.0)], [(1, -0.3)], []]


@pytest.mark.parametrize("pairs", PERTURB_USERS, ids=["two-pairs", "one-pair", "empty"])
@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_perturb_matches_output_probabilities(cls, pairs):
    """One user repeated n = 200k times (d = 3, eps = 1): every (j, symbol)
    frequency within 4.5 binomial sigma of output_probabilities (which the
    audit above bounds); accumulate counts the same symbols."""
    d, eps, n = 3, 1.0, 200_000
    mech = cls(d, eps)
    rep = mech.perturb(identical_users(pairs, n), batch_rng(71, len(pairs) + 10 * len(mech.symbols)))
    np.testing.assert_array_equal(rep.offsets, np.arange(n + 1))
    index = {s: i for i, s in enumerate(mech.symbols)}
    assert set(np.unique(rep.symbols).tolist()) <= set(index)
    sym = np.vectorize(index.get)(rep.symbols.astype(np.int64))
    counts = np.bincount(rep.positions.astype(np.int64) * len(mech.symbols) + sym,
                         minlength=d * len(mech.symbols))
    probs = mech.output_probabilities(pairs)
    assert n * probs.min() > 50
    z = (counts / n - probs) / np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(z) < Z), z
    acc = mech.accumulate(mech.new_counts(), rep)
    assert acc[0] == n
    np.testing.assert_array_equal(mech.stack(acc).T.ravel(), counts)      # stack is (symbol, key)


@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_symbol_meaning_without_noise(cls):
    """At eps = 30 the perturbation keeps everything (flip probabilities
    <= 3e-7 per bit; 5,000 users): the symbol is the documented encoding of
    the sampled key's canonical pair -- KVUE: state - 1; KVOH: mask 1 << state;
    F2M: Disc(v or v_default) * (1 + key bit). Values are +-1 so the state
    is known; users hold key sets of every size."""
    n, d = 5000, 3
    rng = np.random.default_rng(12)
    states = rng.integers(0, 3, size=(n, d))
    users = users_from_states(states)
    mech = cls(d, 30.0)
    rep = mech.perturb(users, batch_rng(5, 0))
    j = rep.positions.astype(np.int64)
    s = states[np.arange(n), j]
    assert len(np.unique(j)) == d
    if cls is KVUE:
        want = s - 1
    elif cls is KVOH:
        want = 1 << s
    else:
        held = s != 1
        want = np.where(held, s - 1, 1) * (1 + held)            # default value +1
    np.testing.assert_array_equal(rep.symbols, want)


# =====================================================================
# 3. State counts: unbiased, with the exact variance (KVUE: not Eq. (5))
# =====================================================================
# Fixed users with deterministic states (values +-1), d = 2 so each key has
# M ~ 2000 reports; R = 1500 repeats. The true N_s among the M users who
# sampled key j is known per repeat (the report's position is j), so each
# repeat gives the standardised error z = (N_s* - N_s)/sqrt(Var(M, N_s)).
# E[z^2] = 1 iff Var is the exact variance; mean(z^2) over R repeats has
# relative s.e. sqrt(2/R) = 3.65%, so +-15% is 4.1 s.e.
VAR_D, VAR_N, VAR_R, VAR_CHUNK = 2, 4000, 1500, 100
VAR_EPS = math.log(9.0)       # e^eps = 9: 2 e^eps/(e^eps + 1) = 1.8 exactly
# key 0: f = 0.01 (30 users at +1, 10 at -1); key 1: f = 0.5 (1300 at +1, 700 at -1)
VAR_KEYS = [(30, 10), (1300, 700)]


@functools.lru_cache(maxsize=None)
def population_states():
    rng = np.random.default_rng(5)
    states = np.ones((VAR_N, VAR_D), dtype=np.int64)
    for j, (plus, minus) in enumerate(VAR_KEYS):
        who = rng.permutation(VAR_N)[:plus + minus]
        states[who[:plus], j] = 2
        states[who[plus:], j] = 0
    return states


def state_repeats(cls, R=VAR_R):
    return _state_repeats(cls, R)


@functools.lru_cache(maxsize=None)
def _state_repeats(cls, R):
    """``(mech, counts[R], truth[R, d, 3])``: R independent runs on the same
    users (perturbed VAR_CHUNK runs at a time as one tiled batch, then
    accumulated run by run) and the true state counts among each key's
    samplers."""
    states = population_states()
    mech = cls(VAR_D, VAR_EPS)
    users = users_from_states(np.tile(states, (VAR_CHUNK, 1)))
    counts, truth = [], []
    for c in range(R // VAR_CHUNK):
        rep = mech.perturb(users, batch_rng(8100 + c, 0))
        np.testing.assert_array_equal(rep.offsets, np.arange(users.n_users + 1))
        for r in range(VAR_CHUNK):
            s = slice(r * VAR_N, (r + 1) * VAR_N)
            one = ReportBatch(np.arange(VAR_N + 1), rep.positions[s], rep.symbols[s])
            counts.append(mech.accumulate(mech.new_counts(), one))
        j = rep.positions.astype(np.int64).reshape(VAR_CHUNK, VAR_N)
        true_state = states[np.arange(VAR_N)[None, :], j]
        idx = (np.arange(VAR_CHUNK)[:, None] * VAR_D + j) * 3 + true_state
        truth.append(np.bincount(idx.ravel(), minlength=VAR_CHUNK * VAR_D * 3).reshape(VAR_CHUNK, VAR_D, 3))
    return mech, np.array(counts), np.concatenate(truth).astype(np.float64)


def state_estimates(mech, counts):
    """``(N*[R, d, 3], M[R, d])`` through ``state_counts(stack(counts))``."""
    out = [mech.state_counts(mech.stack(c)) for c in counts]
    N = np.array([o[:3] for o in out]).transpose(0, 2, 1)
    return N, np.array([o[3] for o in out])


def kvue_exact_variance(M, N, eps):
    """4 [N p(1-p) + (M - N) q(1-q)] / (3p - 1)^2, p = e^eps/(e^eps+2), q = (1-p)/2."""
    p = math.exp(eps) / (math.exp(eps) + 2)
    q = (1 - p) / 2
    return 4 * (N * p * (1 - p) + (M - N) * q * (1 - q)) / (3 * p - 1) ** 2


def kvue_eq5(M, eps):
    """Sun et al. 2019 Eq. (5): M (e^eps + 1)/(e^eps - 1)^2."""
    e = math.exp(eps)
    return M * (e + 1) / (e - 1) ** 2


def kvoh_variance(M, eps):
    """§IV-C: M e^(eps/2)/(e^(eps/2) - 1)^2 (the symmetric UE: exact)."""
    e = math.exp(eps / 2)
    return M * e / (e - 1) ** 2


@pytest.mark.parametrize("cls", [KVUE, KVOH])
def test_state_counts_match_the_papers_formulas(cls):
    """state_counts(stack) is Eq. (4) (KVUE) / §IV-C's N_i* (KVOH), and the
    estimate's raw f, m are (N_2 + N_0)/M and (N_2 - N_0)/(N_2 + N_0)."""
    mech, counts, _ = state_repeats(cls)
    by_hand = kvue_states_by_hand if cls is KVUE else kvoh_states_by_hand
    for c in counts[:5]:
        stack = mech.stack(c)
        (N0, N1, N2), M = by_hand(stack, VAR_EPS)
        got = mech.state_counts(stack)
        for a, b in zip(got, (N0, N1, N2, M)):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-9)
        est = mech.estimate(c)
        np.testing.assert_allclose(est.frequency_raw, (N2 + N0) / M, rtol=1e-12)
        np.testing.assert_allclose(est.mean_raw, (N2 - N0) / (N2 + N0), rtol=1e-12)
        if cls is KVUE:      # GRR: the three calibrated counts add up to M exactly
            np.testing.assert_allclose(N0 + N1 + N2, M, rtol=1e-12)


def test_state_count_variance_methods_are_the_formulas():
    M = np.array([10.0, 2000.0, 1e6])
    for eps in (0.5, VAR_EPS, 4.0):
        for share in (0.0, 0.3, 1.0):
            np.testing.assert_allclose(KVUE(3, eps).state_count_variance(M, share * M),
                                       kvue_exact_variance(M, share * M, eps), rtol=1e-12)
        np.testing.assert_allclose(KVOH(3, eps).state_count_variance(M), kvoh_variance(M, eps), rtol=1e-12)
        # Eq. (5) is the N_s -> 0 limit of the exact KVUE variance
        np.testing.assert_allclose(kvue_exact_variance(M, 0.0, eps), kvue_eq5(M, eps), rtol=1e-12)


def check_state_counts(cls, R, band):
    mech, counts, truth = state_repeats(cls, R)
    N, M = state_estimates(mech, counts)
    np.testing.assert_array_equal(M, truth.sum(axis=2))
    assert truth[:, 0, [0, 2]].sum(axis=1).mean() == pytest.approx(M[:, 0].mean() * 0.01, rel=0.1)
    if cls is KVUE:
        var = kvue_exact_variance(M[..., None], truth, VAR_EPS)
        np.testing.assert_allclose(mech.state_count_variance(M[..., None], truth), var, rtol=1e-12)
    else:
        var = np.broadcast_to(kvoh_variance(M[..., None], VAR_EPS), truth.shape)
        np.testing.assert_allclose(mech.state_count_variance(M[..., None]) + 0 * truth, var, rtol=1e-12)
    z = (N - truth) / np.sqrt(var)
    zbar = z.mean(axis=0) * math.sqrt(R)
    assert np.all(np.abs(zbar) < Z), zbar
    ratio = (z ** 2).mean(axis=0)
    assert np.all(np.abs(ratio - 1) < band), ratio


@pytest.mark.parametrize("cls", [KVUE, KVOH])
def test_state_counts_unbiased_with_exact_variance(cls):
    """Per key and state: mean(z) within 4.5/sqrt(R) of 0 (unbiased), and
    mean(z^2) within +-15% of 1 (the exact variance)."""
    check_state_counts(cls, VAR_R, 0.15)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [KVUE, KVOH])
def test_state_counts_exact_variance_high_power(cls):
    """R = 6000 (~4 s): the relative s.e. of mean(z^2) is sqrt(2/6000) =
    1.8%, so +-8% is 4.4 s.e.; a variance formula off by 10% fails."""
    check_state_counts(cls, 6000, 0.08)


def test_kvue_eq5_is_only_the_small_count_limit():
    """Eq. (5), M (e^eps+1)/(e^eps-1)^2 = 4 M q(1-q)/(3p-1)^2, counts every
    sampler as if it were in another state; one in state s contributes
    p(1-p) = 2e^eps/(e^eps+1) q(1-q) instead. For the <0,0> state of a key
    held by 1% of users nearly all M samplers are in that state, and the
    exact variance is 0.99 * 2e^eps/(e^eps+1) + 0.01 = 1.79x Eq. (5) at
    e^eps = 9. The empirical variance matches the exact
    formula (test above) and is 1.79x Eq. (5) -- far outside Eq. (5)'s
    +-15% band -- wherever the two differ by more than 30% (15% + 4 s.e.);
    for states with N_s << M (key 0's holders) the two agree."""
    mech, counts, truth = state_repeats(KVUE)
    N, M = state_estimates(mech, counts)
    exact = kvue_exact_variance(M[..., None], truth, VAR_EPS)
    eq5 = kvue_eq5(M[..., None] + 0 * truth, VAR_EPS)
    gap = (exact / eq5).mean(axis=0)                 # (key, state)
    assert gap[0, 1] == pytest.approx(0.99 * 1.8 + 0.01, rel=0.01)
    err2 = (N - truth) ** 2
    emp_over_eq5 = (err2 / eq5).mean(axis=0)
    emp_over_exact = (err2 / exact).mean(axis=0)
    far = gap > 1.3
    assert far[0, 1] and far[1, 1], gap          # <0,0>: 1.79x (key 0, f = 0.01), 1.40x (key 1, f = 0.5)
    assert np.all(np.abs(emp_over_eq5[far] - 1) > 0.15), emp_over_eq5
    assert np.all(np.abs(emp_over_eq5[far] / gap[far] - 1) < 0.15), (emp_over_eq5, gap)
    assert np.all(np.abs(emp_over_exact - 1) < 0.15), emp_over_exact
    near = gap < 1.02                                # key 0's states 0 and 2
    assert near[0, 0] and near[0, 2]
    assert np.all(np.abs(emp_over_eq5[near] - 1) < 0.15)


# =====================================================================
# 4. Frequencies unbiased; F2M's mean consistent; the errata
# =====================================================================
@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_frequency_is_unbiased(cls):
    """Given the M samplers of key j, E[f_hat | M] = H/M (H = holders among
    them: the state counts / key bit are calibrated without bias); the M
    samplers are a uniformly random subset of the users, so E[H/M] = f
    exactly. Average raw f over R = 1500 runs within 4.5 s.e. of f = (0.01,
    0.5). The uncalibrated share of "held" reports is rejected by > 10 s.e.
    (for F2M only at f = 0.01: its key-bit share f p1 + (1-f)(1-p1) is 1/2 at f = 1/2)."""
    mech, counts, _ = state_repeats(cls)
    f_true = np.array([sum(k) for k in VAR_KEYS]) / VAR_N
    fr = np.array([mech.estimate(c).frequency_raw for c in counts[:VAR_R]])
    z = z_scores(fr, f_true)
    assert np.all(np.abs(z) < Z), z
    stacks = np.array([mech.stack(c) for c in counts])
    if cls is KVUE:
        naive = (stacks[:, 0] + stacks[:, 2]) / stacks.sum(axis=1)
    elif cls is KVOH:
        masks = np.arange(8)
        naive = stacks[:, ((masks & 1) == 1) | ((masks & 4) == 4)].sum(axis=1) / stacks.sum(axis=1)
    else:
        naive = (stacks[:, 0] + stacks[:, 3]) / stacks.sum(axis=1)
    z_naive = np.abs(z_scores(naive, f_true))
    assert z_naive[0] > 10, z_naive
    if cls is not F2M:       # F2M's key-bit share f p1 + (1-f)(1-p1) is 1/2 at f = 1/2
        assert z_naive[1] > 10, z_naive


def test_f2m_estimates_are_the_papers_formulas():
    mech, counts, _ = state_repeats(F2M)
    for c in counts[:5]:
        est = mech.estimate(c)
        f, m = f2m_by_hand(mech.stack(c), VAR_EPS / 2, VAR_EPS / 2)
        np.testing.assert_allclose(est.frequency_raw, f, rtol=1e-12)
        np.testing.assert_allclose(est.mean_raw, m, rtol=1e-10)


F2M_D = 4
F2M_SIZES = (100_000, 1_600_000)


@functools.lru_cache(maxsize=None)
def f2m_runs(eps):
    """One F2M run per size on the 'multi' data (1 + Poisson(1) keys among
    4, f = 0.33 .. 0.72); the small set is the first batch of the large one."""
    out = []
    for i, n in enumerate(F2M_SIZES):
        data = SyntheticDataset("multi", n_users=n, d=F2M_D, seed=3, lam=1.0)
        out.append(run_local(F2M(F2M_D, eps), data, seed=9100 + i))
    return out


def test_f2m_mean_is_consistent():
    """F2M's m = (m_all - (1 - f) v_default)/f is a ratio (consistent, not
    unbiased). At n = 100k and 1.6M (d = 4, eps = 2) every key's raw mean
    and frequency are within 4.5 reported s.e. of the truth; the s.e. shrink
    by sqrt(16) = 4 (+-20%); the squared error summed over keys shrinks."""
    small, large = f2m_runs(2.0)
    errs = []
    for res in (small, large):
        f, m = res.true_values(F2M_D)
        e = res.estimates
        assert np.all(np.abs(e.mean_raw - m) < Z * e.mean_se), (e.mean_raw, m, e.mean_se)
        assert np.all(np.abs(e.frequency_raw - f) < Z * e.frequency_se)
        errs.append(((e.mean_raw - m) ** 2).sum())
    assert errs[1] < errs[0], errs
    for attr in ("mean_se", "frequency_se"):
        ratio = getattr(small.estimates, attr) / getattr(large.estimates, attr)
        assert np.all(np.abs(ratio / 4 - 1) < 0.2), (attr, ratio)


def test_f2m_m_all_uses_eps2_not_eps():
    """SPEC erratum: the paper's m_all factor (e^eps + 1)/(e^eps - 1) with
    the full eps shrinks m_all (here by 0.61 at eps = 2) and biases m by
    -0.39 (1 - f)/f + (0.61 - 1) m: off by > 10 s.e. on every key at n = 1.6M,
    while the eps2 version (what estimate() returns) is within 4.5 s.e."""
    eps = 2.0
    _, large = f2m_runs(eps)
    f, m = large.true_values(F2M_D)
    stack = F2M(F2M_D, eps).stack(large.counts)
    _, m_right = f2m_by_hand(stack, eps / 2, eps / 2)
    _, m_paper = f2m_by_hand(stack, eps / 2, eps / 2, m_all_eps=eps)
    se = large.estimates.mean_se
    np.testing.assert_allclose(large.estimates.mean_raw, m_right, rtol=1e-10)
    assert np.all(np.abs(m_right - m) < Z * se)
    assert np.all(np.abs(m_paper - m) > 10 * se), (m_paper, m, se)


@functools.lru_cache(maxsize=None)
def sign_population():
    """n = 200k, d = 2: key 0 held by 30% with value +0.8 (Disc random,
    E[Disc] = 0.8), key 1 by 40% with value -0.5; independent."""
    rng = np.random.default_rng(17)
    n = 200_000
    held = rng.random((n, 2)) < [0.3, 0.4]
    owner, keys = np.nonzero(held)
    values = np.where(keys == 0, 0.8, -0.5)
    return UserBatch(np.concatenate([[0], np.cumsum(held.sum(axis=1))]), keys, values)


@pytest.mark.parametrize("cls", [KVUE, KVOH])
def test_mean_sign_erratum(cls):
    """m = (N_2 - N_0)/(N_2 + N_0): a key with mean +0.8 is estimated
    positive, within 4.5 s.e. of 0.8. The paper's literal m = (N_A - N_B)/
    (N_A + N_B), with N_A the count of <1,-1> and N_B of <1,1> (its labels
    in §IV-D), flips the sign: ~-0.8, > 10 s.e. away."""
    users = sign_population()
    mech = cls(2, 2.0)
    counts = mech.accumulate(mech.new_counts(), mech.perturb(users, batch_rng(31, 0)))
    est = mech.estimate(counts)
    truth = truth_counts(users, 2)
    _, m = truth_from_counts(truth, 2)
    np.testing.assert_allclose(m, [0.8, -0.5], rtol=1e-9)      # truth sums are rounded to 2^-20
    assert est.mean_raw[0] > 0 and est.mean_raw[1] < 0
    assert np.all(np.abs(est.mean_raw - m) < Z * est.mean_se), (est.mean_raw, est.mean_se)
    N_A, _, N_B, _ = mech.state_counts(mech.stack(counts))
    paper = (N_A - N_B) / (N_A + N_B)
    np.testing.assert_allclose(paper, -est.mean_raw, rtol=1e-12)
    assert np.all(np.abs(paper - m) > 10 * est.mean_se)


# =====================================================================
# 5. Heavy-tailed raw means; clipping
# =====================================================================
@functools.lru_cache(maxsize=None)
def sparse_runs(eps):
    """'uu' data, d = 100 (f ~ 0.01 per key, ~10 holders among each key's
    ~1000 samplers), n = 100k."""
    data = SyntheticDataset("uu", n_users=100_000, d=100, seed=3)
    return {cls: run_local(cls(100, eps), data, seed=4100) for cls in (KVUE, KVOH, F2M)}


@pytest.mark.parametrize("eps", [1.0, 2.0])
@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_raw_mean_heavy_tailed_clipped_mean_in_range(cls, eps):
    """SPEC: at f ~ 0.01 and eps <= 2 the ratio means are heavy-tailed; the
    raw estimate leaves [-1, 1] on some key (seeded), the clipped default
    never does, and the clipped frequency stays in [0, 1]. Where clipping
    does not bite the clipped mean is the raw one. The mean is null exactly
    where the estimated frequency is <= 0."""
    res = sparse_runs(eps)[cls]
    e = res.estimates
    estimable = e.frequency_raw > 0
    assert np.array_equal(np.isfinite(e.mean), estimable) and np.all(np.isfinite(e.frequency))
    assert np.all(np.abs(e.mean[estimable]) <= 1)
    assert np.all((e.frequency >= 0) & (e.frequency <= 1))
    assert np.abs(e.mean_raw).max() > 1, np.abs(e.mean_raw).max()
    f, m = res.true_values(100)
    mse_raw, mse_clip = np.mean((e.mean_raw - m) ** 2), np.mean((e.mean - m)[estimable] ** 2)
    assert mse_raw > 10 and mse_clip < mse_raw, (mse_clip, mse_raw)   # SPEC: raw MSE 10 .. 10^4 here
    assert mse_clip <= 4                                 # |m_hat - m| <= 2
    if cls is not F2M:
        N0, _, N2, M = cls(100, eps).state_counts(cls(100, eps).stack(res.counts))
        inside = (N0 >= 0) & (N2 >= 0) & (N0 <= M) & (N2 <= M) & (np.abs(e.mean_raw) <= 1)
        assert inside.any()
        np.testing.assert_allclose(e.mean[inside], e.mean_raw[inside], rtol=1e-12)
        np.testing.assert_allclose(e.frequency[inside], np.clip(e.frequency_raw[inside], 0, 1), rtol=1e-12)


def test_ratio_estimates_clip_counts_first():
    """PrivKV's clipping: N_0, N_2 into [0, M] before the ratios."""
    N0 = np.array([-5.0, 30.0, 120.0, 0.0])
    N2 = np.array([10.0, -3.0, 50.0, 0.0])
    M = np.array([100.0, 100.0, 100.0, 100.0])
    f, m = ratio_estimates(N0, N2, M, clip=True)
    np.testing.assert_allclose(f, [0.1, 0.3, 1.5, 0.0])
    np.testing.assert_allclose(m, [1.0, -1.0, (50 - 100) / 150, 0.0])
    f, m = ratio_estimates(N0, N2, M, clip=False)
    np.testing.assert_allclose(f, [0.05, 0.27, 1.7, 0.0])
    np.testing.assert_allclose(m, [15 / 5, -33 / 27, -70 / 170, 0.0])


def test_states_of():
    """state = key_bit * Disc(v) + 1: non-holders 1, holders of +-1 at 2 / 0,
    and a holder of v is at 2 with probability (1 + v)/2."""
    rng = np.random.default_rng(0)
    held = np.array([False, True, True, False])
    np.testing.assert_array_equal(states_of(held, np.array([0.0, 1.0, -1.0, 0.7]), rng), [1, 2, 0, 1])
    n, v = 200_000, 0.3
    s = states_of(np.ones(n, bool), np.full(n, v), np.random.default_rng(1))
    assert set(np.unique(s)) == {0, 2}
    p = (1 + v) / 2
    assert abs((s == 2).mean() - p) < Z * math.sqrt(p * (1 - p) / n)


# =====================================================================
# 6. Validation and plumbing
# =====================================================================
@pytest.mark.parametrize("make_bad", [
    lambda: F2M(3, 1.0, default_value=1.5), lambda: F2M(3, 1.0, default_value=-1.01),
    lambda: KVUE(3, 0.0), lambda: KVOH(3, -1.0), lambda: F2M(3, float("nan")),
    lambda: KVUE(0, 1.0), lambda: KVOH(3, 31.0),
])
def test_constructors_reject_bad_parameters(make_bad):
    with pytest.raises(ValueError):
        make_bad()


@pytest.mark.parametrize("cls, bad_symbol", [(KVUE, 2), (KVUE, -2), (KVOH, 8), (KVOH, -1), (F2M, 0), (F2M, 3)])
def test_accumulate_rejects_foreign_reports(cls, bad_symbol):
    mech = cls(3, 1.0)
    good = mech.symbols[0]
    with pytest.raises(ValueError):
        mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2], [0, 1], [good, bad_symbol]))
    for bad_key in (3, -1):
        with pytest.raises(ValueError):
            mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2], [0, bad_key], [good, good]))
    c = mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2, 3], [0, 2, 2], [good, good, mech.symbols[-1]]))
    assert c[0] == 3
    stack = mech.stack(c)
    assert stack[0, 0] == 1 and stack[0, 2] == 1 and stack[-1, 2] == 1 and stack.sum() == 3


@pytest.mark.parametrize("name, cls", [("kvue", KVUE), ("kvoh", KVOH), ("f2m", F2M)])
def test_registry(name, cls):
    mech = make(name, 5, 1.5)
    assert type(mech) is cls and mech.d == 5 and mech.epsilon == 1.5
    assert make("f2m", 5, 1.5, default_value=-0.5).default_value == -0.5 if cls is F2M else True
