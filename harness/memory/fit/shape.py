"""Model shape: the parameter layout of a decoder, read from a config.json, a model directory's
safetensors headers, a GGUF file's metadata, or (unknown architectures) a meta-device model.

Pure arithmetic on config fields for the known families (no torch import); used by the estimate,
vllm_plan, gguf, offload and both matrices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import UsageError
from .cache_layout import CacheLayer, layout_from_config
from ..family.families import FamilyTraits, traits_from_config
from ..family.registry import model_types
from .config_file import load_config, naming_config
from .meta_count import ParamTally, count_on_meta

KNOWN_FAMILIES = model_types(exact_layout=True)  # family/registry.py
TIED_BY_DEFAULT = model_types(tied_by_default=True)


@dataclass(frozen=True)
class LinearGroup:
    """`count` quantizable nn.Linear (or Conv1D) weights of one shape; `kind` is the module's own
    name (q_proj, qkv_proj, c_attn), `parent` the name of the module holding it (self_attn, mlp)."""

    kind: str
    in_features: int
    out_features: int
    count: int
    parent: str = ""


@dataclass(frozen=True)
class ModelShape:
    family: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    linears: tuple[LinearGroup, ...]
    embedding_params: int
    lm_head_params: int  # 0 when tied to the embedding
    norm_params: int
    bias_params: int
    norm_tensors: int
    bias_tensors: int
    source: str = "config"  # config | safetensors | meta | gguf
    # attention limited to this many past tokens (phi-3: 2047); None when the model attends to all
    sliding_window: int | None = None
    # exact bytes by kind as a file stores them (a GGUF file: precision "gguf"); None otherwise
    stored_weights: tuple[tuple[str, int], ...] | None = None
    # what the family's modeling code does differently (families.py); None: a bare shape
    traits: FamilyTraits | None = None
    # the generation cache layer by layer, as transformers' cache classes hold it (cache_layout.py);
    # None: every layer a full-attention K/V cache of kv_heads x head_dim (a GGUF file's layout)
    cache: tuple[CacheLayer, ...] | None = None
    # nn.Embedding tables beyond the token embedding (Gemma-4's per-layer inputs), in embedding_params
    extra_embedding_params: int = 0
    # parameters of MoE experts stored as 3-D tensors (not nn.Linear: bitsandbytes leaves them in
    # the torch dtype), in norm_params
    expert_params: int = 0

    @property
    def linear_params(self) -> int:
        return sum(g.in_features * g.out_features * g.count for g in self.linears)

    @property
    def total_params(self) -> int:
        return (self.linear_params + self.embedding_params + self.lm_head_params
                + self.norm_params + self.bias_params)

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def largest_linear(self) -> int:
        return max((g.in_features * g.out_features for g in self.linears), default=0)

    @property
    def fused_qkv(self) -> bool:
        """q, k and v come out of one projection (phi-3 qkv_proj, GPT-2 c_attn)."""
        return any(g.out_features == self.qkv_width for g in self.linears)


def _require_int(config: dict, key: str, default: Any = None, minimum: int = 1) -> int:
    value = config.get(key, default)
    if value is None:
        raise UsageError(f"config has no {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise UsageError(f"config {key} must be an integer, got {value!r}")
    if value < minimum:
        raise UsageError(f"config {key} must be >= {minimum}, got {value!r}")
    return int(value)


def _family(config: dict) -> str:
    return str(config.get("model_type") or "").lower()


def _sliding_window(config: dict) -> int | None:
    """The attention window a config applies (Qwen2 states one but switches it off)."""
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False or not isinstance(window, int) or isinstance(window, bool):
        return None
    return window if window > 0 else None


def shape_from_config(config: dict) -> ModelShape:
    """Exact parameter layout of a known family (KNOWN_FAMILIES) from config fields."""
    family = _family(config)
    if family not in KNOWN_FAMILIES:
        raise UsageError(f"model_type {family or '(none)'!r} is not a known family ({', '.join(KNOWN_FAMILIES)})")
    h = _require_int(config, "hidden_size")
    n_layers = _require_int(config, "num_hidden_layers")
    heads = _require_int(config, "num_attention_heads")
    kv_heads = _require_int(config, "num_key_value_heads", heads)
    head_dim = config.get("head_dim") or h // heads
    head_dim = _require_int({"head_dim": head_dim}, "head_dim")
    inter = _require_int(config, "intermediate_size")
    vocab = _require_int(config, "vocab_size")
    tied = bool(config.get("tie_word_embeddings", family in TIED_BY_DEFAULT))
    q, kv = heads * head_dim, kv_heads * head_dim
    if family == "phi3":  # fused projections: peft sees qkv_proj and gate_up_proj, not q/k/v/gate/up
        per_layer = [("qkv_proj", h, q + 2 * kv, "self_attn"), ("o_proj", q, h, "self_attn"),
                     ("gate_up_proj", h, 2 * inter, "mlp"), ("down_proj", inter, h, "mlp")]
    else:
        per_layer = [("q_proj", h, q, "self_attn"), ("k_proj", h, kv, "self_attn"),
                     ("v_proj", h, kv, "self_attn"), ("o_proj", q, h, "self_attn"),
                     ("gate_proj", h, inter, "mlp"), ("up_proj", h, inter, "mlp"),
                     ("down_proj", inter, h, "mlp")]
    bias_params = bias_tensors = 0
    if family == "qwen2":  # q, k and v carry biases in every Qwen2 layer
        bias_params, bias_tensors = n_layers * (q + 2 * kv), n_layers * 3
    elif family in ("llama", "mistral"):
        if config.get("attention_bias"):
            bias_params += n_layers * (q + 2 * kv + h)
            bias_tensors += n_layers * 4
        if config.get("mlp_bias"):
            bias_params += n_layers * (2 * inter + h)
            bias_tensors += n_layers * 3
    elif family == "qwen3" and config.get("attention_bias"):
        bias_params, bias_tensors = n_layers * (q + 2 * kv + h), n_layers * 4
    linears = tuple(LinearGroup(kind, i, o, n_layers, parent) for kind, i, o, parent in per_layer)
    window = _sliding_window(config)
    traits = traits_from_config(config, window)
    # norms: per layer 2 (Gemma: 4) over hidden, plus q/k norms over head_dim, and the final norm
    norm_tensors = traits.norms_per_layer * n_layers + 1
    norm_params = norm_tensors * h
    if traits.qk_norm:
        norm_params += 2 * n_layers * head_dim
        norm_tensors += 2 * n_layers
    return ModelShape(
        family=family, hidden=h, intermediate=inter, layers=n_layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, vocab=vocab, tied=tied, linears=linears,
        embedding_params=vocab * h, lm_head_params=0 if tied else vocab * h,
        norm_params=norm_params, bias_params=bias_params,
        norm_tensors=norm_tensors, bias_tensors=bias_tensors, source="config",
        sliding_window=window, traits=traits,
        cache=layout_from_config(config, n_layers, kv_heads, head_dim, window),
    )


def _read_safetensors_header(path: Path):
    from ...modeldir.safetensors_header import HeaderProblem, read_header

    try:
        with open(path, "rb") as fh:
            return read_header(fh, path.stat().st_size)
    except HeaderProblem as exc:
        raise UsageError(f"{path.name}: {exc.message}") from None


def _counted_shape(tally: ParamTally, base: ModelShape, source: str) -> ModelShape:
    return ModelShape(
        family=base.family, hidden=base.hidden, intermediate=base.intermediate, layers=base.layers,
        heads=base.heads, kv_heads=base.kv_heads, head_dim=base.head_dim, vocab=base.vocab,
        tied=tally.lm_head == 0,
        linears=tuple(LinearGroup(k, i, o, c, par) for (k, i, o, par), c in sorted(tally.linears.items())),
        embedding_params=tally.emb, lm_head_params=tally.lm_head, norm_params=tally.norm,
        bias_params=tally.bias, norm_tensors=tally.norm_t, bias_tensors=tally.bias_t, source=source,
        sliding_window=base.sliding_window, traits=base.traits, cache=base.cache,
        extra_embedding_params=tally.extra_emb, expert_params=tally.experts,
    )


def shape_from_safetensors(config: dict, directory: Path) -> ModelShape | None:
    """Exact tensor sizes from the safetensors headers of a model directory (no weights read)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    base = shape_from_config(config) if _family(config) in KNOWN_FAMILIES else _meta_cached_dims(config)
    tally = ParamTally()
    for file in files:
        for name, info in _read_safetensors_header(file).tensors.items():
            dims = info.shape
            if "embed_tokens" in name or name.endswith("wte.weight"):
                tally.emb += info.numel
            elif name.startswith("lm_head") or ".lm_head." in name:
                tally.lm_head += info.numel
            elif len(dims) == 2 and name.endswith(".weight"):
                tally.linear(name.rsplit(".", 1)[0], dims[1], dims[0])
            else:
                if len(dims) == 3 and "expert" in name:  # fused MoE experts (not a Conv1d's 3-D weight)
                    tally.experts += info.numel
                tally.other(info.numel, is_bias=name.endswith(".bias"))
    return _counted_shape(tally, base, "safetensors")


