"""The peak of one decoder layer recomputed and back-propagated under gradient checkpointing
(QLoRA: a 4-bit base, fp32 activations after prepare_model_for_kbit_training), read from the code
that runs, not fitted:

- torch.utils.checkpoint (non-reentrant, what transformers' GradientCheckpointingLayer uses): the
  first saved tensor the backward asks of a layer reruns its whole forward, so everything the layer
  saves for backward is alive at once; the backward then frees each node's saved tensors as it
  passes it, in reverse order: the MLP first, then the attention.
- peft's LoRA Linear4bit.forward: base_layer(x).clone() + lora_B(lora_A(dropout(x))) * scaling, x
  already fp32: each wrapped module keeps its fp32 dropout output and bool mask (5 bytes per input
  element) and lora_A's fp32 output.
- bitsandbytes 0.50 Linear4bit.forward casts x to the compute dtype (bf16) and the output back;
  MatMul4Bit saves no activation, and its backward is grad_bf16 @ dequantize_4bit(W): the whole
  weight dequantized to bf16 beside the bf16 input gradient, then cast back to fp32.
- Llama/Mistral/Qwen decoder layer: RMSNorm keeps its fp32 input (the layer input, already counted
  as the checkpoint's input, then the residual sum h1 for the second norm); rotary embedding makes
  new q/k that only feed SDPA; the MLP keeps act_fn's input (gate), its output and up for the
  product's backward (a fused gate_up keeps the same: the two halves are views of one tensor).
- SDPA: fp32 with grouped-query attention runs the math kernel (no fused fp32 GQA kernel), which
  repeat_interleaves K and V to all heads, saves the scaled q, the scaled repeated K, the repeated
  V, the causal mask as a float (seq x seq) and the softmax output (batch x heads x seq x seq);
  its backward holds the probabilities, their gradient and the scores' gradient at once (softmax's
  backward). Otherwise (fp32 MHA, or a layer with a window mask) a fused kernel saves q, k, v, the
  output and a logsumexp per row, no scores.

The points where the layer can peak (`layer_points`) are: the recompute's softmax, the down
projection's backward (dequantized W_down), the product act_fn(gate) * up's backward (three
intermediate-sized gradients beside the saved MLP tensors), the gate/up projection's backward,
the o projection's backward and the attention's backward (softmax). They peak apart: a long
sequence peaks in the attention (scores grow as seq^2), a short one in the MLP.
"""

from __future__ import annotations

from ..family.families import sdpa_masked_layers
from .lora import resolve_lora_targets
from .weights import block_rounded

LORA_SAVED_PER_INPUT = 5  # fp32 dropout output + its bool mask, per input element
COMPUTE_BYTES = 2  # bnb_4bit_compute_dtype bf16: the dequantized weight and the cast gradients
# fp32 score blocks alive at the attention's backward peak: the code read gives 3 (probabilities,
# their gradient, the scores' gradient) and the allocator-history snapshot of a 2560 x 1 step holds a
# fourth, made in the backward beside them (docs/vram.md). The fit of the first families' rows had
# 4.25: its quarter block was the step's fp32 logits, alive through the backward, which the estimate
# now counts on their own (train_transient.held_logits_bytes).
SCORE_BLOCKS = 4
ATTN_INPUT_KINDS = ("q_proj", "k_proj", "v_proj", "qkv_proj")
MLP_INPUT_KINDS = ("gate_proj", "up_proj", "gate_up_proj")


def _per_layer(groups, kinds, layers: int):
    return [g for g in groups if g.kind in kinds for _ in range(max(1, round(g.count / layers)))]


def _lora_saved(groups, tok: int, r: int) -> int:
    """What each wrapped module keeps for its LoRA backward: dropout output + mask, lora_A's output."""
    return sum(block_rounded(tok * g.in_features * 4) + block_rounded(tok * g.in_features)
               + block_rounded(tok * r * 4) for g in groups)


def _weight(shape, kinds, default_in: int, default_out: int) -> tuple[int, int]:
    """(in, out) of the largest projection of these kinds (the one whose backward peaks)."""
    found = [(g.in_features, g.out_features) for g in shape.linears if g.kind in kinds]
    return max(found, key=lambda io: io[0] * io[1]) if found else (default_in, default_out)


