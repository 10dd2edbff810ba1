"""What a command writes, never over an earlier run's in silence (issue 39).

* An output the operator named (``--output``, ``--dead-letter``) that
  exists is refused before any compute, unless ``--overwrite``; then it is
  replaced whole when the new one is complete (the writers write under a
  temporary name and rename), and the command says what it replaced.
* An output kvldp names itself (the estimates of a command run without
  ``--output``) takes the next free name (``estimates-pckv-ue-eps4-2.jsonl``)
  rather than the earlier run's, and the command says which.
* Rejected rows go to a dead-letter file of their own per run
  (``NAME.RUNID.rejected.jsonl``, ``RUNID`` the run's UTC time and four
  random hex digits), which no other run truncates; a run that rejected
  nothing leaves none.
"""
from __future__ import annotations

import datetime
import os
import secrets

from apache_beam.io.filesystems import FileSystems


def run_id() -> str:
    """``20261128T101502Z-3fa1``: when this run started (UTC), and four random
    hex digits for two runs in one second."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{secrets.token_hex(2)}"


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def claim(path: str, flag: str, overwrite: bool, dry_run: bool = False) -> bool:
    """Before any compute: refuse ``path`` when it exists, unless
    ``overwrite``; returns whether an earlier output will be replaced. A
    dry run (``--dry_run``) writes nothing and asks no remote store (without
    credentials each call retries for two minutes)."""
    check_writable(path, flag)
    if (dry_run and "://" in path) or not exists(path):
        return False
    if not overwrite:
        raise ValueError(f"{flag} {path} exists (an earlier run's output); pass --overwrite to replace it, or "
                         f"choose another {flag}")
    return True


def fresh(path: str) -> str:
    """``path``, or when it exists the first ``STEM-N.EXT`` (N = 2, 3, …) that
    does not: for outputs kvldp names itself."""
    if not exists(path):
        return path
    stem, ext = _split_extension(path)
    n = 2
    while exists(f"{stem}-{n}{ext}"):
        n += 1
    return f"{stem}-{n}{ext}"


def _split_extension(path: str) -> tuple[str, str]:
    directory, name = os.path.split(path)
    base, dot, ext = name.partition(".")
    return os.path.join(directory, base), (dot + ext if dot else "")


def check_writable(path: str, flag: str) -> None:
    """Before any compute: the directory a local output goes to exists (it
    is created) and this process may write there. Remote outputs are the
    runner's to check."""
    if "://" in path:
        return
    directory = os.path.dirname(os.path.abspath(path)) or "."
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot create {directory} ({err.strerror})") from None
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: {directory} is not writable")
    # os.access misses some refusals (an immutable directory, ACLs, some network and FUSE mounts; and root
    # passes it everywhere): try the write itself, so it fails here rather than after the compute
    probe = os.path.join(directory, f".kvldp-write-probe-{secrets.token_hex(4)}")
    try:
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as err:
        raise ValueError(f"{flag} {path}: {directory} is not writable ({err.strerror})") from None


def drop_if_empty(path: str | None) -> bool:
    """Remove a dead-letter file a run wrote with nothing in it; returns
    whether it held rows."""
    if not path or not exists(path):
        return False
    size = FileSystems.match([path])[0].metadata_list
    if size and size[0].size_in_bytes == 0:
        FileSystems.delete([path])
        return False
    return True
