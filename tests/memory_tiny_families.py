"""Tiny random checkpoints of this year's families (AutoConfig.for_model + small overrides), for
holding the estimate to what transformers itself allocates. Each entry: name (model_type, or
model_type/variant) -> overrides."""

from __future__ import annotations

from harness.memory.family.registry import tiny_configs

COMMON = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, max_position_embeddings=4096)
# name -> overrides: each family's `tiny` in harness/memory/family/registry.py
FAMILIES: dict[str, dict] = tiny_configs()


def model_type(name: str) -> str:
    return name.split("/")[0]


def config_dict(name: str) -> dict:
    """The tiny config as a plain dict (what `--config` reads), model_type included."""
    from transformers import AutoConfig

    cfg = AutoConfig.for_model(model_type(name), **COMMON, **FAMILIES[name])
    return cfg.to_dict() | {"model_type": model_type(name)}


def build(name: str, dtype=None):
    """The tiny random checkpoint on the CPU (seeded), in eval mode."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type(name), **COMMON, **FAMILIES[name])
    return AutoModelForCausalLM.from_config(cfg, dtype=dtype or torch.float32).eval()
