"""A LoRA/QLoRA training step's transient terms beyond the weights and optimizer: what autograd saves without
checkpointing (exact), the family's own terms, and the fitted transient with its phases (the loss's, the
recomputed layer's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .calibration import linear_sum, precision_group, train_act_bytes
from ..family.families import sdpa_masked_layers, train_terms
from .lora import resolve_lora_targets
from .recompute import layer_peak
from .shape import ModelShape
from .weights import block_rounded

if TYPE_CHECKING:
    from .estimate import Query


# peft's LoRA forward casts the input to the adapter's fp32 and drops it out (lora_dropout > 0):
# each wrapped module keeps the fp32 dropout output (for lora_A's weight gradient) and its bool
# mask, 5 bytes per input element, plus lora_A's fp32 output (for lora_B's). The fits of run 1
# found the same without being told: 5.01 bytes (bf16 bases) and 5.05 (4-bit bases).
LORA_INPUT_BYTES = 4  # the fp32 dropout output, per input element
LORA_MASK_BYTES = 1  # its bool mask


def saved_activations(shape: ModelShape, q: Query) -> dict[str, int]:
    """Without checkpointing, what autograd keeps in every layer that follows from the layout
    alone (exact terms, not fitted):
    - the LoRA inputs of every wrapped module (LORA_INPUT_BYTES + LORA_MASK_BYTES per element,
      and the rank-wide lora_A output);
    - fused q/k/v: query, key and value are slices of one qkv tensor; SDPA saves the value view,
      which keeps the whole tensor alive, query and key parts included (separate q/k projections
      free theirs once rotary embedding has made new tensors) - unless K and V are repeated to all
      heads before the kernel saves them: fp32 GQA (the math kernel repeat_interleaves them for
      enable_gqa) and GQA layers with a window mask (transformers' repeat_kv);
    - a sliding window reached: past the window transformers passes SDPA an explicit boolean mask
      which SDPA turns into a float bias of the activations' dtype in every masked layer and
      saves (5 bytes per element a layer in fp32, as phi-3's rows found); with grouped-query attention those
      layers repeat K and V to all heads first (use_gqa_in_sdpa) and the kernel saves the copies.
    With checkpointing one layer is recomputed at a time: those terms are in the fitted transient."""
    if q.grad_checkpointing:
        return {"lora_inputs": 0, "fused_qkv_saved": 0, "attention_masks": 0, "repeated_kv": 0}
    act = train_act_bytes(q.precision)
    tok = q.batch * q.seq_len
    targets = resolve_lora_targets(shape, q.lora_targets)
    lora = sum(g.count * (block_rounded(tok * g.in_features * LORA_INPUT_BYTES)
                          + block_rounded(tok * g.in_features * LORA_MASK_BYTES)
                          + block_rounded(tok * q.lora_r * 4)) for g in targets.groups)
    qk = tok * (shape.heads + shape.kv_heads) * shape.head_dim * act if shape.fused_qkv else 0
    masked = sdpa_masked_layers(shape, q.seq_len)
    gqa = shape.kv_heads < shape.heads
    qkv_kept = shape.layers if not gqa else 0 if act == 4 else shape.layers - masked
    masks = block_rounded(q.batch * q.seq_len * q.seq_len * (act + 1)) * masked  # float bias + the bool mask
    repeated = 2 * (shape.heads - shape.kv_heads) * shape.head_dim * tok * act
    return {"lora_inputs": lora, "fused_qkv_saved": block_rounded(qk) * qkv_kept,
            "attention_masks": masks, "repeated_kv": block_rounded(repeated) * masked}


def family_train_terms(shape: ModelShape, q: Query) -> dict[str, int]:
    """The family's exact extra terms (families.train_terms) for a training query. With fp32 GQA
    the fitted phase and recompute.layer_points both count the math kernel's score blocks, so an
    eager family's terms are what it keeps beyond them."""
    act = train_act_bytes(q.precision)
    covered = act == 4 and shape.kv_heads < shape.heads  # fp32 GQA: the fit counts math-kernel scores
    return train_terms(shape, shape.traits, q, act, act, covered)


def dequant_backward_bytes(shape: ModelShape, precision: str) -> int:
    """bitsandbytes' MatMul4Bit.backward computes the input gradient as grad_output @
    dequantize_4bit(W): the whole weight, dequantized to the compute dtype (bf16), is alive beside
    the recomputed layer's tensors - the largest linear's at the fitted phase's peak.
    recompute.layer_points counts each projection's own at its backward."""
    if precision_group(precision) != "4bit":
        return 0
    return shape.largest_linear * 2


def held_logits_bytes(shape: ModelShape, q: Query) -> int:
    """The step's fp32 logits, alive through the whole backward: the loop keeps the forward's output
    until backward returns (matrix_train.optimizer_steps), so the recomputed layer peaks beside them. The
    eleventh run's snapshots (measurements/vram/families/run-11) hold them at every
    recomputed-layer peak."""
    return block_rounded(q.batch * q.seq_len * shape.vocab * 4)


def late_backward_bytes(coeffs: dict, feats: dict, shape: ModelShape) -> int:
    """How much higher the recomputed layer peaks at the end of the backward than at its start.
    The fitted phase counts every layer's checkpointed input and almost no LoRA gradient (where the
    backward starts); by the first layer all but one checkpoint are freed and every other layer's
    LoRA gradients are made (where a large rank's all-linear step peaks: the eleventh run's
    Mistral-7B r32 128 x 1 holds 31 layers' gradients at its peak, 4.9% over the estimate without
    this term). Zero when the checkpoints outweigh the gradients."""
    layers = max(shape.layers, 1)
    checkpoints = coeffs.get("L_tok_h", 0.0) * feats["L_tok_h"]
    grads = feats["grads"]
    return max(0, int((layers - 1) / layers * (grads - checkpoints) - coeffs.get("grads", 0.0) * grads))


def fitted_phase(coeffs: dict, feats: dict, fam: dict[str, int], shape: ModelShape,
                  q: Query) -> tuple[int, int | None]:
    """The fitted transient with the family's terms where they happen: with checkpointing the
    loss phase and the recomputed layer's phase peak apart (the "max" entry), so the logits extra
    joins the first and the layer's extra the second; without it everything is saved at once.
    A 4-bit base's recomputed layer is the largest of its points read from the code
    (recompute.layer_points: the MLP's backward at short sequences, the attention's at long ones)
    beside the step's held fp32 logits, never below the fitted phase plus the dequantized weight
    (what the fit's rows measured), and higher by late_backward_bytes where the LoRA gradients
    outweigh the checkpoints.
    Returns the transient and the index of the phase that peaks (0: the loss's, 1: the recomputed
    layer's; None without phases or without checkpointing)."""
    base = linear_sum(coeffs, feats)
    phases = [linear_sum(p, feats) for p in coeffs.get("max", [])]
    if q.grad_checkpointing:
        extra = [fam["logits"], fam["layer_transient"]]
        if precision_group(q.precision) == "4bit" and len(phases) > 1:
            fitted = phases[1] + extra[1] + dequant_backward_bytes(shape, q.precision)
            read = layer_peak(shape, q, train_act_bytes(q.precision))[0] + extra[1] + held_logits_bytes(shape, q)
            phases[1] = max(fitted, read) + late_backward_bytes(coeffs, feats, shape)
            extra[1] = 0
        phases = [v + (extra[i] if i < 2 else 0) for i, v in enumerate(phases)] or [max(extra)]
        winner = max(range(len(phases)), key=phases.__getitem__) if len(phases) > 1 else None
        return int(base + max(phases)) + fam["step"], winner
    return int(base + max(phases, default=0.0)) + fam["layer_saved"] + fam["logits"] + fam["step"], None
