"""Shared pieces of the tests of F2M, KVUE and KVOH (``test_sun_*.py``;
SPEC.md §2; Sun et al. 2019 §IV, Alg. 3-5, Eqs. (2)-(7); KVUE = "state
encoding" of Sun et al. 2021 §4.2).

Notation (SPEC.md): state ``<1,-1> -> 0``, ``<0,0> -> 1``, ``<1,+1> -> 2``.
Every mechanism samples a key ``j`` uniformly; ``M`` = reports for a key,
``N_s`` = how many of those ``M`` users are in state ``s``.

Statistical checks run a mechanism many times on *fixed* users with fresh
perturbation seeds. Bands are ``Z`` = 4.5 s.e. (tolerances.py; Bonferroni
over <= ~12 keys/cells: P(|z| > 4.5) = 7e-6 per check). Expectations and
variances are written out from the papers in the tests, never read back
from the code under test.
"""
import functools
import math

import numpy as np

from kvldp.mechanisms.base import ReportBatch
from kvldp.mechanisms.privacy.randomness import batch_rng
from user_batches import users_from_states

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


@functools.cache
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


@functools.cache
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
