"""The command line, `python -m harness <command>`: one thin module per command.

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int`` and calls the capability
packages; exit 0 on success, 1 when a check fails, 2 on bad usage (one line, no traceback).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def print_verdict(result, as_json: bool, print_text) -> int:
    """A check's result on stdout, as JSON (--json) or text; exit 0 when it is ok, 1 when it is not."""
    if as_json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_text(result)
    return 0 if result.ok else 1


def add_ramp_up(parser) -> None:
    """--ramp-up, as bench and gate take it (closed loop; read back with ramp_up_seconds)."""
    parser.add_argument("--ramp-up", type=float, default=0.0,
                        help="closed loop: spread the first sends of the slots over this many seconds (default 0: "
                             "one burst, which one client worker flags as client-bound at high concurrency)")


def ramp_up_seconds(args) -> float:
    from ..errors import UsageError

    if not 0 <= args.ramp_up < float("inf"):
        raise UsageError(f"--ramp-up: {args.ramp_up} must be a number of seconds, 0 or more")
    return args.ramp_up


def check_writable(out: Path, flag: str, create_folders: bool = False) -> None:
    """Refuse, before any work, an output path that cannot be written: a directory, a path through
    a file (/etc/passwd/x.json), a folder that is missing (unless the command creates folders) or
    one this process cannot write into. The folder is tried for real (a temporary file made and
    removed): permission bits say nothing for root or on a read-only mount."""
    from ..errors import UsageError

    if out.is_dir():
        raise UsageError(f"{flag}: {str(out)!r} is a directory")
    folder = out.parent if str(out.parent) else Path(".")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag}: {str(existing)!r} is a file, not a folder: {str(out)!r} cannot be written")
    if existing != folder and not create_folders:
        raise UsageError(f"{flag}: the folder {str(folder)!r} does not exist (create it first)")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=existing)
    except OSError as exc:
        raise UsageError(f"{flag}: cannot write into the folder {str(existing)!r} "
                         f"({exc.strerror or type(exc).__name__})") from None
    os.close(fd)
    os.unlink(probe)
