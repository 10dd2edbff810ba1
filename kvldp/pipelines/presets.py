"""The papers' experimental setups as ``kvldp evaluate --preset NAME``.

Every value can be overridden on the command line.
"""

EPSILONS_PCKV = "0.1,1,2,3,4,5,6"

PRESETS = {
    # PCKV Fig. 6(a)/(b) ("fig1a" in the authors' PG1.m): synthetic UU, all keys
    "pckv-fig1a": {"dataset": "synthetic-uu", "users": 1_000_000, "keys": 100, "padding": 1,
                   "mechanisms": "privkv,privkvm-vi,kvue,pckv-ue,pckv-grr", "epsilons": EPSILONS_PCKV,
                   "top_sets": "20", "repeats": 5},
    # PCKV Fig. 10(b) (PG2.m): Clothing, l = 2, the 50 most frequent keys
    "pckv-fig10b": {"dataset": "clothing", "padding": 2,
                    "mechanisms": "privkv,privkvm-vi,kvue,pckv-ue,pckv-grr", "epsilons": EPSILONS_PCKV,
                    "top_sets": "50", "repeats": 5},
    # Sun et al. 2019 Fig. 1: the PrivKV family vs F2M, KVUE, KVOH (PrivKVM with 10 rounds)
    "sun-fig1": {"dataset": "synthetic-uu", "users": 100_000, "keys": 100,
                 "mechanisms": "privkv,privkv-a,f2m,kvue,kvoh,privkvm", "rounds": 10,
                 "epsilons": "0.1,0.5,1,2,3,4,5", "top_sets": "20", "repeats": 5},
    # KSKV Figs. 3-5: single-pair users, top-20/50 NCR and MSE
    "kskv-singleton": {"dataset": "synthetic-gg", "users": 1_000_000, "keys": 100,
                       "mechanisms": "pckv-ue,pckv-grr,ks-ue,ks-grr", "epsilons": "1,2,3,4,5,6",
                       "top_sets": "20,50", "repeats": 5},
    # issue 12: 30 daily collections over the same users, 10 % re-rating between collections: fresh
    # perturbation, the memoised single layer and the two-layer mode (eps_inf 4, eps_1 1)
    "longitudinal": {"dataset": "synthetic-uu", "users": 1_000_000, "keys": 100, "padding": 1,
                     "mechanisms": "pckv-ue,pckv-grr,kvue", "epsilons": "4", "eps_1": 1.0, "collections": 30,
                     "churn": 0.1, "top_sets": "50", "repeats": 1},
}
