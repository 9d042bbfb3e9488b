"""What makes a family's memory differ, read from its config and from transformers' modeling code
(transformers 5.x: models/<family>/modeling_<family>.py), not fitted.

The fitted transient terms (calibration.py) were measured on SDPA families with two RMSNorms per
layer, no q/k norms and plain logits (Llama, Qwen2, Phi-3). FamilyTraits names what a config does
differently, and the functions below turn each trait into the bytes autograd keeps alive for it:

- eager attention (Gemma-2 from transformers 5.21: `_supports_sdpa = False`, because SDPA cannot
  soft-cap; up to 5.20 it declared `_supports_sdpa = True`, so from_pretrained picked SDPA, which
  ignores the soft-cap, and nothing below applies - attention_implementation): every layer
  materialises batch x heads x seq x seq scores. eager_attention_forward keeps, for backward,
  tanh's output when attention logits are soft-capped (tanh saves its result), the fp32 softmax
  output, and its cast back to the activation dtype when that is not fp32; repeat_kv copies K and
  V to all heads and matmul saves the copies. The boolean masks become float masks of the
  activation dtype, one per layer type (full, sliding), shared by the layers.
- final-logit soft-capping (Gemma-2, 30.0): logits / cap -> tanh -> * cap in the CausalLM forward:
  tanh's output is saved, one more logits-sized tensor alive at the loss's backward peak (the
  returned logits, log_softmax's saved output and the two gradients of cross-entropy's backward
  are there for every family; the chain's own gradients come after that peak has passed).
- q/k norms (Qwen3, Gemma-3): an RMSNorm over every query and key head; with frozen norm weights
  it keeps its fp32 input (the projection's output, otherwise not saved) for backward.
- four RMSNorms per layer (Gemma-2/3: pre/post attention, pre/post feed-forward) instead of two:
  each keeps its fp32 input.
- sliding-window layers (Gemma-2 every other layer, Gemma-3 five of six): past the window SDPA gets
  an explicit mask in those layers only (sdpa_masked_layers); with a mask transformers repeats K
  and V to all heads (use_gqa_in_sdpa is False) and SDPA runs its memory-efficient kernel, which
  saves the repeated K/V and the mask's float bias, not a scores block (the fitted fp32 GQA
  scores term counts the unmasked layers only); during decoding their cache keeps window - 1 tokens.
- scaled embeddings (Gemma: embeddings x sqrt(hidden)): one hidden-sized tensor, transient.
- MoE (Qwen3-MoE, Mixtral in transformers 5): experts are 3-D nn.Parameters, not nn.Linear, so
  bitsandbytes leaves them in the torch dtype; they count as unquantized weights.

Which families the estimate was checked against on a GPU is each entry's `verified` in registry.py
(kept honest by a test that recomputes it from the committed measured rows).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from importlib import metadata
from typing import Any

from .registry import Family, family as registry_entry

# The uncertainty an estimate carries where no GPU measurement backs the family (or the attention
# this transformers picks for it), by mode group: the worst under-prediction the generic path (the
# exact layout, a bare dense family's transient terms) makes on the measured families' committed
# rows, rounded up to the next half per cent (benchmarks/vram/unverified_margin.py recomputes it;
# tests/test_estimate_uncertainty.py holds it to that). Inference: 78 rows of 6 families, worst
# -2.8% (phi-4-mini); training: 79 rows, worst -14.4% (gemma-2-2b, its eager scores and soft-cap
# dropped). A fit inside it is "tight: unverified family", never a plain fit.
UNVERIFIED_MARGIN = {"inference": 0.03, "train": 0.145}
# Each family's verification state, measured margins (`measured_under`: an unverified family's
# uncertainty is never below what was measured for it; tests/test_memory_families.py holds every
# measured family's rows inside its stated uncertainty) and traits are its entry in registry.py.


@dataclass(frozen=True)
class FamilyTraits:
    family: str
    attention: str = "sdpa"  # sdpa | eager
    attn_softcap: float | None = None
    final_softcap: float | None = None
    qk_norm: bool = False
    norms_per_layer: int = 2
    sliding_layers: int = 0  # layers attending to a window (all layers when the config says so)
    scaled_embeddings: bool = False
    experts: int = 0  # MoE: experts per layer (0: dense)
    experts_per_token: int = 0

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def differs(self) -> list[str]:
        """The traits the fitted families do not have, in words."""
        out = []
        if self.attention == "eager":
            out.append("eager attention (scores materialised per layer)")
        if self.attn_softcap:
            ignored = "" if self.attention == "eager" else ", ignored by SDPA"
            out.append(f"attention-logit soft-capping ({self.attn_softcap:g}{ignored})")
        if self.final_softcap:
            out.append(f"final-logit soft-capping ({self.final_softcap:g})")
        if self.qk_norm:
            out.append("q/k norms")
        if self.norms_per_layer != 2:
            out.append(f"{self.norms_per_layer} norms per layer")
        if self.scaled_embeddings:
            out.append("scaled embeddings")
        if self.experts:
            out.append(f"MoE ({self.experts} experts, {self.experts_per_token} active; experts stay unquantized)")
        return out


def _entry(family: str) -> Family:
    """The family's registry entry; a family it does not list has none of the traits or measurements."""
    return registry_entry(family) or Family(family)


