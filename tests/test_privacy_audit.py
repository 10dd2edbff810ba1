"""The exact privacy audit of every registered mechanism, every round.

For each mechanism of the registry (so a new one is audited the moment it is
registered), with a small domain (d = 3, l = 2, two IOH keys, two KS
candidates): enumerate every user with vertex values (``ldp_audit``), take
each round's exact report distribution from ``output_probabilities`` given
the state the round really starts from (from a local run), and assert that no
report is more than ``e^eps_r`` times likelier for one user than for another,
``eps_r`` being what the mechanism's budget ledger says round ``r`` spends.
"""
import math

import numpy as np
import pytest

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.local import run_local
from ldp_audit import all_users, log_worst_ratio

D, EPS = 3, 1.5
OPTIONS = {"pckv-ue": {"padding": 2}, "pckv-grr": {"padding": 2}, "ks-ue": {"padding": 2},
           "ioh-oue": {"ioh_keys": (0, 2)}, "ioh-sue": {"ioh_keys": (1, 2)},
           "ks-grr": {"top": 1}, "ks-adap": {"top": 1}, "privkvm": {"rounds": 3},
           "privkvm-plus": {"a0": 0.01, "max_rounds": 4}}
USERS = list(all_users(D))


def rounds_to_audit():
    for name in registry.names():
        mech = registry.make(name, D, EPS, **OPTIONS.get(name, {}))
        run = run_local(mech, SyntheticDataset("multi", n_users=4_000, d=D, seed=5), seed=11, batch_size=1_000)
        starts = [mech.initial_state(run.states[0].collection), *run.states[:-1]]
        for r, state in enumerate(starts):
            if not state.stopped:
                yield pytest.param(mech, r, state, id=f"{name}-round{r + 1}")


@pytest.mark.parametrize("mech, round_index, state", list(rounds_to_audit()))
def test_every_round_within_its_ledger_share(mech, round_index, state):
    P = np.array([mech.output_probabilities(u, round_index, state) for u in USERS])
    eps_round = mech.ledger.round_epsilon(round_index)
    assert 0 < eps_round <= mech.epsilon + 1e-12
    worst = log_worst_ratio(P)          # also: rows are distributions with full support
    assert worst <= eps_round + 1e-9, f"ln worst ratio {worst:.6g} > round share {eps_round:.6g}"
    # not vacuous: users are told apart (a constant report would pass trivially)
    assert worst > 0.05 * eps_round


def test_every_registered_mechanism_is_audited():
    audited = {p.values[0].name for p in rounds_to_audit()}
    assert audited == {registry.make(n, D, EPS, **OPTIONS.get(n, {})).name for n in registry.names()}


def test_ledger_spends_the_stated_budget():
    """Across rounds, every mechanism's ledger adds up to at most epsilon, and
    a single-round mechanism's to exactly epsilon."""
    for name in registry.names():
        mech = registry.make(name, D, EPS, **OPTIONS.get(name, {}))
        assert mech.ledger.total == EPS
        assert mech.ledger.spent() <= EPS * (1 + 1e-12)
        if mech.max_rounds == 1:
            assert math.isclose(mech.ledger.spent(), EPS, rel_tol=1e-12)


# -- the audited distributions are the ones perturb draws from ----------------

def test_ioh_output_probabilities_agree_with_the_per_cell_formula():
    mech = registry.make("ioh-oue", D, EPS, ioh_keys=(0, 2))
    import itertools

    ys = np.array(list(itertools.product((0, 1), repeat=mech.n_cells)), dtype=np.uint8)
    for user in ([], [(0, 1.0)], [(0, -1.0), (2, 1.0)], [(1, 1.0), (2, -1.0)]):
        held = dict(user)
        states = [1 if k not in held else (2 if held[k] > 0 else 0) for k in mech.ioh_keys]
        cell = states[0] * 3 + states[1]
        expect = np.array([mech.output_probability(cell, y) for y in ys])
        np.testing.assert_allclose(mech.output_probabilities(user), expect, rtol=1e-12, atol=0)


@pytest.mark.parametrize("name, round_index", [("ks-grr", 1), ("ks-adap", 2)])
@pytest.mark.parametrize("user", [[], [(0, 1.0)], [(0, -1.0), (1, 1.0)], [(0, 1.0), (1, -1.0), (2, 1.0)]])
def test_ks_final_round_draws_its_output_probabilities(name, round_index, user):
    """200k draws of one user: every (pair, sign) count within 4.5 binomial s.d."""
    from kvldp.mechanisms.base import UserBatch
    from kvldp.mechanisms.privacy.randomness import batch_rng

    mech = registry.make(name, D, EPS, **OPTIONS[name])
    run = run_local(mech, SyntheticDataset("multi", n_users=4_000, d=D, seed=5), seed=11, batch_size=1_000)
    state = run.states[round_index - 1]
    n = 200_000
    keys = np.array([k for k, _ in user] * n, dtype=np.int64)
    values = np.array([v for _, v in user] * n)
    users = UserBatch(np.arange(n + 1) * len(user), keys, values)
    reports = mech.perturb_round(round_index, users, batch_rng(3, 0, round_index=round_index), state)
    index = 2 * reports.positions.astype(np.int64) + (reports.symbols > 0)
    expect = mech.output_probabilities(user, round_index, state)
    counts = np.bincount(index, minlength=len(expect))
    assert len(counts) == len(expect) and counts.sum() == n
    assert np.all(np.abs(counts - n * expect) <= 4.5 * np.sqrt(n * expect * (1 - expect)))
