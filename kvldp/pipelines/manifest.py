"""The reports' manifest: what ``perturb`` wrote, so ``collect`` can tell a
complete delivery from a partial, stale, truncated or foreign one.

``perturb`` writes ``PREFIX.manifest.json`` beside ``PREFIX-NNNNN.avro``
after its pipeline finished: every report file with its size, SHA-256 and
record count, the reports' public configuration, and the SHA-256 of the key
dictionary (the names in index order, one per line). ``collect`` groups the
files its ``--input`` matches by prefix and checks each group against that
prefix's manifest before any compute:

- a listed file that is missing (``--allow-partial`` collects the rest and
  says which are missing),
- a matched file the manifest does not list (a stale file of an earlier run,
  a file of another run under the same prefix),
- a file whose size or hash differs (truncated in transfer, edited),
- a key dictionary that is not the one the reports were made with (a
  reordered or edited dictionary silently relabels every key).

The manifest holds nothing the reports do not: counts per file and public
parameters (``docs/threat-model.md``).
"""
from __future__ import annotations

import glob
import hashlib
import json
import re
from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems

from kvldp.runtime import atomic
from kvldp.schemas import envelope
from kvldp.schemas.invalid import InvalidFile, one_line, reading

FORMAT = "kvldp-reports-manifest/1"
_BATCH_FILE = re.compile(r"^(?P<prefix>.*)-(?P<batch>\d{5,})\.avro$")


class ManifestMismatch(ValueError):
    """The report files do not match what perturb wrote."""


def manifest_path(prefix: str) -> str:
    return prefix + ".manifest.json"


def dictionary_fingerprint(names: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(map(str, names)).encode("utf-8")).hexdigest()


def file_digest(path: str) -> dict:
    """Name, size and SHA-256 of one file."""
    digest, size = hashlib.sha256(), 0
    with FileSystems.open(path) as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
            size += len(chunk)
    return {"name": FileSystems.split(path)[1], "bytes": size, "sha256": digest.hexdigest()}


def describe_file(path: str) -> dict:
    """``file_digest`` and the number of reports it holds."""
    with FileSystems.open(path) as fh:
        records = envelope.ReportContainer(fh, path).count()
    return {**file_digest(path), "records": records}


def batch_files(prefix: str) -> list[str]:
    """The ``PREFIX-NNNNN.avro`` files that exist now."""
    matched = FileSystems.match([prefix + "-*.avro"])[0].metadata_list
    return sorted(m.path for m in matched if (b := _BATCH_FILE.match(m.path)) and b["prefix"] == prefix)


def unfinished_files(prefix: str) -> list[str]:
    """Report files and manifests a killed run left half-written under their
    temporary names (``PATH.tmp-<uuid>``), and the key dictionary's Beam
    sink directory: never read, removed with ``--overwrite``."""
    directory, name = FileSystems.split(prefix)
    patterns = [f"{prefix}-*.avro.tmp-*", f"{manifest_path(prefix)}.tmp-*"]
    found = [m.path for result in FileSystems.match(patterns) for m in result.metadata_list]
    # Beam's text sink writes inside a directory of its own; a match finds its files, not the directory
    # (on a local disk the directory itself, even empty; on an object store there is no empty one)
    sink = FileSystems.join(directory, f"beam-temp-{name}.keys.txt-*")
    dirs = set(glob.glob(sink)) if "://" not in sink else {
        FileSystems.split(m.path)[0] for m in FileSystems.match([FileSystems.join(sink, "*")])[0].metadata_list}
    return sorted(found + sorted(dirs))


def clear(prefix: str, key_dictionary: bool = False) -> list[str]:
    """Delete an earlier run's report files, manifest and unfinished files
    under ``prefix`` (a run owns its prefix, as Beam's file sinks own theirs),
    and with ``key_dictionary`` its ``.keys.txt``; returns them."""
    named = [manifest_path(prefix)] + ([f"{prefix}.keys.txt"] if key_dictionary else [])
    stale = batch_files(prefix) + [p for p in named if FileSystems.exists(p)] + unfinished_files(prefix)
    if stale:
        FileSystems.delete(stale)
    return stale


def write_manifest(prefix: str, config: dict, key_names: Sequence[str],
                   rating_range: Sequence[float] | None = None, failure: str | None = None) -> dict:
    """Describe every ``PREFIX-NNNNN.avro`` this run wrote (the pipeline has
    finished) in ``PREFIX.manifest.json``; returns the manifest.
    ``rating_range``: the ratings' own scale (public, like the config), so
    the collector can give means on it. ``failure``: why the ingest failed
    (too many rows rejected): the manifest says so (``status`` "failed")
    and ``check_delivery`` refuses the reports. Written under a temporary
    name and renamed: a reader sees the whole manifest or none."""
    files = batch_files(prefix)
    manifest = {"format": FORMAT, "status": "failed" if failure else "complete",
                **({"failure": failure} if failure else {}), "config": json.loads(json.dumps(dict(config))),
                "key_dictionary_sha256": dictionary_fingerprint(key_names), "keys": len(key_names),
                "rating_range": None if rating_range is None else [float(x) for x in rating_range],
                "files": [describe_file(f) for f in files]}
    manifest["reports"] = sum(f["records"] for f in manifest["files"])
    with atomic.replaced_on_filesystems(manifest_path(prefix)) as temp, FileSystems.create(temp) as fh:
        fh.write(json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))
    return manifest


