"""Weight bytes on the device: every nn.Linear at a precision (quant state included), the
unquantized tensors, the KV cache, and the serving precisions (W4A16 checkpoints, GGUF files).

transformers quantizes only the decoder's nn.Linear layers; embeddings, norms, biases and lm_head
stay in the torch dtype (bf16 for quantized loads). int8 (LLM.int8) stores CB int8 plus SCB float32
per output row; nf4/fp4 pack two values per byte plus a float32 absmax per 64, double quantization
stores the absmax as uint8 plus a float32 per 256 blocks; every quant-state tensor is one
allocation (torch's allocator rounds each to 512 bytes).
"""

from __future__ import annotations

import math
from typing import Any

from ...errors import UsageError
from .cache_layout import cache_bytes, layer_bytes
from .shape import ModelShape

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "nf4", "nf4-dq", "fp4", "fp4-dq", "w4a16")
BLOCK = 512  # torch's CUDA caching allocator rounds every allocation up to 512 bytes


def block_rounded(nbytes: float) -> int:
    """Bytes one allocation of `nbytes` takes in torch's caching allocator."""
    return int(math.ceil(nbytes / BLOCK) * BLOCK) if nbytes > 0 else 0


def dtype_bytes(precision: str) -> int:
    """Bytes of one element of the torch dtype a precision keeps unquantized tensors in."""
    return 4 if precision == "fp32" else 2


def quantized_linear_bytes(in_features: int, out_features: int, precision: str) -> int:
    """Device bytes of one nn.Linear weight at `precision`, quant state included."""
    n = in_features * out_features
    if precision == "w4a16":
        return w4a16_linear_bytes(in_features, out_features)
    if precision in ("fp32", "fp16", "bf16"):
        return block_rounded(n * dtype_bytes(precision))
    if precision == "int8":  # Int8Params: CB int8 (the data itself) + SCB float32 per output row
        return block_rounded(n) + block_rounded(4 * out_features)
    nblocks = math.ceil(n / 64)
    packed = block_rounded(math.ceil(n / 2))
    code = block_rounded(16 * 4)  # the 16-value NF4/FP4 code table, one per quant state
    if precision.endswith("-dq"):
        nested = math.ceil(nblocks / 256)
        # absmax as uint8, nested absmax float32, the 256-entry dynamic code, the float32 offset
        return packed + block_rounded(nblocks) + block_rounded(4 * nested) + block_rounded(256 * 4) + block_rounded(4) + code
    return packed + block_rounded(4 * nblocks) + code


