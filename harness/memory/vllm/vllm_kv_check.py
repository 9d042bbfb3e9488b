"""vLLM's own KV cache sizing for a config, without starting an engine.

Run BY A vLLM INTERPRETER (not the harness's): `.venvs/vllm-X/bin/python vllm_kv_check.py < cases.json`.
It imports nothing from the harness. Each case is a config.json (dict) and the serving settings; for
each it does what a vLLM worker and engine core do before the KV cache is allocated, with vLLM's own
code at the installed version:

1. `EngineArgs(...).create_engine_config()` (the platform's and the model's config updates);
2. builds the model on the meta device (no weights, no engine, no worker process), so that every
   attention / Mamba / GDN / short-conv layer registers itself as in a real start;
3. `current_platform.update_block_size_for_backend` (hybrid block-size alignment, Mamba padding);
4. the model runner's `get_kv_cache_spec` (KV-sharing layers skipped, backend customisation);
5. `resolve_kv_cache_layout`, then `get_kv_cache_configs` on the given KV bytes and
   `get_kv_cache_capacity`, the figures vLLM logs as "KV cache size: N tokens" and
   "Maximum concurrency".

Prints one JSON list, one object per case: the resolved settings, the per-layer specs, the groups,
num_blocks, kv_cache_tokens and max_concurrency, or {"error": "..."} with vLLM's own message.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import traceback
from types import SimpleNamespace

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
logging.disable(logging.WARNING)


def _spec_dict(spec) -> dict:
    out = {"type": type(spec).__name__, "block_size": spec.block_size, "page_size_bytes": spec.page_size_bytes}
    for name in ("num_kv_heads", "head_size", "head_size_v", "sliding_window", "attention_chunk_size",
                 "shapes", "page_size_padded", "mamba_cache_mode", "num_prefill_checkpoint_blocks"):
        if hasattr(spec, name):
            value = getattr(spec, name)
            out[name] = [list(s) for s in value] if name == "shapes" else value
    if hasattr(spec, "dtype"):
        out["dtype"] = str(spec.dtype).replace("torch.", "")
    if hasattr(spec, "dtypes"):
        out["dtypes"] = [str(d).replace("torch.", "") for d in spec.dtypes]
    return out


_DIST_READY = False


def _init_distributed() -> None:
    global _DIST_READY
    if _DIST_READY:
        return
    from vllm.distributed.parallel_state import ensure_model_parallel_initialized, init_distributed_environment

    from vllm.config import VllmConfig, set_current_vllm_config

    path = tempfile.mktemp(prefix="vllm-kv-check-")
    # No model in the current config: vLLM then creates the expert-parallel group too, so dense
    # and MoE models can be built one after the other in this process.
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"file://{path}", backend="gloo")
        ensure_model_parallel_initialized(1, 1)
    _DIST_READY = True


def quantization_tables() -> dict:
    """vLLM's quantization methods and the activation dtypes of those the plan sizes."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, get_quantization_config

    dtypes = {}
    for name in ("awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "mxfp4", "gpt_oss_mxfp4"):
        dtypes[name] = [str(d).replace("torch.", "") for d in get_quantization_config(name).get_supported_act_dtypes()]
    return {"methods": sorted(QUANTIZATION_METHODS), "act_dtypes": dtypes}


def check(case: dict) -> dict:
    if case.get("kind") == "quantization":
        return quantization_tables()
    import torch
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform
    from vllm.v1.core import kv_cache_utils as U

    with tempfile.TemporaryDirectory() as directory:
        with open(os.path.join(directory, "config.json"), "w") as fh:
            json.dump(case["config"], fh)
        kwargs = dict(model=directory, skip_tokenizer_init=True, max_model_len=case["max_model_len"],
                      dtype=case.get("dtype", "auto"), kv_cache_dtype=case.get("kv_cache_dtype", "auto"),
                      enforce_eager=True, load_format="dummy")
        for key in ("max_num_seqs", "max_num_batched_tokens", "block_size", "quantization",
                    "enable_prefix_caching"):
            if case.get(key) is not None:
                kwargs[key] = case[key]
        vllm_config = EngineArgs(**kwargs).create_engine_config()
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        with set_current_vllm_config(vllm_config):
            _init_distributed()
            with torch.device("meta"):
                initialize_model(vllm_config)
            current_platform.update_block_size_for_backend(vllm_config)
            runner = SimpleNamespace(vllm_config=vllm_config, shared_kv_cache_layers={})
            specs = GPUModelRunner.get_kv_cache_spec(runner)
        cache = vllm_config.cache_config
        if getattr(cache, "kv_cache_layout", "unset") is None:
            from vllm.v1.attention.backends.utils import resolve_kv_cache_layout

            from vllm.v1.worker.worker_base import WorkerBase

            with set_current_vllm_config(vllm_config):
                names = WorkerBase.get_supported_kv_cache_layouts(SimpleNamespace(vllm_config=vllm_config))
            cache.kv_cache_layout = resolve_kv_cache_layout(vllm_config, [names], list(specs.values())).name
        configs = U.get_kv_cache_configs(vllm_config, [specs], [int(case["kv_cache_bytes"])])
        if hasattr(U, "get_kv_cache_capacity"):
            tokens, concurrency = U.get_kv_cache_capacity(vllm_config, configs[0])
        else:
            concurrency = U.get_max_concurrency_for_kv_cache_config(vllm_config, configs[0])
            tokens = int(concurrency * vllm_config.model_config.max_model_len)
        sched = vllm_config.scheduler_config
        return {
            "num_blocks": configs[0].num_blocks,
            "kv_cache_tokens": tokens,
            "max_concurrency": concurrency,
            "max_concurrency_2dp": round(concurrency, 2),
            "block_size": cache.block_size,
            "mamba_block_size": cache.mamba_block_size,
            "mamba_page_size_padded": cache.mamba_page_size_padded,
            "mamba_cache_mode": getattr(cache, "mamba_cache_mode", None),
            "enable_prefix_caching": cache.enable_prefix_caching,
            "kv_cache_layout": getattr(cache, "kv_cache_layout", None),
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "max_num_seqs": sched.max_num_seqs,
            "async_scheduling": bool(getattr(sched, "async_scheduling", False)),
            "max_in_flight_tokens": getattr(vllm_config, "max_in_flight_tokens", None),
            "dtype": str(vllm_config.model_config.dtype).replace("torch.", ""),
            "layers": {name: _spec_dict(spec) for name, spec in specs.items()},
            "groups": [{"layers": list(g.layer_names), "spec": _spec_dict(g.kv_cache_spec)}
                       for g in configs[0].kv_cache_groups],
        }


def main() -> int:
    cases = json.load(sys.stdin)
    # vLLM prints to stdout; the JSON answer goes to the real stdout, everything else to stderr
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    import vllm
    from vllm.model_executor.models import registry

    # vLLM inspects a model class in a subprocess (to keep CUDA out of the parent); there is no
    # CUDA here. (Qwen3.5 needs torchvision importable: scripts/lib.sh, ensure_vllm_torchvision.)
    registry._run_in_subprocess = lambda fn: fn()

    results = []
    for case in cases:
        try:
            result = check(case)
        except Exception as exc:  # vLLM's own refusal is the answer for this case
            if os.environ.get("VLLM_KV_CHECK_TRACE"):
                traceback.print_exc()
            last = traceback.extract_tb(exc.__traceback__)[-1]
            result = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500],
                      "where": f"{os.path.basename(last.filename)}:{last.lineno}"}
        result["id"] = case.get("id")
        result["vllm_version"] = vllm.__version__
        results.append(result)
    answer.write(json.dumps(results) + "\n")
    answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
