"""`python -m harness estimate`: predicted peak VRAM for a config at precisions, modes and lengths."""

from __future__ import annotations

import argparse
import json
import sys

from .model_options import add_shared_options, read_precisions, read_shared_options

PRECISION_CHOICES = "fp32, fp16, bf16, int8, nf4, nf4-dq, fp4, fp4-dq"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shared_options(parser, precision_help=f"comma list of: {PRECISION_CHOICES}, w4a16; gguf for a .gguf file "
                                              "(default: bf16, or gguf for a .gguf file)",
                       budget_help="VRAM of the card (e.g. 6GiB or 8GB): add the verdict, does it fit with the "
                                   "context and reserve",
                       replay_help="with --budget and --mode train: replay torch's caching allocator on each step "
                                   "under the card's cap (the holes a reserve can only guess; default: off)")
    parser.add_argument("--mode", default="prefill", help="comma list of: weights, prefill, generate, train")
    parser.add_argument("--seq-len", default="2048", help="prompt / training sequence length(s), comma list")
    parser.add_argument("--batch", default="1", help="batch size(s), comma list")
    parser.add_argument("--explain", action="store_true",
                        help="draw where the memory goes for each estimate (weights, quantization state, LoRA, "
                             "gradients, optimizer, activations, logits/loss, KV cache, reserve, context)")


def run(args: argparse.Namespace) -> int:
    from ..memory.fit import estimate as E
    from ..memory.fit.lora import check_lora_targets
    from ..memory.fit.shape import model_shape
    from ..memory.fit.weights import FILE_PRECISIONS, PRECISIONS
    from ..memory.fit import picture as P
    from ..units import comma_list, format_bytes, format_size, int_list

    shape = model_shape(args.config)
    own = FILE_PRECISIONS if shape.stored_weights is not None else ()  # a GGUF file's own precision
    precisions = read_precisions(args.precision, own[:1] or ("bf16",), PRECISIONS + own)
    modes = comma_list(args.mode, "--mode", choices=E.MODES, lower=True)
    seqs = int_list(args.seq_len, "--seq-len")
    batches = int_list(args.batch, "--batch")
    opts = read_shared_options(args)
    budget, context, targets = opts.budget_bytes, opts.context_bytes, opts.lora_targets
    if args.replay and (budget is None or "train" not in modes):
        from ..errors import UsageError

        raise UsageError("--replay replays a training step on a card: give --budget and --mode train")
    note = check_lora_targets(shape, targets) if "train" in modes else None
    results, replayers = [], {}
    for p in precisions:
        for m in modes:
            for s in (seqs if m != "weights" else seqs[:1]):
                for b in (batches if m != "weights" else batches[:1]):
                    q = E.Query(p, m, seq_len=s, batch=b, new_tokens=opts.new_tokens, lora_r=opts.lora_r,
                                lora_targets=targets, grad_checkpointing=opts.grad_checkpointing,
                                optimizer=opts.optimizer)
                    est = E.estimate(shape, q)
                    obj = est.as_dict()
                    # what the card needs: the allocator peak + its reserve + the CUDA context
                    obj["context_bytes"] = context
                    obj["card_bytes"] = obj["peak_bytes"] + obj["reserve_bytes"] + context
                    if budget is not None:
                        obj.update(_verdicts(est, m, budget, context))
                        if m == "train" and args.replay:
                            obj["replay"] = _replay(args.config, shape, q, budget, context, replayers)
                            _replayed_verdict(obj)
                    if args.explain:
                        obj["picture"] = [part.as_dict() for part in P.parts(est, shape, context)]
                        obj["picture_text"] = P.describe(est, shape, context, _config_name(args.config))
                    results.append(obj)
    for line in (note, _limit_note(args.config, seqs, modes, opts.new_tokens)):
        if line:
            print(f"note: {line}", file=sys.stderr)
    if args.json:
        for r in results:
            r.pop("picture_text", None)
        print(json.dumps(results, indent=1))
        return 0
    print(f"{'precision':9s} {'mode':8s} {'seq':>6s} {'batch':>5s} {'peak':>11s} {'card needs':>11s} "
          f"{'weights':>11s} {'kv cache':>11s} {'activ.':>11s} {'logits/loss':>11s} {'other':>11s}"
          + (f"  fits {format_size(budget)}?" if budget is not None else ""))
    for r in results:
        bd = r["breakdown"]
        logits = bd.get("logits", 0) + bd.get("loss_logits", 0)
        other = bd.get("adapter_grads_optimizer", 0) + bd.get("loading_transient", 0)
        seq = "-" if r["mode"] == "weights" else str(r["seq_len"])
        verdict = ("  " + {"fits": "yes", "tight": "tight", "unknown": "unknown"}.get(r["fit"], "no")) \
            if budget is not None else ""
        print(f"{r['precision']:9s} {r['mode']:8s} {seq:>6s} {r['batch']:>5d} {format_bytes(r['peak_bytes']):>11s} "
              f"{format_bytes(r['card_bytes']):>11s} {format_bytes(bd['weights']):>11s} "
              f"{format_bytes(bd.get('kv_cache')):>11s} {format_bytes(bd.get('activations')):>11s} "
              f"{format_bytes(logits):>11s} {format_bytes(other):>11s}{verdict}")
    print(f"peak: torch's allocator peak. card needs: peak + allocator reserve + the {format_size(context)} "
          f"CUDA context (--context-bytes), what nvidia-smi would show.")
    print("logits/loss: the logits (the loss's fp32 copy and its gradient when training); other: LoRA "
          "weights, gradients and optimizer states, or the load's transient.")
    if any(r.get("paged_optimizer_states") for r in (x["breakdown"] for x in results)):
        print("paged optimizer states live outside torch's allocator (unified memory): not in the peak.")
    for line in dict.fromkeys(_verification_line(r) for r in results if not (r.get("verification") or {}).get("verified", True)):
        print(line)
    for r in results:
        if r.get("picture_text"):
            print()
            print("\n".join(r["picture_text"]))
    if budget is not None:
        _print_verdicts(results, budget)
    return 0  # a report of rows, each with its verdict (plan is the command whose exit code is the fit)


