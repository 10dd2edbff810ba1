"""Rating data as batches of users: built-in synthetic and real datasets."""
from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE

from .base import Dataset, InMemoryDataset, batch_specs
from .files import load_clothing, load_movielens_100k, shared_data_dir
from .synthetic import SYNTHETIC_KINDS, SyntheticDataset

__all__ = [
           "DEFAULT_BATCH_SIZE",
           "SYNTHETIC_KINDS",
           "Dataset",
           "InMemoryDataset",
           "SyntheticDataset",
           "batch_specs",
           "load_clothing",
           "load_movielens_100k",
           "shared_data_dir",
]
