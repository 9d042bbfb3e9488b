"""Peak-VRAM predictor: pure arithmetic on a config.json (no torch import for known families).

What it models (facts.md, Memory; read from the installed transformers / peft / bitsandbytes):
- weights: transformers quantizes only the decoder's nn.Linear layers; embeddings, norms, biases
  and lm_head stay in the torch dtype (bf16 for quantized loads). int8 (LLM.int8) stores CB int8
  plus SCB float32 per output row; nf4/fp4 pack two values per byte plus a float32 absmax per 64,
  double quantization stores the absmax as uint8 plus a float32 per 256 blocks; every quant-state
  tensor is one allocation (torch's allocator rounds each to 512 bytes).
- KV cache: 2 * layers * kv_heads * head_dim * bytes * batch * tokens (GQA).
- prefill: one forward with use_cache=True and logits for the last position only (generate sets
  logits_to_keep=1), the logits copied to float32. generate: the KV cache grows by torch.cat, so a
  decode step briefly holds one layer's cache twice.
- train: LoRA adapters in fp32 (weight + grad + two AdamW states = 16 bytes a parameter); quantized
  bases go through prepare_model_for_kbit_training, which casts every non-4-bit parameter to fp32;
  the loss upcasts logits to float32 (batch * seq * vocab * 4) and keeps a gradient of them.
- activation / transient peaks are linear in tokens x (hidden, intermediate, q/k/v width) with
  coefficients fitted to measurements on an H200 (suites/vram/measured/, see CALIBRATION).

Unknown architectures fall back to a meta-device parameter count (imports torch + transformers).
A model directory with safetensors gives exact tensor sizes from the headers without loading.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from ..errors import UsageError
from ..models import CONFIG_DIR

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "nf4", "nf4-dq", "fp4", "fp4-dq", "w4a16")
MODES = ("weights", "prefill", "generate", "train")
KNOWN_FAMILIES = ("llama", "qwen2", "mistral", "phi3")
DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BLOCK = 512  # torch's CUDA caching allocator rounds every allocation up to 512 bytes
MiB = 1024**2


# ---------------------------------------------------------------------------------------------
# Model shape


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
    """Exact parameter layout of a known family (llama, qwen2, mistral, phi3) from config fields."""
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
    tied = bool(config.get("tie_word_embeddings", False))
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
    linears = tuple(LinearGroup(kind, i, o, n_layers, parent) for kind, i, o, parent in per_layer)
    return ModelShape(
        family=family, hidden=h, intermediate=inter, layers=n_layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, vocab=vocab, tied=tied, linears=linears,
        embedding_params=vocab * h, lm_head_params=0 if tied else vocab * h,
        norm_params=(2 * n_layers + 1) * h, bias_params=bias_params,
        norm_tensors=2 * n_layers + 1, bias_tensors=bias_tensors, source="config",
        sliding_window=_sliding_window(config),
    )


def _read_safetensors_header(path: Path):
    from ..modeldir.safetensors_header import HeaderProblem, read_header

    try:
        with open(path, "rb") as fh:
            return read_header(fh, path.stat().st_size)
    except HeaderProblem as exc:
        raise UsageError(f"{path.name}: {exc.message}") from None


class _ParamTally:
    """Parameters counted by role, from safetensors headers or a meta-device model alike."""

    def __init__(self) -> None:
        self.linears: dict[tuple[str, int, int, str], int] = {}
        self.emb = self.lm_head = self.norm = self.bias = self.norm_t = self.bias_t = 0

    def linear(self, name: str, in_features: int, out_features: int) -> None:
        """`name`: the module's dotted name (model.layers.0.self_attn.q_proj)."""
        parts = name.split(".")
        key = (parts[-1], in_features, out_features, parts[-2] if len(parts) > 1 else "")
        self.linears[key] = self.linears.get(key, 0) + 1

    def other(self, numel: int, is_bias: bool) -> None:
        if is_bias:
            self.bias, self.bias_t = self.bias + numel, self.bias_t + 1
        else:  # norms and anything else that is not quantized
            self.norm, self.norm_t = self.norm + numel, self.norm_t + 1

    def shape(self, base: ModelShape, source: str) -> ModelShape:
        return ModelShape(
            family=base.family, hidden=base.hidden, intermediate=base.intermediate, layers=base.layers,
            heads=base.heads, kv_heads=base.kv_heads, head_dim=base.head_dim, vocab=base.vocab,
            tied=self.lm_head == 0,
            linears=tuple(LinearGroup(k, i, o, c, par) for (k, i, o, par), c in sorted(self.linears.items())),
            embedding_params=self.emb, lm_head_params=self.lm_head, norm_params=self.norm,
            bias_params=self.bias, norm_tensors=self.norm_t, bias_tensors=self.bias_t, source=source,
            sliding_window=base.sliding_window,
        )


