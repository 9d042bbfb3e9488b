"""Peak-VRAM predictor: pure arithmetic on a config.json (no torch import for known families).

The estimate itself; its parts live in shape.py (model shape), weights.py (weight and KV bytes,
serving precisions), lora.py (LoRA targets, adapters, optimizers) and calibration.py (fitted
transient terms); import each name from the module that defines it.

What it models (read from the installed transformers / peft / bitsandbytes):
- weights: see weights.py (only the decoder's nn.Linear layers are quantized).
- KV cache: layer by layer as transformers' cache classes hold it (cache_layout.py: full, sliding
  and chunked windows, KV shared across layers, linear-attention / conv / Mamba-2 states).
- prefill: one forward with use_cache=True and logits for the last position only (generate sets
  logits_to_keep=1), the logits copied to float32. generate: the KV cache grows by torch.cat, so a
  decode step briefly holds one layer's cache twice.
- train: LoRA adapters in fp32 (weight + grad + two AdamW states = 16 bytes a parameter); quantized
  bases go through prepare_model_for_kbit_training, which casts every non-4-bit parameter to fp32;
  the loss upcasts logits to float32 (batch * seq * vocab * 4) and keeps a gradient of them.
- activation / transient peaks are linear in tokens x (hidden, intermediate, q/k/v width) with
  coefficients fitted to measurements on an H200 (measurements/vram/, see CALIBRATION).

Unknown architectures fall back to a meta-device parameter count (imports torch + transformers).
A model directory with safetensors gives exact tensor sizes from the headers without loading.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from ...errors import UsageError
from .calibration import (CALIBRATION, calibration_key, features, features_for, precision_group, train_act_bytes,
                          transient_bytes)
from .cache_layout import summary as cache_summary
from ..family.families import eager_attention_base, inference_terms, verification
from .lora import DEFAULT_LORA_TARGETS, adapter_bytes, optimizer_name, resolve_lora_targets
from .shape import ModelShape
from .weights import (ENGINES, EXPERTS_KEY, FILE_PRECISIONS, PRECISIONS, block_rounded, dtype_bytes,
                      kv_cache_bytes, largest_cache_layer_bytes, serving_notes, weight_breakdown)
from .train_transient import fitted_phase, family_train_terms, held_logits_bytes, saved_activations

MODES = ("weights", "prefill", "generate", "train")
# tokens generated after the prompt when a caller does not say: what the H200 matrix measured
# generate with (matrix.GENERATE); estimate and plan use it too
DEFAULT_NEW_TOKENS = 64


# The allocator reserve a card must hold beyond the allocated peak (fragmentation, blocks rounded
# and split), as a fraction of the peak, from the H200 matrices' reserved against allocated:
# - inference 3%: the median max_memory_reserved / max_memory_allocated - 1 is 1.3% (weights),
#   3.8% (prefill), 2.4% (generate) over the inference matrix, and under an emulated 6 GiB card
#   a 3% reserve gave no fit verdict that ran out of memory there (402 rows);
# - training 5.5% of the planned bytes, plus the holes a step cannot reuse (REALLOCATED_HOLES:
#   the optimizer's states, the upcast's bf16 copy); the flat 5.7% it replaces (the median of 96
#   uncapped training rows) let two predicted fits run out (docs/vram.md, "Where a training step's
#   reserve goes").
# `plan` and `estimate --budget` use it as their headroom: peak + reserve + CUDA context <= card.
RESERVE_FRACTION: dict[str, float] = {"weights": 0.03, "prefill": 0.03, "generate": 0.03, "train": 0.055}
# Training where fp32 GQA attention falls back to SDPA's math kernel (calibration.features,
# "scores"): every layer allocates and frees batch x heads x seq x seq blocks (scores, probabilities, their grads),
# and under a capped allocator the holes they leave cannot all be reused. Under the emulated 6 GiB
# card (measurements/vram/truth/) tinyllama nf4 b4 x 1024 ran out with its predicted peak at 84%
# of the cap. The card is asked to keep this many such blocks free beyond the peak: 1.5 separated
# the 42 boundary cases of the first H200 run best (no false fit; 1 gave one, 2 one more false
# alarm), and was then checked on fresh boundary cases (the README of truth/ gives the figures).
FRAGMENTATION_BLOCKS = 1.5
# The holes a training step leaves that a capped caching allocator cannot reuse, beyond a fraction
# of the peak (docs/vram.md, "Where a training step's reserve goes"):
# - "optimizer_states": AdamW's first step creates its states (and the step's foreach temporaries)
#   inside the blocks the backward has just freed, splitting them: the next step's large blocks
#   then need segments of their own;
# - "upcast": prepare_model_for_kbit_training casts the embedding (and an untied lm_head) to fp32
#   and frees the bf16 copy, a hole inside the segment the load carved every weight from. Only
#   the step's large transient blocks can reuse it, never the small pool (LoRA tensors <= 1 MiB,
#   their grads and 8-bit states): what the transients leave of the largest such hole is held
#   beside the peak. Measured (measurements/vram/families/run-06): the four predicted fits that
#   ran out in the fifth run had their peaks right and 0.5-0.9 GiB of large-pool holes at the OOM,
#   whose failed request was a 2 MiB small-pool segment; all four fitted with expandable segments;
#   phi-4-mini's large-pool holes stay at 1.0-1.3 GiB at every rank (its bf16 embedding: 1.15 GiB);
# - "logits": the fp32 logits blocks every step frees and allocates again (0 in this choice).
# The shares and the training RESERVE_FRACTION are one pooled choice over every committed boundary
# case (benchmarks/vram/choose_reserve.py): of the settings that let no predicted fit run out, the
# smallest logistic loss on the margin.
REALLOCATED_HOLES = {"logits": 0.0, "optimizer_states": 1.0, "upcast": 0.75}


@dataclass
class Estimate:
    precision: str
    mode: str
    seq_len: int
    batch: int
    peak_bytes: int
    breakdown: dict[str, Any]
    new_tokens: int | None = None
    lora_r: int | None = None
    lora_targets: list[str] | None = None
    grad_checkpointing: bool | None = None
    params: int = 0
    source: str = "config"
    optimizer: str | None = None
    lora_modules: int | None = None  # modules peft would wrap
    lora_unmatched_targets: list[str] | None = None  # requested targets that match nothing
    reserve_bytes: int = 0  # allocator cache beyond the peak (RESERVE_FRACTION, fragmentation included)
    fragmentation_bytes: int = 0  # the part of the reserve for holes (fragmentation_parts)
    # was this family measured on a GPU for this mode, and through which path was it computed
    verification: dict[str, Any] | None = None

    @property
    def planned_bytes(self) -> int:
        """What a fit verdict compares with the budget, before the fractional reserve."""
        return self.peak_bytes + self.fragmentation_bytes

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Query:
    precision: str
    mode: str
    seq_len: int = 512
    batch: int = 1
    new_tokens: int = DEFAULT_NEW_TOKENS
    lora_r: int = 16
    lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    grad_checkpointing: bool = True
    optimizer: str = "adamw_torch"


def validate(q: Query) -> None:
    if q.precision not in PRECISIONS + FILE_PRECISIONS:
        raise UsageError(f"unknown precision {q.precision!r} (choose from {', '.join(PRECISIONS)})")
    if q.mode not in MODES:
        raise UsageError(f"unknown mode {q.mode!r} (choose from {', '.join(MODES)})")
    for name in ("seq_len", "batch", "lora_r"):
        value = getattr(q, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
    if not isinstance(q.new_tokens, int) or q.new_tokens < 0:
        raise UsageError(f"new-tokens must be >= 0, got {q.new_tokens!r}")
    if q.mode == "train":
        optimizer_name(q.optimizer)


def estimate(shape: ModelShape, q: Query, calibration: dict | None = None) -> Estimate:
    """Predicted peak for one query. `calibration` overrides CALIBRATION entries (for fitting)."""
    est = _estimate(shape, q, calibration)
    est.verification = verification(shape.family, q.mode, shape.source, shape.traits)
    experts = est.breakdown.get("weights_by_kind", {}).get(EXPERTS_KEY)
    if experts:
        est.breakdown["weights_note"] = (
            f"{shape.expert_params:,} MoE expert parameters are 3-D nn.Parameters, not nn.Linear: bitsandbytes "
            f"leaves them unquantized at {q.precision} ({experts / 2**30:.2f} GiB)")
    return est


def _estimate(shape: ModelShape, q: Query, calibration: dict | None = None) -> Estimate:
    validate(q)
    p, group = q.precision, precision_group(q.precision)
    act = dtype_bytes(p)
    if q.mode == "train":
        est = _estimate_train(shape, _trainable(q), calibration)
        holes = fragmentation_parts(shape, q, est.breakdown, est.peak_bytes)
        est.breakdown["fragmentation"] = holes
        est.fragmentation_bytes = sum(holes.values())
        est.reserve_bytes = int(est.planned_bytes * RESERVE_FRACTION["train"]) + est.fragmentation_bytes
        return est
    wb = weight_breakdown(shape, p)
    weights = sum(wb.values())
    breakdown: dict[str, Any] = {"weights": weights, "weights_by_kind": wb}
    if p in ENGINES:
        breakdown.update(serving_notes(shape, p))
    feats = features(shape, p, q.batch, q.seq_len, act)
    reserve = RESERVE_FRACTION[q.mode]
    if q.mode == "weights":
        load = transient_bytes(f"weights/{group}", feats, calibration)
        breakdown["loading_transient"] = load
        peak = weights + load
        return Estimate(p, q.mode, q.seq_len, q.batch, peak, breakdown, params=shape.total_params,
                        source=shape.source, reserve_bytes=int(peak * reserve))
    kv_prefill = kv_cache_bytes(shape, p, q.batch, q.seq_len)
    logits = block_rounded(q.batch * shape.vocab * act) + block_rounded(q.batch * shape.vocab * 4)
    scores = inference_terms(shape, shape.traits, q.batch, q.seq_len, act, p == "fp16")  # eager attention families
    transient = transient_bytes(f"prefill/{group}", feats, calibration)
    if scores:  # eager attention peaks at its softmax, the fitted transient at the MLP: the larger
        transient = max(transient, scores + eager_attention_base(shape, q.batch, q.seq_len, act))
    prefill_peak = weights + kv_prefill + transient + logits
    breakdown.update(kv_cache=kv_prefill, activations=transient, logits=logits)
    if shape.cache is not None:
        breakdown["cache_layers"] = cache_summary(shape.cache)
    if scores:
        breakdown["attention_scores"] = scores
    peak = prefill_peak
    if q.mode == "generate":
        total = q.seq_len + q.new_tokens
        # the cache generate returns: the prompt and new_tokens - 1 decode steps (the last token is
        # never fed back), sliding layers cut to their window (cache_layout.py)
        kv_final = kv_cache_bytes(shape, p, q.batch, q.seq_len, max(q.new_tokens - 1, 0))
        one_layer = largest_cache_layer_bytes(shape, p, q.batch, total)  # torch.cat: old + new of one layer
        dfeats = features(shape, p, q.batch, 1, act)
        decode_peak = (weights + kv_final + one_layer + transient_bytes(f"prefill/{group}", dfeats, calibration)
                       + inference_terms(shape, shape.traits, q.batch, 1, act, p == "fp16") + logits)
        breakdown.update(kv_cache=kv_final, decode_peak=decode_peak, prefill_peak=prefill_peak)
        peak = max(prefill_peak, decode_peak)
    return Estimate(p, q.mode, q.seq_len, q.batch, int(peak), breakdown, new_tokens=q.new_tokens
                    if q.mode == "generate" else None, params=shape.total_params, source=shape.source,
                    reserve_bytes=int(peak * reserve))


def train_parts(shape: ModelShape, q: Query) -> dict[str, Any]:
    """The exactly modelled part of a training peak (`static`: weights, LoRA weights, optimizer
    states in the allocator; `saved`: activations known from the layout) and the features the
    fitted transient multiplies."""
    quantized = precision_group(q.precision) in ("int8", "4bit")
    wb = weight_breakdown(shape, q.precision, train_prepared=quantized)
    weights = sum(wb.values())
    targets = resolve_lora_targets(shape, q.lora_targets)
    ad = adapter_bytes(shape, q.lora_r, targets, q.optimizer)
    feats = features_for(shape, q)
    feats["grads"] = ad["lora_grads"]
    return {"weights_by_kind": wb, "weights": weights, "targets": targets, "adapter": ad,
            "static": weights + ad["lora_weights"] + ad["optimizer_states"], "features": feats,
            "saved": saved_activations(shape, q), "key": calibration_key(q)}


def fragmentation_parts(shape: ModelShape, q: Query, breakdown: dict[str, Any], peak_bytes: int,
                        shares: dict[str, float] | None = None) -> dict[str, int]:
    """Training only: the room kept free beyond the peak for holes the allocator cannot reuse.
    - attention scores: FRAGMENTATION_BLOCKS x the scores block SDPA's math kernel materialises
      (fp32 activations with grouped-query attention), 0 when it stays fused;
    - logits, optimizer states, upcast: `shares` (REALLOCATED_HOLES) of one fp32 logits block, of
      the optimizer's GPU states + step transient, and of what the step's transients (peak minus
      weights, LoRA weights and states) leave unfilled of the largest bf16 tensor
      prepare_model_for_kbit_training freed (`breakdown` is the training estimate's)."""
    if q.mode != "train":
        return {}
    shares = REALLOCATED_HOLES if shares is None else shares
    scores = 0
    if train_act_bytes(q.precision) == 4 and shape.kv_heads < shape.heads:
        scores = int(FRAGMENTATION_BLOCKS * q.batch * shape.heads * q.seq_len * q.seq_len * 4)
    optimizer = breakdown.get("optimizer_states", 0) + breakdown.get("optimizer_step_transient", 0)
    upcast_hole = 0
    if precision_group(q.precision) in ("int8", "4bit"):
        upcast_hole = block_rounded(max(shape.embedding_params, shape.lm_head_params) * 2)
    static = breakdown.get("weights", 0) + breakdown.get("lora_weights", 0) + breakdown.get("optimizer_states", 0)
    return {"attention_scores": scores,
            "logits": int(shares["logits"] * q.batch * q.seq_len * shape.vocab * 4),
            "optimizer_states": int(shares["optimizer_states"] * optimizer),
            "upcast": int(shares["upcast"] * max(0, upcast_hole - (peak_bytes - static)))}


def _estimate_train(shape: ModelShape, q: Query, calibration: dict | None = None) -> Estimate:
    """Peak of a LoRA/QLoRA step as users run it: weights (fp32 non-4-bit parameters after
    prepare_model_for_kbit_training) + LoRA weights + optimizer states (from the second step on)
    + the larger of the activation/loss transient (fitted) and the optimizer step's own transient."""
    p = q.precision
    parts = train_parts(shape, q)
    wb, weights, targets, ad, static, feats, key = (parts[k] for k in (
        "weights_by_kind", "weights", "targets", "adapter", "static", "features", "key"))
    n_lora = sum(g.count * q.lora_r * (g.in_features + g.out_features) for g in targets.groups)
    saved = parts["saved"]
    table = calibration if calibration is not None and key in calibration else CALIBRATION
    coeffs = table.get(key, {})
    fam = family_train_terms(shape, q)
    fitted, phase = fitted_phase(coeffs, feats, fam, shape, q)
    transient = fitted + sum(saved.values())
    loss = int(feats["tok_v"] * max([coeffs.get("tok_v", 0.0)] + [p.get("tok_v", 0.0) for p in coeffs.get("max", [])]))
    loss += fam["logits"]
    if phase == 1 and precision_group(q.precision) == "4bit":
        # the step peaks in the recomputed layer, after the loss's backward has freed its tensors:
        # what is left of logits/loss there is the fp32 logits the step's outputs still hold (the
        # loop keeps `out` through backward, matrix_train.optimizer_steps; the lm_head is fp32 after
        # prepare_model_for_kbit_training) and the loss. Only the split changes, not the peak.
        loss = min(loss, held_logits_bytes(shape, q))
    grads_live = int(feats["grads"] * coeffs.get("grads", 0.0))
    step = ad["lora_grads"] + ad["optimizer_step_transient"]  # after backward: all grads + temp
    breakdown = {"weights": weights, "weights_by_kind": wb,
                 "adapter_grads_optimizer": ad["lora_weights"] + ad["lora_grads"] + ad["optimizer_states"],
                 "lora_params": n_lora, "lora_weights": ad["lora_weights"], "lora_grads": ad["lora_grads"],
                 "optimizer_states": ad["optimizer_states"],
                 "paged_optimizer_states": ad["paged_optimizer_states"],
                 "optimizer_step_transient": ad["optimizer_step_transient"],
                 "activations": transient - loss - grads_live, "loss_logits": loss, "gradients_live": grads_live,
                 "peak_phase": "optimizer step" if step > transient else "forward/backward", **saved}
    if any(fam.values()):
        breakdown["family_terms"] = fam
    peak = static + max(transient, step)
    return Estimate(p, "train", q.seq_len, q.batch, int(peak), breakdown, lora_r=q.lora_r,
                    lora_targets=list(q.lora_targets), grad_checkpointing=q.grad_checkpointing,
                    params=shape.total_params, source=shape.source, optimizer=optimizer_name(q.optimizer),
                    lora_modules=targets.modules, lora_unmatched_targets=list(targets.unmatched))


def _trainable(q: Query) -> Query:
    """Training a W4A16 checkpoint through transformers trains its decompressed bf16 weights."""
    if q.precision == "w4a16":
        return replace(q, precision="bf16")
    if q.precision in FILE_PRECISIONS:
        raise UsageError(f"{q.precision} files are not trained: fine-tune the original model, then convert")
    return q