def _print_verdicts(results: list[dict], budget: int) -> None:
    """The verdicts last, in plan's words and figures (budget.fit_verdict; replayed with --replay)."""
    from ..units import format_size

    for r in results:
        seq = "" if r["mode"] == "weights" else f" {r['seq_len']} x {r['batch']}"
        print(f"{r['precision']} {r['mode']}{seq}: {r['verdict']}")
    if len(results) > 1:
        short = [r for r in results if r["fit"] != "fits"]
        print(f"verdict: {len(results) - len(short)} of {len(results)} fit {format_size(budget)}"
              + (f"; {len(short)} do not (tight or unknown counted with them)" if short else ""))


def _verdicts(est, mode: str, budget: int, context: int) -> dict:
    """Does the estimate fit the card (with the mode's reserve, and an unverified family's
    uncertainty kept free: budget.fit_verdict, the rule plan's limits follow), said in words, and
    for training whether it would with expandable segments."""
    from ..memory.fit import budget as B

    headroom = B.default_headroom(mode)
    uncertainty = (est.verification or {}).get("uncertainty", 0.0)
    verdict = B.fit_verdict(est.planned_bytes, budget, context, headroom, uncertainty)
    need = B.need_text("it", est.planned_bytes, budget, context, headroom, B.fragmentation_note(est)).replace(
        "it need ", "it needs " if est.fragmentation_bytes else "the peak is ", 1)
    head = {"fits": "fits: ", "does not fit": "does not fit: ",
            "tight": B.tight_unverified_text(uncertainty, (est.verification or {}).get("family", "?")) + ": "}[verdict]
    out = {"budget_bytes": budget, "fits": verdict == "fits", "fit": verdict, "uncertainty": uncertainty,
           "verdict": head + need + B.tight_note(est.planned_bytes, budget, context, headroom, mode)
           + B.expandable_note(est, budget, context)}
    if mode == "train":
        out["fits_expandable_segments"] = B.fits_expandable(est, budget, context)
    return out