def shape_from_safetensors(config: dict, directory: Path) -> ModelShape | None:
    """Exact tensor sizes from the safetensors headers of a model directory (no weights read)."""
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    base = shape_from_config(config) if _family(config) in KNOWN_FAMILIES else _generic_dims(config)
    tally = _ParamTally()
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
                tally.other(info.numel, is_bias=name.endswith(".bias"))
    return tally.shape(base, "safetensors")


def _generic_dims(config: dict) -> ModelShape:
    """Dimensions of an unknown decoder from the usual config fields (no parameter layout)."""
    h = _require_int(config, "hidden_size")
    heads = _require_int(config, "num_attention_heads")
    kv_heads = _require_int(config, "num_key_value_heads", heads)
    head_dim = _require_int({"head_dim": config.get("head_dim") or h // heads}, "head_dim")
    return ModelShape(
        family=_family(config) or "unknown", hidden=h,
        intermediate=_require_int(config, "intermediate_size", 4 * h),
        layers=_require_int(config, "num_hidden_layers"), heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, vocab=_require_int(config, "vocab_size"),
        tied=bool(config.get("tie_word_embeddings", False)), linears=(), embedding_params=0,
        lm_head_params=0, norm_params=0, bias_params=0, norm_tensors=0, bias_tensors=0,
        sliding_window=_sliding_window(config),
    )


def shape_from_meta(config: dict) -> ModelShape:
    """Unknown architecture: build it on the meta device and count (imports torch)."""
    base = _generic_dims(config)
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.pytorch_utils import Conv1D
    except ImportError as exc:  # pragma: no cover - torch is a hard dependency
        raise UsageError(f"unknown architecture needs torch and transformers: {exc}") from None
    data = dict(config)
    model_type = data.pop("model_type", None)
    try:
        cfg = AutoConfig.for_model(model_type, **data)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:
        raise UsageError(f"cannot build model_type {model_type!r} on the meta device: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    tally = _ParamTally()
    seen: set[int] = set()
    out_emb = model.get_output_embeddings()
    for name, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            numel = param.numel()
            if isinstance(module, torch.nn.Embedding):
                tally.emb += numel
            elif module is out_emb and pname == "weight":
                tally.lm_head += numel
            elif module is out_emb:
                tally.bias += numel
            elif isinstance(module, torch.nn.Linear) and pname == "weight":
                tally.linear(name, module.in_features, module.out_features)
            elif isinstance(module, Conv1D) and pname == "weight":  # GPT-2 style: weight is (in, out)
                tally.linear(name, param.shape[0], param.shape[1])
            else:
                tally.other(numel, is_bias=pname == "bias")
    return tally.shape(base, "meta")


def load_config(spec: str | Path | dict) -> tuple[dict, Path | None]:
    """(config dict, model directory or None) from a dict, a config.json, a directory or a
    reference name (harness/configs/<name>.json)."""
    if isinstance(spec, dict):
        return dict(spec), None
    if str(spec).lower().endswith(".gguf"):
        from .gguf import read_gguf

        return {k: v for k, v in read_gguf(spec).config.items() if v is not None}, None
    path = Path(spec).expanduser()
    directory = None
    if path.is_dir():
        directory = path
        path = path / "config.json"
        if not path.is_file():
            raise UsageError(f"{directory} has no config.json")
    elif not path.is_file():
        ref = CONFIG_DIR / f"{spec}.json"
        if not ref.is_file():
            raise UsageError(f"--config: {str(spec)!r} is neither a file, a model directory nor a "
                             f"reference name")
        path = ref
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON config ({str(exc).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: a config.json must hold a JSON object")
    if "text_config" in config and "hidden_size" not in config:  # multimodal wrappers
        config = dict(config["text_config"], model_type=config["text_config"].get("model_type"))
    return config, directory


def model_shape(spec: str | Path | dict) -> ModelShape:
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


# ---------------------------------------------------------------------------------------------
# Weights


def _blocks(nbytes: float) -> int:
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
        return _blocks(n * dtype_bytes(precision))
    if precision == "int8":  # Int8Params: CB int8 (the data itself) + SCB float32 per output row
        return _blocks(n) + _blocks(4 * out_features)
    nblocks = math.ceil(n / 64)
    packed = _blocks(math.ceil(n / 2))
    code = _blocks(16 * 4)  # the 16-value NF4/FP4 code table, one per quant state
    if precision.endswith("-dq"):
        nested = math.ceil(nblocks / 256)
        # absmax as uint8, nested absmax float32, the 256-entry dynamic code, the float32 offset
        return packed + _blocks(nblocks) + _blocks(4 * nested) + _blocks(256 * 4) + _blocks(4) + code
    return packed + _blocks(4 * nblocks) + code


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
    out["embeddings"] = _blocks(shape.embedding_params * other)
    out["lm_head"] = _blocks(shape.lm_head_params * other)
    per_norm = shape.norm_params / max(shape.norm_tensors, 1)
    out["norms"] = shape.norm_tensors * _blocks(per_norm * other)
    per_bias = shape.bias_params / max(shape.bias_tensors, 1)
    out["biases"] = shape.bias_tensors * _blocks(per_bias * other)
    out["rotary"] = shape.layers and _blocks(shape.head_dim // 2 * 4)  # inv_freq buffer, float32
    return out


def weight_bytes(shape: ModelShape, precision: str, train_prepared: bool = False) -> int:
    return sum(weight_breakdown(shape, precision, train_prepared).values())


def kv_cache_bytes(shape: ModelShape, precision: str, batch: int, tokens: int) -> int:
    per_layer = 2 * _blocks(shape.kv_heads * shape.head_dim * dtype_bytes(precision) * batch * tokens)
    return shape.layers * per_layer


ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraTargets:
    """What peft would wrap for a target list on this architecture.

    peft matches each module's dotted name against every target: equal, or ending in "." + target
    ("all-linear" = every Linear/Conv1D but the output layer). A target that matches nothing is
    not an error to peft as long as another target matches: the model just gets fewer adapters
    than the user thinks (q_proj on phi-3, whose attention is one fused qkv_proj)."""

    requested: tuple[str, ...]
    groups: tuple[LinearGroup, ...]  # the wrapped projections
    unmatched: tuple[str, ...]  # requested targets that match no module

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(g.kind for g in self.groups))

    @property
    def modules(self) -> int:
        return sum(g.count for g in self.groups)

    def note(self, shape: "ModelShape") -> str | None:
        """A one-line warning when some targets match nothing, None when all do."""
        if not self.unmatched:
            return None
        have = ", ".join(dict.fromkeys(g.kind for g in shape.linears))
        wrapped = ", ".join(self.kinds) or "nothing"
        return (f"LoRA target(s) {', '.join(self.unmatched)} match no module of this {shape.family} model "
                f"(its projections: {have}); peft would wrap only {wrapped}")


def _target_matches(group: LinearGroup, target: str) -> bool:
    if target == group.kind:
        return True
    if "." not in target:
        return False
    # a dotted target ("self_attn.q_proj", "mlp.down_proj") matches a suffix of the full name
    key = f"model.layers.0.{group.parent}.{group.kind}" if group.parent else f"model.layers.0.{group.kind}"
    return key == target or key.endswith("." + target)


def resolve_lora_targets(shape: ModelShape, targets: Iterable[str] | str) -> LoraTargets:
    """peft's matching of `target_modules` (a list, or "all-linear") against this architecture."""
    requested = (targets,) if isinstance(targets, str) else tuple(targets)
    if any(t.lower() == ALL_LINEAR for t in requested):
        return LoraTargets(requested, tuple(shape.linears), ())
    groups = tuple(g for g in shape.linears if any(_target_matches(g, t) for t in requested))
    unmatched = tuple(t for t in requested if not any(_target_matches(g, t) for g in shape.linears))
    return LoraTargets(requested, groups, unmatched)


def check_lora_targets(shape: ModelShape, targets: Iterable[str] | str, flag: str = "--lora-targets") -> str | None:
    """A usage error when no target matches (peft refuses to train nothing); a one-line note when
    only some do (peft wraps fewer modules than asked, silently); None when all match."""
    resolved = resolve_lora_targets(shape, targets)
    if not resolved.groups:
        kinds = ", ".join(dict.fromkeys(g.kind for g in shape.linears))
        raise UsageError(f"{flag}: {', '.join(resolved.requested)} not in this model (linear layers: {kinds}); "
                         f"peft would find no module to wrap")
    return resolved.note(shape)


def lora_params(shape: ModelShape, r: int, targets: Iterable[str] | str) -> int:
    return sum(g.count * r * (g.in_features + g.out_features)
               for g in resolve_lora_targets(shape, targets).groups)


# Optimizers: the names HF Trainer's `optim` uses, and short aliases.
OPTIMIZERS = ("adamw_torch", "adamw_8bit", "paged_adamw_32bit", "paged_adamw_8bit")
OPTIMIZER_ALIASES = {"adamw": "adamw_torch", "adamw_bnb_8bit": "adamw_8bit", "adamw8bit": "adamw_8bit",
                     "paged_adamw": "paged_adamw_32bit", "paged_adamw_32": "paged_adamw_32bit"}
# bitsandbytes (optim/optimizer.py): tensors under min_8bit_size elements keep 32-bit states;
# paged optimizers page only tensors of at least 1e5 elements (cudaMallocManaged, outside torch's
# allocator), smaller ones are ordinary allocations; 8-bit states keep a float32 absmax per 256.
BNB_MIN_8BIT_SIZE = 4096
BNB_PAGED_MIN = 100_000
BNB_BLOCK = 256


def optimizer_name(name: str) -> str:
    key = str(name).strip().lower()
    key = OPTIMIZER_ALIASES.get(key, key)
    if key not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {name!r} (choose from {', '.join(OPTIMIZERS)}; aliases "
                         f"{', '.join(sorted(OPTIMIZER_ALIASES))})")
    return key


def _state_bytes(numel: int, optimizer: str) -> tuple[int, int]:
    """(allocator bytes, paged bytes) of the optimizer states of one fp32 trainable tensor."""
    eight = optimizer in ("adamw_8bit", "paged_adamw_8bit") and numel >= BNB_MIN_8BIT_SIZE
    paged = optimizer.startswith("paged") and numel >= BNB_PAGED_MIN
    states = 2 * (numel if eight else 4 * numel)
    extra = 2 * _blocks(4 * math.ceil(numel / BNB_BLOCK)) if eight else 0  # absmax1, absmax2
    if paged:
        return extra, states
    return 2 * _blocks(states // 2) + extra, 0


def adapter_bytes(shape: ModelShape, r: int, targets: LoraTargets, optimizer: str = "adamw_torch") -> dict[str, int]:
    """LoRA weights, their gradients and the optimizer states (fp32 LoRA: peft upcasts adapters),
    each tensor its own allocation. `paged_states` live outside torch's allocator."""
    optimizer = optimizer_name(optimizer)
    weights = grads = states = paged = 0
    tensors: list[int] = []
    for g in targets.groups:
        tensors += [r * g.in_features] * g.count + [r * g.out_features] * g.count  # lora_A, lora_B
    for n in tensors:
        weights += _blocks(4 * n)
        alloc, paged_n = _state_bytes(n, optimizer)
        states += alloc
        paged += paged_n
    grads = weights
    # torch's multi-tensor AdamW (the default on CUDA) builds sqrt(exp_avg_sq) for every tensor at
    # once during step(): one more fp32 copy of the adapter, after backward freed the activations
    step_temp = weights if optimizer == "adamw_torch" else 0
    return {"lora_weights": weights, "lora_grads": grads, "optimizer_states": states,
            "paged_optimizer_states": paged, "optimizer_step_transient": step_temp}


# ---------------------------------------------------------------------------------------------
# Transient terms, fitted to measurements (see suites/vram/measured/ and harness/memory/matrix.py).
# Each entry maps a feature name to its coefficient; features are defined in _features().
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
    # training: fitted to the fresh-process training matrix (suites/vram/measured/truth/, the five
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


def _features(shape: ModelShape, precision: str, batch: int, seq: int, act_bytes: int,
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
    for key in ("tok_h", "tok_i", "tok_qkv", "tok_r", "tok_lora_in", "scores"):
        f["L_" + key] = f[key] * shape.layers
    return f


def _linear(coeffs: dict[str, Any], feats: dict[str, float]) -> float:
    return sum(c * feats.get(name, 0.0) for name, c in coeffs.items() if name != "max")


def _transient(key: str, feats: dict[str, float], calibration: dict | None = None) -> int:
    """Sum of coefficient x feature; a "max" entry holds phases of which only the largest counts
    (with checkpointing, the loss/logits peak and the peak of a layer recomputed in backward
    happen at different times)."""
    coeffs = (calibration if calibration is not None and key in calibration else CALIBRATION).get(key, {})
    phases = [_linear(p, feats) for p in coeffs.get("max", [])]
    return int(_linear(coeffs, feats) + max(phases, default=0.0))


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


def _train_act_bytes(precision: str) -> int:
    # activations are fp32 after prepare_model_for_kbit_training (fp32 norms upcast the stream)
    return 4 if precision_group(precision) in ("int8", "4bit", "fp32") else 2


def features_for(shape: "ModelShape", q: "Query") -> dict[str, float]:
    """The features the calibration key of `q` multiplies (as estimate() computes them)."""
    if q.mode != "train":
        return _features(shape, q.precision, q.batch, q.seq_len, dtype_bytes(q.precision))
    targets = resolve_lora_targets(shape, q.lora_targets)
    per_layer = targets.modules / max(shape.layers, 1)
    lora_in = sum(g.count * g.in_features for g in targets.groups)
    return _features(shape, q.precision, q.batch, q.seq_len, _train_act_bytes(q.precision), q.lora_r,
                     round(per_layer), lora_in)


# ---------------------------------------------------------------------------------------------
# The estimate


# The allocator reserve a card must hold beyond the allocated peak (fragmentation, blocks rounded
# and split), as a fraction of the peak, from the H200 matrices' reserved against allocated:
# - inference 3%: the median max_memory_reserved / max_memory_allocated - 1 is 1.3% (weights),
#   3.8% (prefill), 2.4% (generate) over the inference matrix, and under an emulated 6 GiB card
#   a 3% reserve gave no fit verdict that ran out of memory there (402 rows);
# - training 5.7%: the median over the fresh-process training matrix (suites/vram/measured/truth/,
#   96 uncapped rows; the 90th percentile is 16.7%).
# `plan` and `estimate --budget` use it as their headroom: peak + reserve + CUDA context <= card.
RESERVE_FRACTION: dict[str, float] = {"weights": 0.03, "prefill": 0.03, "generate": 0.03, "train": 0.057}
# Training where fp32 GQA attention falls back to SDPA's math kernel (see _features "scores"): every
# layer allocates and frees batch x heads x seq x seq blocks (scores, probabilities, their grads),
# and under a capped allocator the holes they leave cannot all be reused. Under the emulated 6 GiB
# card (suites/vram/measured/truth/) tinyllama nf4 b4 x 1024 ran out with its predicted peak at 84%
# of the cap. The card is asked to keep this many such blocks free beyond the peak: 1.5 separated
# the 42 boundary cases of the first H200 run best (no false fit; 1 gave one, 2 one more false
# alarm), and was then checked on fresh boundary cases (the README of truth/ gives the figures).
FRAGMENTATION_BLOCKS = 1.5


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
    fragmentation_bytes: int = 0  # the part of the reserve for holes of large attention blocks

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
    new_tokens: int = 64
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
    validate(q)
    p, group = q.precision, precision_group(q.precision)
    act = dtype_bytes(p)
    if q.mode == "train":
        est = _estimate_train(shape, _trainable(q), calibration)
        est.fragmentation_bytes = fragmentation_bytes(shape, q)
        est.reserve_bytes = int(est.planned_bytes * RESERVE_FRACTION["train"]) + est.fragmentation_bytes
        return est
    wb = weight_breakdown(shape, p)
    weights = sum(wb.values())
    breakdown: dict[str, Any] = {"weights": weights, "weights_by_kind": wb}
    if p in ENGINES:
        breakdown.update(serving_notes(shape, p))
    feats = _features(shape, p, q.batch, q.seq_len, act)
    reserve = RESERVE_FRACTION[q.mode]
    if q.mode == "weights":
        load = _transient(f"weights/{group}", feats, calibration)
        breakdown["loading_transient"] = load
        peak = weights + load
        return Estimate(p, q.mode, q.seq_len, q.batch, peak, breakdown, params=shape.total_params,
                        source=shape.source, reserve_bytes=int(peak * reserve))
    kv_prefill = kv_cache_bytes(shape, p, q.batch, q.seq_len)
    logits = _blocks(q.batch * shape.vocab * act) + _blocks(q.batch * shape.vocab * 4)
    transient = _transient(f"prefill/{group}", feats, calibration)
    prefill_peak = weights + kv_prefill + transient + logits
    breakdown.update(kv_cache=kv_prefill, activations=transient, logits=logits)
    peak = prefill_peak
    if q.mode == "generate":
        total = q.seq_len + q.new_tokens
        kv_final = kv_cache_bytes(shape, p, q.batch, total)
        one_layer = kv_final // max(shape.layers, 1)  # torch.cat holds old + new of one layer
        dfeats = _features(shape, p, q.batch, 1, act)
        decode_peak = weights + kv_final + one_layer + _transient(f"prefill/{group}", dfeats, calibration) + logits
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


def fragmentation_bytes(shape: ModelShape, q: Query) -> int:
    """Training only: FRAGMENTATION_BLOCKS x the attention scores block SDPA's math kernel
    materialises (fp32 activations with grouped-query attention), 0 when it stays fused."""
    if q.mode != "train" or _train_act_bytes(q.precision) != 4 or shape.kv_heads >= shape.heads:
        return 0
    return int(FRAGMENTATION_BLOCKS * q.batch * shape.heads * q.seq_len * q.seq_len * 4)


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
      free theirs once rotary embedding has made new tensors);
    - a sliding window reached: past the window transformers passes SDPA an explicit boolean mask,
      which SDPA turns into a float bias of the activations' dtype in every layer and saves.
    With checkpointing one layer is recomputed at a time: those terms are in the fitted transient."""
    if q.grad_checkpointing:
        return {"lora_inputs": 0, "fused_qkv_saved": 0, "attention_masks": 0}
    act = _train_act_bytes(q.precision)
    tok = q.batch * q.seq_len
    targets = resolve_lora_targets(shape, q.lora_targets)
    lora = sum(g.count * (_blocks(tok * g.in_features * LORA_INPUT_BYTES)
                          + _blocks(tok * g.in_features * LORA_MASK_BYTES)
                          + _blocks(tok * q.lora_r * 4)) for g in targets.groups)
    qk = tok * (shape.heads + shape.kv_heads) * shape.head_dim * act if shape.fused_qkv else 0
    masked = shape.sliding_window is not None and q.seq_len >= shape.sliding_window
    masks = q.batch * q.seq_len * q.seq_len * (act + 1) if masked else 0  # float bias + the bool mask
    return {"lora_inputs": lora, "fused_qkv_saved": _blocks(qk) * shape.layers,
            "attention_masks": _blocks(masks) * shape.layers}


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
    transient = _transient(key, feats, calibration) + sum(saved.values())
    table = calibration if calibration is not None and key in calibration else CALIBRATION
    coeffs = table.get(key, {})
    loss = int(feats["tok_v"] * max([coeffs.get("tok_v", 0.0)] + [p.get("tok_v", 0.0) for p in coeffs.get("max", [])]))
    grads_live = int(feats["grads"] * coeffs.get("grads", 0.0))
    step = ad["lora_grads"] + ad["optimizer_step_transient"]  # after backward: all grads + temp
    breakdown = {"weights": weights, "weights_by_kind": wb,
                 "adapter_grads_optimizer": ad["lora_weights"] + ad["lora_grads"] + ad["optimizer_states"],
                 "lora_params": n_lora, "lora_weights": ad["lora_weights"], "lora_grads": ad["lora_grads"],
                 "optimizer_states": ad["optimizer_states"],
                 "paged_optimizer_states": ad["paged_optimizer_states"],
                 "optimizer_step_transient": ad["optimizer_step_transient"],
                 "activations": transient - loss - grads_live, "loss_logits": loss, **saved}
    peak = static + max(transient, step)
    return Estimate(p, "train", q.seq_len, q.batch, int(peak), breakdown, lora_r=q.lora_r,
                    lora_targets=list(q.lora_targets), grad_checkpointing=q.grad_checkpointing,
                    params=shape.total_params, source=shape.source, optimizer=optimizer_name(q.optimizer),
                    lora_modules=targets.modules, lora_unmatched_targets=list(targets.unmatched))


def estimate_many(spec: str | Path | dict | ModelShape, queries: Iterable[Query]) -> list[Estimate]:
    shape = spec if isinstance(spec, ModelShape) else model_shape(spec)
    return [estimate(shape, q) for q in queries]


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
    return sum(_blocks(b) for b in parts) if rounded else sum(parts)


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


def _trainable(q: Query) -> Query:
    """Training a W4A16 checkpoint through transformers trains its decompressed bf16 weights."""
    from dataclasses import replace

    if q.precision == "w4a16":
        return replace(q, precision="bf16")
    if q.precision in FILE_PRECISIONS:
        raise UsageError(f"{q.precision} files are not trained: fine-tune the original model, then convert")
    return q
