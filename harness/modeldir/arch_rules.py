"""Parameter shapes of four dense decoder families without importing torch: a model of ours.

The truth is transformers' own model built on the meta device (consistency._build_expected_model),
but building it costs importing torch and transformers' modeling code, about 3 s of CPU: most of
a first check-dir on a small directory. llama, mistral, qwen2 and qwen3 declare one decoder
skeleton (embedding, per layer q/k/v/o projections, gate/up/down MLP, two RMSNorms, final norm,
lm_head) that differs only in which biases and head norms exist; FAMILIES writes that down, read
off their modeling files. These rules are ours and could drift from transformers, so they answer
only where they cannot decide anything alone:
  - the installed transformers is VERIFIED_VERSION and its modeling / configuration files for the
    family and modeling_utils.py hash to VERIFIED_SOURCES: the sources the rules were compared
    with (tests/test_modeldir_arch_rules.py builds each family on the meta device and compares
    names, shapes, tied embeddings and vocab); any other version or an edited file: no rule;
  - the config object is the one transformers' own config class builds from config.json (torch
    is deferred while it runs, see _deferred_torch; the dtype, which the class turns into a torch
    attribute, must be one of DTYPES, else no rule), and every size it yields is a positive int
    and every bias flag a bool (anything else: no rule, transformers decides);
  - a rule's answer is used to confirm a directory (consistency.expected_model): stored tensors
    that differ from it in any way send the directory to the real build, so every finding about
    tensors comes from transformers' own model.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import types

VERIFIED_VERSION = "5.25.0"
VERIFIED_SOURCES = {  # sha256[:16] of modeling_<f>.py + configuration_<f>.py + modeling_utils.py
    "llama": "87a3b0e0b6928ba9",
    "qwen2": "74bcd932ecf005e9",
    "qwen3": "049952a5fac52d22",
    "mistral": "0b3787ee7a0b4d3b",
}
# model_type -> (q/k/v bias, o bias, MLP bias, q_norm/k_norm, `head_dim or default` instead of
# getattr(config, "head_dim", default)); a str names the config attribute that holds the flag
FAMILIES: dict[str, tuple] = {
    "llama": ("attention_bias", "attention_bias", "mlp_bias", False, False),
    "qwen2": (True, False, False, False, False),
    "qwen3": ("attention_bias", "attention_bias", False, True, False),
    "mistral": (False, False, False, False, True),
}
DTYPES = ("float32", "float16", "bfloat16", "float64")  # getattr(torch, name) is a torch.dtype (a test says so)
SIZES = ("hidden_size", "intermediate_size", "vocab_size", "num_hidden_layers", "num_attention_heads",
         "num_key_value_heads")


def sources_hash(model_type: str, root: str | None = None) -> str | None:
    """The hash VERIFIED_SOURCES pins, of the installed transformers' files; None when unreadable."""
    try:
        root = root or os.path.dirname(importlib.util.find_spec("transformers").origin)
        digest = hashlib.sha256()
        for rel in (f"models/{model_type}/modeling_{model_type}.py",
                    f"models/{model_type}/configuration_{model_type}.py", "modeling_utils.py"):
            with open(os.path.join(root, rel), "rb") as fh:
                digest.update(fh.read())
        return digest.hexdigest()[:16]
    except (OSError, AttributeError, ImportError, ValueError):
        return None


def applies(config: dict, verified: dict[str, str] | None = None) -> bool:
    """Whether a rule may answer for this config.json at all (family, sources, dtype, no quantization)."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES or "quantization_config" in config:
        return False
    if any(config.get(k) is not None and config.get(k) not in DTYPES for k in ("dtype", "torch_dtype")):
        return False
    from .verdict_cache import versions

    if versions().get("transformers") != VERIFIED_VERSION:
        return False
    return sources_hash(model_type) == (verified if verified is not None else VERIFIED_SOURCES).get(model_type)


def shapes_by_rule(config: dict, verified: dict[str, str] | None = None) -> dict | None:
    """{"shapes", "embed_key", "lm_head_key", "tied", "vocab_size"} or None (no rule: build it).
    Raises what transformers' config class raises on a config it refuses."""
    if not applies(config, verified):
        return None
    cfg = config_object(config)
    try:
        return _shapes(cfg, FAMILIES[config["model_type"]])
    except (TypeError, ValueError, ZeroDivisionError, AttributeError):
        return None  # something the rule does not model: transformers decides