def _meta_cached_dims(config: dict) -> ModelShape:
    """An unknown family's dimensions with its cache layout read on the meta device (the dense
    rule when the model cannot be built there: its tensors still come from the headers)."""
    base = _generic_dims(config)
    try:
        return replace(base, cache=count_on_meta(config)[1])
    except UsageError:
        return base


def _layer_list_length(config: dict) -> int | None:
    """Layers of a config that lists them instead (Nemotron-H's layers_block_type)."""
    for key in ("layer_types", "layers_block_type"):
        if isinstance(config.get(key), list) and config[key]:
            return len(config[key])
    return None


def _generic_dims(config: dict) -> ModelShape:
    """Dimensions of an unknown decoder from the usual config fields (no parameter layout)."""
    h = _require_int(config, "hidden_size")
    heads = _require_int(config, "num_attention_heads")
    kv_heads = _require_int(config, "num_key_value_heads", heads)
    head_dim = _require_int({"head_dim": config.get("head_dim") or h // heads}, "head_dim")
    return ModelShape(
        family=_family(config) or "unknown", hidden=h,
        intermediate=_require_int(config, "intermediate_size", 4 * h),
        layers=_require_int(config, "num_hidden_layers", _layer_list_length(config)), heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, vocab=_require_int(config, "vocab_size"),
        tied=bool(config.get("tie_word_embeddings", _family(config) in TIED_BY_DEFAULT)), linears=(),
        embedding_params=0, lm_head_params=0, norm_params=0, bias_params=0, norm_tensors=0, bias_tensors=0,
        sliding_window=_sliding_window(config), traits=traits_from_config(config, _sliding_window(config)),
    )


_META_SHAPES: dict[str, ModelShape] = {}  # canonical config JSON -> its shape, the newest last
_META_SHAPES_KEPT = 64


def shape_from_meta(config: dict) -> ModelShape:
    """Unknown architecture: build it on the meta device (in bf16, the dtype it is run in), count its
    parameters, and read its generation cache's layout from one forward there (imports torch).
    Remembered by the config's content: the forward costs 0.2-1 s, and a table or a sweep asks for
    the same config once a row."""
    key = json.dumps(config, sort_keys=True, default=repr)
    if key not in _META_SHAPES:
        shape = _shape_from_meta(config)
        if len(_META_SHAPES) >= _META_SHAPES_KEPT:
            del _META_SHAPES[next(iter(_META_SHAPES))]
        _META_SHAPES[key] = shape
    return _META_SHAPES[key]


def _shape_from_meta(config: dict) -> ModelShape:
    base = _generic_dims(config)
    tally, layout = count_on_meta(config)
    return replace(_counted_shape(tally, base, "meta"), cache=layout)


def model_shape(spec: str | Path | dict) -> ModelShape:
    with naming_config(spec):
        return _model_shape(spec)


def _model_shape(spec: str | Path | dict) -> ModelShape:
    if isinstance(spec, (str, Path)) and str(spec).lower().endswith(".gguf"):
        from dataclasses import replace

        from .gguf import read_gguf

        info = read_gguf(spec)  # dimensions from the metadata, exact bytes by kind from the header
        config, _ = load_config(spec)
        base = shape_from_config(config) if _family(config) in KNOWN_FAMILIES else _generic_dims(config)
        return replace(base, source="gguf", stored_weights=tuple(sorted(info.bytes_by_kind.items())))
    config, directory = load_config(spec)
    if "hidden_size" not in config:
        raise UsageError("config has no hidden_size")
    if directory is not None and not (config.get("quantization_config") and _family(config) in KNOWN_FAMILIES):
        # (a quantized directory stores packed tensors: the config gives the real layer shapes)
        shape = shape_from_safetensors(config, directory)
        if shape is not None:
            return shape
    if _family(config) in KNOWN_FAMILIES:
        return shape_from_config(config)
    return shape_from_meta(config)
