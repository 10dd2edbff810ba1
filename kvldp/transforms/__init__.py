"""Beam wiring around the pure mechanisms: one DoFn, one CombineFn, I/O.

Built on Beam's public API only: importing this package (or any module of
kvldp) changes nothing of Beam's. The local runner's tuning lives in
``kvldp.runtime`` and applies around kvldp's own local jobs only."""
