"""The harness's own planners, called for the figures a fix needs (every figure here is a prediction,
labelled as such; figures read from the log are kept apart by the recognisers).

- transformers: harness.memory.fit.budget.plan (longest context, largest batch per precision)
- vLLM: harness.memory.vllm.vllm_plan.plan (KV cache tokens, the --max-model-len and the
  --gpu-memory-utilization that start)
- driver and torch builds: harness.hw.compat (the wheel index a driver runs)
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import UsageError
from ..memory.fit.gpus import GPUS, Gpu, resolve_gpu
from .model import Context
from .text import GiB, gib

PLAN_SOURCE = "prediction: harness.memory plan (python -m harness plan)"
VLLM_SOURCE = "prediction: harness.memory.vllm.vllm_plan (python -m harness plan --engine vllm)"


def card_from_total(total_bytes: int | None) -> Gpu | None:
    """The table card whose usable memory matches a total torch or vLLM logged (within 1 %)."""
    if not total_bytes:
        return None
    best = min(GPUS.values(), key=lambda g: abs(g.total_bytes - total_bytes))
    if abs(best.total_bytes - total_bytes) <= 0.01 * total_bytes:
        return best
    return Gpu(f"{total_bytes / GiB:.2f} GiB card (from the log)", int(total_bytes), (8, 0), "log")


def gpu_for(ctx: Context, total_from_log: int | None = None) -> Gpu | None:
    """--gpu-memory when given (it wins: the user knows the card), else the card the log implies."""
    if ctx.gpu_memory:
        return resolve_gpu(ctx.gpu_memory)  # UsageError names --gpu-memory
    return card_from_total(total_from_log)


def transformers_plan(ctx: Context, gpu: Gpu | None, train: bool, seq_len: int | None = None) -> dict[str, Any] | None:
    """Per precision, what fits the card (needs --config and a card size)."""
    if not ctx.config or gpu is None:
        return None
    from ..memory.fit.budget import context_limit, plan
    from ..memory.fit.shape import model_shape
    from ..memory.fit.config_file import load_config

    shape = model_shape(ctx.config)
    config, _ = load_config(ctx.config)
    limit = context_limit(config)
    reference = min(seq_len, limit.tokens) if seq_len and limit.tokens else (seq_len or 2048)
    plans = plan(shape, gpu.total_bytes, train=train, max_seq_len=limit.tokens, reference_seq_len=reference)
    rows = [{"precision": p.precision, "fits": p.fits, "max_seq_len": p.max_seq_len, "max_batch": p.max_batch,
             "at_seq_len": p.reference_seq_len} for p in plans]
    fitting = [r for r in rows if r["fits"]]
    best = max(fitting, key=lambda r: (r["max_batch"] or 0, r["max_seq_len"] or 0), default=None)
    return {"source": PLAN_SOURCE, "model": str(ctx.config), "card": gpu.name, "card_bytes": gpu.total_bytes,
            "mode": "train" if train else "generate", "plans": rows, "best": best}


def plan_text(computed: dict[str, Any] | None) -> str:
    if not computed or not computed.get("plans"):
        return ""
    best = computed.get("best")
    budget = f"{computed['card_bytes'] / GiB:.2f}GiB"
    command = (f"python -m harness plan --config {computed['model']} --budget {budget}"
               f"{' --train' if computed['mode'] == 'train' else ''}")
    if not best:
        return f" The planner finds no precision that fits {computed['card']} ({command})."
    if best["max_batch"]:
        what = f"batch {best['max_batch']} at {best['at_seq_len']} tokens, or {best['max_seq_len']} tokens at batch 1"
    else:
        what = f"{best['max_seq_len']} tokens at batch 1 (batch 1 at {best['at_seq_len']} tokens does not fit)"
    return f" Predicted for {computed['card']}: {best['precision']} fits at most {what} ({command})."


def vllm_plan(ctx: Context, gpu: Gpu | None, utilization: float, max_model_len: int,
              version: str | None = None) -> dict[str, Any] | None:
    """The vLLM plan for the logged settings: does it start, and which length/utilization would."""
    if not ctx.config or gpu is None:
        return None
    from ..memory.vllm import vllm_plan as V
    from ..memory.vllm.vllm_query import DEFAULT_VERSION, VllmQuery
    from ..memory.vllm.vllm_model import model_facts

    facts = model_facts(ctx.config)
    query = VllmQuery(gpu=gpu, gpu_memory_utilization=min(max(utilization, 0.01), 1.0),
                        max_model_len=max_model_len, vllm_version=version or DEFAULT_VERSION)
    result = V.plan(facts, query)
    return {"source": VLLM_SOURCE, "model": str(ctx.config), "card": gpu.name, "starts": result.starts,
            "kv_cache_tokens": result.kv_cache_tokens, "largest_max_model_len": result.largest_max_model_len,
            "smallest_gpu_memory_utilization": result.smallest_gpu_memory_utilization,
            "largest_gpu_memory_utilization": result.largest_gpu_memory_utilization, "reason": result.reason}


def host_load_bytes(ctx: Context) -> dict[str, Any] | None:
    """Host RAM a plain from_pretrained materialises for --config's model, per load dtype."""
    if not ctx.config:
        return None
    from ..memory.fit.shape import model_shape
    from ..memory.fit.weights import weight_bytes

    shape = model_shape(ctx.config)
    return {"source": "prediction: the model's weight bytes (harness.memory.fit.weights) per load dtype",
            "model": str(ctx.config), "fp32_bytes": weight_bytes(shape, "fp32"),
            "bf16_bytes": weight_bytes(shape, "bf16")}


def utilization_that_starts(free_bytes: float, total_bytes: float, margin: float = 0.01) -> float:
    """vLLM V1 refuses to start unless free >= utilization x total: the largest two-decimal
    utilization under free/total, less a margin for what the next start's context takes."""
    return round(max(0.0, math.floor(100 * free_bytes / total_bytes) / 100 - margin), 2)


def torch_index_for_driver_cuda(major: int, minor: int) -> str | None:
    """The torch wheel index this driver runs (None: the driver predates every current build)."""
    if major < 11:
        return None
    from ..hw.compat import wheel_for_driver

    return wheel_for_driver((major, minor))


def safe(fn, *args, **kwargs):
    """A planner's figures, or None with the reason when the given config cannot be planned."""
    try:
        return fn(*args, **kwargs)
    except UsageError:
        raise
    except Exception as exc:  # a planner that cannot handle this config must not hide the explanation
        return {"error": f"planner failed: {type(exc).__name__}: {exc}"}
