"""Privacy accounting and client randomness: the budget every protocol
states (``budget``), the simulated per-device ledger (``ledger``), where
client randomness comes from (``randomness``) and memoised permanent
randomness (``memo``)."""
