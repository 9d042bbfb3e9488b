"""`python -m harness explain [FILE|-] [--json] [--config DIR] [--gpu-memory SIZE|GPU]`: an error
text, log or traceback -> what happened, the ranked causes with their evidence, and the fix.
Exit 0 when recognised, 1 when not, 2 on bad usage (a missing, unreadable, binary or empty input).
A log longer than 8 MiB is explained from its last 8 MiB, and the answer says so (harness.explain.reading)."""

from __future__ import annotations

import argparse
import json

from ..explain.reading import read_input

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-", metavar="FILE|-",
                        help="the log or pasted error text (default -, stdin); a longer log than 8 MiB is read "
                             "from its end")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--config", default=None, metavar="DIR|config.json|NAME",
                        help="the model the log is about: fixes then come with planned batch/length/utilization")
    parser.add_argument("--gpu-memory", default=None, metavar="SIZE|GPU",
                        help="the card (6GiB, t4, rtx-3060-6gb) when the log does not give its size")


def _validate(args) -> None:
    if args.gpu_memory:
        from ..memory.fit.gpus import resolve_gpu

        resolve_gpu(args.gpu_memory)
    if args.config:
        from ..memory.fit.config_file import load_config

        load_config(args.config)


def _print_text(result) -> None:
    if not result.recognised:
        print(f"not recognised: {result.what_happened}")
        return
    print(f"{result.kind}: {result.what_happened}")
    if result.source:
        s = result.source
        print(f"raised at: {s['library']} {s['version'] or '?'} {s['file']}:{s['line']} ({s['exception']}"
              + (f", when {s['condition']}" if s.get("condition") else "") + ")"
              + (" -- the text holds the message's start only" if s.get("matched") == "cut" else ""))
    print("\nlikely causes, most likely first:")
    for i, cause in enumerate(result.causes, 1):
        print(f"  {i}. {cause.cause}\n     evidence: {cause.evidence}")
    print(f"\nfix: {result.fix}")
    if result.figures_from_log:
        print("\nfigures from the log: " + ", ".join(f"{k}={v}" for k, v in result.figures_from_log.items()))
    if result.computed:
        print("computed: " + json.dumps(result.computed, default=str))
    for other in result.also:
        print(f"\nalso in the text: {other['kind']}: {other['what_happened']}")
    also = ", ".join(other["kind"] for other in result.also)
    print(f"\nverdict: recognised as {result.kind}" + (f" (the text also shows {also})" if also else ""))


def run(args) -> int:
    from ..explain import explain

    source = read_input(args.file)
    _validate(args)
    result = explain(source.text, config=args.config, gpu_memory=args.gpu_memory)
    if args.json:
        print(json.dumps(dict(result.as_dict(), input=source.as_dict()), default=str))
    else:
        if source.cut:
            print(f"read: {source.cut}")
        _print_text(result)
    return 0 if result.recognised else 1
