"""Reports and estimates on files.

* ``WriteReports`` / ``ReadReports``: one Avro file per report batch, named by
  batch id (a retried bundle overwrites the same file, so retries are
  idempotent), written and read with fastavro (10x ``WriteToAvro``'s speed,
  DESIGN.md); the file metadata pins the mechanism's public parameters.
* ``WriteEstimates``: a run's ``EstimateTable`` as Avro, JSON Lines or CSV by
  file extension, its records made as they are written.
"""
from __future__ import annotations

import json
from collections.abc import Mapping

import apache_beam as beam
import fastavro
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems

from kvldp import schemas
from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE, Reports
from kvldp.runtime import atomic, tally
from kvldp.schemas import envelope
from kvldp.schemas.invalid import reading
from kvldp.transforms.coders import ArrayPayloadCoder  # noqa: F401  (registers the coders)
from kvldp.transforms.context import element_context

FORMATS = ("csv", "jsonl", "avro")


def format_of(path: str, declared: str | None = None) -> str:
    """File format from ``declared`` or the path's extension."""
    if declared:
        if declared not in FORMATS:
            raise ValueError(f"unknown format {declared!r}; known: {FORMATS}")
        return declared
    lower = path.lower().rstrip("*")
    for ext, fmt in ((".csv", "csv"), (".jsonl", "jsonl"), (".ndjson", "jsonl"), (".json", "jsonl"),
                     (".avro", "avro")):
        if lower.endswith(ext):
            return fmt
    raise ValueError(f"cannot tell the format of {path!r} from its extension; "
                     f"use .csv, .jsonl or .avro (or declare it with --input-format)")


TEMP_INFIX = atomic.TEMP_INFIX          # a file being written: PATH.tmp-<uuid>, renamed to PATH when whole


class _WriteReportFileFn(beam.DoFn):
    def __init__(self, prefix: str, config: dict):
        self._prefix, self._config = prefix, dict(config)
        self._written = tally.counter("reports_written")

    def process(self, reports):
        # under a temporary name, then renamed: a job killed mid-write leaves no half file under a report
        # file's name (``R-*.avro`` does not match the temporary one; --overwrite removes it)
        path = f"{self._prefix}-{reports.batch_id:05d}.avro"
        # (element_context: a full disk names the file it could not write)
        with element_context(path), atomic.replaced_on_filesystems(path) as temp, FileSystems.create(temp) as fh:
            envelope.write_reports(fh, reports, self._config)
        self._written.inc(reports.n_reports)
        yield path


class WriteReports(beam.PTransform):
    """``ReportBatch``es -> ``{prefix}-{batch_id:05d}.avro`` (one file per batch);
    ``config``: the mechanism's public parameters, stored as file metadata."""

    def __init__(self, prefix: str, config: Mapping, label: str | None = None):
        super().__init__(label)
        self._fn = _WriteReportFileFn(prefix, dict(config))

    def expand(self, reports):
        return reports | "WriteReportFiles" >> beam.ParDo(self._fn)


@beam.typehints.with_output_types(Reports)
class _ReadReportFileFn(beam.DoFn):
    def __init__(self, protocol, round_index: int, config: dict, batch_rows: int):
        self._protocol, self._round = protocol, round_index
        self._config, self._rows = dict(config), batch_rows
        self._read = tally.counter("reports_read")

    def process(self, readable):
        path = readable.metadata.path
        with element_context(path), readable.open() as fh, reading(path, "report file"):
            container = envelope.ReportContainer(fh, path)
            container.check(self._config, self._protocol.round_report_type(self._round), path)
            for reports in container.batches(self._protocol, self._round, rows=self._rows):
                # a report no honest client makes fails this file by name, not the combine of all of them
                self._protocol.check_reports(self._round, reports)
                self._read.inc(reports.n_reports)
                yield reports


def report_configs(pattern: str) -> dict[str, dict]:
    """The public parameters stored with every report file matching
    ``pattern`` (file headers only), by path."""
    matched = FileSystems.match([pattern])[0].metadata_list
    if not matched:
        raise ValueError(f"no report files match {pattern!r}")
    out = {}
    for meta in sorted(matched, key=lambda m: m.path):
        with FileSystems.open(meta.path) as fh, reading(meta.path, "report file"):
            out[meta.path] = envelope.ReportContainer(fh, meta.path).config or {}
    return out


