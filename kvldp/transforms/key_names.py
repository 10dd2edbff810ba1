"""The key dictionary of a job: a one-element PCollection (a side input of
the calibration), created without Beam's per-element type inference, or --
a synthetic domain's ``NumberedKeys``, a recipe that pickles as d -- a
constant of the steps that read it (no stage of its own: a PCollection of
one element is a stage to build and run in every job)."""
from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from kvldp.datasets.base import NumberedKeys


class CreateKeyNames(beam.PTransform):
    """``pbegin -> [names]``: one element, the dictionary's item ids in key
    order. Its type is declared: ``beam.Create`` otherwise infers the type of
    a list by visiting every item -- 10 s of the driver's time at d = 10^6."""

    def __init__(self, names: Sequence[str], label: str | None = None):
        super().__init__(label)
        # numbered names stay a recipe (pickled as d): a list would cost every stage that reads it d strings
        self._names = names if isinstance(names, NumberedKeys) else list(names)

    def expand(self, pbegin):
        kind = NumberedKeys if isinstance(self._names, NumberedKeys) else list[str]
        return pbegin | "Create" >> beam.Create([self._names]).with_output_types(kind)


def key_names_in(p: beam.Pipeline, names: Sequence[str]):
    """``names`` as the job's steps take them: a ``NumberedKeys`` recipe as
    itself, any other dictionary as a ``CreateKeyNames`` PCollection."""
    return names if isinstance(names, NumberedKeys) else p | "KeyNames" >> CreateKeyNames(names)


def key_names_arg(names):
    """A step's argument for the job's key names (``key_names_in``): the
    PCollection as a singleton side input, a constant as itself."""
    return AsSingleton(names) if isinstance(names, beam.PCollection) else names


def key_names_pcollection(p: beam.Pipeline, names):
    """The job's key names (``key_names_in``) as a one-element PCollection,
    for a step that writes them."""
    return names if isinstance(names, beam.PCollection) else p | "KeyNames" >> CreateKeyNames(names)
