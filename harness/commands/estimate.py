"""`python -m harness estimate`: predicted peak VRAM for a config at precisions, modes and lengths."""

from __future__ import annotations

import argparse
import json

from ..errors import UsageError

PRECISION_CHOICES = "fp32, fp16, bf16, int8, nf4, nf4-dq, fp4, fp4-dq"


def _int_list(text: str, what: str) -> list[int]:
    out = []
    for item in str(text).split(","):
        item = item.strip()
        if not item:
            continue
        try:
            value = int(item)
        except ValueError:
            raise UsageError(f"{what}: {item!r} is not an integer") from None
        if value < 1:
            raise UsageError(f"{what}: {value} must be a positive integer")
        out.append(value)
    if not out:
        raise UsageError(f"{what}: no value given")
    return out


def _str_list(text: str, what: str, allowed: tuple[str, ...]) -> list[str]:
    items = [t.strip().lower() for t in str(text).split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad or not items:
        raise UsageError(f"{what}: unknown value {', '.join(bad) or repr(text)} (choose from {', '.join(allowed)})")
    return items


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, metavar="DIR|config.json|NAME",
                        help="model directory, config.json, or a reference name (harness/configs)")
    parser.add_argument("--precision", default=None,
                        help=f"comma list of: {PRECISION_CHOICES}, w4a16; gguf for a .gguf file "
                             "(default: bf16, or gguf for a .gguf file)")
    parser.add_argument("--mode", default="prefill", help="comma list of: weights, prefill, generate, train")
    parser.add_argument("--seq-len", default="2048", help="prompt / training sequence length(s), comma list")
    parser.add_argument("--new-tokens", default="64", help="tokens generated after the prompt (generate)")
    parser.add_argument("--batch", default="1", help="batch size(s), comma list")
    parser.add_argument("--lora-r", default="16", help="LoRA rank (train)")
    parser.add_argument("--lora-targets", default=None,
                        help="comma list of module names (default: all attention and MLP projections)")
    gc = parser.add_mutually_exclusive_group()
    gc.add_argument("--grad-checkpointing", dest="grad_checkpointing", action="store_true", default=True,
                    help="train with gradient checkpointing (default)")
    gc.add_argument("--no-grad-checkpointing", dest="grad_checkpointing", action="store_false")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one object per combination")


def _new_tokens(text: str) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise UsageError(f"--new-tokens: {text!r} is not an integer") from None
    if value < 0:
        raise UsageError(f"--new-tokens: {value} must be >= 0")
    return value


def run(args: argparse.Namespace) -> int:
    from ..memory import estimate as E
    from ..units import format_bytes

    shape = E.model_shape(args.config)
    own = E.FILE_PRECISIONS if shape.stored_weights is not None else ()  # a GGUF file's own precision
    precisions = _str_list(args.precision or (own[0] if own else "bf16"), "--precision", E.PRECISIONS + own)
    modes = _str_list(args.mode, "--mode", E.MODES)
    seqs = _int_list(args.seq_len, "--seq-len")
    batches = _int_list(args.batch, "--batch")
    new_tokens = _new_tokens(args.new_tokens)
    lora_r = _int_list(args.lora_r, "--lora-r")[0]
    targets = E.DEFAULT_LORA_TARGETS
    if args.lora_targets:
        targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
    if "train" in modes:
        kinds = {g.kind for g in shape.linears}
        fused = {"qkv_proj": {"q_proj", "k_proj", "v_proj"}, "gate_up_proj": {"gate_proj", "up_proj"}}
        known = kinds | {k for f, ks in fused.items() if f in kinds for k in ks}
        unknown = [t for t in targets if t not in known]
        if unknown:
            raise UsageError(f"--lora-targets: {', '.join(unknown)} not in this model "
                             f"(linear layers: {', '.join(sorted(kinds))})")
    results = []
    for p in precisions:
        for m in modes:
            for s in (seqs if m != "weights" else seqs[:1]):
                for b in (batches if m != "weights" else batches[:1]):
                    q = E.Query(p, m, seq_len=s, batch=b, new_tokens=new_tokens, lora_r=lora_r,
                                lora_targets=targets, grad_checkpointing=args.grad_checkpointing)
                    results.append(E.estimate(shape, q).as_dict())
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{'precision':9s} {'mode':8s} {'seq':>6s} {'batch':>5s} {'peak':>11s} {'weights':>11s} "
          f"{'kv cache':>11s} {'activ.':>11s} {'other':>11s}")
    for r in results:
        bd = r["breakdown"]
        other = (bd.get("logits", 0) + bd.get("loss_logits", 0) + bd.get("adapter_grads_optimizer", 0)
                 + bd.get("loading_transient", 0))
        seq = "-" if r["mode"] == "weights" else str(r["seq_len"])
        print(f"{r['precision']:9s} {r['mode']:8s} {seq:>6s} {r['batch']:>5d} {format_bytes(r['peak_bytes']):>11s} "
              f"{format_bytes(bd['weights']):>11s} {format_bytes(bd.get('kv_cache')):>11s} "
              f"{format_bytes(bd.get('activations')):>11s} {format_bytes(other):>11s}")
    return 0
