"""`python -m harness plan`: per precision, the longest context and largest batch that fit a budget;
with --offload, where accelerate would put a model that does not fit, and what decode then costs."""

from __future__ import annotations

import argparse
import json
import sys

from ..memory.fit.budget import default_headroom
from . import plan_vllm
from .model_options import SharedOptions, add_shared_options, read_precisions, read_shared_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_shared_options(parser, precision_help="comma list (default: all; --offload: bf16; two --config: one "
                                              "precision, or one per model, default nf4-dq)",
                       budget_help="VRAM of the card, e.g. 6GiB or 8GB (required unless --engine vllm)",
                       replay_help="--train: find the nf4-dq / fp4-dq limits by replaying torch's caching allocator "
                                   "on traced steps around the reserve rule's answer (default: on with --train; "
                                   "--no-replay answers by the reserve rule alone, at once)",
                       config_repeats=True)
    parser.add_argument("--turn-tokens", type=int, default=256,
                        help="two --config: prompt tokens a conversation turn adds (plus --new-tokens generated)")
    parser.add_argument("--disk-gbps", type=float, default=2.0,
                        help="two --config: disk read rate a switch loads the checkpoint at (GB/s, default 2.0)")
    parser.add_argument("--train", action="store_true", help="plan LoRA/QLoRA training instead of inference")
    parser.add_argument("--headroom", type=float, default=None,
                        help="allocator reserve kept free, a fraction of the peak (default "
                             f"{default_headroom('generate')}, training {default_headroom('train')})")
    parser.add_argument("--batch-seq-len", type=int, default=2048, help="sequence length for the batch limit")
    parser.add_argument("--offload", action="store_true",
                        help="place the model with accelerate (GPU, then CPU, then disk) for this budget")
    parser.add_argument("--offload-seq-len", type=int, default=2048,
                        help="--offload: context (prompt + generated) the GPU keeps room for")
    parser.add_argument("--cpu-memory", default=None, help="--offload: host RAM for weights (default: available)")
    parser.add_argument("--hw-results", default=None,
                        help="--offload: results JSON of `pytest suites/hw --hw-level full` (measured bandwidths)")
    plan_vllm.add_arguments(parser)  # --engine and the vLLM options (issue 15)


def _offload(args, opts: SharedOptions, headroom, precisions):
    from ..errors import UsageError
    from ..memory.fit import offload as O
    from ..units import parse_bytes

    if args.precision and len(precisions) != 1:
        raise UsageError("--offload plans one precision: give --precision bf16, fp16 or fp32")
    precision = precisions[0] if args.precision else "bf16"
    if args.offload_seq_len < 1:
        raise UsageError(f"--offload-seq-len: {args.offload_seq_len} is out of range")
    bw = O.bandwidths_from_results(args.hw_results) if args.hw_results else O.Bandwidths()
    cpu = parse_bytes(args.cpu_memory, "--cpu-memory") if args.cpu_memory else None
    return O.plan_offload(args.config, opts.budget_bytes, precision, context_bytes=opts.context_bytes,
                          headroom=headroom, seq_len=args.offload_seq_len,
                          new_tokens=min(opts.new_tokens, args.offload_seq_len - 1),
                          cpu_memory_bytes=cpu, bandwidths=bw)


