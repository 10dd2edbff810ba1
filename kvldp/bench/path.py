"""One timed run of one path, in a process of its own (``kvldp bench --sweep``).

``python -m kvldp.bench.path PATH MECHANISM USERS KEYS SEED OUT.npy [option=value …]``
runs the mechanism on synthetic users either on the pure-NumPy local runner
(``numpy``) or as the Beam pipeline of ``simulate`` (``beam``), saves the
frequency estimates (in ``estimate_keys`` order) to ``OUT.npy`` and prints
one JSON line: the run's seconds (imports and set-up excluded), the
process's peak RSS, and for Beam the run's split (``graph_seconds``, its
pipeline built and translated up to the first stage; ``stages_seconds``;
``read_seconds``). Its own process, so one path's memory never counts
against the other's and the parent can time the whole command.
"""
from __future__ import annotations

import json
import resource
import sys
import time


def main(argv: list[str]) -> dict:
    path, name, users, keys, seed, out, *options = argv
    # set up as the ``kvldp`` command's start does for a local job (``runtime.start``): before any import
    # that starts threads
    from kvldp.runtime import process, tweaks
    tuning = tweaks.active()
    process.set_up(tuning)
    from kvldp.pipelines.mechanism_config import MechanismConfig
    from kvldp.pipelines.sources import DataConfig, Seeds, built_in_dataset

    given = dict(option.split("=", 1) for option in options)
    epsilon = float(given.pop("epsilon", "4"))
    data = DataConfig("synthetic-uu", users=int(users), keys=int(keys), seed=int(seed))
    seeds = Seeds.of(data)
    dataset = built_in_dataset(data, seeds.data)
    chosen = MechanismConfig(name, epsilon, {k: _number(v) for k, v in given.items()},
                             ioh_top=3 if name.startswith("ioh") else None)
    from kvldp.pipelines import mechanism_config
    ioh_keys = mechanism_config.resolve_ioh_keys(chosen, data, [], dataset.key_names, dataset, None)
    mechanism = chosen.make(dataset.d, dataset, ioh_keys)
    data = data.sized_for(mechanism, dataset.d)
    if path not in ("numpy", "beam"):
        raise ValueError(f"path is numpy or beam, not {path!r}")
    # imported before the clock starts (as the docstring says: imports excluded)
    from kvldp.bench.command import beam_frequencies
    from kvldp.mechanisms.local import run_local
    from kvldp.mechanisms.privacy.randomness import noise_generator_name
    from kvldp.runtime.local_runner import tuned
    # the noise generators' module (randomgen) is imported by the first batch
    # otherwise: ~15 ms on either path, which at 10^6 users is a third of a
    # NumPy run and would count an import as the run's work
    noise_generator_name(seeds.perturb)
    import numpy as np
    process.settle(tuning)
    phases: dict = {}
    start = time.perf_counter()
    if path == "numpy":
        frequency = run_local(mechanism, dataset, seeds.perturb, data.sized_batch).estimates.frequency
    else:
        with tuned(True):
            frequency = beam_frequencies(data, [], dataset, mechanism, seeds.perturb, phases)
    seconds = time.perf_counter() - start
    np.save(out, np.asarray(frequency, dtype=np.float64))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"path": path, "mechanism": name, "users": int(users), "seconds": seconds, "peak_rss_mb": peak,
            "batch": data.sized_batch, **{f"{phase}_seconds": value for phase, value in phases.items()}}


def _number(text: str):
    """An option's value: a whole number, a number, or the text."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])), flush=True)
