"""The command line, `python -m harness <command>`: one thin module per command.

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int`` and calls the capability
packages; exit 0 on success, 1 when a check fails, 2 on bad usage (one line, no traceback).
"""

from __future__ import annotations

import json
import sys


def print_verdict(result, as_json: bool, print_text) -> int:
    """A check's result on stdout, as JSON (--json) or text; exit 0 when it is ok, 1 when it is not."""
    if as_json:
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_text(result)
    return 0 if result.ok else 1
