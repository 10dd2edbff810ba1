"""Beam wiring around the pure mechanisms: one DoFn, one CombineFn, I/O.

Importing the package routes Beam's per-DoFn state/timer introspection
through a per-class memo (``dofn_specs``): every graph kvldp builds, and
every stage a worker sets up, asks it several times per ParDo."""
from kvldp.transforms import dofn_specs

dofn_specs.install()