def layer_points(shape, q, act: int = 4) -> dict[str, int]:
    """Bytes alive in one recomputed layer at each candidate peak (the checkpointed inputs of all
    layers and the rest of the step are outside: calibration's base terms)."""
    tok, layers = q.batch * q.seq_len, max(shape.layers, 1)
    h, i, qd = shape.hidden, shape.intermediate, shape.heads * shape.head_dim
    kvd = shape.kv_heads * shape.head_dim
    wrapped = resolve_lora_targets(shape, q.lora_targets).groups
    lora_qkv = _lora_saved(_per_layer(wrapped, ATTN_INPUT_KINDS, layers), tok, q.lora_r)
    lora_o = _lora_saved(_per_layer(wrapped, ("o_proj",), layers), tok, q.lora_r)
    lora_gu = _lora_saved(_per_layer(wrapped, MLP_INPUT_KINDS, layers), tok, q.lora_r)
    lora_down = _lora_saved(_per_layer(wrapped, ("down_proj",), layers), tok, q.lora_r)
    wrapped_kinds = {g.kind for g in wrapped}
    t = lambda width, nbytes=act: block_rounded(tok * width * nbytes)  # noqa: E731
    math = act == 4 and shape.kv_heads < shape.heads and sdpa_masked_layers(shape, q.seq_len) < shape.layers
    scores = block_rounded(q.batch * shape.heads * q.seq_len * q.seq_len * act) if math else 0
    mask = block_rounded(q.seq_len * q.seq_len * act) if math else 0
    # what SDPA saves: math kernel q, repeated K and V (all heads), probabilities, float mask;
    # a fused kernel q, k, v, output and a fp32 logsumexp per head and row
    sdpa = 3 * t(qd) + scores + mask if math else 2 * t(qd) + 2 * t(kvd) + t(shape.heads, 4)
    mlp = 3 * t(i)  # act_fn's input (gate), its output and up, saved for the product's backward
    saved_all = lora_qkv + sdpa + lora_o + t(h) + lora_gu + mlp + lora_down + 2 * t(1, 4)  # + two rsqrt
    g = t(h)  # the gradient arriving at the layer's output (the residual stream's)
    di, do = _weight(shape, ("down_proj",), i, h)
    ui, uo = _weight(shape, MLP_INPUT_KINDS, h, i)
    oi, oo = _weight(shape, ("o_proj",), qd, h)
    dequant = lambda n_in, n_out: block_rounded(n_in * n_out * COMPUTE_BYTES)  # noqa: E731
    lora_grad = lambda kind, width: t(width) if kind in wrapped_kinds else 0  # noqa: E731
    points = {
        # the recompute's softmax: what the attention saved so far, the scores beside the probabilities
        "recompute_softmax": lora_qkv + 3 * t(qd) + mask + 2 * scores + g,
        # down_proj's backward: the bf16 gradient, W_down dequantized, its bf16 product; the LoRA
        # branch's fp32 input gradient already waits in the input buffer
        "down_backward": saved_all + g + t(do, COMPUTE_BYTES) + dequant(di, do) + t(di, COMPUTE_BYTES)
        + lora_grad("down_proj", di),
        # act_fn(gate) * up: the product's gradient and the two it makes, with gate/up still saved
        "mlp_product_backward": saved_all - lora_down + g + 3 * t(i),
        # gate/up's backward: the product's saved tensors are gone, act_fn's input is not
        "gate_up_backward": saved_all - lora_down - 2 * t(i) + g + 2 * t(i) + t(uo, COMPUTE_BYTES)
        + dequant(ui, uo) + t(ui, COMPUTE_BYTES) + lora_grad("up_proj", ui) + lora_grad("gate_up_proj", ui),
        # o_proj's backward: the MLP and the second norm are done; the residual's gradient and h1's
        "o_backward": lora_qkv + sdpa + lora_o + 2 * g + t(oo, COMPUTE_BYTES) + dequant(oi, oo)
        + t(oi, COMPUTE_BYTES) + lora_grad("o_proj", oi),
    }
    if math:  # softmax's backward: probabilities, their gradient, the scores' gradient; V's gradient
        # waits. The H200 rows hold SCORE_BLOCKS score blocks here, not the 3 the code accounts for
        points["attention_backward"] = lora_qkv + 2 * t(qd) + mask + int(SCORE_BLOCKS * scores) + t(qd) + 2 * g
    else:  # the fused kernel's backward: q/k/v gradients beside what it saved
        points["attention_backward"] = lora_qkv + sdpa + 2 * t(qd) + 2 * t(kvd) + t(qd) + 2 * g
    return points


def layer_peak(shape, q, act: int = 4) -> tuple[int, str]:
    """The recomputed layer's peak and where it happens."""
    points = layer_points(shape, q, act)
    where = max(points, key=points.get)
    return points[where], where
