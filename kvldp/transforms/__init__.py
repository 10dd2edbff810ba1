"""Beam wiring around the pure mechanisms: one DoFn, one CombineFn, I/O.

Importing the package routes Beam's per-DoFn state/timer introspection
through a per-class memo (``dofn_specs``): every graph kvldp builds, and
every stage a worker sets up, asks it several times per ParDo; and the
source scan ``ParDo`` runs on each DoFn's ``process`` through a
per-function memo (``yield_check``); and its argument specs of a DoFn's
methods, asked at every step too, through a per-function memo (``argspecs``);
and the origin Beam records with every type hint names its frames without
reading their source lines (``hint_origins``)."""
from kvldp.transforms import argspecs, dofn_specs, hint_origins, yield_check

argspecs.install()
hint_origins.install()
dofn_specs.install()
yield_check.install()
