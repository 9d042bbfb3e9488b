"""What a vLLM memory plan is asked: the query, its checks, and the vLLM versions the rules cover."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...errors import UsageError
from ..fit.gpus import Gpu

QUANTIZATIONS = ("none", "awq", "gptq", "compressed-tensors", "fp8", "bitsandbytes")
DTYPES = ("auto", "bf16", "fp16", "fp32")
KV_CACHE_DTYPES = ("auto", "fp8")
ENGINES = ("v0", "v1")
ENTRYPOINTS = ("serve", "llm")
DEFAULT_VERSION = "0.32"
OLDEST_VERSION, NEWEST_VERSION = (0, 5, 0), (0, 33, 99)  # the releases these rules were read from
GPU_BLOCK_SIZE = 16


def parse_version(text: str | None) -> tuple[int, int, int]:
    """'0.6.4.post1' -> (0, 6, 4); '0.11' -> (0, 11, 0); '0.8.x' -> (0, 8, 0)."""
    if text is None:
        text = DEFAULT_VERSION
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not m:
        raise UsageError(f"--vllm-version: {text!r} is not a version like 0.11 or 0.6.4")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


@dataclass(frozen=True)
class VllmQuery:
    gpu: Gpu
    gpu_memory_utilization: float
    max_model_len: int
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    dtype: str = "auto"
    quantization: str | None = None  # None: from config.json
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    enable_lora: bool = False
    max_lora_rank: int = 16
    max_loras: int = 1
    weights_bytes: int | None = None
    vllm_version: str = DEFAULT_VERSION
    engine: str | None = None  # v0 | v1; None: what that version picks on that card
    entrypoint: str = "serve"  # serve (OpenAI server) | llm (the LLM class)
    enable_chunked_prefill: bool | None = None
    other_process_bytes: int = 0  # memory other processes hold on the card (desktop, servers)
    flashinfer_sampler: bool = False
    block_size: int = GPU_BLOCK_SIZE


def version_note(version: tuple[int, int, int]) -> str:
    """'' for a version these rules cover; else what the plan assumed."""
    if version > NEWEST_VERSION:
        return (f"vLLM {'.'.join(map(str, version))} is newer than any release these rules were read from "
                f"(0.{NEWEST_VERSION[1]}): planned with 0.{NEWEST_VERSION[1]}'s rules")
    return ""


def validate(q: VllmQuery) -> None:
    if parse_version(q.vllm_version) < OLDEST_VERSION:
        raise UsageError(f"--vllm-version: {q.vllm_version} is older than 0.5, the first release these memory "
                         "rules cover")
    if parse_version(q.vllm_version) > NEWEST_VERSION:
        raise UsageError(f"--vllm-version: {q.vllm_version} is an unknown version: newer than any release these "
                         f"memory rules were read from (0.5 to 0.{NEWEST_VERSION[1]})")
    if not 0 < q.gpu_memory_utilization <= 1:
        raise UsageError(f"--gpu-memory-utilization: {q.gpu_memory_utilization} must be in (0, 1]")
    for name in ("max_model_len", "max_lora_rank", "max_loras", "block_size"):
        value = getattr(q, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"--{name.replace('_', '-')}: {value!r} must be a positive integer")
    for name in ("max_num_seqs", "max_num_batched_tokens", "weights_bytes"):
        value = getattr(q, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise UsageError(f"--{name.replace('_', '-')}: {value!r} must be a positive integer")
    if q.dtype not in DTYPES:
        raise UsageError(f"--dtype: {q.dtype!r} (choose from {', '.join(DTYPES)})")
    if q.quantization is not None and q.quantization not in QUANTIZATIONS:
        raise UsageError(f"--quantization: {q.quantization!r} (choose from {', '.join(QUANTIZATIONS)})")
    if q.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise UsageError(f"--kv-cache-dtype: {q.kv_cache_dtype!r} (choose from {', '.join(KV_CACHE_DTYPES)})")
    if q.engine is not None and q.engine not in ENGINES:
        raise UsageError(f"--vllm-engine: {q.engine!r} (choose from {', '.join(ENGINES)})")
    if q.entrypoint not in ENTRYPOINTS:
        raise UsageError(f"--entrypoint: {q.entrypoint!r} (choose from {', '.join(ENTRYPOINTS)})")
    if q.other_process_bytes < 0:
        raise UsageError("--gpu-used-by-others must be >= 0")
    parse_version(q.vllm_version)