def report_config(pattern: str) -> dict:
    """The public parameters of the reports matching ``pattern``, which must
    all agree (reports of two configurations cannot be summed)."""
    configs = report_configs(pattern)
    distinct = {json.dumps(c, sort_keys=True): path for path, c in configs.items()}
    if len(distinct) > 1:
        (a, path_a), (b, path_b) = list(distinct.items())[:2]
        raise ValueError(f"{pattern} mixes reports of different configurations: {path_a} was made by {a}, "
                         f"{path_b} by {b}")
    return next(iter(configs.values()))


def check_report_files(pattern: str, config: Mapping, found: Mapping | None = None) -> None:
    """Fail fast, in the driver, when no file matches or the reports were
    made with other parameters (``found``: ``report_config(pattern)`` when the
    caller has read it already)."""
    found = report_config(pattern) if found is None else dict(found)
    expected = dict(config)
    if found != expected:
        raise ValueError(f"{pattern}: reports were made by {found}, but the collector was configured "
                         f"as {expected}; rerun collect with the perturbing side's parameters")


class ReadReports(beam.PTransform):
    """Avro report files -> round ``round_index``'s report batches of
    ``protocol`` (its report type decodes them), checked against ``config``."""

    def __init__(self, pattern: str, protocol, round_index: int, config: Mapping,
                 batch_rows: int = DEFAULT_BATCH_SIZE, label: str | None = None):
        super().__init__(label)
        self._pattern = pattern
        self._fn = _ReadReportFileFn(protocol, round_index, dict(config), batch_rows)

    def expand(self, pbegin):
        return (pbegin
                | "Match" >> fileio.MatchFiles(self._pattern)
                | "Open" >> fileio.ReadMatches()
                | "ReadReportFiles" >> beam.ParDo(self._fn))


def write_estimate_table(fh, table, fmt: str) -> int:
    """Write ``table``'s records to the binary file ``fh`` as ``fmt``
    (byte for byte what ``WriteToText`` wrote for the text formats: a header
    line for CSV, one line per key); returns the number of records."""
    if fmt == "avro":
        fastavro.writer(fh, schemas.load(schemas.ESTIMATE), table.records(), codec="deflate",
                        sync_marker=envelope.sync_marker(f"estimates {len(table)}"))    # a rerun: the same bytes
        return len(table)
    if fmt == "csv":
        fh.write((",".join(schemas.ESTIMATE_FIELDS) + "\n").encode("utf-8"))
    for lines in table.lines(fmt):
        fh.write(("\n".join(lines) + "\n").encode("utf-8"))
    return len(table)


@beam.typehints.with_output_types(str)     # declared: Beam otherwise infers it from process's bytecode
class _WriteEstimateTableFn(beam.DoFn):
    """One ``EstimateTable`` -> ``path``, written under a temporary name and
    renamed, so a reader never sees half a file and a retry overwrites."""

    def __init__(self, path: str, fmt: str):
        self._path, self._fmt = path, fmt
        self._written = tally.counter("estimates_written")

    def process(self, table):
        # (element_context: a full disk names the file it could not write)
        with element_context(self._path), atomic.replaced_on_filesystems(self._path) as temp, \
                FileSystems.create(temp) as fh:
            n = write_estimate_table(fh, table, self._fmt)
        self._written.inc(n)
        yield self._path


class WriteEstimates(beam.PTransform):
    """The run's ``EstimateTable`` (a one-element PCollection) -> one file,
    format by extension (.avro/.jsonl/.csv). The records are made as they
    are written, a chunk of keys at a time: memory follows the estimates'
    arrays, not d record dicts (issue 17: d = 10^6 took 4.4 GB when the
    records were elements grouped into one shard by ``WriteToText``)."""

    def __init__(self, path: str, label: str | None = None):
        super().__init__(label)
        self._path, self._fmt = path, format_of(path)

    def expand(self, tables):
        return tables | "WriteEstimateFile" >> beam.ParDo(_WriteEstimateTableFn(self._path, self._fmt))
