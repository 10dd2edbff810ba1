"""Pure-NumPy key-value LDP mechanisms (no Beam import: a client can use them alone)."""
from .base import Estimates, ReportBatch, UserBatch
from .protocol import Mechanism
from .registry import make, names

__all__ = ["Estimates", "Mechanism", "ReportBatch", "UserBatch", "make", "names"]