def read_manifest(prefix: str) -> dict | None:
    path = manifest_path(prefix)
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as fh, reading(path, f"reports manifest ({FORMAT})"):
        manifest = json.loads(fh.read().decode("utf-8"))
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ManifestMismatch(f"{path} is not a kvldp reports manifest ({FORMAT})")
    problem = _shape_problem(manifest)
    if problem:
        raise InvalidFile(f"{path}: not a valid reports manifest ({FORMAT}): {one_line(problem)}")
    return manifest


_NUMBER = (int, float)
_FIELDS = {"status": str, "config": dict, "key_dictionary_sha256": str, "keys": int, "files": list, "reports": int}
_FILE_FIELDS = {"name": str, "bytes": int, "sha256": str, "records": int}


def _shape_problem(manifest: dict) -> str | None:
    """What is missing or of the wrong type in a parsed manifest (``None``:
    nothing): the readers index it without further checks."""
    files = manifest.get("files") if isinstance(manifest.get("files"), list) else []
    for fields, where in [(_FIELDS, manifest)] + [(_FILE_FIELDS, f) for f in files]:
        if not isinstance(where, dict):
            return f"a files entry is {type(where).__name__}, not an object"
        for name, kind in fields.items():
            if name == "status" and name not in where:      # manifests before the status field: complete
                continue
            if not isinstance(where.get(name), kind) or isinstance(where.get(name), bool):
                return f"{name} is {where.get(name)!r}, not {kind.__name__}"
    scale = manifest.get("rating_range")
    if scale is not None and not (isinstance(scale, list) and len(scale) == 2
                                  and all(isinstance(x, _NUMBER) and not isinstance(x, bool) for x in scale)):
        return f"rating_range is {scale!r}, not two numbers"
    return None


def rating_scale(pattern: str) -> tuple[float, float] | None:
    """The rating range the manifests of the files ``pattern`` matches
    state (``None``: none stated, or they disagree)."""
    matched = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    prefixes = {m["prefix"] for path in matched if (m := _BATCH_FILE.match(path))}
    found = set()
    for prefix in prefixes:
        manifest = read_manifest(prefix)
        found.add(tuple(manifest["rating_range"]) if manifest and manifest.get("rating_range") else None)
    return found.pop() if len(found) == 1 else None


def check_delivery(pattern: str, key_names: Sequence[str], allow_partial: bool = False,
                   require: bool = True) -> list[str]:
    """Check the files ``pattern`` matches against their prefixes' manifests;
    returns notes for the operator (what ``allow_partial`` let through).
    Raises ``ManifestMismatch`` naming the first problem's files."""
    matched = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    groups: dict[str, list[str]] = {}
    for path in matched:
        m = _BATCH_FILE.match(path)
        groups.setdefault(m["prefix"] if m else path, []).append(path)
    notes, fingerprint = [], dictionary_fingerprint(key_names)
    for prefix, paths in sorted(groups.items()):
        manifest = read_manifest(prefix)
        if manifest is None:
            if require:
                raise ManifestMismatch(
                    f"no manifest {manifest_path(prefix)} for {len(paths)} report file(s): they were not written "
                    "by kvldp perturb (or it did not finish); pass --no-manifest to collect them unchecked")
            notes.append(f"{prefix}-*.avro: no manifest, collected unchecked")
            continue
        if manifest.get("status", "complete") != "complete":
            why = one_line(manifest.get("failure", "no reason given"))
            raise ManifestMismatch(
                f"the ingest that wrote {prefix}-*.avro failed ({why}); "
                "collect refuses its reports: fix the input and rerun perturb")
        if manifest["key_dictionary_sha256"] != fingerprint:
            raise ManifestMismatch(
                f"the key dictionary is not the one {prefix}-*.avro were made with ({manifest['keys']} keys, "
                f"sha256 {one_line(manifest['key_dictionary_sha256'][:16])}…; given {len(key_names)} keys, "
                f"sha256 {fingerprint[:16]}…): an edited or reordered dictionary relabels every key; "
                f"use {prefix}.keys.txt")
        listed = {f["name"]: f for f in manifest["files"]}
        present = {FileSystems.split(p)[1]: p for p in paths}
        extra = sorted(set(present) - set(listed))
        if extra:
            raise ManifestMismatch(f"{', '.join(extra)} match {pattern!r} but {manifest_path(prefix)} does not "
                                   "list them: stale files of an earlier run, or another run's; remove them")
        for name in sorted(present):
            found = file_digest(present[name])
            if (found["bytes"], found["sha256"]) != (listed[name]["bytes"], listed[name]["sha256"]):
                raise ManifestMismatch(f"{present[name]} is not the file perturb wrote ({found['bytes']} bytes, "
                                       f"{listed[name]['bytes']} expected): truncated or edited")
        missing = sorted(set(listed) - set(present))
        if missing:
            lost = sum(listed[n]["records"] for n in missing)
            text = (f"{len(missing)} of {len(listed)} report files of {prefix} are missing "
                    f"({one_line(', '.join(missing))}; {lost} of {manifest['reports']} reports)")
            if not allow_partial:
                raise ManifestMismatch(text + ": pass --allow-partial to collect the rest")
            notes.append("PARTIAL: " + text)
    return notes
