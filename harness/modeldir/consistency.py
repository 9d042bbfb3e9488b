"""Consistency of stored tensors with what config.json describes.

The architecture is instantiated on the meta device from config.json's contents (a dict given
to AutoConfig.for_model: nothing from the directory is imported, trust_remote_code is never
set); shapes come from safetensors headers only.
"""

from __future__ import annotations

import re

from .findings import WARNING, Collector
from .safetensors_header import FLOAT_DTYPES, TensorInfo

CONFIG_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                 "fp32": "F32", "fp16": "F16", "bf16": "BF16", "half": "F16", "float": "F32"}
ADAPTER_KEY = re.compile(r"(^|\.)(lora_[AB]|lora_embedding_[AB]|lora_magnitude_vector|base_layer)(\.|$)|^base_model\.model\.")


def adapter_keys(names) -> list[str]:
    return [n for n in names if ADAPTER_KEY.search(n)]


def config_dtype(config: dict) -> str | None:
    value = config.get("dtype", config.get("torch_dtype"))
    text = str(value).replace("torch.", "") if value is not None else None
    return CONFIG_DTYPES.get(text) if text else None


class ExpectedModel:
    """Parameter names and shapes of the architecture, with its embedding and lm_head names."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], embed_key: str | None, lm_head_key: str | None,
                 tied: bool, vocab_size: int | None):
        self.shapes = shapes
        self.embed_key = embed_key
        self.lm_head_key = lm_head_key
        self.tied = tied
        self.vocab_size = vocab_size


def expected_model(config: dict, tensors: dict | None = None) -> ExpectedModel:
    """Instantiate on meta; raises with a one-line reason when transformers cannot build it.
    A built architecture is kept on disk by config and versions (harness.modeldir.verdict_cache):
    the same config again costs no transformers / torch import.

    tensors (name -> (file, TensorInfo), the whole stored set) lets a family rule
    (harness.modeldir.arch_rules, a model of ours pinned to the transformers sources it was compared
    with) answer without torch when the stored tensors agree with it in every name and shape;
    any disagreement, and no tensors at all, is judged on transformers' own model."""
    from . import verdict_cache

    k = verdict_cache.key("arch", config, "consistency.py")
    cached = _from_cache(verdict_cache.load(k))
    if cached is not None:
        return cached
    if tensors:
        ruled = _by_rule(config)
        if ruled is not None and _agrees(ruled, tensors):
            return ruled
    built = _build_expected_model(config)
    verdict_cache.save(k, _as_json(built))
    return built


def _by_rule(config: dict) -> ExpectedModel | None:
    """The family rule's answer (verdict cache kind "arch-rule"), or None where no rule answers.
    Raises what transformers' config class raises on a config it refuses."""
    from . import arch_rules, verdict_cache

    if not arch_rules.applies(config):
        return None
    k = verdict_cache.key("arch-rule", config, "arch_rules.py")
    cached = _from_cache(verdict_cache.load(k))
    if cached is not None:
        return cached
    ruled = arch_rules.shapes_by_rule(config)
    if ruled is None:
        return None
    verdict_cache.save(k, ruled)
    return _from_cache(ruled)


def _agrees(expected: ExpectedModel, tensors: dict) -> bool:
    """No finding of check_tensors: the same names, shapes, tied head and vocab rows."""
    scratch = Collector()
    check_tensors(expected, tensors, scratch, quantized=False)
    return not scratch.findings


def _as_json(model: ExpectedModel) -> dict:
    return {"shapes": model.shapes, "embed_key": model.embed_key, "lm_head_key": model.lm_head_key,
            "tied": model.tied, "vocab_size": model.vocab_size}


def _from_cache(stored) -> ExpectedModel | None:
    if not isinstance(stored, dict):
        return None
    try:
        return ExpectedModel({n: tuple(s) for n, s in stored["shapes"].items()}, stored["embed_key"],
                             stored["lm_head_key"], bool(stored["tied"]), stored["vocab_size"])
    except (KeyError, TypeError, AttributeError):
        return None  # a damaged entry: build it again


def _build_expected_model(config: dict) -> ExpectedModel:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    data = {k: v for k, v in config.items() if k not in ("auto_map", "quantization_config")}
    model_type = data.pop("model_type", None)
    cfg = AutoConfig.for_model(model_type, **data)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    names = {id(m): n for n, m in model.named_modules()}
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    embed_key = f"{names[id(embed)]}.weight" if embed is not None and id(embed) in names else None
    head_key = f"{names[id(head)]}.weight" if head is not None and id(head) in names else None
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    tied = bool(getattr(text_cfg, "tie_word_embeddings", getattr(cfg, "tie_word_embeddings", False)))
    return ExpectedModel(shapes, embed_key, head_key, tied, getattr(text_cfg, "vocab_size", None))


