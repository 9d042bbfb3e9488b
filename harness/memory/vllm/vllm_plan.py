"""vLLM's memory plan, predicted: will it start on this card, and how many requests will it hold?

vLLM sizes its KV cache once, at start-up (read from its source, per version range):

    kv_bytes = total x gpu_memory_utilization - (weights + activation peak + non-torch [+ graphs])
    blocks   = kv_bytes // (block_size x layers x 2 x kv_heads x head_dim x kv_dtype_bytes)

- weights: "Model loading took" (the allocator's growth while loading: parameters at the load
  dtype or packed quantized tensors, the vocabulary padded to 64 rows, the rotary cos/sin cache,
  and in V1 the LoRA slots); in 0.26 the allocator's slack too, as vLLM loads under
  max_split_size_mb:20 (vllm_alloc.py: 0.11 GiB on a bf16 qwen2.5-1.5b).
- activation: the allocator's peak during one dummy forward over `max_num_batched_tokens` tokens
  spread over `max_num_seqs` requests, then the dummy sampler over one row of logits per request.
  Forward: the MLP holds residual, normed input, gate_up (2I), act (I) and down's output at once:
  T x (3h + 3I) x dtype bytes (Llama-3.1-8B at 20k/29k tokens: 2.06/2.99 GiB predicted, 2.07/2.99
  logged). Sampler: requests x vocab x 37.5 bytes (fp16 logits, their fp32 copy, sort values and
  int64 indices of top-p/top-k, softmax buffers; measured from two logs that differ only in
  max_num_seqs: (1.78 - 1.61) GiB / (32 x 151936)); with FlashInfer's sampler ~14.5 bytes (one
  log: 0.45 GiB for 256 x 128256 logits); the V2 model runner's dummy sampler skips top-k/top-p:
  from 0.27 ~6 bytes (the logits in both dtypes; the 0.27.1 log), in 0.22-0.26 it works on the
  logits in place (Triton kernels; the Gumbel-max sample allocates nothing of that size): 2 bytes,
  the logits in the model's dtype (0.26.0 on the H200: 1024 x 151936 logits and a 0.54 GiB peak,
  below their fp32 copy alone). Kernels that dequantize a whole weight (AWQ/GPTQ before
  sm80, bitsandbytes) add the largest layer in fp16. The larger of forward and sampler counts:
  the forward's tensors are freed before the sampler runs, except the hidden states. The V2
  runner's eager profile (0.26.0's source, logged on the H200) also holds each layer's input
  through its MLP (T x h) and allocates cuBLAS's workspace in it.
- non-torch and what else is counted depends on the version (see REGIMES in vllm_engine.py).
- CUDA graphs are captured after the KV cache is allocated; from 0.20 the V1 model runner first
  estimates their memory and subtracts it (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default);
  the V2 runner's estimate is 0 (`profile_cudagraph_memory` returns 0 in 0.22-0.26), so there
  they come out of the headroom outside the utilization.
- The model runner (vLLM's `VllmConfig.use_v2_model_runner`): V2 from 0.25 for every generate
  model that is not a mixture of experts (and for the MoE architectures it lists), from 0.22 to
  0.24 only for the architectures listed (V2_ARCHITECTURES; 0.22-0.23 unquantized dense ones
  only), V1 otherwise, and V1 without Triton
  (the CPU build). In the V2 runner the non-torch growth over load and profile was 0.22 GiB on the
  H200 (0.26.0: Triton kernels loaded during the profile), not V1's 0.01-0.09.

Then the KV cache must hold one request of max_model_len, or vLLM refuses to start; V1 (from
0.9) also refuses when the free memory at start is below utilization x total.

On the CPU build the KV cache is exactly VLLM_CPU_KVCACHE_SPACE GiB and blocks hold 128 tokens.

The predictor is pure arithmetic on a config.json (or a model directory's safetensors headers).
Checked against 20 published start-up logs (tests/data/vllm_logs/) and, exactly, against the
CPU build's own log (tests/test_vllm_plan_cpu.py, suites/serving).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..fit.gpus import Gpu
from .vllm_alloc import cublas_workspace_bytes, load_slack_bytes
from .vllm_model import ModelFacts
from .vllm_plan_kv import gpu_kv_layout, kv_layout_note, layout_fit_reason
from .vllm_linear_terms import linear_bytes, lora_slot_bytes
from .vllm_query import GPU_BLOCK_SIZE, VllmQuery, parse_version, validate, version_note
from .vllm_engine import EngineSettings, resolve_engine_settings

GiB = 1024**3
MiB = 1024**2


# The dummy sampler's bytes per (request x vocabulary) element, see the module docstring.
SAMPLER_BYTES = {"v0": 37.5, "v1": 37.5, "v1-flashinfer": 14.5, "v2": 6.0, "v2-in-place": 2.0}
# Device memory in use by this process before vLLM's first snapshot (CUDA context, cuBLAS
# handles): 0.41-0.49 GiB in the V1 logs' "Free memory on device (x/y)" lines.
CUDA_CONTEXT_BYTES = int(0.45 * GiB)
# What the "non-torch" term holds, per regime (single GPU; logs: 0.01-0.09 GiB profiled,
# 0.35 GiB when the context is counted, 0.26 GiB when persistent buffers are counted too).
NON_TORCH_PROFILED = int(0.05 * GiB)
NON_TORCH_WITH_CONTEXT = int(0.35 * GiB)
NON_TORCH_CONSUMED = int(0.25 * GiB)
NON_TORCH_V2_PROFILED = int(0.22 * GiB)  # 0.26.0's V2 runner on the H200 (measurements/vllm_plan/)
# Memory of the captured CUDA graphs (logs: 0.17-1.1 GiB; LoRA and long capture lists at the top).
CUDA_GRAPH_BYTES = int(0.3 * GiB)
CPU_BLOCK_SIZE = 128


# ---------------------------------------------------------------------------------------------
# Inputs


# ---------------------------------------------------------------------------------------------
# The terms


def weights_bytes(facts: ModelFacts, s: EngineSettings) -> int:
    if facts.stored_weights_bytes is not None and s.quantization in ("none", facts.quantization):
        base = facts.stored_weights_bytes
    else:
        other = facts.params - facts.linear_params
        if s.quantization == "mxfp4":
            # gpt-oss: MXFP4 experts (4-bit values + one e8m0 scale per 32: 4.25 bits), attention,
            # router and embeddings left in the model dtype (its modules_to_not_convert); the
            # fused expert tensors are the non-linear parameters beyond the embeddings
            embeddings = facts.vocab * facts.hidden * (1 if facts.tied else 2)
            base = (facts.linear_params + embeddings) * s.act_bytes + (other - embeddings) * 4.25 / 8
        else:
            quantized = sum(linear_bytes(i, o, s.quantization, s.act_bytes, facts.group_size,
                                         facts.weight_bits) * c for _, i, o, c in facts.linears)
            base = quantized + other * s.act_bytes
    pad_rows = facts.padded_vocab - facts.vocab
    base += pad_rows * facts.hidden * s.act_bytes * (1 if facts.tied else 2)
    rope = facts.max_position * facts.rotary_dim * s.act_bytes
    slack = load_slack_bytes(facts, s.quantization, s.act_bytes) if _load_max_split(s) else 0
    return int(base + rope + slack)


def _load_max_split(s: EngineSettings) -> bool:
    """0.26's Worker.load_model loads under max_split_size_mb:20 (vllm_alloc); the releases before
    were not read for it, and from 0.27 what is counted is measured another way."""
    return s.engine == "v1" and s.regime == "profiled" and s.version >= (0, 26)


def activation_bytes(facts: ModelFacts, s: EngineSettings, gpu: Gpu, eager: bool = False) -> int:
    T, a = s.max_num_batched_tokens, s.act_bytes
    forward = T * (3 * facts.hidden + 3 * facts.intermediate) * a
    workspace = 0
    if s.runner == "v2" and s.regime == "profiled":
        # Eager: the model's layer loop (Qwen2Model.forward) holds each layer's input hidden
        # states until the layer returns, through its MLP. cuBLAS's workspace is allocated at
        # the first cuBLAS call, inside the profile: in the forward when the linears are
        # unquantized, else in the sampler's lm_head.
        forward += T * facts.hidden * a if eager else 0
        workspace = cublas_workspace_bytes(gpu.compute_capability)
        forward += workspace if s.quantization == "none" else 0
    dequantizes = s.quantization == "bitsandbytes" or (
        s.quantization in ("awq", "gptq") and not gpu.has_marlin and T >= 256)
    if dequantizes:
        forward += facts.largest_linear * 2
    sampler = T * facts.hidden * a + s.profile_requests * facts.padded_vocab * SAMPLER_BYTES[s.sampler] + workspace
    return int(max(forward, sampler))


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass
class VllmPlan:
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_cache_bytes: int
    kv_cache_tokens: int
    max_concurrency: float
    starts: bool
    reason: str
    num_blocks: int = 0
    verdict: str = ""  # yes | no | unknown (a layer kind the plan does not model)
    block_size: int = GPU_BLOCK_SIZE
    kv_bytes_per_token: int = 0
    requested_bytes: int = 0
    total_bytes: int = 0
    max_model_len: int = 0
    largest_max_model_len: int | None = None
    smallest_gpu_memory_utilization: float | None = None
    largest_gpu_memory_utilization: float | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    kv_groups: list[dict] = field(default_factory=list)  # hybrid layouts: vLLM's KV cache groups

    def as_dict(self) -> dict:
        out = asdict(self)
        out["starts"] = self.verdict or ("yes" if self.starts else "no")
        return out


def kv_bytes_per_token(facts: ModelFacts, kv_bytes: int) -> int:
    return 2 * facts.layers * facts.kv_heads * facts.head_dim * kv_bytes


def capacity(num_blocks: int, block_size: int, max_model_len: int, version: tuple[int, int, int],
             engine: str) -> tuple[int, float]:
    """(logged KV tokens, logged max concurrency) as that version prints them."""
    if num_blocks <= 0:
        return 0, 0.0
    if engine == "v0" or version < (0, 9):
        tokens = num_blocks * block_size
        return tokens, tokens / max_model_len
    blocks_per_request = -(-max_model_len // block_size)
    concurrency = num_blocks / blocks_per_request
    if version >= (0, 20):
        return int(concurrency * max_model_len), concurrency
    return num_blocks * block_size, concurrency


def _core(facts: ModelFacts, q: VllmQuery) -> tuple[VllmPlan, EngineSettings]:
    s = resolve_engine_settings(facts, q)
    lora = q.enable_lora
    weights = q.weights_bytes if q.weights_bytes is not None else weights_bytes(facts, s)
    lora_bytes = lora_slot_bytes(facts, q.max_lora_rank, q.max_loras, s.act_bytes) if lora else 0
    act = activation_bytes(facts, s, q.gpu, q.enforce_eager)
    graphs = 0 if q.enforce_eager else CUDA_GRAPH_BYTES
    notes: list[str] = [n for n in (version_note(s.version),) if n]
    if facts.not_modelled:
        notes.append(f"{facts.not_modelled}: the activation peak is the dense-MLP rule's estimate and the weights "
                     "count every expert; the KV cache follows vLLM's per-layer specs")
    total = q.gpu.total_bytes
    requested = math.ceil(total * q.gpu_memory_utilization)
    weights_counted = weights
    if s.regime == "free-delta":
        non_torch = NON_TORCH_PROFILED + lora_bytes
    elif s.regime == "absolute":
        non_torch = NON_TORCH_WITH_CONTEXT + q.other_process_bytes + lora_bytes
    elif s.regime == "profiled":
        non_torch = NON_TORCH_V2_PROFILED if s.runner == "v2" else NON_TORCH_PROFILED
        if s.engine == "v1":
            weights_counted += lora_bytes  # V1 creates the LoRA slots inside "Model loading"
        elif s.version < (0, 7):
            non_torch += lora_bytes  # V0 0.6.5-0.6.6: seen as non-torch growth since init
        elif lora:
            notes.append("V0 from 0.7 allocates the LoRA slots outside every measurement: they are "
                         "not subtracted from the KV cache and come out of the headroom")
    else:
        non_torch = NON_TORCH_CONSUMED
        weights_counted += lora_bytes
    subtracted_graphs = graphs if (s.version >= (0, 20) and s.engine == "v1"
                                   and (s.runner == "v1" or s.version >= (0, 27))) else 0
    kv = requested - (weights_counted + act + non_torch + subtracted_graphs)
    per_token = kv_bytes_per_token(facts, s.kv_bytes)
    bytes_per_block = per_token * q.block_size
    blocks = max(0, kv // bytes_per_block) if kv > 0 else 0
    tokens, concurrency = capacity(blocks, q.block_size, q.max_model_len, s.version, s.engine)
    layout, unknown = gpu_kv_layout(facts, s, q, kv)
    kv_fit = None
    if layout is not None and layout.hybrid:
        blocks, tokens = layout.sizing.num_blocks, layout.sizing.kv_cache_tokens
        concurrency, bytes_per_block = layout.sizing.max_concurrency, layout.sizing.bytes_per_block
        per_token = 0
        kv_fit = layout_fit_reason(layout, q.max_model_len)
    starts, reason = start_verdict(facts, q, s, kv, blocks, bytes_per_block, requested, act,
                                   graphs - subtracted_graphs, kv_fit)
    verdict = "yes" if starts else "no"
    if unknown:
        starts, verdict, reason = False, "unknown", f"unknown: {unknown}"
    if layout is not None and layout.hybrid:
        notes.append(kv_layout_note(layout))
    if s.version < (0, 20) and not q.enforce_eager:
        notes.append(f"CUDA graphs (~{graphs / GiB:.1f} GiB) are captured after the KV cache and come out "
                     f"of the {1 - q.gpu_memory_utilization:.0%} left outside the utilization")
    plan = VllmPlan(
        weights_bytes=int(weights_counted), activation_bytes=int(act), non_torch_bytes=int(non_torch),
        cuda_graph_bytes=int(graphs), kv_cache_bytes=int(kv), kv_cache_tokens=int(tokens),
        max_concurrency=round(concurrency, 2), starts=starts, reason=reason, num_blocks=int(blocks),
        block_size=layout.block_size if layout is not None and layout.hybrid else q.block_size,
        kv_bytes_per_token=per_token, requested_bytes=requested,
        total_bytes=total, max_model_len=q.max_model_len, verdict=verdict,
        kv_groups=layout.groups if layout is not None and layout.hybrid else [],
        settings={"vllm_version": ".".join(map(str, s.version)), "engine": s.engine, "model_runner": s.runner,
                  "regime": s.regime, "quantization": s.quantization, "max_num_seqs": s.max_num_seqs,
                  "max_num_batched_tokens": s.max_num_batched_tokens, "chunked_prefill": s.chunked_prefill,
                  "dummy_requests": s.profile_requests, "sampler": s.sampler, "entrypoint": q.entrypoint,
                  "gpu": q.gpu.name, "kv_cache_dtype": q.kv_cache_dtype,
                  "cuda_graphs_subtracted": bool(subtracted_graphs), "lora_slot_bytes": lora_bytes},
        notes=notes,
    )
    return plan, s


def start_verdict(facts: ModelFacts, q: VllmQuery, s: EngineSettings, kv: int, blocks: int, bytes_per_block: int,
                  requested: int, act: int, late_graphs: int, kv_fit: str | None = None) -> tuple[bool, str]:
    """(starts, why not): vLLM's own refusals at start, in the order it checks them, then a CUDA
    out-of-memory where the card holds less than what is allocated (late_graphs: CUDA graph memory
    not subtracted from the KV cache, taken after it)."""
    total = q.gpu.total_bytes
    starts, reason = True, ""
    limit = facts.max_len_limit
    free_at_start = total - CUDA_CONTEXT_BYTES - q.other_process_bytes
    if limit and q.max_model_len > limit:
        return False, (f"max_model_len {q.max_model_len} is past the model's own limit ({limit}, from "
                       "max_position_embeddings and its RoPE scaling): vLLM refuses it at start unless "
                       "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, and outputs past the trained length are unreliable")
    if s.engine == "v1" and s.version >= (0, 9) and free_at_start < requested:
        starts = False
        reason = (f"free memory at start ({free_at_start / GiB:.2f}/{total / GiB:.2f} GiB after the CUDA "
                  f"context{' and other processes' if q.other_process_bytes else ''}) is below "
                  f"utilization x total ({q.gpu_memory_utilization} x {total / GiB:.2f} = "
                  f"{requested / GiB:.2f} GiB)")
    elif s.quantization == "fp8" and q.gpu.compute_capability < (8, 0):
        starts = False
        reason = "FP8 weights need compute capability 8.0 or newer (Marlin FP8 from sm80, native from sm89)"
    elif kv <= 0:
        starts = False
        reason = "no available memory for the cache blocks"
    elif kv_fit is not None:  # a hybrid layout: vLLM's check over its KV cache groups
        starts, reason = kv_fit == "", kv_fit
    else:
        needed_blocks = -(-q.max_model_len // q.block_size)
        usable_blocks = blocks - (1 if (s.engine == "v1" and s.version >= (0, 20)) else 0)
        if needed_blocks > usable_blocks:
            starts = False
            reason = (f"max_model_len {q.max_model_len} needs {needed_blocks} KV blocks "
                      f"({needed_blocks * bytes_per_block / GiB:.2f} GiB), only {usable_blocks} fit "
                      f"({usable_blocks * q.block_size} tokens)")
    if starts:
        # What is physically on the card once the KV cache (and then the CUDA graphs) are
        # allocated; the dummy run's activation has been handed back by then. Versions that count
        # the CUDA context and other processes inside the utilization cannot overshoot this way;
        # the others can, at utilizations near 1.
        before = 0 if s.regime == "absolute" else CUDA_CONTEXT_BYTES + q.other_process_bytes
        after_graphs = before + requested - act + late_graphs
        if after_graphs > total:
            starts = False
            stage = "allocating the KV cache" if before + requested - act > total else "capturing CUDA graphs"
            reason = (f"CUDA out of memory expected while {stage}: CUDA context"
                      f"{' and other processes' if q.other_process_bytes else ''} ({before / GiB:.2f} GiB) + "
                      f"utilization x total ({requested / GiB:.2f} GiB) - activation handed back "
                      f"({act / GiB:.2f} GiB){' + CUDA graphs' if late_graphs else ''} > "
                      f"{total / GiB:.2f} GiB on the card")
    return starts, reason


def plan(facts: ModelFacts, q: VllmQuery, *, search: bool = True) -> VllmPlan:
    """The plan for one query; when it does not start, also the largest max_model_len and the
    smallest gpu_memory_utilization that would (searched with the whole plan recomputed: in V0
    max_num_batched_tokens follows max_model_len, so the activation moves with it)."""
    validate(q)
    from .vllm_quant_rules import check_quantization
    check_quantization(q.quantization if q.quantization is not None else facts.quantization, q.dtype,
                       parse_version(q.vllm_version), from_config=q.quantization is None)
    result, s = _core(facts, q)
    if result.verdict == "no" and search and not result.reason.startswith("FP8 weights"):
        result.largest_max_model_len = _largest_len(facts, q)
        window = _utilization_window(facts, q)
        hints = []
        if window is not None:
            low, high = window
            result.smallest_gpu_memory_utilization, result.largest_gpu_memory_utilization = low, high
            hints.append(f"--gpu-memory-utilization {low} would start" if low == high else
                         f"--gpu-memory-utilization between {low} and {high} would start")
        if result.largest_max_model_len:
            hints.append(f"--max-model-len {result.largest_max_model_len} would start")
        if not hints:
            hints.append("neither a shorter --max-model-len at this utilization nor another utilization at "
                         "this length starts it: quantize the weights or the KV cache, lower --max-num-seqs "
                         "or --max-num-batched-tokens, or use a larger card")
        result.reason += "; " + "; ".join(hints)
    return result


def _starts(facts: ModelFacts, q: VllmQuery) -> tuple[bool, int]:
    p, _ = _core(facts, q)
    return p.starts, p.kv_cache_tokens


def utilization_limit(q: VllmQuery, version: tuple[int, int, int], engine: str) -> float:
    """The largest utilization V1 (0.9+) accepts: what is free at start over the total."""
    if engine == "v1" and version >= (0, 9):
        free = q.gpu.total_bytes - CUDA_CONTEXT_BYTES - q.other_process_bytes
        return math.floor(100 * free / q.gpu.total_bytes) / 100
    return 1.0


def _largest_len(facts: ModelFacts, q: VllmQuery) -> int | None:
    """Largest max_model_len below the asked one that starts at the asked utilization."""
    lo, hi = 0, q.max_model_len - 1
    if hi < 1 or not _starts(facts, replace(q, max_model_len=1))[0]:
        return None
    # not monotonic across V0's 32K chunked-prefill switch: search each side of it
    best = None
    for lo, hi in ((1, min(hi, 32768)), (32769, hi)):
        if lo > hi or not _starts(facts, replace(q, max_model_len=lo))[0]:
            continue
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if _starts(facts, replace(q, max_model_len=mid))[0]:
                lo = mid
            else:
                hi = mid - 1
        best = lo
    return best


def _utilization_window(facts: ModelFacts, q: VllmQuery) -> tuple[float, float] | None:
    """The utilizations (2 decimals) that start with the asked max_model_len: at least enough for
    the KV cache to hold one request, at most what is free (V1) or what leaves room for the CUDA
    context and graphs. None when no utilization does."""
    s = resolve_engine_settings(facts, q)
    limit = utilization_limit(q, s.version, s.engine)
    ok = [u / 100 for u in range(1, int(round(limit * 100)) + 1)
          if _starts(facts, replace(q, gpu_memory_utilization=u / 100))[0]]
    return (ok[0], ok[-1]) if ok else None
