"""Pure-NumPy key-value LDP mechanisms (no Beam import: a client can use them alone)."""
from kvldp.mechanisms.base import Estimates, ReportBatch, UserBatch
from kvldp.mechanisms.protocol import Mechanism
from kvldp.mechanisms.registry import make, names

__all__ = ["Estimates", "Mechanism", "ReportBatch", "UserBatch", "make", "names"]
