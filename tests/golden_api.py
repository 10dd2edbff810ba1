"""The entry points ``golden_runs.fingerprints`` calls, for this tree's API."""
from __future__ import annotations

import types

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.protocol import Collection
from kvldp.mechanisms.privacy.randomness import batch_rng


def _run(mech, data, seed, batch_size):
    """Every round's report batches and counts, and the final estimates."""
    state = mech.initial_state(Collection.from_seed(seed))
    rounds = []
    for r in range(mech.max_rounds):
        if state.stopped:
            break
        reports, counts = [], mech.new_round_counts(r)
        for users in data.batches(batch_size):
            rng = batch_rng(seed, users.batch_id, round_index=r)
            rep = mech.perturb_round(r, mech.participants(r, users, state), rng, state)
            reports.append(rep)
            mech.accumulate_round(r, counts, rep)
        state = mech.next_state(r, state, counts)
        rounds.append((reports, counts))
    return {"rounds": rounds, "estimates": mech.estimates(state)}


API = types.SimpleNamespace(
    names=registry.names,
    make=registry.make,
    dataset=lambda kind, n, d, seed: SyntheticDataset(kind, n_users=n, d=d, seed=seed),
    run=_run,
)
