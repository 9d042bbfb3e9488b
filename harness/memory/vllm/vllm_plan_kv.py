"""The KV-layout part of vLLM's plan (harness.memory.vllm.vllm_plan on a card, vllm_servers on the CPU
build): the per-version layout rules of vllm_kv_rules applied to the memory the plan leaves for
the KV cache, and the lines the plan prints about them."""

from __future__ import annotations

from .vllm_kv_families import CUDA, Platform, Unmodelled
from .vllm_kv_layout import LayoutRefused
from .vllm_kv_rules import KvPlan, plan_kv

# In-flight batches on a CUDA start (async scheduling, on by default from the V1 engine's
# executors): sliding-window and chunked layers keep that many batches of tokens beyond the window.
CUDA_CONCURRENT_BATCHES = 2


def gpu_kv_layout(facts, s, q, kv_bytes: int) -> tuple[KvPlan | None, str]:
    """(the layout plan, '') or (None, why the plan cannot say: unknown). A dense layout planned
    at a version without layout rules returns (None, ''): the dense arithmetic stands."""
    platform = Platform(CUDA.name, q.block_size, CUDA.kernel_block, q.block_size, False)
    return kv_layout(facts.config, s.version, platform, max(kv_bytes, 0), q.max_model_len,
                     s.max_num_batched_tokens, s.act_bytes, s.kv_bytes, CUDA_CONCURRENT_BATCHES)


def kv_layout(config: dict, version, platform: Platform, kv_bytes: int, max_model_len: int,
              max_num_batched_tokens: int, act_bytes: int, kv_dtype_bytes: int,
              concurrent_batches: int = 1) -> tuple[KvPlan | None, str]:
    try:
        return plan_kv(config, version, platform=platform, available_bytes=kv_bytes, max_model_len=max_model_len,
                       max_num_batched_tokens=max_num_batched_tokens, act_dtype_bytes=act_bytes,
                       kv_dtype_bytes=kv_dtype_bytes, max_concurrent_batches=concurrent_batches), ""
    except Unmodelled as exc:
        return None, str(exc)
    except LayoutRefused as exc:
        return None, f"vLLM cannot lay this KV cache out: {exc}"


def layout_fit_reason(layout: KvPlan, max_model_len: int) -> str:
    """'' when one request at max_model_len fits (vLLM's _check_enough_kv_cache_memory), else why."""
    sz = layout.sizing
    if sz.fits_one_request:
        return ""
    hint = f"; --max-model-len {layout.largest_max_model_len} would fit" if layout.largest_max_model_len else ""
    return (f"max_model_len {max_model_len} needs {sz.blocks_per_request} KV blocks across {len(layout.groups)} "
            f"groups ({sz.needed_bytes / 1024**3:.2f} GiB), only {max(sz.num_blocks - 1, 0)} fit{hint}")


def kv_layout_note(layout: KvPlan) -> str:
    kinds: dict[str, int] = {}
    for g in layout.groups:
        key = g["kind"] + (f" {g['window']}" if g.get("window") else "")
        kinds[key] = kinds.get(key, 0) + 1
    parts = ", ".join(f"{n} {k}" for k, n in kinds.items())
    shared = f", {layout.shared_layers} layers reuse earlier layers' KV" if layout.shared_layers else ""
    per_req = layout.sizing.blocks_per_request
    return (f"KV layout ({layout.family}, vLLM's hybrid KV cache manager): {len(layout.groups)} groups ({parts}) of "
            f"{layout.sizing.bytes_per_block:,} bytes per block, block size {layout.block_size}, {per_req} blocks per "
            f"request{shared}")
