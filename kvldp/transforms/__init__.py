"""Beam wiring around the pure mechanisms: one DoFn, one CombineFn, I/O."""
