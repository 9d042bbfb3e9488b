"""Device bytes of the terms vLLM allocates per linear layer: one quantized weight as vLLM holds it,
and the stacked LoRA slots."""

from __future__ import annotations

from .vllm_model import ModelFacts


def linear_bytes(in_f: int, out_f: int, quant: str, act_bytes: int, group: int = 128, bits: int = 4) -> int:
    """Device bytes of one linear weight as vLLM holds it (Marlin repacking keeps the sizes)."""
    n = in_f * out_f
    groups = max(1, in_f // group) if group else 1
    if quant == "none":
        return n * act_bytes
    if quant == "fp8":
        return n + 4 * 2  # fp8 weight + weight and input scales
    if quant == "bitsandbytes":  # nf4, double-quantized absmax (vLLM quantizes that way too)
        from ..fit.weights import quantized_linear_bytes
        return quantized_linear_bytes(in_f, out_f, "nf4-dq")
    if bits == 8:
        return n + out_f * 4 * groups
    packed = n // 2
    scales = groups * out_f * 2
    if quant == "awq":
        return packed + scales + groups * out_f // 2  # int4 zero points packed in int32
    if quant == "gptq":
        return packed + scales + groups * out_f // 2 + in_f * 4  # zeros + g_idx (int32)
    return packed + scales  # compressed-tensors W4A16, symmetric


def lora_slot_bytes(facts: ModelFacts, rank: int, max_loras: int, act_bytes: int) -> int:
    """The stacked LoRA A/B buffers vLLM allocates for max_loras adapters of max_lora_rank, on
    every linear it can adapt, plus the logits processor's (vocabulary + 256 extra tokens)."""
    per_layer = sum(rank * (i + o) * c for _, i, o, c in facts.linears) // max(facts.layers, 1)
    logits = rank * (facts.padded_vocab + 256 + facts.hidden)
    return max_loras * act_bytes * (per_layer * facts.layers + logits)