def run(args: argparse.Namespace) -> int:
    from ..errors import UsageError

    configs = list(args.config or [None])  # None: plan_vllm / reject_vllm_options name what is missing
    if len(configs) > 2:
        raise UsageError(f"--config: given {len(configs)} times; plan takes one model, or two sharing a card")
    if len(configs) == 2:
        return _two_models(args, configs)
    args.config = configs[0]
    if args.engine == "vllm":
        return plan_vllm.run(args)
    plan_vllm.reject_vllm_options(args)
    from ..memory.fit import budget as B
    from ..memory.fit.lora import check_lora_targets
    from ..memory.fit.shape import model_shape
    from ..memory.fit.config_file import load_config
    from ..memory.fit.weights import FILE_PRECISIONS, PRECISIONS
    from ..units import format_size

    if args.budget is None:
        raise UsageError("--budget is required (or plan vLLM's server with --engine vllm)")
    opts = read_shared_options(args)
    budget, context, targets = opts.budget_bytes, opts.context_bytes, opts.lora_targets
    if args.headroom is not None and not 0 <= args.headroom < 1:
        raise UsageError(f"--headroom: {args.headroom} must be in [0, 1)")
    if args.batch_seq_len < 1:
        raise UsageError(f"--batch-seq-len: {args.batch_seq_len} is out of range")
    if args.replay and not args.train:
        raise UsageError("--replay replays training steps: add --train")
    shape = model_shape(args.config)
    # a GGUF file brings its own precision ("gguf": its tensors as stored), planned first
    own = FILE_PRECISIONS if shape.stored_weights is not None and not args.train else ()
    precisions = read_precisions(args.precision, own + PRECISIONS, PRECISIONS + own)
    config, _ = load_config(args.config)
    note = check_lora_targets(shape, targets, "--lora-targets") if args.train else None
    limit = B.context_limit(config)
    mode = "train" if args.train else "generate"
    headroom = B.default_headroom(mode) if args.headroom is None else args.headroom
    plans = B.plan(shape, budget, train=args.train, precisions=precisions, context_bytes=context,
                   headroom=headroom, new_tokens=opts.new_tokens, reference_seq_len=args.batch_seq_len,
                   lora_r=opts.lora_r, max_seq_len=limit.tokens, limit_source=limit.source,
                   lora_targets=targets, grad_checkpointing=opts.grad_checkpointing, optimizer=opts.optimizer)
    if args.train and args.replay is not False:
        plans = _replayed(plans, shape, args.config, opts, limit)
    offload = _offload(args, opts, B.default_headroom("generate") if args.headroom is None
                       else args.headroom, precisions) if args.offload else None
    advice = _train_advice(shape, plans, opts, budget, context, headroom, args.batch_seq_len, limit.tokens) if args.train else {}
    verified = verification_of(shape, mode)
    overall, code = _overall(plans, verified)
    if offload is not None and not any(p.fits for p in plans):  # the question asked was the offload placement
        overall, code = f"does not fit on the GPU alone; with offload: {offload.reason}", 0
    if args.json:
        out = {"budget_bytes": budget, "context_bytes": context, "headroom": headroom, "mode": mode,
               "context_limit": limit.tokens, "context_limit_source": limit.source, "verification": verified,
               "plans": [p.as_dict() | _engine(p.precision) | _advice_of(advice, p.precision) for p in plans]}
        if args.train:
            out.update(lora_r=opts.lora_r, lora_targets=list(targets), optimizer=opts.optimizer,
                       grad_checkpointing=opts.grad_checkpointing, lora_note=note)
        if offload is not None:
            out["offload"] = offload.as_dict() | ({"moe_note": _moe_note(shape)} if _moe_note(shape) else {})
        print(json.dumps(out | {"verdict": overall}, indent=1))
        return code
    if note:
        print(f"note: {note}", file=sys.stderr)
    recipe = (f"train (LoRA r={opts.lora_r} on {','.join(targets)}, {opts.optimizer}, "
              f"{'with' if opts.grad_checkpointing else 'without'} gradient checkpointing)") if args.train else "generate"
    print(f"budget {format_size(budget)}, CUDA context {format_size(context)}, headroom {headroom:.1%}, "
          f"model limit {limit.tokens or '-'} tokens, mode {recipe}")
    _print_plans(plans, min(args.batch_seq_len, limit.tokens or args.batch_seq_len))
    _print_replayed(plans)
    if not verified["verified"]:
        print(f"note: {verified['note']}; computed through {verified['path']}.")
    _print_advice(plans, advice)
    if offload is not None:
        print_offload(offload)
        if _moe_note(shape):
            print(f"  {_moe_note(shape)}")
    if overall:
        print(f"verdict: {overall}")
    return code


def _overall(plans, verified: dict) -> tuple[str | None, int]:
    """The plan's last line: the precisions that fit (exit 0; an unverified family's with its uncertainty
    kept free), else "tight: unverified family" where something fits only inside that margin, the
    refusal of a step that cannot be traced, or nothing fits (exit 1)."""
    fitting = [p.precision for p in plans if p.fits]
    if fitting and verified["verified"]:
        return f"fits ({', '.join(fitting)})", 0
    if fitting:
        return (f"fits ({', '.join(fitting)}), with the {verified['uncertainty']:.1%} uncertainty of an unverified "
                f"family kept free").replace(".0%", "%"), 0
    tight = [p for p in plans if p.verdict == "tight"]
    if tight:
        from ..memory.fit.budget import tight_unverified_text

        return f"{tight_unverified_text(verified['uncertainty'], verified['family'])} ({', '.join(p.precision for p in tight)})", 1
    refused = [p for p in plans if p.verdict == "unknown"]
    if refused:
        return f"unknown: {refused[0].reason}", 1
    return f"does not fit at any precision asked ({', '.join(p.precision for p in plans)})", 1


def _two_models(args: argparse.Namespace, configs: list) -> int:
    from ..errors import UsageError
    from . import plan_two

    if args.engine == "vllm" or args.offload:
        raise UsageError("two --config plan a shared card; --engine vllm and --offload take one model")
    if args.replay:
        raise UsageError("two --config plan a shared card by the estimate; --replay replays one model's training")
    return plan_two.run(args, configs)