def weight_breakdown(shape: ModelShape, precision: str, train_prepared: bool = False) -> dict[str, int]:
    """Bytes by module kind. `train_prepared`: after prepare_model_for_kbit_training (every
    non-4-bit floating parameter cast to float32)."""
    if precision == "gguf":
        return gguf_weight_breakdown(shape)
    other = 4 if (train_prepared and precision not in ("fp16", "bf16")) else dtype_bytes(precision)
    linear_precision = precision
    if train_prepared and precision == "int8":
        linear_precision = "int8"
    out: dict[str, int] = {}
    for g in shape.linears:
        out[f"linear.{g.kind}"] = out.get(f"linear.{g.kind}", 0) + g.count * quantized_linear_bytes(
            g.in_features, g.out_features, linear_precision)
    out["embeddings"] = block_rounded((shape.embedding_params - shape.extra_embedding_params) * other)
    if shape.extra_embedding_params:  # Gemma-4's per-layer input tables (nn.Embedding: never quantized)
        out["per_layer_embeddings"] = block_rounded(shape.extra_embedding_params * other)
    out["lm_head"] = block_rounded(shape.lm_head_params * other)
    if shape.expert_params:  # MoE experts as 3-D nn.Parameters: bitsandbytes quantizes nn.Linear only
        out[EXPERTS_KEY] = block_rounded(shape.expert_params * other)
    norm_params = shape.norm_params - shape.expert_params
    per_norm = norm_params / max(shape.norm_tensors, 1)
    out["norms"] = shape.norm_tensors * block_rounded(per_norm * other) if norm_params else 0
    per_bias = shape.bias_params / max(shape.bias_tensors, 1)
    out["biases"] = shape.bias_tensors * block_rounded(per_bias * other)
    out["rotary"] = shape.layers and block_rounded(shape.head_dim // 2 * 4)  # inv_freq buffer, float32
    return out


# the breakdown's name for fused MoE experts: transformers 5 stores them as 3-D nn.Parameters, which
# bitsandbytes does not quantize (its replacement walks nn.Linear modules), so they stay in the torch
# dtype at every precision (and prepare_model_for_kbit_training casts them to float32)
EXPERTS_KEY = "experts_3d_unquantized"


def weight_bytes(shape: ModelShape, precision: str, train_prepared: bool = False) -> int:
    return sum(weight_breakdown(shape, precision, train_prepared).values())


def kv_cache_bytes(shape: ModelShape, precision: str, batch: int, tokens: int, decode_steps: int = 0) -> int:
    """The generation cache after a prefill of `tokens` and `decode_steps` one-token steps, layer by
    layer as transformers' cache classes hold it (cache_layout.py); without a layout (a GGUF
    file's shape) every layer a full K/V cache."""
    if shape.cache is not None:
        return cache_bytes(shape.cache, dtype_bytes(precision), batch, tokens, decode_steps)
    per_layer = 2 * block_rounded(shape.kv_heads * shape.head_dim * dtype_bytes(precision) * batch * (tokens + decode_steps))
    return shape.layers * per_layer


def largest_cache_layer_bytes(shape: ModelShape, precision: str, batch: int, tokens: int) -> int:
    """One layer's cache at `tokens` (the largest): what a decode step's torch.cat holds twice."""
    if shape.cache is not None:
        return max((layer_bytes(layer, dtype_bytes(precision), batch, tokens) for layer in shape.cache), default=0)
    return kv_cache_bytes(shape, precision, batch, tokens) // max(shape.layers, 1)


def accelerate_style_bytes(shape: ModelShape, precision: str) -> int:
    """The anchor: accelerate's estimate-memory (all parameters at fp32 size, divided by 1/2/4/8
    for float32 / half / int8 / int4), independent of mode and length."""
    divisor = {"fp32": 1, "fp16": 2, "bf16": 2, "int8": 4}.get(precision, 8)
    return shape.total_params * 4 // divisor


# ---------------------------------------------------------------------------------------------
# Serving precisions (issue 14): W4A16 checkpoints and GGUF files. What each engine holds:
# vLLM keeps W4A16 packed (compressed-tensors, GPTQ and AWQ kernels); transformers 5.17 with
# compressed-tensors 0.19 loads it packed and decompresses every layer to bf16 at the first
# forward (measured on an H200, qwen2.5-1.5b: 1.144 GB held after load, 3.114 GB after one
# forward); llama.cpp maps a GGUF file's tensors as they are stored.

FILE_PRECISIONS = ("gguf",)  # the precision a file fixes: valid only with --config FILE.gguf
W4A16_GROUP_SIZE = 128  # llm-compressor's W4A16 preset, GPTQ and AWQ defaults
ENGINES = {
    "w4a16": "vLLM (packed: compressed-tensors, GPTQ, AWQ; CPU build: CPUWNA16 on AVX-512 only); "
             "transformers + compressed-tensors loads it packed and decompresses to bf16 at the first forward "
             "(from then on the bf16 figure, transformers_decompressed_weights)",
    "gguf": "llama.cpp (the file's tensors as stored); transformers dequantizes a GGUF to float on load",
}


def w4a16_linear_bytes(in_features: int, out_features: int, group_size: int = W4A16_GROUP_SIZE,
                       zero_points: bool = False, g_idx: bool = False, scale_bytes: int = 2,
                       rounded: bool = True) -> int:
    """One W4A16 Linear as vLLM holds it (and, with rounded=False, as the checkpoint stores it):
    int32-packed 4-bit values (in*out/2 bytes), a 16-bit scale per group and output channel, an
    int32-packed 4-bit zero point per group and output channel when asymmetric, the int64 [2]
    unpacked shape, and one int32 group index per input channel with activation order."""
    groups = in_features // group_size if group_size > 0 else 1
    parts = [out_features * math.ceil(in_features * 4 / 32) * 4, out_features * groups * scale_bytes, 16]
    if zero_points:
        parts.append(math.ceil(out_features * 4 / 32) * groups * 4)
    if g_idx:
        parts.append(in_features * 4)
    return sum(block_rounded(b) for b in parts) if rounded else sum(parts)


def gguf_weight_breakdown(shape: ModelShape) -> dict[str, int]:
    if shape.stored_weights is None:
        raise UsageError("precision gguf is the precision of a GGUF file: give --config FILE.gguf")
    return dict(shape.stored_weights)


def serving_notes(shape: ModelShape, precision: str) -> dict[str, Any]:
    """Breakdown entries for a serving precision: which engine holds what."""
    notes: dict[str, Any] = {"engine": ENGINES[precision]}
    if precision == "w4a16":
        notes["transformers_decompressed_weights"] = weight_bytes(shape, "bf16")
    return notes
