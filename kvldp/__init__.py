"""kvldp: key-value data under local differential privacy, on Apache Beam.

Sub-packages, one job each (DESIGN.md):

* ``kvldp.mechanisms`` -- the mechanisms and protocols, pure NumPy (no Beam);
* ``kvldp.datasets`` -- built-in datasets and the truth statistics of a run;
* ``kvldp.schemas`` -- the Avro schemas and the record conversions;
* ``kvldp.transforms`` -- Beam wiring: perturb DoFn, CombineFn, rounds, I/O;
* ``kvldp.pipelines`` -- the jobs behind the ``kvldp`` command.
"""
__version__ = "0.1.0"
