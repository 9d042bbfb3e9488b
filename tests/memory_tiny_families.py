"""Tiny random checkpoints of this year's families (AutoConfig.for_model + small overrides), for
holding the estimate to what transformers itself allocates. Each entry: model_type -> overrides."""

from __future__ import annotations

COMMON = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, max_position_embeddings=4096)
WINDOW = 24  # below the prompts the tests use, so sliding layers drop tokens
FAMILIES: dict[str, dict] = {
    "llama": dict(num_hidden_layers=2),  # the dense control
    "gemma3_text": dict(num_hidden_layers=3, sliding_window=WINDOW, sliding_window_pattern=3, layer_types=None),
    "gemma4_text": dict(num_hidden_layers=4, sliding_window=WINDOW, hidden_size_per_layer_input=8,
                        vocab_size_per_layer_input=128, num_kv_shared_layers=0, global_head_dim=32,
                        layer_types=["sliding_attention", "full_attention"] * 2),
    "gemma4_text/kv-shared": dict(num_hidden_layers=6, sliding_window=WINDOW, hidden_size_per_layer_input=8,
                                  vocab_size_per_layer_input=128, num_kv_shared_layers=2, global_head_dim=32,
                                  layer_types=["sliding_attention", "full_attention"] * 3),
    "qwen3_5_text": dict(num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=8, linear_value_head_dim=8),
    "qwen3_5_moe_text": dict(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, linear_num_key_heads=2, linear_num_value_heads=4,
                             linear_key_head_dim=8, linear_value_head_dim=8),
    "qwen3_next": dict(num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=32, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=8, linear_value_head_dim=8),
    "gpt_oss": dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW),
    "olmo3": dict(num_hidden_layers=4, sliding_window=WINDOW),
    "lfm2": dict(num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"]),
    "granitemoehybrid": dict(num_hidden_layers=4, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8,
                             mamba_n_groups=1, num_local_experts=4, num_experts_per_tok=2,
                             layer_types=["mamba", "attention", "mamba", "mamba"]),
    "falcon_h1": dict(num_hidden_layers=2, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
                      mamba_d_ssm=64),
    "nemotron_h": dict(num_hidden_layers=4, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, n_groups=1,
                       layers_block_type=["mamba", "moe", "attention", "mlp"], n_routed_experts=4,
                       num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=32),
    "llama4_text": dict(num_hidden_layers=4, attention_chunk_size=WINDOW, num_local_experts=2, intermediate_size_mlp=96),
}


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