def _replayed(plans, shape, spec, opts: SharedOptions, limit) -> list:
    """The plans of the traced precisions with their limits replayed on torch's caching allocator
    (harness.memory.replay.replay_limits); the others as the reserve rule left them, `replay` saying why:
    "skipped" (a precision the replay does not trace, weights that do not fit) or "error"."""
    from dataclasses import replace

    from ..errors import UnsupportedError
    from ..memory.fit import budget as B
    from ..memory.fit.estimate import Query
    from ..memory.replay.replay_limits import StepReplayer, replay_plan, replay_unavailable
    from ..memory.fit.config_file import load_config
    from ..memory.replay.step_trace import TRACED_PRECISIONS

    from ..memory.family.families import verification
    from ..memory.replay.step_verdict import REPLAY_MARGIN

    say = lambda msg: print(f"replay {msg}", file=sys.stderr, flush=True)  # noqa: E731
    checked = verification(shape.family, "train", shape.source, shape.traits)
    replayer, out = None, []
    hi = limit.tokens or B.UNSTATED_LIMIT
    for p in plans:
        if p.precision not in TRACED_PRECISIONS:
            out.append(replace(p, replay={"skipped": f"the replay traces {' and '.join(TRACED_PRECISIONS)} only"}))
            continue
        if not B.fits(p.weights_bytes, opts.budget_bytes, opts.context_bytes, p.headroom):
            out.append(replace(p, replay={"skipped": "the weights alone do not fit"}))
            continue
        try:
            if replayer is None:  # nf4-dq and fp4-dq allocate alike: one replayer, its traces shared
                missing = replay_unavailable()
                if missing:
                    raise UnsupportedError(missing)
                say(f"{p.precision}: tracing steps around the reserve rule's limits (about 10 s each)")
                recipe = Query(p.precision, "train", lora_r=opts.lora_r, lora_targets=tuple(opts.lora_targets),
                               grad_checkpointing=opts.grad_checkpointing, optimizer=opts.optimizer)
                replayer = StepReplayer(load_config(spec)[0], shape, recipe, opts.budget_bytes, opts.context_bytes,
                                        margin=REPLAY_MARGIN + checked["uncertainty"], progress=say)
            out.append(replay_plan(p, shape, replayer, lo_seq=min(B.TRAIN_MIN_SEQ, hi), hi_seq=hi, max_batch=256,
                                   limit_source=limit.source if limit.tokens else None))
        except UnsupportedError as exc:
            if checked["verified"]:
                out.append(replace(p, replay={"error": str(exc)}))
            else:  # no measurement and no trace: the reserve rule would be a dense stand-in's answer
                out.append(replace(p, fits=False, max_seq_len=None, max_batch=None, peak_at_max_bytes=None,
                                   verdict="unknown", replay={"error": str(exc)},
                                   reason=f"refused: the training step of this unverified family cannot be traced "
                                          f"({exc}), and no GPU measurement backs its estimate"))
    return out


def _print_replayed(plans) -> None:
    replayed = [p for p in plans if p.limits_from == "replay"]
    if replayed:
        traced = {(q["seq_len"], q["batch"]) for p in replayed for axis in ("seq_len", "batch")
                  for q in p.replay[axis]["points"]}
        print(f"{', '.join(p.precision for p in replayed)}: limits replayed on torch's caching allocator "
              f"({len(traced)} traced settings, REPLAY_MARGIN {replayed[0].replay['margin']:.1%}; "
              "docs/vram.md, \"plan --train, replayed\"); the others by the reserve rule")
    for p in plans:
        if p.replay and "error" in p.replay:
            print(f"note: {p.precision} not replayed, its limits are the reserve rule's: {p.replay['error']}")


def verification_of(shape, mode: str) -> dict:
    """Whether the estimator was checked on a GPU for this family and mode, and its path (as estimate says)."""
    from ..memory.family.families import verification

    return verification(shape.family, mode, shape.source, shape.traits)


