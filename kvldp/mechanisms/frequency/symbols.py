"""Counting per-key report symbols: the collector side of every mechanism
whose report is ``(key index, small symbol)`` (PrivKV's LPP, F2M, KVUE, KVOH).

Counts layout: ``[n, C[0, :], C[1, :], …]`` with ``C[i, k]`` the number of
reports at key ``k`` carrying ``symbols[i]``.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvldp.mechanisms.base import ReportBatch


def accumulate_symbols(counts: np.ndarray, reports: ReportBatch, d: int, symbols: Sequence[int]) -> np.ndarray:
    """Add ``reports`` into ``counts`` (in place); unknown keys or symbols are
    an error (they mean the reports come from another mechanism)."""
    pos, s = reports.positions, reports.symbols.astype(np.int64)
    if len(pos) and (pos.min() < 0 or pos.max() >= d):
        raise ValueError(f"report key index outside [0, {d})")
    table = np.full(256, -1, dtype=np.int64)
    table[np.asarray(symbols, dtype=np.int64) + 128] = np.arange(len(symbols))
    index = table[s + 128]
    if len(index) and index.min() < 0:
        bad = sorted(set(s[index < 0].tolist()))[:5]
        raise ValueError(f"report symbols {bad} are not among {tuple(symbols)}")
    counts[0] += reports.n_reports
    counts[1:] += np.bincount(index * d + pos, minlength=len(symbols) * d)
    return counts


def symbol_stack(counts: np.ndarray, d: int, n_symbols: int) -> np.ndarray:
    """``(n_symbols, d)`` float view of the per-key symbol counts."""
    return np.asarray(counts[1:1 + n_symbols * d], dtype=np.float64).reshape(n_symbols, d)
