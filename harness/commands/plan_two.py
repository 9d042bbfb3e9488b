"""`python -m harness plan --config A --config B --budget 6GiB`: two models on one card - do both
stay resident through a conversation (weights, KV growth per turn, the larger step's activations),
or must they be switched, and what a switch costs (harness.memory.fit.cohabit)."""

from __future__ import annotations

import argparse
import json

from .model_options import read_shared_options


def _precisions(text: str | None) -> list[str]:
    from ..errors import UsageError
    from ..memory.fit.weights import PRECISIONS
    from ..units import comma_list

    if not text:
        return ["nf4-dq", "nf4-dq"]
    values = comma_list(text, "--precision", choices=PRECISIONS, lower=True)
    if len(values) > 2:
        raise UsageError(f"--precision: {text!r} names {len(values)} precisions; two --config take one, or one per model")
    return values * 2 if len(values) == 1 else values


def _name(spec: str) -> str:
    from pathlib import Path

    path = Path(spec)
    return path.parent.name if path.name == "config.json" else path.name.removesuffix(".json")


def run(args: argparse.Namespace, configs: list[str]) -> int:
    from ..errors import UsageError
    from ..memory.fit import budget as B
    from ..memory.fit import cohabit as C
    from ..memory.fit.shape import model_shape
    from ..memory.fit.config_file import load_config

    if args.budget is None:
        raise UsageError("--budget is required")
    opts = read_shared_options(args)
    for flag, value in (("--turn-tokens", args.turn_tokens), ("--batch-seq-len", args.batch_seq_len)):
        if value < 1:
            raise UsageError(f"{flag}: {value} is out of range")
    if not args.disk_gbps > 0:
        raise UsageError(f"--disk-gbps: {args.disk_gbps} must be positive")
    if args.headroom is not None and not 0 <= args.headroom < 1:
        raise UsageError(f"--headroom: {args.headroom} must be in [0, 1)")
    shapes = [model_shape(c) for c in configs]
    limits = [B.context_limit(load_config(c)[0]).tokens for c in configs]
    limit = min([n for n in limits if n] or [None]) if any(limits) else None
    seq = min(args.batch_seq_len, limit) if limit else args.batch_seq_len
    headroom = args.headroom if args.headroom is not None else B.default_headroom("train" if args.train else "generate")
    train_kw = dict(lora_r=opts.lora_r, lora_targets=tuple(opts.lora_targets), grad_checkpointing=opts.grad_checkpointing,
                    optimizer=opts.optimizer)
    plan = C.plan_two(configs, shapes, [_name(c) for c in configs], _precisions(args.precision), opts.budget_bytes,
                      opts.context_bytes, headroom, seq, new_tokens=opts.new_tokens, turn_tokens=args.turn_tokens,
                      train=args.train, train_kw=train_kw, limit=limit, disk_gbps=args.disk_gbps)
    from ..memory.family.families import verification

    checks = [verification(s.family, "train" if m.role == "train" else "generate", s.source, s.traits)
              for s, m in zip(shapes, plan.models)]
    if args.json:
        print(json.dumps({"mode": "two-models", **plan.as_dict(), "verification": checks}, indent=1))
        return 0
    print(_text(plan))
    for m, v in zip(plan.models, checks):
        if not v["verified"]:
            print(f"note: {m.name}: {v['note']}; computed through {v['path']}.")
    return 0


def _text(plan) -> str:
    from ..units import format_bytes

    lines = [f"two models on one card: budget {format_bytes(plan.budget_bytes)}, CUDA context "
             f"{format_bytes(plan.context_bytes)} (one process), headroom {plan.headroom:.1%}, conversation "
             f"{plan.seq_len} tokens, {plan.turn_tokens} tokens a turn"]
    lines.append(f"{'model':18s} {'role':5s} {'precision':9s} {'weights':>11s} {'KV/turn':>11s} {'step':>11s} "
                 f"{'alone fits':>10s} {'load (disk)':>11s}")
    for m, c in zip(plan.models, plan.switch["per_model"]):
        lines.append(f"{m.name[:18]:18s} {m.role:5s} {m.precision:9s} {format_bytes(m.weights_bytes):>11s} "
                     f"{format_bytes(m.kv_bytes_per_token * plan.turn_tokens):>11s} {format_bytes(m.step_bytes):>11s} "
                     f"{'yes' if m.alone_fits else 'no':>10s} {c['load_s_from_disk']:>9.1f} s")
    lines.append(plan.reason)
    lines.append(f"switch cost: {plan.switch['note']} (disk {plan.switch['disk_gbps']:g} GB/s, host->device "
                 f"{plan.switch['h2d_gbps']:g} GB/s)")
    return "\n".join(lines)
