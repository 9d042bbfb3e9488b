"""`python -m harness plan --engine vllm`: will vLLM start on this card, and how many requests will
it hold? (harness/memory/vllm/vllm_plan.py does the arithmetic; this module is the command line.)

A comma list in --max-model-len, --quantization or --kv-cache-dtype (or --sweep) gives a table:
max-model-len against KV tokens and max concurrency, one column group per precision.
"""

from __future__ import annotations

import argparse
import json
import re

from ..errors import UsageError
from ..units import comma_list, int_list

# option -> default; plan.py's own options are left alone
VLLM_ONLY = {
    "gpu_memory": None, "gpu_memory_utilization": None, "max_model_len": None, "max_num_seqs": None,
    "max_num_batched_tokens": None, "dtype": "auto", "quantization": None, "kv_cache_dtype": "auto",
    "enforce_eager": False, "enable_lora": False, "max_lora_rank": 16, "max_loras": 1, "weights_bytes": None,
    "vllm_version": None, "vllm_engine": None, "entrypoint": "serve", "gpu_used_by_others": None,
    "flashinfer_sampler": False, "sweep": False,
}
DEFAULT_UTILIZATION = 0.9  # vLLM's own default
LAST_V0_VERSION = "0.10.2"  # V0 was removed in 0.11
# a release as pip spells it (0.6.4, 0.10.1.1, 0.8.5.post1, 0.9.0rc2, 0.32.0+cpu) or a minor line (0.8.x)
VERSION_TEXT = re.compile(r"^v?\d+\.\d+(\.(\d+|x))?(\.\d+)*([.-]?(post|rc|dev|a|b)\d*)*(\+[\w.]+)?$")
SWEEP_LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
SWEEP_PRECISIONS = (("none", "auto"), ("fp8", "auto"), ("awq", "auto"), ("awq", "fp8"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The --engine switch and the vLLM options (one argument group). --config stops being an
    argparse-required option here, so that with --engine vllm one error names every missing option
    (reject_vllm_options asks for it on the other path)."""
    for action in parser._actions:
        if "--config" in action.option_strings:
            action.required = False
    parser.add_argument("--engine", choices=("transformers", "vllm"), default="transformers",
                        help="whose memory plan: transformers' generate/training (default) or vLLM's server")
    g = parser.add_argument_group("vLLM (--engine vllm)")
    g.add_argument("--gpu-memory", metavar="SIZE|GPU_NAME",
                   help="total memory as CUDA reports it (14.74GiB) or a card: t4, l4, a10, rtx-3060-6gb, "
                        "rtx-4060-8gb, a100-40gb, a100-80gb, h100, h200, ... (harness/memory/fit/gpus.py); with "
                        "--sweep a comma list of cards gives each one's longest context and concurrency")
    g.add_argument("--gpu-memory-utilization", type=float, metavar="U",
                   help=f"vLLM's share of the card (default {DEFAULT_UTILIZATION}, as vLLM's)")
    g.add_argument("--max-model-len", metavar="L[,L..]", help="context length; a comma list gives a sweep table")
    g.add_argument("--max-num-seqs", type=int, metavar="S", help="default: what that vLLM version picks")
    g.add_argument("--max-num-batched-tokens", type=int, metavar="T", help="default: what that vLLM version picks")
    g.add_argument("--dtype", default="auto", help="auto|bf16|fp16|fp32")
    g.add_argument("--quantization", metavar="Q[,Q..]",
                   help="none|awq|gptq|compressed-tensors|fp8|bitsandbytes (default: from config.json)")
    g.add_argument("--kv-cache-dtype", default="auto", metavar="auto|fp8[,..]")
    g.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    g.add_argument("--enable-lora", action="store_true")
    g.add_argument("--max-lora-rank", type=int, default=16, metavar="R")
    g.add_argument("--max-loras", type=int, default=1, metavar="N")
    g.add_argument("--weights-bytes", metavar="N|SIZE",
                   help="weights as loaded, when the config cannot tell (mixed-precision 'dynamic' 4-bit)")
    g.add_argument("--vllm-version", metavar="X.Y",
                   help="default 0.32 (with --vllm-engine v0: 0.10.2); the memory rules changed across versions")
    g.add_argument("--vllm-engine", choices=("v0", "v1"), help="default: what that version picks on that card")
    g.add_argument("--entrypoint", choices=("serve", "llm"), default="serve",
                   help="vllm serve (default) or the offline LLM class: their batch defaults differ")
    g.add_argument("--gpu-used-by-others", metavar="SIZE",
                   help="memory other processes hold on the card (a desktop: ~0.3 GiB)")
    g.add_argument("--flashinfer-sampler", action="store_true",
                   help="FlashInfer is installed (V1 0.8-0.26: a smaller dummy sampler)")
    g.add_argument("--sweep", action="store_true",
                   help="table of max-model-len (1k-128k) x precision (bf16, fp8, awq, awq + fp8 KV)")


def reject_vllm_options(args: argparse.Namespace) -> None:
    """Without --engine vllm, the vLLM options would be silently ignored: refuse them instead."""
    if getattr(args, "config", "") is None:
        raise UsageError("--config is required")
    given = [name for name, default in VLLM_ONLY.items() if getattr(args, name, default) != default]
    if given:
        raise UsageError(f"--{given[0].replace('_', '-')} needs --engine vllm")


def _list(text: str | None, what: str) -> list[str]:
    return list(comma_list(text, what))


def _int(text: str, what: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not an integer") from None
    if value < 1:
        raise UsageError(f"{what}: {value} must be positive")
    return value


def missing_options(args: argparse.Namespace) -> list[str]:
    """The required options not given, all of them (so one error names every one)."""
    need = [("--config", args.config), ("--gpu-memory", args.gpu_memory)]
    if not args.sweep:
        need.append(("--max-model-len", args.max_model_len))
    return [name for name, value in need if value is None]


def card(spec: str):
    """The card --gpu-memory names; a name that fits several table entries (rtx-3060: the 12 GB
    desktop card and the 6 GB laptop one) is refused with the candidates rather than guessed."""
    from ..memory.fit.gpus import ALIASES, GPUS, _fold, resolve_gpu  # noqa: F401

    key = _fold(spec)
    if key not in GPUS:
        stem = key if key.startswith(("rtx-", "gtx-")) or not key[:1].isdigit() else f"rtx-{key}"
        candidates = sorted(n for n in GPUS if n.startswith(stem + "-"))
        if len(candidates) > 1 and key not in ALIASES.values():
            sizes = ", ".join(f"{n} ({GPUS[n].total_bytes / 1024**3:.2f} GiB)" for n in candidates)
            raise UsageError(f"--gpu-memory: {spec!r} is more than one card: {sizes}; name one, or give the "
                             "total memory CUDA reports (nvidia-smi's MiB, e.g. 5.80GiB)")
    return resolve_gpu(spec)


def version_for(args: argparse.Namespace) -> tuple[str, str | None]:
    """(version, note): V0 without a version is planned as the last release that had it."""
    from ..memory.vllm.vllm_query import DEFAULT_VERSION

    if args.vllm_version:
        for text in args.vllm_version.split(","):
            if not VERSION_TEXT.match(text):
                raise UsageError(f"--vllm-version: {text!r} is not a version like 0.11, 0.6.4 or 0.8.5.post1")
        return args.vllm_version.split(",")[0], None
    if args.vllm_engine == "v0":
        return LAST_V0_VERSION, (f"no --vllm-version: V0 planned with vLLM {LAST_V0_VERSION}'s rules (its last "
                                 "release with V0; V0 from 0.6.5 to 0.10 sizes the cache the same way)")
    return DEFAULT_VERSION, None


def _lora_note(args: argparse.Namespace) -> str | None:
    """--max-lora-rank / --max-loras without --enable-lora: vLLM reserves nothing for LoRA then."""
    given = [f"--{n.replace('_', '-')}" for n in ("max_lora_rank", "max_loras") if getattr(args, n) != VLLM_ONLY[n]]
    if given and not args.enable_lora:
        return f"{' and '.join(given)} without --enable-lora: planned without LoRA, as vLLM starts then"
    return None


def _queries(args: argparse.Namespace):
    from ..memory.vllm.vllm_query import VllmQuery
    from ..units import parse_bytes

    missing = missing_options(args)
    if missing:
        hint = " (--gpu-memory: a size like 5.80GiB or a card name like t4)" if "--gpu-memory" in missing else ""
        raise UsageError(f"plan --engine vllm needs {', '.join(missing)}{hint}")
    gpu = card(args.gpu_memory)
    utilization = DEFAULT_UTILIZATION if args.gpu_memory_utilization is None else args.gpu_memory_utilization
    if args.sweep:
        lengths = list(int_list(args.max_model_len, "--max-model-len") if args.max_model_len else SWEEP_LENGTHS)
        precisions = ([(q, k) for q in _list(args.quantization, "--quantization")
                       for k in _list(args.kv_cache_dtype, "--kv-cache-dtype")]
                      if args.quantization else list(SWEEP_PRECISIONS))
    else:
        if args.max_model_len is None:
            raise UsageError("--max-model-len is required with --engine vllm")
        lengths = [_int(x, "--max-model-len") for x in _list(args.max_model_len, "--max-model-len")]
        quants = _list(args.quantization, "--quantization") if args.quantization else [None]
        precisions = [(q, k) for q in quants for k in _list(args.kv_cache_dtype, "--kv-cache-dtype")]
    weights = None
    if args.weights_bytes is not None:
        text = str(args.weights_bytes)
        weights = int(text) if text.isdigit() else parse_bytes(text, "--weights-bytes")
    others = parse_bytes(args.gpu_used_by_others, "--gpu-used-by-others") if args.gpu_used_by_others else 0
    if others >= gpu.total_bytes:
        raise UsageError(f"--gpu-used-by-others: {args.gpu_used_by_others} is the whole card or more "
                         f"({gpu.name}: {gpu.total_bytes / 1024**3:.2f} GiB)")
    base = dict(gpu=gpu, gpu_memory_utilization=utilization, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens, dtype=args.dtype,
                enforce_eager=args.enforce_eager, enable_lora=args.enable_lora, max_lora_rank=args.max_lora_rank,
                max_loras=args.max_loras, weights_bytes=weights, vllm_version=version_for(args)[0],
                engine=args.vllm_engine, entrypoint=args.entrypoint, other_process_bytes=others,
                flashinfer_sampler=args.flashinfer_sampler)
    return [(quant, kv, length, VllmQuery(max_model_len=length, quantization=quant, kv_cache_dtype=kv, **base))
            for quant, kv in precisions for length in lengths]


def run(args: argparse.Namespace) -> int:
    """0 when the plan starts, 1 when it does not or cannot say (unknown: a failed check, as for
    every command); a sweep table is a report, not a check: 0. `--vllm-version A,B`: both plans
    side by side with the delta and its cause (plan_vllm_versions)."""
    from ..memory.vllm.vllm_plan import plan
    from ..memory.vllm.vllm_model import model_facts

    if args.sweep and args.gpu_memory and "," in args.gpu_memory:
        from .plan_vllm_cards import run_cards
        return run_cards(args, _queries, model_facts, plan)
    if args.vllm_version and "," in args.vllm_version:
        from .plan_vllm_versions import run_versions
        return run_versions(args, _queries, model_facts, plan)
    queries = _queries(args)
    facts = model_facts(args.config)
    notes = [n for n in (version_for(args)[1], _lora_note(args)) if n]
    results = [(quant, kv, length, plan(facts, q, search=len(queries) == 1)) for quant, kv, length, q in queries]
    for *_, r in results:
        r.notes[:0] = notes
    if len(results) == 1:
        result = results[0][3]
        if args.json:
            print(json.dumps(result.as_dict(), indent=1))
        else:
            _print_one(result, facts.name)
        return 0 if result.verdict == "yes" else 1
    if args.json:
        print(json.dumps({"model": facts.name, "plans": [r.as_dict() for *_, r in results]}, indent=1))
        return 0
    _print_sweep(results, facts.name)
    return 0


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB"


def _print_one(p, name: str) -> None:
    s = p.settings
    print(f"vLLM {s['vllm_version']} ({s['engine']} engine, {s['regime']} accounting) · {name} on {s['gpu']} "
          f"({_gib(p.total_bytes)}) · max-model-len {p.max_model_len} · "
          f"{s['max_num_seqs']} seqs x {s['max_num_batched_tokens']} batched tokens")
    print(f"  requested (utilization x total)  {_gib(p.requested_bytes):>11}")
    print(f"  - weights                        {_gib(p.weights_bytes):>11}   {s['quantization']}")
    print(f"  - activation peak (dummy run)    {_gib(p.activation_bytes):>11}   {s['dummy_requests']} requests, "
          f"{s['sampler']} sampler")
    print(f"  - non-torch                      {_gib(p.non_torch_bytes):>11}")
    graphs = "subtracted" if s["cuda_graphs_subtracted"] else "not subtracted (taken after the KV cache)"
    print(f"    CUDA graphs                    {_gib(p.cuda_graph_bytes):>11}   {graphs}")
    per = (f"{p.kv_bytes_per_token} bytes/token" if not p.kv_groups else
           f"{len(p.kv_groups)} KV cache groups (" + ", ".join(_group_text(g) for g in p.kv_groups[:4]) +
           (", ..." if len(p.kv_groups) > 4 else "") + ")")
    print(f"  = KV cache                       {_gib(p.kv_cache_bytes):>11}   {p.num_blocks} blocks of "
          f"{p.block_size} tokens, {per}")
    print(f"  KV cache tokens {p.kv_cache_tokens:,} · max concurrency at {p.max_model_len} tokens: "
          f"{p.max_concurrency:.2f}x")
    for note in p.notes:
        print(f"  note: {note}")
    verdict = p.verdict or ("yes" if p.starts else "no")
    print(f"starts: {'yes' if verdict == 'yes' else verdict + ' — ' + p.reason}")


def _group_text(g: dict) -> str:
    window = f" {g['window']}" if g.get("window") else ""
    return f"{g['layers']} {g['kind']}{window} x {g['pages_per_request']} blocks/request"


def _print_sweep(results, name: str) -> None:
    columns: dict[tuple, dict[int, object]] = {}
    lengths: list[int] = []
    for quant, kv, length, p in results:
        label = (quant or p.settings["quantization"], kv)
        columns.setdefault(label, {})[length] = p
        if length not in lengths:
            lengths.append(length)
    first = results[0][3]
    print(f"{name} on {first.settings['gpu']} ({_gib(first.total_bytes)}), utilization "
          f"{first.requested_bytes / first.total_bytes:.2f}, vLLM {first.settings['vllm_version']}: "
          "KV tokens / max concurrency ('-' = does not start)")
    heads = [f"{q}{' kv-fp8' if k == 'fp8' else ''}" for q, k in columns]
    print(f"{'max-model-len':>13} " + " ".join(f"{h:>22}" for h in heads))
    for length in lengths:
        cells = []
        for label in columns:
            p = columns[label].get(length)
            if p is None:
                cells.append("")
            elif p.verdict == "unknown":
                cells.append("unknown")
            elif not p.starts:
                cells.append("-")
            else:
                cells.append(f"{p.kv_cache_tokens:,} / {p.max_concurrency:.1f}x")
        print(f"{length:>13} " + " ".join(f"{c:>22}" for c in cells))
