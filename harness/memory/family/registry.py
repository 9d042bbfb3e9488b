"""The model families the harness knows, one entry each: what the estimate does with the family,
whether a GPU measurement backs it, the vLLM KV layout its model file builds, and its tiny test
configs. Every reader (families.py, fit/shape.py, vllm/vllm_kv_families.py, vllm/vllm_tiny.py,
tests/memory_tiny_families.py) reads this table; a new family is one `Family(...)` below (plus, if
vLLM builds a layout no entry uses yet, its function, declared with `@layout` in vllm_kv_families).

Stdlib only: the vLLM layout is named, not imported (vllm_kv_families.LAYOUTS resolves the name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Tiny vLLM checkpoints (vllm_tiny): the CPU attention kernel's sizes
_ATTN = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 64, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
_GDN = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"]}
# Tiny transformers checkpoints (tests/memory_tiny_families): a window below the tests' prompts
WINDOW = 24
_HF_GDN = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8)
_HF_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)


@dataclass(frozen=True)
class Family:
    """One model_type. `verified`: (inference, training) estimates checked on a GPU within the goals,
    backed by the rows of `verified_by` (tests/test_memory_families.py recomputes it);
    `measured_under`: mode group -> the worst under-prediction measured where the rows miss the goals;
    `vllm_layout`: the name of vllm_kv_families' layout function (None: dense attention), or
    `vllm_unmodelled`: why the plan refuses it; `tiny`: name -> transformers config overrides
    (AutoConfig.for_model); `vllm_tiny`: name -> (reference config or base dict, overrides)."""

    model_type: str
    verified: tuple[bool, bool] = (False, False)
    verified_by: tuple[str, ...] = ()
    verified_attention: str | None = None  # the attention the rows were measured with, where it varies
    measured_under: dict[str, float] = field(default_factory=dict)
    exact_layout: bool = False  # fit/shape.py counts its parameters from config fields
    qk_norm: bool = False
    four_norms: bool = False  # pre/post attention and feed-forward RMSNorms
    tied_by_default: bool = False  # the config class defaults to tied embeddings
    eager_since: tuple[int, int] | None = None  # transformers refuses SDPA from this version on
    vllm_layout: str | None = None
    vllm_unmodelled: str | None = None
    tiny: dict[str, dict] = field(default_factory=dict)
    vllm_tiny: dict[str, tuple[str | dict, dict]] = field(default_factory=dict)


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
_GEMMA4_VLLM = {**_ATTN, "sliding_window": 64, "global_head_dim": 128, "hidden_size_per_layer_input": 16,
                "use_double_wide_mlp": False}
_GEMMA4_HF = dict(sliding_window=WINDOW, hidden_size_per_layer_input=8, vocab_size_per_layer_input=128,
                  global_head_dim=32)
_GEMMA3 = dict(qk_norm=True, four_norms=True, tied_by_default=True, vllm_layout="interleaved_6")
_QWEN3_5 = dict(measured_under={"inference": 0.09, "train": 0.30}, vllm_layout="gated_deltanet")

FAMILIES: tuple[Family, ...] = (
    # The fitted families, measured on the H200 (measurements/vram/, measurements/vram/families/)
    Family("llama", (True, True), ("llama-3.2-1b", "llama-3.2-3b", "tinyllama-1.1b", "smollm2-1.7b"),
           exact_layout=True, tiny={"llama": dict(num_hidden_layers=2)}),  # the dense control
    Family("qwen2", (True, True), ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-3b", "qwen2.5-7b"), exact_layout=True),
    # phi-3-mini-4k held out of the fit, phi-4-mini (issue 27) held out
    Family("phi3", (True, True), ("phi-3-mini-4k", "phi-4-mini"), exact_layout=True),
    # issue 27 (measurements/vram/families/, transformers 5.17): within 2% median, 5% worst. Gemma-2 was
    # measured under 5.17 (SDPA); its eager path (transformers >= 5.21) has no GPU rows yet
    Family("gemma2", (True, True), ("gemma-2-2b",), verified_attention="sdpa", exact_layout=True, four_norms=True,
           tied_by_default=True, eager_since=(5, 21), vllm_layout="interleaved_2"),
    Family("gemma3_text", (True, True), ("gemma-3-1b", "gemma-3-4b"), exact_layout=True, **_GEMMA3,
           tiny={"gemma3_text": dict(num_hidden_layers=3, sliding_window=WINDOW, sliding_window_pattern=3,
                                     layer_types=None)},
           vllm_tiny={"gemma3": ("gemma-3-1b", {**_ATTN, "num_hidden_layers": 6, "sliding_window": 64,
                                                "query_pre_attn_scalar": 64,
                                                "layer_types": ["sliding_attention"] * 5 + ["full_attention"]})}),
    Family("gemma3", **_GEMMA3),
    Family("gemma", tied_by_default=True),
    Family("qwen3", (True, True), ("qwen3-1.7b",), exact_layout=True, qk_norm=True),  # held out
    # the second run (run-02, held out): inference within the goals; QLoRA training since recompute.py,
    # backed out of sample by run-03 (7 fresh checkpointed rows median 1.1%, worst +3.4%)
    Family("mistral", (True, True), ("mistral-7b-v0.3",), exact_layout=True),
    # only its bf16 inference was measured (within 1.2%), not the bitsandbytes path (3-D experts
    # stay unquantized), nor training
    Family("qwen3_moe", qk_norm=True),
    # This year's run (measurements/vram/families/run-20, transformers 5.17): Gemma-4-E2B/E4B
    # inference median 0.7%, worst -1.7% over 9 rows; training worst -9.6% without checkpointing
    Family("gemma4_text", (True, False), ("gemma-4-e2b", "gemma-4-e4b"), measured_under={"train": 0.10},
           vllm_layout="gemma4",
           tiny={"gemma4_text": dict(num_hidden_layers=4, num_kv_shared_layers=0, **_GEMMA4_HF,
                                     layer_types=["sliding_attention", "full_attention"] * 2),
                 "gemma4_text/kv-shared": dict(num_hidden_layers=6, num_kv_shared_layers=2, **_GEMMA4_HF,
                                               layer_types=["sliding_attention", "full_attention"] * 3)},
           vllm_tiny={"gemma4": ("gemma-4-e2b", {**_GEMMA4_VLLM, "num_hidden_layers": 6, "num_kv_shared_layers": 0,
                                                 "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}),
                      "gemma4-shared": ("gemma-4-e2b", {**_GEMMA4_VLLM, "num_hidden_layers": 12,
                                                        "num_kv_shared_layers": 6, "layer_types":
                                                        (["sliding_attention"] * 5 + ["full_attention"]) * 2})}),
    Family("gemma4", vllm_layout="gemma4"),
    # Gated DeltaNet, short-conv and Mamba-2 layers on transformers' reference PyTorch path (run-20):
    # the generic margin does not cover Qwen3.5's training without checkpointing (-29.8%) or
    # Granite-4-H's Mamba-2 prefill (-48.7%)
    Family("qwen3_5_text", **_QWEN3_5, tiny={"qwen3_5_text": dict(num_hidden_layers=4, **_HF_GDN)},
           vllm_tiny={"qwen3.5": ("qwen3.5-0.8b", {**_ATTN, "num_hidden_layers": 4, **_GDN})}),
    Family("qwen3_5", vllm_layout="gated_deltanet"),
    Family("qwen3_5_moe_text", vllm_layout="gated_deltanet",
           tiny={"qwen3_5_moe_text": dict(num_hidden_layers=4, **_HF_MOE, **_HF_GDN)}),
    Family("qwen3_5_moe", vllm_layout="gated_deltanet"),
    Family("qwen3_next", vllm_layout="gated_deltanet", tiny={"qwen3_next": dict(num_hidden_layers=4, **_HF_MOE, **_HF_GDN)},
           vllm_tiny={"qwen3-next": ("qwen3-next-80b-a3b", {**_ATTN, "num_hidden_layers": 4, **_GDN, "num_experts": 4,
                                                            "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                                                            "shared_expert_intermediate_size": 128})}),
    Family("gpt_oss", measured_under={"inference": 0.04}, vllm_layout="gpt_oss",
           tiny={"gpt_oss": dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW)},
           vllm_tiny={"gpt-oss": ("gpt-oss-20b", {**_ATTN, "num_hidden_layers": 4, "sliding_window": 64,
                                                  "num_local_experts": 4, "num_experts_per_tok": 2, "experts_per_token": 2,
                                                  "intermediate_size": 256, "quantization_config": None,
                                                  "layer_types": ["sliding_attention", "full_attention"] * 2})}),
    Family("olmo3", vllm_layout="interleaved_4", tiny={"olmo3": dict(num_hidden_layers=4, sliding_window=WINDOW)},
           vllm_tiny={"olmo3": ("olmo-3-7b", {**_ATTN, "num_hidden_layers": 4, "sliding_window": 64, "rope_scaling": None,
                                              "layer_types": ["sliding_attention"] * 3 + ["full_attention"]})}),
    Family("cohere2", vllm_layout="interleaved_4"),
    # over by up to 66% (training), under by 0.5% at most
    Family("lfm2", measured_under={"inference": 0.005, "train": 0.005}, vllm_layout="short_conv",
           tiny={"lfm2": dict(num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"])},
           vllm_tiny={"lfm2": ("lfm2-1.2b", {**_ATTN, "num_hidden_layers": 4, "conv_dim": 256, "conv_dim_out": 256,
                                             "block_dim": 256, "block_ff_dim": 512, "num_heads": 4,
                                             "layer_types": ["conv", "conv", "full_attention", "conv"]})}),
    Family("granitemoehybrid", measured_under={"inference": 0.49}, vllm_layout="mamba2_hybrid",
           tiny={"granitemoehybrid": dict(num_hidden_layers=4, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8,
                                          mamba_n_groups=1, num_local_experts=4, num_experts_per_tok=2,
                                          layer_types=["mamba", "attention", "mamba", "mamba"])},
           vllm_tiny={"granite4h": ("granite-4.0-h-tiny", {**_ATTN, "num_hidden_layers": 4, "mamba_n_heads": 8,
                                                           "mamba_d_head": 64, "mamba_d_state": 16,
                                                           "num_local_experts": 4, "num_experts_per_tok": 2,
                                                           "shared_intermediate_size": 256, "intermediate_size": 256,
                                                           "layer_types": ["mamba", "mamba", "attention", "mamba"]})}),
    Family("nemotron_h", vllm_layout="nemotron_h",
           tiny={"nemotron_h": dict(num_hidden_layers=4, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8,
                                    n_groups=1, layers_block_type=["mamba", "moe", "attention", "mlp"],
                                    n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                    moe_shared_expert_intermediate_size=32)},
           vllm_tiny={"nemotron-h": (NEMOTRON_H, {})}),
    Family("falcon_h1", vllm_layout="falcon_h1",
           tiny={"falcon_h1": dict(num_hidden_layers=2, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8,
                                   mamba_n_groups=1, mamba_d_ssm=64)},
           vllm_tiny={"falcon-h1": (FALCON_H1, {})}),
    Family("deepseek_v2", vllm_layout="mla",
           vllm_tiny={"deepseek-v2": (DEEPSEEK_V2_LITE, {"hidden_size": 256, "num_hidden_layers": 2,
                                                         "num_attention_heads": 4, "num_key_value_heads": 4,
                                                         "intermediate_size": 512, "moe_intermediate_size": 128,
                                                         "n_routed_experts": 4, "n_shared_experts": 1,
                                                         "num_experts_per_tok": 2, "max_position_embeddings": 4096})}),
    Family("deepseek_v3", vllm_layout="mla"),
    Family("llama4_text", vllm_layout="llama4",
           tiny={"llama4_text": dict(num_hidden_layers=4, attention_chunk_size=WINDOW, num_local_experts=2,
                                     intermediate_size_mlp=96)},
           vllm_tiny={"llama4": (LLAMA4_TEXT, {"num_hidden_layers": 4})}),
    Family("llama4", vllm_layout="llama4"),
    # Layer kinds the vLLM plan does not model (their own layer_types or fields), named so it says why
    Family("jamba", vllm_unmodelled="Mamba-1 hybrid (jamba)"),
    Family("lfm2_moe", vllm_unmodelled="short-conv MoE (lfm2_moe)"),
    Family("olmo_hybrid", vllm_unmodelled="OLMo hybrid"),
    Family("deepseek_v32", vllm_unmodelled="sparse MLA with an indexer (deepseek_v32)"),
    Family("deepseek_v4", vllm_unmodelled="DeepSeek-V4 compressed attention"),
)
BY_TYPE: dict[str, Family] = {f.model_type: f for f in FAMILIES}


def family(model_type: str) -> Family | None:
    return BY_TYPE.get(model_type)


def model_types(**wanted: Any) -> tuple[str, ...]:
    """The model types whose entries have every given field value, e.g. model_types(exact_layout=True);
    a field given as True also matches any truthy value (a layout name, a tuple of rows)."""
    return tuple(f.model_type for f in FAMILIES
                 if all(bool(getattr(f, k)) if v is True else getattr(f, k) == v for k, v in wanted.items()))


def tiny_configs() -> dict[str, dict]:
    """Every entry's tiny transformers configs, name -> overrides (the name's part before '/' is the model_type)."""
    return {name: overrides for f in FAMILIES for name, overrides in f.tiny.items()}


def vllm_tiny_configs() -> dict[str, tuple[str | dict, dict]]:
    return {name: spec for f in FAMILIES for name, spec in f.vllm_tiny.items()}
