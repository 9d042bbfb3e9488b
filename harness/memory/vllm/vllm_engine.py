"""What vLLM resolves a query to on a card: engine, model runner, memory regime, batch defaults, sampler."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import UsageError
from .vllm_model import ModelFacts
from .vllm_query import VllmQuery, parse_version

GiB = 1024**3


# The architectures vLLM runs on the V2 model runner by default before 0.25 made it the default
# for every model that is not a mixture of experts (vllm/config/vllm.py, per release); from 0.25
# on, the MoE ones listed there still get it.
V2_ARCHITECTURES = {  # 0.22-0.23: and only unquantized dense models
    (0, 22): frozenset({"Qwen3ForCausalLM"}),
    (0, 23): frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}),
    (0, 24): frozenset({"Qwen3ForCausalLM", "DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM",
                        "GraniteMoeForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"}),
    (0, 25): frozenset({"DeepseekV2ForCausalLM", "GraniteMoeForCausalLM", "Qwen2MoeForCausalLM"}),
}


# How vLLM turns its measurements into "memory left for the KV cache", by version range:
REGIMES = {
    "free-delta": "V0 up to 0.6.3: total x util - (free at init - free after the dummy run); "
                  "the activation stays reserved in the allocator cache",
    "absolute": "V0 0.6.4, V1 0.7-0.8: total x util - (torch's absolute peak + everything else "
                "on the card: CUDA context, other processes)",
    "profiled": "V0 0.6.5-0.10, V1 0.9-0.26: total x util - (weights + peak increase during the "
                "dummy run + non-torch increase since init)",
    "consumed": "from 0.27: total x util - (all memory consumed since init + transient peak); "
                "persistent buffers now count",
}


@dataclass
class EngineSettings:
    """What vLLM resolves the query to (defaults filled in)."""

    version: tuple[int, int, int]
    engine: str
    runner: str  # v0 | v1 | v2 (model runner)
    regime: str
    quantization: str
    act_bytes: int
    kv_bytes: int
    max_num_seqs: int
    max_num_batched_tokens: int
    chunked_prefill: bool
    profile_requests: int
    sampler: str


def uses_v2_runner(facts: ModelFacts, v: tuple[int, int, int]) -> bool:
    """vLLM 0.22-0.26's default model runner for this model on a GPU (see vllm_plan's docstring)."""
    if v < (0, 22):
        return False
    listed = V2_ARCHITECTURES[max(k for k in V2_ARCHITECTURES if k <= v[:2])]
    moe = "mixture of experts" in facts.not_modelled
    if v < (0, 24):
        return facts.architecture in listed and not moe and facts.quantization == "none"
    return facts.architecture in listed or (v >= (0, 25) and not moe)


def resolve_engine_settings(facts: ModelFacts, q: VllmQuery) -> EngineSettings:
    v = parse_version(q.vllm_version)
    quant = q.quantization if q.quantization is not None else facts.quantization
    cc = q.gpu.compute_capability
    engine = q.engine
    if engine is None:
        if v < (0, 8):
            engine = "v0"
        elif v >= (0, 11):
            engine = "v1"
        elif cc < (8, 0):  # "Compute Capability < 8.0 is not supported by the V1 Engine"
            engine = "v0"
        elif v < (0, 9) and (quant == "bitsandbytes" or (q.kv_cache_dtype == "fp8" and cc < (9, 0))):
            engine = "v0"
        else:
            engine = "v1"
    if engine == "v0" and v >= (0, 11):
        raise UsageError(f"--vllm-engine v0: vLLM {q.vllm_version} has no V0 engine (removed in 0.11)")
    if engine == "v1" and v < (0, 7):
        raise UsageError(f"--vllm-engine v1: vLLM {q.vllm_version} has no V1 engine (from 0.7, default from 0.8)")
    if engine == "v0":
        runner = "v0"
        regime = "free-delta" if v < (0, 6, 4) else "absolute" if v < (0, 6, 5) else "profiled"
    else:
        runner = "v2" if v >= (0, 27) or uses_v2_runner(facts, v) else "v1"
        regime = "absolute" if v < (0, 9) else "profiled" if v < (0, 27) else "consumed"
    # vLLM downcasts float32 checkpoints to bf16 (fp16 before sm80) unless told --dtype float32
    act_bytes = 4 if q.dtype == "fp32" else 2
    kv_bytes = 1 if q.kv_cache_dtype == "fp8" else act_bytes
    big = q.gpu.total_bytes >= 70 * GiB and ("a100" not in q.gpu.name.lower() or v < (0, 9))
    if engine == "v0":
        seqs = q.max_num_seqs or 256
        chunked = q.enable_chunked_prefill
        if chunked is None:
            chunked = q.max_model_len > 32768 and not q.enable_lora
        if q.max_num_batched_tokens:
            tokens = q.max_num_batched_tokens
        elif chunked:
            tokens = 512 if v < (0, 6, 5) else 2048
        else:
            tokens = max(q.max_model_len, 2048)
        requests = min(seqs, tokens)
    else:
        chunked = True
        if q.entrypoint == "serve":
            default_tokens, default_seqs = (8192, 1024) if big else (2048, 256)
        else:
            default_tokens, default_seqs = (16384, 1024) if big else (8192, 256)
        seqs = q.max_num_seqs or default_seqs
        tokens = q.max_num_batched_tokens or default_tokens
        requests = min(seqs, tokens)
    if runner == "v2":
        sampler = "v2" if v >= (0, 27) else "v2-in-place"
    elif runner == "v1" and q.flashinfer_sampler:
        sampler = "v1-flashinfer"
    else:
        sampler = runner
    return EngineSettings(v, engine, runner, regime, quant, act_bytes, kv_bytes, seqs, tokens, chunked,
                    requests, sampler)