def check_tensors(expected: ExpectedModel, stored: dict[str, tuple[str, TensorInfo]], out: Collector,
                  quantized: bool) -> None:
    """Missing / unexpected / misshaped parameters, tied embeddings and vocab rows."""
    leftovers = set(adapter_keys(stored))
    unexpected, misshaped, missing, empty = [], [], [], []
    for name, (path, info) in sorted(stored.items()):
        if name in leftovers:
            continue
        want = expected.shapes.get(name)
        if want is None:
            if not quantized and info.numel == 0:  # transformers drops it with a warning: nothing to load
                empty.append((path, f"{name} {list(info.shape)}"))
            elif not quantized:
                unexpected.append((path, f"{name} {list(info.shape)}"))
        elif want != info.shape and not quantized and name not in (expected.embed_key, expected.lm_head_key):
            misshaped.append((path, f"{name} is {list(info.shape)}, expected {list(want)}"))
    for name, want in sorted(expected.shapes.items()):
        if name in stored or name == expected.lm_head_key:
            continue
        if quantized and _maybe_quantized_name(name, stored):
            continue
        missing.append((".", f"{name} {list(want)}"))

    if empty:
        out.add("arch.unexpected_tensor", empty[0][0],
                f"{_listing(empty)} empty and not parameters of this architecture: transformers drops them with a "
                "warning; remove them", severity=WARNING)
    if unexpected:
        out.add("arch.unexpected_tensor", unexpected[0][0],
                f"{_listing(unexpected)} not parameters of this architecture: remove them, or fix config.json")
    if misshaped:
        out.add("arch.shape_mismatch", misshaped[0][0],
                f"{_listing(misshaped)}: config.json and the weights come from different models")
    if missing:
        out.add("arch.missing_tensor", ".",
                f"{_listing(missing)} not stored: transformers would random-initialise them (with only a warning); "
                "save the full model again")

    head = expected.lm_head_key
    if head:
        if expected.tied and head in stored:
            out.add("tied.lm_head_stored", stored[head][0],
                    f"config ties embeddings but {head} is stored too; loaders ignore it (run --deep to see whether it differs)")
        if not expected.tied and head not in stored:
            out.add("tied.lm_head_missing", ".",
                    f"config has tie_word_embeddings=false but {head} is not stored: it would be random-initialised; "
                    "save lm_head, or set tie_word_embeddings=true if it really is the embedding")

    embed = stored.get(expected.embed_key) if expected.embed_key else None
    if embed and expected.vocab_size and embed[1].shape and embed[1].shape[0] != expected.vocab_size:
        out.add("vocab.config_mismatch", embed[0],
                f"{expected.embed_key} has {embed[1].shape[0]} rows but config.vocab_size is {expected.vocab_size}: "
                "set vocab_size to the embedding rows (vLLM asserts on this)")
    if head and head in stored and expected.vocab_size and stored[head][1].shape[0] != expected.vocab_size and not quantized:
        out.add("vocab.config_mismatch", stored[head][0],
                f"{head} has {stored[head][1].shape[0]} rows but config.vocab_size is {expected.vocab_size}")


def _listing(items: list[tuple[str, str]], limit: int = 4) -> str:
    shown = ", ".join(text for _path, text in items[:limit])
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return f"{len(items)} tensor(s): {shown}{more}"


def _maybe_quantized_name(name: str, stored) -> bool:
    base = name.rsplit(".", 1)[0]
    return any(k.startswith(base + ".") for k in stored)


def check_dtype(config: dict, stored: dict[str, tuple[str, TensorInfo]], out: Collector) -> None:
    want = config_dtype(config)
    by_dtype: dict[str, int] = {}
    for _path, info in stored.values():
        if info.dtype in FLOAT_DTYPES:
            by_dtype[info.dtype] = by_dtype.get(info.dtype, 0) + (info.end - info.begin)
    if not by_dtype:
        return
    main = max(by_dtype, key=by_dtype.get)
    if want and main != want:
        grow = {"F32": 2.0, "F64": 4.0}.get(main, 1.0) if want in ("BF16", "F16") else 1.0
        note = f" (the directory is {grow:.0f}x the size it should be)" if grow > 1 else ""
        out.add("dtype.mismatch", ".",
                f"config.json says {config.get('dtype', config.get('torch_dtype'))} but the weights are {main}{note}: "
                f"save with model.to(torch.{_torch_name(want)}) before save_pretrained, or fix the config's dtype")
    elif len(by_dtype) > 1:
        others = ", ".join(sorted(set(by_dtype) - {main}))
        out.add("dtype.mixed", ".", f"most weights are {main} but some are {others}; loaders cast them, check this is intended")


def _torch_name(st_dtype: str) -> str:
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}.get(st_dtype, st_dtype)


def tokenizer_size(tokenizer_json: dict) -> int | None:
    """1 + the largest id in tokenizer.json (model vocab and added tokens), without tokenizers."""
    ids: list[int] = []
    model = tokenizer_json.get("model")
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, dict):
        ids += [v for v in vocab.values() if isinstance(v, int)]
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        ids.append(len(vocab) - 1)
    added = tokenizer_json.get("added_tokens")
    for token in added if isinstance(added, list) else []:
        if isinstance(token, dict) and isinstance(token.get("id"), int):
            ids.append(token["id"])
    return max(ids) + 1 if ids else None
