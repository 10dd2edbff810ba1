"""The pure local runner: any registered mechanism or protocol over in-memory batches.

The same per-batch steps the Beam pipeline runs (generate -> pick the
round's participants -> perturb with the batch's generator -> accumulate ->
advance), in a plain loop. Counts are integers added in any order, so for the
same seed its estimates equal the pipeline's exactly; it is also the NumPy
baseline of ``kvldp bench``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE, Estimates
from kvldp.mechanisms.estimation.truth import truth_counts, truth_from_counts
from kvldp.mechanisms.privacy.randomness import batch_rng
from kvldp.mechanisms.protocol import Collection, Protocol, ProtocolState, check_count_draw


@dataclasses.dataclass
class LocalResult:
    state: ProtocolState          # after the last round
    estimates: Estimates
    truth: np.ndarray             # truth_counts summed over every batch
    round_counts: list            # the counts of each round (zeros for rounds after a stop)
    states: list                  # the state after each round (index r = after round r+1)

    @property
    def counts(self) -> np.ndarray:
        """The counts of a single-round mechanism."""
        if len(self.round_counts) != 1:
            raise ValueError(f"{len(self.round_counts)} rounds ran: use round_counts")
        return self.round_counts[0]

    def true_values(self, d: int):
        return truth_from_counts(self.truth, d)


def run_local(protocol: Protocol, dataset, seed: int, batch_size: int = DEFAULT_BATCH_SIZE,
              draw_counts: bool = False) -> LocalResult:
    """Run every round of ``protocol`` over ``dataset`` (anything with ``d``
    and ``batches(batch_size)``) in this process: the same users each round;
    batch ``b`` of round ``r`` uses ``batch_rng(seed, b, round=r)``; groups
    come from ``Collection.from_seed(seed)``. ``draw_counts``: each batch's
    counts are drawn without its reports (``Protocol.draw_round_counts``)."""
    if draw_counts:
        check_count_draw(protocol)
    if dataset.d != protocol.d:
        raise ValueError(f"dataset has d={dataset.d} keys but the mechanism expects d={protocol.d}")
    state = protocol.initial_state(Collection.from_seed(seed))
    truth = np.zeros(1 + 2 * protocol.d)
    all_counts, states = [], []
    for r in range(protocol.max_rounds):
        counts = protocol.new_round_counts(r)
        if state.stopped:      # no user reports after the stop: skip the work
            all_counts.append(counts)
            states.append(state)
            continue
        for users in dataset.batches(batch_size):
            if r == 0:
                truth += truth_counts(users, protocol.d)
            rng = batch_rng(seed, users.batch_id, round_index=r)
            mine = protocol.participants(r, users, state)
            if draw_counts:
                counts += protocol.draw_round_counts(r, mine, rng, state)
            else:
                protocol.accumulate_round(r, counts, protocol.perturb_round(r, mine, rng, state))
        state = protocol.next_state(r, state, counts)
        all_counts.append(counts)
        states.append(state)
    return LocalResult(state, protocol.estimates(state), truth, all_counts, states)
