"""The command line, `python -m harness <command>`: one thin module per command.

Each module exposes ``add_arguments(parser)`` and ``run(args) -> int`` and calls the capability
packages; exit 0 on success, 1 when a check fails, 2 on bad usage (one line, no traceback).
"""