def tied_by_default(family: str) -> bool:
    """Whether the family's config class defaults to tied embeddings."""
    return _entry(family).tied_by_default


def _int(value: Any, default: int = 0) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def sliding_layer_count(config: dict, window: int | None) -> int:
    """Layers with a sliding window: the config's layer_types, else Gemma's patterns, else all
    layers when a window applies (Mistral, Phi-3)."""
    layers = _int(config.get("num_hidden_layers"))
    if window is None:
        return 0
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        return sum(1 for t in types if t == "sliding_attention")
    family = str(config.get("model_type") or "")
    if family == "gemma2":  # even layers slide (Gemma2Config.layer_types default)
        return (layers + 1) // 2
    if family in ("gemma3_text", "gemma3"):
        pattern = _int(config.get("sliding_window_pattern"), 6) or 6
        return sum(1 for i in range(layers) if (i + 1) % pattern)
    return layers


def installed_transformers() -> str | None:
    """The installed transformers' version, read without importing it (None: not installed)."""
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def _version_tuple(version: str) -> tuple[int, int]:
    parts = [int("".join(c for c in p if c.isdigit()) or 0) for p in version.split(".")[:2]]
    return (parts + [0, 0])[0], (parts + [0, 0])[1]


def attention_implementation(family: str, transformers: str | None) -> str:
    """What from_pretrained picks without attn_implementation: SDPA where the model class declares
    `_supports_sdpa`, else eager. `transformers` None: the newest behaviour (eager for Gemma-2)."""
    since = _entry(family).eager_since
    if since is None:
        return "sdpa"
    if transformers is not None and (5, 0) <= _version_tuple(transformers) < since:
        return "sdpa"
    return "eager"


def at_transformers(shape, transformers: str | None):
    """`shape` as the given transformers version runs it (the attention it picks); unchanged
    when no version is given."""
    if transformers is None or shape.traits is None:
        return shape
    attention = attention_implementation(shape.traits.family, transformers)
    return replace(shape, traits=replace(shape.traits, attention=attention))


def sdpa_masked_layers(shape, seq: int) -> int:
    """Layers whose SDPA call gets an explicit mask at this sequence length: past the sliding
    window, the sliding ones (Gemma-3: 5 of 6; all layers when the config says nothing more);
    none for eager attention (one shared float mask, train_terms) or within the window."""
    if shape.sliding_window is None or seq < shape.sliding_window:
        return 0
    traits = shape.traits
    if traits is None:
        return shape.layers
    if traits.attention == "eager":
        return 0
    return min(traits.sliding_layers, shape.layers) if traits.sliding_layers else shape.layers


