"""Transient terms of the peak, fitted to measurements (see measurements/vram/ and
harness/memory/measured/matrix.py): activation / transient peaks are linear in tokens x (hidden,
intermediate, q/k/v width) with coefficients fitted on an H200 (CALIBRATION).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..family.families import sdpa_masked_layers
from .lora import resolve_lora_targets
from .shape import ModelShape
from .weights import dtype_bytes

if TYPE_CHECKING:
    from .estimate import Query

# Each entry maps a feature name to its coefficient; features are defined in features().
# Group keys: "fp32", "half" (fp16/bf16), "int8", "4bit" (nf4, fp4, with or without -dq).

CALIBRATION: dict[str, dict[str, Any]] = {
    "weights/fp32": {},
    "weights/half": {"tied_emb_src": 0.0002692, "largest_linear_src": 0.0069},
    "weights/int8": {"tied_emb_src": 0.002656, "largest_linear_src": 1.715},
    "weights/4bit": {"largest_linear_src": 1.078},
    "prefill/fp32": {"const": 37280000.0, "tok_i": 0.06312, "tok_qkv": 5.187, "scores": 2.273},
    "prefill/half": {"const": 34530000.0, "tok_h": 3.995, "tok_i": 3.001},
    "prefill/int8": {"const": 35860000.0, "tok_h": 4.712, "tok_i": 4.956},
    "prefill/4bit": {"const": 44650000.0, "tok_h": 4.65, "tok_i": 2.827},
    # training: fitted to the fresh-process training matrix (measurements/vram/truth/, the five
    # architectures of the inference fit; phi-3-mini-4k and qwen2.5-3b held out), after the exact
    # terms of train_parts (weights, adapter, optimizer states, saved_activations) are taken off
    "train/half/gc": {"const": 67330000.0, "L_tok_h": 1.005, "grads": 0.05873,
                      "max": [{"tok_v": 7.005, "tok_h": 1.784}, {}]},
    "train/half/nogc": {"const": 93570000.0, "L_tok_h": 5.049, "L_tok_i": 3.118, "L_tok_qkv": 0.7299,
                        "tok_v": 6.979},
    "train/4bit/gc": {"const": 70170000.0, "L_tok_h": 1.014, "grads": 0.01096,
                      "max": [{"tok_v": 8.01, "tok_h": 0.3974},
                              {"scores": 4.252, "tok_i": 0.6778, "tok_qkv": 0.2841, "tok_lora_in": 1.695,
                               "tok_h": 0.2515}]},
    "train/4bit/nogc": {"const": 73540000.0, "L_tok_h": 3.838, "L_tok_i": 3.307, "L_tok_qkv": 0.3554,
                        "L_scores": 1.008, "tok_v": 7.663},
}


def precision_group(precision: str) -> str:
    if precision == "fp32":
        return "fp32"
    if precision in ("fp16", "bf16", "w4a16", "gguf"):  # W4A16 and GGUF compute in 16-bit activations
        return "half"
    if precision == "int8":
        return "int8"
    return "4bit"


def features(shape: ModelShape, precision: str, batch: int, seq: int, act_bytes: int,
              lora_r: int = 0, n_targets: int = 0, lora_in: int = 0) -> dict[str, float]:
    """`n_targets`: LoRA-wrapped modules per layer; `lora_in`: the sum of their in_features over
    all layers (each wrapped module keeps its dropped-out input for the LoRA weight gradient)."""
    tok = batch * seq
    largest_tensor = max(shape.largest_linear, shape.embedding_params)
    layers = max(shape.layers, 1)
    f = {
        "const": 1.0,
        "tok_h": tok * shape.hidden * act_bytes,
        "tok_i": tok * shape.intermediate * act_bytes,
        "tok_qkv": tok * shape.qkv_width * act_bytes,
        "tok_v": tok * shape.vocab * 2,  # in bf16-element units (2 bytes)
        "tok_r": tok * lora_r * n_targets * 4,
        "tok_lora_in": tok * lora_in / layers * act_bytes,  # one layer's LoRA inputs
        "largest_linear_act": shape.largest_linear * 2,  # a dequantized weight in the compute dtype
        "largest_linear_src": shape.largest_linear * 2,  # the bf16 checkpoint tensor
        "largest_tensor_src": largest_tensor * 2,
        # torch's SDPA has no fused fp32 kernel with enable_gqa (flash is half-only, the
        # memory-efficient kernel refuses GQA), so fp32 GQA attention falls back to the math
        # kernel and materialises batch x heads x seq x seq scores. MHA in fp32 stays fused.
        "scores": (batch * shape.heads * seq * seq * act_bytes
                   if act_bytes == 4 and shape.kv_heads < shape.heads else 0),
        "tied_emb_src": shape.embedding_params * 2 if shape.tied else 0,
    }
    for key in ("tok_h", "tok_i", "tok_qkv", "tok_r", "tok_lora_in"):
        f["L_" + key] = f[key] * shape.layers
    # the layers SDPA gets an explicit window mask in run its memory-efficient kernel (K/V repeated
    # to all heads first), which keeps no scores: those layers' saved bytes are train_transient.saved_activations'
    f["L_scores"] = f["scores"] * (shape.layers - sdpa_masked_layers(shape, seq))
    return f


def linear_sum(coeffs: dict[str, Any], feats: dict[str, float]) -> float:
    return sum(c * feats.get(name, 0.0) for name, c in coeffs.items() if name != "max")


def transient_bytes(key: str, feats: dict[str, float], calibration: dict | None = None) -> int:
    """Sum of coefficient x feature; a "max" entry holds phases of which only the largest counts
    (with checkpointing, the loss/logits peak and the peak of a layer recomputed in backward
    happen at different times)."""
    coeffs = (calibration if calibration is not None and key in calibration else CALIBRATION).get(key, {})
    phases = [linear_sum(p, feats) for p in coeffs.get("max", [])]
    return int(linear_sum(coeffs, feats) + max(phases, default=0.0))


def calibration_key(q: "Query") -> str:
    group = precision_group(q.precision)
    if q.mode == "train":
        group = "4bit" if group in ("int8", "4bit") else ("fp32" if group == "fp32" else "half")
        if group == "fp32":
            group = "half"
        return f"train/{group}/{'gc' if q.grad_checkpointing else 'nogc'}"
    if q.mode == "generate":
        return f"prefill/{group}"
    return f"{q.mode}/{group}"


def train_act_bytes(precision: str) -> int:
    # activations are fp32 after prepare_model_for_kbit_training (fp32 norms upcast the stream)
    return 4 if precision_group(precision) in ("int8", "4bit", "fp32") else 2


def features_for(shape: ModelShape, q: "Query") -> dict[str, float]:
    """The features the calibration key of `q` multiplies (as estimate() computes them)."""
    if q.mode != "train":
        return features(shape, q.precision, q.batch, q.seq_len, dtype_bytes(q.precision))
    targets = resolve_lora_targets(shape, q.lora_targets)
    per_layer = targets.modules / max(shape.layers, 1)
    lora_in = sum(g.count * g.in_features for g in targets.groups)
    return features(shape, q.precision, q.batch, q.seq_len, train_act_bytes(q.precision), q.lora_r,
                     round(per_layer), lora_in)
