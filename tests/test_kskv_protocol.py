"""KSKV protocol plumbing: disjoint seeded user groups, the budget ledger
(every user spends eps once) and construction / validation (SPEC.md §4).
"""
import math

import numpy as np
import pytest

from kvldp.mechanisms import registry
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.kv.ksadap import KSAdap
from kvldp.mechanisms.kv.kskv import KSGRR, KSUE
from kvldp.mechanisms.privacy.accountant import Accountant
from kvldp.mechanisms.protocol import Collection, assign_groups
from tolerances import Z_FEW, binomial_sigma


# =====================================================================
# 1. Groups and budget
# =====================================================================
def indexed_batches(n, batch):
    """Single-pair users whose key is their global index (identity survives subset)."""
    out = []
    for b, start in enumerate(range(0, n, batch)):
        stop = min(start + batch, n)
        out.append(UserBatch.single_pair(np.arange(start, stop), np.zeros(stop - start), batch_id=b))
    return out


@pytest.mark.parametrize("proto", [KSAdap(10, 1.0, top=2), KSGRR(10, 1.0, top=2, group_split=0.3),
                                   KSGRR(10, 1.0, top=2)], ids=["adap", "grr-0.3", "grr"])
def test_group_split_is_disjoint_complete_and_seeded(proto):
    """participants over 4 batches of 50k users: the round groups are
    pairwise disjoint and cover everyone; repeated calls return the same
    users; each round's users are those assign_groups puts in its group;
    shares are within 4 binomial sigma of the configured ones; another seed,
    or another batch, gives an independent assignment (agreement with the
    first ~ sum of squared shares, 4 sigma)."""
    n = 200_000
    state = proto.initial_state(Collection.from_seed(12))
    seed = state.collection.key
    shares = proto.group_shares
    batches = indexed_batches(n, 50_000)
    rounds = range(proto.max_rounds)
    members = [np.concatenate([proto.participants(r, u, state).keys for u in batches]) for r in rounds]
    again = [np.concatenate([proto.participants(r, u, state).keys for u in batches]) for r in rounds]
    for a, b in zip(members, again, strict=True):
        np.testing.assert_array_equal(a, b)
    everyone = np.concatenate(members)
    assert len(everyone) == n and len(np.unique(everyone)) == n        # disjoint and complete
    for r, m in enumerate(members):
        g = np.concatenate([assign_groups(seed, u.batch_id, u.n_users, shares) for u in batches])
        np.testing.assert_array_equal(m, np.flatnonzero(g == proto.round_groups[r]))
        s = shares[proto.round_groups[r]]
        assert abs(len(m) - n * s) < Z_FEW * math.sqrt(n * s * (1 - s)), (r, len(m))
    same = sum(s * s for s in shares)
    sd = binomial_sigma(same, 50_000)
    g0 = assign_groups(seed, 0, 50_000, shares)
    assert abs(np.mean(g0 == assign_groups(seed + 1, 0, 50_000, shares)) - same) < Z_FEW * sd
    assert abs(np.mean(g0 == assign_groups(seed, 1, 50_000, shares)) - same) < Z_FEW * sd
    np.testing.assert_array_equal(g0, assign_groups(seed, 0, 50_000, shares))


@pytest.mark.parametrize("proto", [KSGRR(20, 1.3, top=3), KSGRR(20, 0.7, top=3, group_split=0.3),
                                   KSAdap(20, 2.0, top=4), KSAdap(20, 2.0, top=4, group_shares=(0.2, 0.3, 0.5))],
                         ids=["grr", "grr-0.3", "adap", "adap-shares"])
def test_budget_ledger_every_user_spends_eps_once(proto):
    """Each group reports in exactly one round, with the whole eps, and every
    round belongs to one group: per user eps is spent once."""
    eps = proto.epsilon
    led = proto.ledger
    assert isinstance(led, Accountant) and led.total == eps
    assert len(led.shares) == proto.max_rounds == len(proto.group_shares)
    assert proto.round_groups == tuple(range(proto.max_rounds))
    assert led.groups == sorted(f"group{g + 1}" for g in range(len(proto.group_shares)))
    for g in led.groups:
        mine = [s for s in led.shares if s.group == g]
        assert len(mine) == 1 and mine[0].epsilon == eps
        assert f"group{proto.round_groups[mine[0].round] + 1}" == g
        assert led.spent(group=g) == pytest.approx(eps, rel=1e-12)
    assert led.spent() == pytest.approx(eps, rel=1e-12)
    assert sorted(s.round for s in led.shares) == list(range(proto.max_rounds))
    for r in range(proto.max_rounds):
        assert led.round_epsilon(r) == pytest.approx(eps, rel=1e-12)


# =====================================================================
# 2. Construction
# =====================================================================
def test_registry_and_validation():
    assert isinstance(registry.make("ks-ue", 10, 1.0, padding=2), KSUE)
    g = registry.make("ks-grr", 50, 1.0, top=3, group_split=0.4)
    assert isinstance(g, KSGRR) and g.group_shares == (0.4, 0.6) and g.n_candidates == 6
    a = registry.make("ks-adap", 50, 1.0, top=3, coverage=0.8)
    assert isinstance(a, KSAdap) and a.coverage == 0.8 and a.group_shares == (0.4, 0.1, 0.5)
    assert KSAdap(100, 1.0, top=20).max_size == 16 and KSAdap(100, 1.0, top=3).max_size == 6
    for bad in (dict(top=0), dict(top=1.5), dict(group_split=0.0), dict(group_split=1.0)):
        with pytest.raises(ValueError):
            KSGRR(10, 1.0, **bad)
    for bad in (dict(coverage=0.0), dict(coverage=1.2), dict(group_shares=(0.5, 0.5)),
                dict(group_shares=(0.4, 0.4, 0.4))):
        with pytest.raises(ValueError):
            KSAdap(10, 1.0, **bad)