def config_object(config: dict):
    """transformers' own config class on config.json's contents, as consistency's build passes them,
    less the dtype (checked against DTYPES by `applies`), with torch deferred."""
    data = {k: v for k, v in config.items() if k not in ("auto_map", "quantization_config", "dtype", "torch_dtype")}
    model_type = data.pop("model_type")
    with _deferred_torch():
        from transformers import AutoConfig

        return AutoConfig.for_model(model_type, **data)


def _shapes(cfg, family: tuple) -> dict | None:
    qkv_bias, o_bias, mlp_bias, head_norms, head_dim_or = tuple(_flag(cfg, f) for f in family[:3]) + family[3:]
    default = cfg.hidden_size // cfg.num_attention_heads
    head_dim = (getattr(cfg, "head_dim", None) or default) if head_dim_or else getattr(cfg, "head_dim", default)
    sizes = [getattr(cfg, name) for name in SIZES] + [head_dim]
    if not all(type(v) is int and v > 0 for v in sizes) or not all(type(b) is bool for b in (qkv_bias, o_bias, mlp_bias)):
        return None
    hidden, inter, vocab, layers, heads, kv_heads, _ = sizes
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        linears = {"self_attn.q_proj": (heads * head_dim, hidden, qkv_bias),
                   "self_attn.k_proj": (kv_heads * head_dim, hidden, qkv_bias),
                   "self_attn.v_proj": (kv_heads * head_dim, hidden, qkv_bias),
                   "self_attn.o_proj": (hidden, heads * head_dim, o_bias),
                   "mlp.gate_proj": (inter, hidden, mlp_bias), "mlp.up_proj": (inter, hidden, mlp_bias),
                   "mlp.down_proj": (hidden, inter, mlp_bias)}
        for name, (rows, cols, bias) in linears.items():
            shapes[f"{p}{name}.weight"] = (rows, cols)
            if bias:
                shapes[f"{p}{name}.bias"] = (rows,)
        if head_norms:
            shapes[f"{p}self_attn.q_norm.weight"] = (head_dim,)
            shapes[f"{p}self_attn.k_norm.weight"] = (head_dim,)
        shapes[f"{p}input_layernorm.weight"] = (hidden,)
        shapes[f"{p}post_attention_layernorm.weight"] = (hidden,)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    tied = bool(getattr(text_cfg, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False)))
    return {"shapes": shapes, "embed_key": "model.embed_tokens.weight", "lm_head_key": "lm_head.weight",
            "tied": tied, "vocab_size": getattr(text_cfg, "vocab_size", None)}


def _flag(cfg, flag):
    return getattr(cfg, flag) if isinstance(flag, str) else flag


class _DeferredModule(types.ModuleType):
    """A module that imports itself on the first use of anything but its spec: transformers' config
    classes ask whether torch is installed (its spec) and bind `import torch`, but a config without
    a dtype never uses it. Any use imports the real torch, so nothing behaves differently."""

    def __init__(self, name: str, spec) -> None:
        super().__init__(name)
        object.__setattr__(self, "__spec__", spec)
        object.__setattr__(self, "_real", None)

    def _load(self):
        real = object.__getattribute__(self, "_real")
        if real is None:
            name = object.__getattribute__(self, "__name__")
            if sys.modules.get(name) is self:
                del sys.modules[name]
            real = importlib.import_module(name)
            object.__setattr__(self, "_real", real)
        return real

    def __getattr__(self, name: str):
        return getattr(self._load(), name)


@contextlib.contextmanager
def _deferred_torch():
    if "torch" in sys.modules:
        yield
        return
    spec = importlib.util.find_spec("torch")
    if spec is None:
        yield
        return
    proxy = _DeferredModule("torch", spec)
    sys.modules["torch"] = proxy
    try:
        yield
    finally:
        if sys.modules.get("torch") is proxy:
            del sys.modules["torch"]  # never used: the next `import torch` is the real one
