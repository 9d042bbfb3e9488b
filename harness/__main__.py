"""`python -m harness <command>`: one entry per command of docs/architecture.md.

Each command lives in harness/commands/<module>.py and exposes ``add_arguments(parser)`` and
``run(args) -> int``; registering a command is one line in COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .errors import HarnessError, one_line

# command name -> (module under harness.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "env": ("env", "probe this machine: driver, CUDA, torch, bitsandbytes, vLLM"),
    "estimate": ("estimate", "predict peak VRAM for a config at precisions, modes and lengths"),
    "plan": ("plan", "longest context and largest batch that fit a VRAM budget, per precision"),
    "check-dir": ("check_dir", "check a model directory: complete, consistent, safe to load"),
    "drift": ("drift", "did quantizing change what the model says: KL, top-1, perplexity, greedy answers"),
    "bench": ("bench", "load an OpenAI-compatible endpoint and measure TTFT, TPOT, ITL, throughput"),
    "compare": ("compare", "compare two bench results with a noise model; exit 1 on a regression"),
    "report": ("report", "render results JSON files into one self-contained HTML report"),
    "fleet": ("fleet", "run the suites on every node of a Ray cluster and write one fleet report"),
    "explain": ("explain", "an error text or log -> what happened, the ranked causes and the (computed) fix"),
}


class _Parser(argparse.ArgumentParser):
    """argparse, but bad usage is one line on stderr and exit code 2."""

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {one_line(message)}\n")


def _load(name: str):
    return importlib.import_module(f"harness.commands.{COMMANDS[name][0]}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m harness",
        description="Diagnostics and benchmarks for fine-tuning and serving LLMs on small GPUs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (_, help_text) in COMMANDS.items():
        module = _load(name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    module = _load(args.command)
    try:
        return int(module.run(args) or 0)
    except HarnessError as exc:
        print(f"harness {args.command}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"harness {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; no traceback (the Python docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
