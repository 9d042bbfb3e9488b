"""`python -m harness <command>`: one entry per command of docs/architecture.md.

Each command lives in harness/commands/<module>.py and exposes ``add_arguments(parser)`` and
``run(args) -> int``; registering a command is one line in COMMANDS.

Every error of every command leaves through `main`, the one place that words it: one line on
stderr, `harness <command>: error: ...`, the exit code of the error (2 bad usage), and with a
`--json` switch also one JSON object on stdout (`error_object`), so a script that asked for JSON
always gets JSON.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from .errors import HarnessError, UsageError, error_code, one_line, os_error_line

# command name -> (module under harness.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "env": ("env", "probe this machine: driver, CUDA, torch, bitsandbytes, vLLM"),
    "estimate": ("estimate", "predict peak VRAM for a config at precisions, modes and lengths"),
    "plan": ("plan", "longest context and largest batch that fit a VRAM budget, per precision"),
    "check-dir": ("check_dir", "check a model directory: complete, consistent, safe to load"),
    "drift": ("drift", "did quantizing change what the model says: KL, top-1, perplexity, greedy answers"),
    "bench": ("bench", "load an OpenAI-compatible endpoint and measure TTFT, TPOT, ITL, throughput"),
    "compare": ("compare", "compare two bench results: each metric OK, REGRESSED or UNDECIDED (exit 0, 1, 3)"),
    "gate": ("gate", "interleaved A/B gate of two servers, blocks added until each metric is decided (exit 0, 1, 3)"),
    "report": ("report", "render results JSON files into one self-contained HTML report"),
    "fleet": ("fleet", "run the suites on every node of a Ray cluster and write one fleet report"),
    "explain": ("explain", "an error text or log -> what happened, the ranked causes and the (computed) fix"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but bad usage is a UsageError: `main` words it like every other error."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UsageError(message)


def _load(name: str):
    return importlib.import_module(f"harness.commands.{COMMANDS[name][0]}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m harness",
        description="Diagnostics and benchmarks for fine-tuning and serving LLMs on small GPUs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    parser.json_switch = set()  # the commands whose --json is a switch (compare's names a file)
    for name, (_, help_text) in COMMANDS.items():
        module = _load(name)
        command = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command)
        if any("--json" in a.option_strings and a.nargs == 0 for a in command._actions):  # noqa: SLF001
            parser.json_switch.add(name)
    return parser


def error_object(command: str | None, exc: BaseException, message: str, exit_code: int) -> dict:
    """The JSON a `--json` command prints on stdout when it fails (docs/exit-codes.md)."""
    return {"ok": False, "command": command, "error": message, "error_code": error_code(exc),
            "exit_code": exit_code, **(getattr(exc, "json_fields", None) or {})}


def _fail(command: str | None, exc: BaseException, message: str, exit_code: int, as_json: bool) -> int:
    """One line on stderr (`harness <command>: error: ...`), the JSON object on stdout with --json."""
    prog = f"harness {command}" if command else "harness"
    interrupted = isinstance(exc, KeyboardInterrupt)
    print(f"{prog}: interrupted" if interrupted else f"{prog}: error: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps(error_object(command, exc, message, exit_code)), flush=True)
    return exit_code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    command = argv[0] if argv and argv[0] in COMMANDS else None  # no options come before it
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        return _fail(command, exc, one_line(str(exc)), 2, command in parser.json_switch and "--json" in argv)
    if args.command is None:
        parser.print_help()
        return 2
    as_json = getattr(args, "json", None) is True
    module = _load(args.command)
    try:
        return int(module.run(args) or 0)
    except HarnessError as exc:
        return _fail(args.command, exc, one_line(str(exc)), exc.exit_code, as_json)
    except KeyboardInterrupt as exc:
        return _fail(args.command, exc, "interrupted", 130, as_json)
    except BrokenPipeError:  # `... | head`: the reader left; no traceback (the Python docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        if exc.filename is None:  # not about a path the user gave: a bug to see whole
            raise
        # a file or folder that cannot be read or written (e.g. --out under a file): bad input
        return _fail(args.command, exc, one_line(os_error_line(exc)), 2, as_json)


if __name__ == "__main__":
    sys.exit(main())
