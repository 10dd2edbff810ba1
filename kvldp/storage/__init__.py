"""What the perturbing side keeps on disk: the per-device privacy ledger
(``ledger.py``, SQLite). Never sent to the collector."""
