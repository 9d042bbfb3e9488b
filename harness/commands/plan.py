"""`python -m harness plan`: per precision, the longest context and largest batch that fit a budget."""

from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="DIR|config.json|NAME",
                        help="model directory, config.json, or a reference name (harness/configs)")
    parser.add_argument("--budget", required=True, help="VRAM of the card, e.g. 6GiB, 8GB")
    parser.add_argument("--train", action="store_true", help="plan LoRA/QLoRA training instead of inference")
    parser.add_argument("--precision", default=None, help="comma list (default: all)")
    parser.add_argument("--context-bytes", default=None,
                        help="CUDA context + driver reservation to subtract (default 400MiB)")
    parser.add_argument("--headroom", type=float, default=None, help="fraction kept free (default 0.03)")
    parser.add_argument("--new-tokens", type=int, default=128, help="generated tokens counted in the context")
    parser.add_argument("--batch-seq-len", type=int, default=2048, help="sequence length for the batch limit")
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    from ..memory import budget as B
    from ..errors import UsageError
    from ..memory.estimate import ENGINES, FILE_PRECISIONS, PRECISIONS, model_shape
    from ..units import format_bytes, parse_bytes

    budget = parse_bytes(args.budget, "--budget")
    context = parse_bytes(args.context_bytes, "--context-bytes") if args.context_bytes else B.DEFAULT_CONTEXT_BYTES
    headroom = B.DEFAULT_HEADROOM if args.headroom is None else args.headroom
    if not 0 <= headroom < 1:
        raise UsageError(f"--headroom: {headroom} must be in [0, 1)")
    for name in ("new_tokens", "batch_seq_len", "lora_r"):
        if getattr(args, name) < (0 if name == "new_tokens" else 1):
            raise UsageError(f"--{name.replace('_', '-')}: {getattr(args, name)} is out of range")
    shape = model_shape(args.config)
    # a GGUF file brings its own precision ("gguf": its tensors as stored), planned first
    own = FILE_PRECISIONS if shape.stored_weights is not None and not args.train else ()
    precisions = own + PRECISIONS
    if args.precision:
        precisions = tuple(p.strip().lower() for p in args.precision.split(",") if p.strip())
        bad = [p for p in precisions if p not in PRECISIONS + own]
        if bad:
            raise UsageError(f"--precision: unknown {', '.join(bad)} (choose from {', '.join(own + PRECISIONS)})")
    plans = B.plan(shape, budget, train=args.train, precisions=precisions, context_bytes=context,
                   headroom=headroom, new_tokens=args.new_tokens, reference_seq_len=args.batch_seq_len,
                   lora_r=args.lora_r)
    if args.json:
        print(json.dumps({"budget_bytes": budget, "context_bytes": context, "headroom": headroom,
                          "mode": "train" if args.train else "generate",
                          "plans": [p.as_dict() | _engine(p.precision, ENGINES) for p in plans]}, indent=1))
        return 0
    print(f"budget {format_bytes(budget)}, CUDA context {format_bytes(context)}, headroom {headroom:.0%}, "
          f"mode {'train (LoRA r=%d, grad checkpointing)' % args.lora_r if args.train else 'generate'}")
    print(f"{'precision':9s} {'fits':4s} {'weights':>11s} {'max context':>11s} "
          f"{'max batch@' + str(args.batch_seq_len):>15s}  why")
    for p in plans:
        print(f"{p.precision:9s} {'yes' if p.fits else 'no':4s} {format_bytes(p.weights_bytes):>11s} "
              f"{p.max_seq_len if p.max_seq_len else '-':>11} {p.max_batch if p.max_batch else '-':>15}  {p.reason}")
    for name in dict.fromkeys(p.precision for p in plans if p.precision in ENGINES):
        print(f"{name}: {ENGINES[name]}")
    return 0


def _engine(precision: str, engines: dict) -> dict:
    """Which engine loads a serving precision (w4a16, gguf) and what it holds."""
    return {"engine": engines[precision]} if precision in engines else {}
