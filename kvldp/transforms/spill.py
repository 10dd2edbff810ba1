"""A grouping whose values wait on disk: ``SpilledGroupByKey``.

Assembling each user's ratings needs every row of a file grouped by user
(``ratings.ReadRatings``), and Beam's local runner keeps a GroupByKey's
input in memory: its buffer holds every encoded value until the stage that
reads it ends, and that stage's input goes to its workers as one more
encoded copy. An ingest of 5M rows held 1.5 GB that way, growing with the
rows whatever ``--memory-budget`` said (Dataflow and Flink spill their
shuffles to disk themselves).

Here each value goes to a file of its own, written by the step that makes
it; only ``(key, path)`` passes through the GroupByKey, and a group's values
are read back when its iterable is walked. What a worker holds is then the
group it is on, not the whole input. The files live in a job's scratch
directory (``runner.scratch_path``: under ``TMPDIR``, private to the user,
removed when the job ends, however it ends) and hold what the grouping
would have held -- raw ratings, on the ingest side, never the collector's.
Where ``TMPDIR`` is a tmpfs the files are in memory again, once and
swappable instead of twice in the process: point it at a disk for files
larger than the memory budget. A retried bundle writes fresh files
(the abandoned attempt's are only removed with the directory), so a group
reads exactly the values its committed input named.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator

import apache_beam as beam
from apache_beam import coders
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.typehints import typehints
from apache_beam.typehints.trivial_inference import key_value_types

from kvldp.runtime import tally
from kvldp.transforms.context import element_context

SPILLED_FILES = "spilled_files"
SPILLED_BYTES = "spilled_bytes"


class SpillFn(beam.DoFn):
    """``(key, value) -> (key, path)``: the value, encoded by ``coder``, in a
    file of its own under ``directory``."""

    def __init__(self, directory: str, coder: coders.Coder):
        self._directory, self._coder = directory, coder
        self._files, self._bytes = tally.counter(SPILLED_FILES), tally.counter(SPILLED_BYTES)

    def process(self, element):
        key, value = element
        path = FileSystems.join(self._directory, f"{uuid.uuid4().hex}.bin")
        data = self._coder.encode(value)
        where = (f"spilling a group's value to {self._directory} "
                 "(set TMPDIR to a directory with room: ~50 B a ratings row)")
        with element_context(where), FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            fh.write(data)
        self._files.inc()
        self._bytes.inc(len(data))
        yield key, path


class SpilledValues(Iterable):
    """A group's values, read from their files each time it is walked (it
    pickles as its paths)."""

    def __init__(self, paths: list[str], coder: coders.Coder):
        self.paths, self._coder = paths, coder

    def __iter__(self) -> Iterator:
        for path in self.paths:
            with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
                yield self._coder.decode(fh.read())

    def __len__(self) -> int:
        return len(self.paths)


def _load(element, coder: coders.Coder):
    key, paths = element
    return key, SpilledValues(sorted(paths), coder)


class SpilledGroupByKey(beam.PTransform):
    """``PCollection[(K, V)] -> PCollection[(K, Iterable[V])]``, as
    ``GroupByKey``, with the values spilled to files under ``directory``
    (module docstring); ``directory=None`` is Beam's ``GroupByKey``.
    The values are encoded with the coder of the input's declared value
    type (pickle for an undeclared one)."""

    def __init__(self, directory: str | None, label: str | None = None):
        super().__init__(label)
        self._directory = directory

    def expand(self, pcoll):
        if self._directory is None:
            return pcoll | "Group" >> beam.GroupByKey()
        key_type, value_type = key_value_types(pcoll.element_type)     # Any, Any when undeclared
        coder = coders.registry.get_coder(value_type)
        return (pcoll
                | "Spill" >> beam.ParDo(SpillFn(self._directory, coder)).with_output_types(
                    typehints.KV[key_type, str])
                | "Group" >> beam.GroupByKey()
                | "Load" >> beam.Map(_load, coder).with_output_types(
                    typehints.KV[key_type, typehints.Iterable[value_type]]))

