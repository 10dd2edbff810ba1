"""Where a run's seed comes from, keeping a real run's seed off the command line.

Whoever knows the seed of a run that perturbed real ratings can regenerate
its noise (``mechanisms/privacy/randomness.py``) and undo it. So the seed of a real
run is a secret of the perturbing side, and the place it is passed decides
who sees it:

- ``--seed N``: simulations and tests. On a real input it is a leak:
  the command line is visible to every local user (``ps``,
  ``/proc/PID/cmdline``), shell history, CI logs and schedulers' task
  views. ``perturb``/``publish`` warn.
- ``--seed-file PATH``: a reproducible production run (a retried or resumed
  ingest job must redraw exactly the same reports). The file holds 32 hex
  digits (128 bits): ``kvldp seed PATH`` writes one readable by its owner
  only, as does ``openssl rand -hex 16``.
- ``$KVLDP_SEED``: the same 32 hex digits in the environment (for secret
  managers that inject environment variables; ``/proc/PID/environ`` is
  readable by the process's owner only).
- none of these: a fresh seed from the OS CSPRNG, never written anywhere
  (the run cannot be reproduced, and need not be).
"""
from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys

from apache_beam.io.filesystems import FileSystems

from kvldp.mechanisms.privacy.randomness import fresh_seed

SEED_ENV = "KVLDP_SEED"
SEED_BITS = 128
MIN_SECRET = 1 << 64        # a "secret" below 2^64 is a typo or a toy value: refused
_HEX = re.compile(r"(?:0x)?([0-9a-fA-F]{32})")


@dataclasses.dataclass(frozen=True)
class RunSeed:
    """A run seed and where it came from: ``flag`` (``--seed``), ``file``
    (``--seed-file``), ``env`` (``$KVLDP_SEED``) or ``None`` (none given)."""

    value: int | None
    origin: str | None = None

    @property
    def is_exposed(self) -> bool:
        """Given on the command line, where others can read it."""
        return self.origin == "flag"


def parse_secret(text: str, where: str) -> int:
    """32 hex digits (optionally ``0x``-prefixed) -> the 128-bit seed."""
    match = _HEX.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{where} must hold 32 hex digits (128 bits), e.g. from `kvldp seed FILE` or "
                         "`openssl rand -hex 16`")
    value = int(match.group(1), 16)
    if value < MIN_SECRET:
        raise ValueError(f"{where} holds a value below 2^64: too small to be a secret (write a fresh one with "
                         "`kvldp seed FILE`)")
    return value


def read_seed_file(path: str, err=None) -> int:
    """The seed in ``path`` (any Beam filesystem); warns when a local file is
    readable by others than its owner."""
    try:
        with FileSystems.open(path) as fh:
            text = fh.read(256).decode("ascii", errors="replace")
    except OSError as exc:
        raise FileNotFoundError(f"--seed-file {path}: cannot read it ({exc.__class__.__name__})") from None
    if os.path.exists(path) and os.stat(path).st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(f"WARNING: --seed-file {path} is readable by other users (mode "
              f"{stat.filemode(os.stat(path).st_mode)}): whoever reads it can undo the noise; chmod 600 it",
              file=err or sys.stderr)
    return parse_secret(text, f"--seed-file {path}")


def write_seed_file(path: str) -> None:
    """A fresh 128-bit seed as 32 hex digits, created readable by its owner
    only; never overwrites."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{fresh_seed():032x}\n")


def resolve(seed: int | None, seed_file: str | None, environ=None) -> RunSeed:
    """The run's seed from ``--seed``, ``--seed-file`` or ``$KVLDP_SEED``
    (at most one of the two flags; a flag wins over the environment)."""
    if seed is not None and seed_file:
        raise ValueError("--seed and --seed-file both given: pass one")
    if seed is not None:
        return RunSeed(seed, "flag")
    if seed_file:
        return RunSeed(read_seed_file(seed_file), "file")
    text = (os.environ if environ is None else environ).get(SEED_ENV)
    if text:
        return RunSeed(parse_secret(text, f"${SEED_ENV}"), "env")
    return RunSeed(None)


def exposed_seed_warning(command: str) -> str:
    return (f"WARNING: kvldp {command} --seed on real ratings: anyone who sees this command line (ps, shell "
            f"history, CI and scheduler logs) can regenerate the noise and undo it. For a reproducible run "
            f"pass --seed-file FILE (`kvldp seed FILE` writes one) or ${SEED_ENV}; without any, the seed is "
            f"fresh from the OS CSPRNG.")


@dataclasses.dataclass(frozen=True)
class SeedConfig:
    """``kvldp seed PATH``: where to write a fresh seed file."""

    path: str

    @classmethod
    def from_args(cls, args) -> SeedConfig:
        return cls(args.path)


def run_seed_command(config: SeedConfig, beam_args) -> None:
    try:
        write_seed_file(config.path)
    except FileExistsError:
        raise ValueError(f"{config.path} exists: a seed file is never overwritten (its runs could no "
                         "longer be reproduced)") from None
    print(f"wrote a fresh 128-bit seed to {config.path} (mode 600); pass --seed-file {config.path}")
