"""`python -m harness explain [FILE|-] [--json] [--config DIR] [--gpu-memory SIZE|GPU]`: an error
text, log or traceback -> what happened, the ranked causes with their evidence, and the fix.
Exit 0 when recognised, 1 when not, 2 on bad usage (a missing, unreadable or binary file)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import UsageError

MAX_BYTES = 64 * 1024**2  # a longer log is read from its end: the failure is there


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", nargs="?", default="-", metavar="FILE|-",
                        help="the log or pasted error text (default -, stdin)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--config", default=None, metavar="DIR|config.json|NAME",
                        help="the model the log is about: fixes then come with planned batch/length/utilization")
    parser.add_argument("--gpu-memory", default=None, metavar="SIZE|GPU",
                        help="the card (6GiB, t4, rtx-3060-6gb) when the log does not give its size")


def _decode(data: bytes, where: str) -> str:
    if b"\x00" in data[:65536]:
        raise UsageError(f"{where}: looks binary (NUL bytes), not a log or error text")
    text = data.decode("utf-8", errors="replace")
    if text.count("\ufffd") > max(16, len(text) // 20):
        raise UsageError(f"{where}: not text (mostly bytes that are not UTF-8)")
    if not text.strip():
        raise UsageError(f"{where}: empty: nothing to explain")
    return text


def read_input(spec: str) -> str:
    if spec == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no input: give a FILE, or pipe the error text on stdin (FILE -)")
        data = sys.stdin.buffer.read()
        return _decode(data[-MAX_BYTES:], "stdin")
    path = Path(spec)
    try:
        if path.is_dir():
            raise UsageError(f"{spec}: is a directory, not a log file")
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size > MAX_BYTES:
                handle.seek(size - MAX_BYTES)
            data = handle.read()
    except FileNotFoundError:
        raise UsageError(f"{spec}: no such file") from None
    except PermissionError:
        raise UsageError(f"{spec}: cannot read it (permission denied)") from None
    except OSError as exc:
        raise UsageError(f"{spec}: cannot read it ({exc.strerror or exc})") from None
    return _decode(data, spec)


def _validate(args) -> None:
    if args.gpu_memory:
        from ..memory.gpus import resolve_gpu

        resolve_gpu(args.gpu_memory)
    if args.config:
        from ..memory.shape import load_config

        load_config(args.config)


def _print_text(result) -> None:
    if not result.recognised:
        print(f"not recognised: {result.what_happened}")
        return
    print(f"{result.kind}: {result.what_happened}")
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


def run(args) -> int:
    from ..explain import explain

    text = read_input(args.file)
    _validate(args)
    result = explain(text, config=args.config, gpu_memory=args.gpu_memory)
    if args.json:
        print(json.dumps(result.as_dict(), default=str))
    else:
        _print_text(result)
    return 0 if result.recognised else 1