def _replayed_verdict(obj: dict) -> None:
    """With --replay the row's verdict is the replayed one, as plan --train's limits are (the
    reserve rule's kept beside it); a step that could not be replayed keeps the reserve rule's."""
    replay = obj["replay"]
    if "error" in replay:
        if not obj["verification"]["verified"]:  # no trace and no measurement: a dense stand-in's number
            obj.update(fits=False, fit="unknown", verdict=f"unknown: refused: the training step of this unverified "
                       f"family cannot be traced ({replay['error']}), and no GPU measurement backs its estimate")
        else:
            obj["verdict"] += f" (reserve rule: not replayed, {replay['error']})"
        return
    obj["reserve_rule_fits"] = obj["fits"]
    obj["fits"] = replay["fits"]
    obj["fit"] = "fits" if replay["fits"] else "does not fit"
    obj["verdict"] = replay_line(replay)


def _replay(spec, shape, q, budget: int, context: int, replayers: dict | None = None) -> dict:
    """The step traced and torch's allocator replayed on it under budget - context, or why not
    (one replayer per precision: its traces are shared by the rows)."""
    from ..errors import UnsupportedError
    from ..memory.family.families import verification
    from ..memory.replay.replay_limits import StepReplayer
    from ..memory.fit.config_file import load_config

    say = lambda msg: print(f"replay {q.precision} {msg}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        from ..memory.replay.step_verdict import REPLAY_MARGIN

        uncertainty = verification(shape.family, "train", shape.source, shape.traits)["uncertainty"]
        replayers = {} if replayers is None else replayers
        if q.precision not in replayers:
            replayers[q.precision] = StepReplayer(load_config(spec)[0], shape, q, budget, context, progress=say,
                                                  margin=REPLAY_MARGIN + uncertainty)  # an unverified family's too
        replayer = replayers[q.precision]
        p = replayer.point(q.seq_len, q.batch)
    except UnsupportedError as exc:
        return {"error": str(exc)}
    return {"fits": p.fits, "need_bytes": p.need_bytes, "cap_bytes": replayer.cap_bytes, "margin": replayer.margin,
            "traced_peak_bytes": p.traced_peak_bytes}


def replay_line(replay: dict) -> str:
    from ..memory.replay.replay_limits import point_text

    if "error" in replay:
        return f"not replayed: {replay['error']}"
    return point_text(replay["fits"], replay["need_bytes"], replay["cap_bytes"], replay["margin"])


def _limit_note(config, seqs: list[int], modes: list[str], new_tokens: int) -> str | None:
    """A --seq-len past the model's own context limit is estimated (arithmetic), but said."""
    from ..memory.fit.budget import context_limit
    from ..memory.fit.config_file import load_config

    limit = context_limit(load_config(config)[0])
    longest = max(s + (new_tokens if m == "generate" else 0) for s in seqs for m in modes if m != "weights") \
        if set(modes) - {"weights"} else 0
    if limit.tokens is None or longest <= limit.tokens:
        return None
    return (f"{longest} tokens is past the model's own limit ({limit.tokens}, {limit.source}): estimated "
            "anyway, but the model was not trained that long (vLLM refuses it as a max-model-len)")


def _verification_line(result: dict) -> str:
    v = result["verification"]
    margin = f"; it carries {v['uncertainty']:.1%} of uncertainty (families.UNVERIFIED_MARGIN)".replace(".0%", "%") \
        if v.get("uncertainty") else ""
    return f"note: {v['note']}; computed through {v['path']}{margin}."


def _config_name(spec) -> str:
    from pathlib import Path

    name = Path(str(spec)).name
    return Path(str(spec)).parent.name if name == "config.json" else name.removesuffix(".json")
