"""Attention and dropout as CUDA runs them, for a trace on the meta device: the SDPA kernel CUDA picks
(flash, memory-efficient, math) and dropout's fused kernel with its bool mask.
"""

from __future__ import annotations

from contextlib import contextmanager


def sdpa_backend(query, key, attn_mask=None, enable_gqa=False) -> str:
    """The kernel CUDA's F.scaled_dot_product_attention picks on sm90 for a training step: flash for
    fp16/bf16 without a mask (grouped-query heads native), else memory-efficient where the heads
    match (it takes fp32 and a mask, not grouped-query heads), else the math path. peft's k-bit
    preparation leaves the layer norms in fp32, so q/k/v arrive in fp32 and grouped-query families
    take the math path, which keeps the fp32 score matrix (the H200 histories of
    measurements/vram/families/run-16)."""
    import torch

    if query.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and query.shape[-1] <= 256:
        return "flash"
    if key.shape[-3] == query.shape[-3]:
        return "efficient"
    return "math"


def _additive(bool_mask, query):
    """A bool attention mask (True: attend) as the additive one SDPA's kernels apply."""
    import torch

    return torch.zeros(bool_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(~bool_mask, float("-inf"))


def _math_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """torch's _scaled_dot_product_attention_math in the order the H200 histories show: fp16/bf16
    upcast to fp32, q scaled, the causal mask made additive, grouped heads repeated, the mask added
    in place, the safe softmax's bool temporaries (safe_softmax_temps)."""
    import math

    import torch

    dtype = query.dtype
    if dtype in (torch.float16, torch.bfloat16):
        query, key, value = query.float(), key.float(), value.float()
    factor = math.sqrt(scale if scale is not None else 1 / math.sqrt(query.shape[-1]))
    query = query * factor  # scaled first, as torch does (an H200 history's order)
    if is_causal:
        causal = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool, device=query.device).tril()
        attn_mask = torch.where(causal, torch.scalar_tensor(0.0, dtype=query.dtype, device=query.device),
                                torch.scalar_tensor(float("-inf"), dtype=query.dtype, device=query.device))
        del causal
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = _additive(attn_mask, query)
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        rep = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(rep, -3), value.repeat_interleave(rep, -3)
    attn = torch.matmul(query, key.transpose(-2, -1) * factor)
    if attn_mask is not None:
        attn.add_(attn_mask)
    attn = torch.ops.aten._safe_softmax(attn, -1)
    if dropout_p > 0.0:
        attn = torch.ops.aten.native_dropout(attn, dropout_p, True)[0]
    return torch.matmul(attn, value).to(dtype)


def sdpa_as_cuda(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention through the kernel CUDA would pick (sdpa_backend): flash and
    memory-efficient by their own ops (a bool mask made additive), the math path as torch runs it
    on CUDA (_math_sdpa)."""
    import torch

    backend = sdpa_backend(query, key, attn_mask, enable_gqa)
    if backend == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                                   scale=scale)[0]
    if backend == "math":
        return _math_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        attn_mask = _additive(attn_mask, query)
    if attn_mask is not None and attn_mask.dim() == 4:
        attn_mask = attn_mask.expand(query.shape[0], query.shape[1], -1, -1)
    return torch.ops.aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, True, dropout_p,
                                                                   is_causal, scale=scale)[0]


def dropout_as_cuda(input, p=0.5, training=True, inplace=False):
    """F.dropout as CUDA's fused kernel runs it: the output and a bool mask."""
    import torch

    if not training or p == 0.0:
        return input
    return torch.ops.aten.native_dropout(input, p, True)[0]


@contextmanager
def functional_as_cuda():
    import torch.nn.functional as F

    saved = F.scaled_dot_product_attention, F.dropout
    F.scaled_dot_product_attention, F.dropout = sdpa_as_cuda, dropout_as_cuda
    try:
        yield
    finally:
        F.scaled_dot_product_attention, F.dropout = saved


def sdpa_without_softcap(module, *args, softcap=None, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, *args, **kwargs)