def traits_from_config(config: dict, window: int | None = None, transformers: str | None = None) -> FamilyTraits:
    """`transformers`: the version whose attention choice applies (default: the installed one)."""
    family = str(config.get("model_type") or "unknown").lower()
    entry = _entry(family)
    softcap = config.get("attn_logit_softcapping")
    final = config.get("final_logit_softcapping")
    experts = _int(config.get("num_experts") or config.get("num_local_experts"))
    return FamilyTraits(
        family=family,
        attention=attention_implementation(family, transformers or installed_transformers()),
        attn_softcap=float(softcap) if isinstance(softcap, (int, float)) and softcap else None,
        final_softcap=float(final) if isinstance(final, (int, float)) and final else None,
        qk_norm=entry.qk_norm,
        norms_per_layer=4 if entry.four_norms else 2,
        sliding_layers=sliding_layer_count(config, window),
        scaled_embeddings=family.startswith("gemma"),
        experts=experts,
        experts_per_token=_int(config.get("num_experts_per_tok")),
    )


def verification(family: str, mode: str, source: str, traits: FamilyTraits | None = None) -> dict[str, Any]:
    """Whether the estimate of `mode` was checked on a GPU for this family, and how it was made."""
    entry = _entry(family)
    infer_ok, train_ok = entry.verified
    checked = train_ok if mode == "train" else infer_ok
    attention = traits.attention if traits is not None else None
    other_attention = checked and attention not in (None, entry.verified_attention or attention)
    layout = {"config": "the exact layout from config fields", "meta": "a layout counted on the meta device",
              "safetensors": "the layout from the safetensors headers", "gguf": "the layout from the GGUF header"}.get(source, source)
    differs = traits.differs if traits is not None else []
    path = (f"{layout}, transient terms fitted on Llama/Qwen2 (SDPA)"
            + (f", plus this family's own terms: {', '.join(differs)}" if differs else ""))
    checked = checked and not other_attention
    group = "train" if mode == "train" else "inference"
    measured = entry.measured_under.get(group, 0.0)
    out = {"family": family, "verified": checked, "measured_on": list(entry.verified_by) if checked else [],
           "path": path, "uncertainty": 0.0 if checked else max(UNVERIFIED_MARGIN[group], measured)}
    what = f"unverified for {family} {'training' if mode == 'train' else 'inference'}"
    if other_attention:
        out["note"] = (f"{what} with {attention} attention (what this transformers picks): the GPU rows were "
                       f"measured with {entry.verified_attention} attention")
    elif not checked and group in entry.measured_under:
        out["note"] = (f"{what}: measured on the H200 with errors outside the goals, the worst "
                       f"under-prediction {measured:.1%}; its uncertainty is "
                       f"{out['uncertainty']:.1%}").replace(".0%", "%")
    elif not checked:
        out["note"] = f"{what}: no GPU measurement of this family backs it"
    return out


# ---------------------------------------------------------------------------------------------
# Bytes, per trait


def score_elements(shape, batch: int, q_len: int, kv_len: int) -> int:
    return batch * shape.heads * q_len * kv_len


def eager_saved_bytes_per_score(traits: FamilyTraits, act: int) -> int:
    """What eager_attention_forward keeps per score element for backward."""
    tanh = act if traits.attn_softcap else 0
    cast = act if act != 4 else 0  # softmax's fp32 output cast back to the activation dtype
    return tanh + 4 + cast