def _print_plans(plans, batch_seq_len: int) -> None:
    from ..memory.fit.weights import ENGINES
    from ..units import format_bytes

    print(f"{'precision':9s} {'fits':4s} {'weights':>11s} {'max context':>11s} "
          f"{'max batch@' + str(batch_seq_len):>15s}  why")
    for p in plans:
        print(f"{p.precision:9s} {'yes' if p.fits else 'no':4s} {format_bytes(p.weights_bytes):>11s} "
              f"{p.max_seq_len if p.max_seq_len else '-':>11} {p.max_batch if p.max_batch else '-':>15}  {p.reason}")
    for name in dict.fromkeys(p.precision for p in plans if p.precision in ENGINES):
        print(f"{name}: {ENGINES[name]}")
    more = [p for p in plans if p.max_seq_len_expandable and (p.max_seq_len_expandable, p.max_batch_expandable)
            != (p.max_seq_len, p.max_batch)]
    if more:
        from ..memory.fit.budget import EXPANDABLE_SEGMENTS, EXPANDABLE_TRAIN_RESERVE

        limits = ", ".join(f"{p.precision} {p.max_seq_len_expandable} tokens, batch "
                           f"{p.max_batch_expandable or '-'}@{batch_seq_len}" for p in more)
        print(f"with {EXPANDABLE_SEGMENTS} (the allocator gives its holes back; the peak + "
              f"{EXPANDABLE_TRAIN_RESERVE:.0%}): {limits}")


def _moe_note(shape) -> str | None:
    """MoE under accelerate's offload: the hooks move a whole layer, every expert of it."""
    t = shape.traits
    if t is None or not t.experts:
        return None
    return (f"MoE: a token uses {t.experts_per_token} of {t.experts} experts per layer, but accelerate's offload "
            f"hooks copy the whole layer (transformers keeps the experts as one 3-D tensor each), so every "
            f"offloaded expert crosses the bus for every token; bitsandbytes leaves the experts unquantized")


def _train_advice(shape, plans, opts: SharedOptions, budget: int, context: int, headroom: float, seq: int,
                  limit: int | None) -> dict:
    """Per precision whose weights fit: what stops training at --batch-seq-len tokens (batch 1)
    and which change helps most (harness.memory.fit.advice)."""
    from ..memory.fit.advice import train_advice
    from ..memory.fit.estimate import Query

    seq = min(seq, limit) if limit else seq
    out = {}
    for p in plans:
        if not p.fits and p.reason.startswith("weights alone"):
            continue
        q = Query(p.precision, "train", seq_len=seq, batch=1, lora_r=opts.lora_r, lora_targets=tuple(opts.lora_targets),
                  grad_checkpointing=opts.grad_checkpointing, optimizer=opts.optimizer)
        out[p.precision] = train_advice(shape, q, budget, context, headroom,
                                        p.max_seq_len or 0 if p.limits_from == "replay" else None, p.uncertainty)
    return out


def _advice_of(advice: dict, precision: str) -> dict:
    return {"advice": advice[precision].as_dict()} if precision in advice else {}


def _print_advice(plans, advice: dict) -> None:
    from ..memory.fit.advice import advice_lines

    stopped = [p.precision for p in plans if p.precision in advice and not advice[p.precision].fits]
    if advice and not stopped:
        a = next(iter(advice.values()))
        print(f"training at {a.seq_len} tokens fits at every precision whose weights fit")
    loaded = {p.precision: p.weights_bytes for p in plans}
    for precision in stopped:
        print(f"\n{precision}: what stops it and what helps")
        print("\n".join(advice_lines(advice[precision])))
        trained = next((s["bytes"] for s in advice[precision].stopped_by if s["component"] == "weights"), 0)
        if trained > 1.01 * loaded[precision]:  # the table's weights are as loaded
            print(f"    (weights {trained / 2**30:.2f} GiB as trained, {loaded[precision] / 2**30:.2f} GiB as "
                  "loaded: prepare_model_for_kbit_training casts the embeddings, norms and lm_head to fp32)")


def _engine(precision: str) -> dict:
    """Which engine loads a serving precision (w4a16, gguf) and what it holds."""
    from ..memory.fit.weights import ENGINES

    return {"engine": ENGINES[precision]} if precision in ENGINES else {}


def print_offload(o) -> None:
    from ..units import format_bytes

    print(f"\noffload ({o.precision}, accelerate's placement for max_memory GPU "
          f"{format_bytes(o.gpu_max_memory_bytes)}, CPU {format_bytes(o.cpu_max_memory_bytes)}):")
    print(f"  on GPU {format_bytes(o.bytes_on_gpu)} ({o.layers_on['gpu']} layers), CPU "
          f"{format_bytes(o.bytes_on_cpu)} ({o.layers_on['cpu']}), disk {format_bytes(o.bytes_on_disk)} "
          f"({o.layers_on['disk']}); host RAM needed {format_bytes(o.host_ram_bytes)}")
    print(f"  predicted decode {o.predicted_decode_ms:.0f} ms/token ({o.predicted_tokens_per_s:.2f} tokens/s); "
          f"host->device {o.h2d_gbps:.1f} GB/s ({o.h2d_source})")
    print(f"  {o.reason}")
