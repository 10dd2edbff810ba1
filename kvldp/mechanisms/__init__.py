"""Pure-NumPy key-value LDP mechanisms (no Beam import: a client can use them alone)."""
from .base import Estimates, Mechanism, ReportBatch, UserBatch
from .registry import make, names

__all__ = ["Estimates", "Mechanism", "ReportBatch", "UserBatch", "make", "names"]
