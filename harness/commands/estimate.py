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
    parser.add_argument("--optimizer", default="adamw_torch",
                        help="train: adamw_torch, adamw_8bit, paged_adamw_32bit or paged_adamw_8bit")
    parser.add_argument("--budget", default=None,
                        help="VRAM of the card (e.g. 6GiB): add the verdict, does it fit with the context and reserve")
    parser.add_argument("--context-bytes", default=None,
                        help="CUDA context + driver reservation the card loses (default 400MiB)")
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
    import sys

    from ..memory import budget as B
    from ..memory import estimate as E
    from ..units import format_bytes, parse_bytes

    shape = E.model_shape(args.config)
    own = E.FILE_PRECISIONS if shape.stored_weights is not None else ()  # a GGUF file's own precision
    precisions = _str_list(args.precision or (own[0] if own else "bf16"), "--precision", E.PRECISIONS + own)
    modes = _str_list(args.mode, "--mode", E.MODES)
    seqs = _int_list(args.seq_len, "--seq-len")
    batches = _int_list(args.batch, "--batch")
    new_tokens = _new_tokens(args.new_tokens)
    lora_r = _int_list(args.lora_r, "--lora-r")[0]
    optimizer = E.optimizer_name(args.optimizer)
    budget = parse_bytes(args.budget, "--budget") if args.budget else None
    context = parse_bytes(args.context_bytes, "--context-bytes") if args.context_bytes else B.DEFAULT_CONTEXT_BYTES
    targets = E.DEFAULT_LORA_TARGETS
    if args.lora_targets:
        targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
    note = E.check_lora_targets(shape, targets) if "train" in modes else None
    results = []
    for p in precisions:
        for m in modes:
            for s in (seqs if m != "weights" else seqs[:1]):
                for b in (batches if m != "weights" else batches[:1]):
                    q = E.Query(p, m, seq_len=s, batch=b, new_tokens=new_tokens, lora_r=lora_r,
                                lora_targets=targets, grad_checkpointing=args.grad_checkpointing,
                                optimizer=optimizer)
                    est = E.estimate(shape, q)
                    obj = est.as_dict()
                    # what the card needs: the allocator peak + its reserve + the CUDA context
                    obj["context_bytes"] = context
                    obj["card_bytes"] = obj["peak_bytes"] + obj["reserve_bytes"] + context
                    if budget is not None:
                        headroom = B.default_headroom(m)
                        obj["budget_bytes"] = budget
                        obj["fits"] = B.fits(est.planned_bytes, budget, context, headroom)
                        obj["verdict"] = ("fits: " if obj["fits"] else "does not fit: ") + B.need_text(
                            "it", est.planned_bytes, budget, context, headroom, B.fragmentation_note(est)).replace(
                            "it need ", "it needs " if est.fragmentation_bytes else "the peak is ", 1)
                    results.append(obj)
    if note:
        print(f"note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    print(f"{'precision':9s} {'mode':8s} {'seq':>6s} {'batch':>5s} {'peak':>11s} {'card needs':>11s} "
          f"{'weights':>11s} {'kv cache':>11s} {'activ.':>11s} {'other':>11s}"
          + (f"  fits {format_bytes(budget)}?" if budget is not None else ""))
    for r in results:
        bd = r["breakdown"]
        other = (bd.get("logits", 0) + bd.get("loss_logits", 0) + bd.get("adapter_grads_optimizer", 0)
                 + bd.get("loading_transient", 0))
        seq = "-" if r["mode"] == "weights" else str(r["seq_len"])
        verdict = ("  yes" if r["fits"] else "  no") if budget is not None else ""
        print(f"{r['precision']:9s} {r['mode']:8s} {seq:>6s} {r['batch']:>5d} {format_bytes(r['peak_bytes']):>11s} "
              f"{format_bytes(r['card_bytes']):>11s} {format_bytes(bd['weights']):>11s} "
              f"{format_bytes(bd.get('kv_cache')):>11s} {format_bytes(bd.get('activations')):>11s} "
              f"{format_bytes(other):>11s}{verdict}")
    print(f"peak: torch's allocator peak. card needs: peak + allocator reserve + the {format_bytes(context)} "
          f"CUDA context (--context-bytes), what nvidia-smi would show.")
    if any(r.get("paged_optimizer_states") for r in (x["breakdown"] for x in results)):
        print("paged optimizer states live outside torch's allocator (unified memory): not in the peak.")
    return 0
