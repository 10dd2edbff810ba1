"""The key-value mechanisms, one module per paper family: PCKV (``pckv``),
PrivKV/PrivKV-A/PrivKVM (``privkv``, ``privkvm``), Sun et al.'s F2M/KVUE/KVOH
(``sun``) and IOH (``ioh``, ``cells``, ``query``), KSKV (``kskv``), and the
two-layer longitudinal mode (``longitudinal``, ``layers``, ``permanent``)."""
