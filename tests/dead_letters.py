"""The dead letter of a run: ``kvldp-rejected/STEM.RUNID.rejected.jsonl``
beside the input (one per run that rejected anything, issue 39)."""
from __future__ import annotations

from pathlib import Path


def dead_letter(directory: Path, stem: str) -> Path:
    """The one dead-letter file of ``stem`` in ``directory/kvldp-rejected``."""
    found = sorted((Path(directory) / "kvldp-rejected").glob(f"{stem}.*.rejected.jsonl"))
    assert len(found) == 1, found
    return found[0]