def train_terms(shape, traits: FamilyTraits | None, q, act: int, logit_bytes: int, covered_scores: bool) -> dict[str, int]:
    """Extra bytes of a LoRA/QLoRA step for this family beyond the fitted SDPA-family terms.
    `covered_scores`: the fitted terms already count one fp32 score block per layer (no
    checkpointing) / ~4 blocks in the recomputed layer (checkpointing) - fp32 GQA, where SDPA falls
    back to its math kernel. Keys: `layer_saved` (all layers, no checkpointing), `layer_transient`
    (one recomputed layer, checkpointing), `logits` (the loss phase), `step` (the whole step)."""
    out = {"layer_saved": 0, "layer_transient": 0, "logits": 0, "step": 0}
    if traits is None:
        return out
    tok = q.batch * q.seq_len
    layers = max(shape.layers, 1)
    sc = score_elements(shape, q.batch, q.seq_len, q.seq_len)
    if traits.attention == "eager":
        saved = eager_saved_bytes_per_score(traits, act)
        repeat = 2 * (shape.heads - shape.kv_heads) * shape.head_dim * tok * act
        grads = 2 * 4  # backward through softmax: the fp32 grad of its output and of its input
        if covered_scores:  # the math kernel's probabilities and repeated K/V are in the fit already:
            # one fp32 block per layer saved, ~4.25 blocks in the recomputed layer (CALIBRATION)
            out["layer_saved"] += layers * sc * (saved - 4)
            out["layer_transient"] += sc * (saved + grads) - int(4.25 * 4 * sc)
        else:
            out["layer_saved"] += layers * (sc * saved + repeat)
            out["layer_transient"] += sc * (saved + grads)
        masks = 2 if traits.sliding_layers else 1
        out["step"] += masks * q.batch * q.seq_len * q.seq_len * act
    if traits.final_softcap:  # tanh's saved output, live through the loss's backward peak
        out["logits"] += tok * shape.vocab * logit_bytes
    # each RMSNorm keeps its fp32 input and its fp32 rsqrt (one value per row)
    per_layer_norm = tok * (traits.norms_per_layer - 2) * (shape.hidden + 1) * 4
    if traits.qk_norm:
        per_layer_norm += tok * (shape.heads + shape.kv_heads) * (shape.head_dim + 1) * 4
    out["layer_saved"] += layers * per_layer_norm
    out["layer_transient"] += per_layer_norm
    out["layer_transient"] = max(0, out["layer_transient"])
    return out


def inference_terms(shape, traits: FamilyTraits | None, batch: int, seq: int, act: int, fp16: bool = False) -> int:
    """Extra transient of a prefill for this family: eager attention's scores of one layer at the
    softmax, where eager_attention_forward peaks (`softmax(w, dtype=float32).to(query.dtype)`):
    ATen's softmax converts a bf16 input with toType before _softmax (only fp16 on CUDA takes the
    half_to_float kernel), so the input, its fp32 copy and the fp32 output are alive at once; and the
    float masks, one per layer type. The eager prefill traced on the meta device (transformers
    5.25, gemma-2-2b bf16, 1024-4096 tokens) peaks within 3% of this (docs/vram.md)."""
    if traits is None or traits.attention != "eager":
        return 0
    sc = score_elements(shape, batch, seq, seq)
    masks = 2 if traits.sliding_layers else 1
    return sc * eager_softmax_bytes_per_score(act, fp16) + masks * batch * seq * seq * act


def eager_attention_base(shape, batch: int, seq: int, act: int) -> int:
    """What else is alive beside the scores at eager attention's softmax: the residual stream and
    its normed copy (hidden), the query, and K and V repeated to every head (repeat_kv). The
    attention's peak is this plus inference_terms; the fitted SDPA transient (the MLP's peak) is the
    other candidate, so the prefill's transient is the larger of the two."""
    return batch * seq * act * (2 * shape.hidden + 3 * shape.heads * shape.head_dim)


def eager_softmax_bytes_per_score(act: int, fp16: bool = False) -> int:
    """Live bytes per score element at eager attention's softmax (inference)."""
    return act + 4 + (4 if act != 4 and not fp16 else 0)
