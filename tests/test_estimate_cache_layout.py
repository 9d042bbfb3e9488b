"""The estimate's KV cache against the cache transformers itself returns from generate, for tiny
random checkpoints of this year's families (built on the CPU from their configs): equal, byte for byte."""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.memory.fit.cache_layout import real_cache_bytes
from harness.memory.fit.estimate import Query, estimate
from harness.memory.fit.shape import model_shape

from memory_tiny_families import FAMILIES, build, config_dict

PROMPT, NEW, BATCH = 40, 6, 2  # the tiny windows are 24 tokens: sliding layers drop tokens
# fixed-size states (Gated DeltaNet, short convolutions, Mamba-2) also checked in fp32
STATE_FAMILIES = ("qwen3_5_text", "lfm2", "granitemoehybrid", "falcon_h1", "nemotron_h")


def _generated_cache_bytes(name: str, dtype) -> int:
    import torch

    model = build(name, dtype)
    ids = torch.randint(3, 120, (BATCH, PROMPT), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                             do_sample=False, return_dict_in_generate=True)
    return real_cache_bytes(out.past_key_values)


@pytest.mark.parametrize("name,precision", [(n, "bf16") for n in FAMILIES] + [(n, "fp32") for n in STATE_FAMILIES])
def test_generate_cache_equals_transformers_cache(name, precision):
    import torch

    real = _generated_cache_bytes(name, torch.bfloat16 if precision == "bf16" else torch.float32)
    shape = model_shape(config_dict(name))
    est = estimate(shape, Query(precision, "generate", seq_len=PROMPT, batch=BATCH, new_tokens=NEW))
    assert est.breakdown["kv_cache"] == real, est.breakdown.get("cache_layers")


def test_layouts_name_transformers_cache_classes():
    assert model_shape(config_dict("gemma4_text/kv-shared")).cache[-2].kind == "DummyLayer"  # KV shared
    kinds = {layer.kind for layer in model_shape(config_dict("falcon_h1")).cache}
    assert kinds == {"LinearAttentionAndFullAttentionLayer"}
    qwen = model_shape(config_dict("qwen3_5_text")).cache
    assert [layer.attends for layer in qwen] == [False, False, False, True]  # GDN layers keep fixed states


def test_prefill_cache_holds_every_prompt_token_in_sliding_layers_too():
    """The sliding layer keeps a view of its last window - 1 tokens, whose storage is the whole cat."""
    shape = model_shape(config_dict("gemma3_text"))
    one = estimate(shape, Query("bf16", "prefill", seq_len=100)).breakdown["kv_cache"]
    two = estimate(shape, Query("bf16", "prefill", seq_len=200)).breakdown["kv_cache"]
    assert two - one == 100 * 3 * 2 * 2 * 16 * 2  # every one of the 3 layers grows


def test_a_config_saved_by_transformers_builds_and_a_refused_one_says_why():
    from transformers import AutoConfig
    import json

    saved = json.loads(AutoConfig.for_model("falcon_h1", num_hidden_layers=2).to_json_string())
    assert saved["time_step_limit"][1] == {"__float__": "Infinity"}  # how save_pretrained writes inf
    assert model_shape(dict(saved, model_type="falcon_h1")).family == "falcon_h1"
    with pytest.raises(UsageError) as exc:
        model_shape(dict(saved, model_type="falcon_h1", time_step_limit=[0, "x"]))
    msg = str(exc.value)
    assert "\n" not in msg and "time_step_limit" in msg and "doesn't match" in msg


def test_a_cache_layer_kind_not_modelled_is_refused_in_one_line():
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("deepseek_v32", hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
                               num_attention_heads=4, num_hidden_layers=2, vocab_size=128)
    with pytest.raises(UsageError) as exc:
        model_shape(cfg.to_dict() | {"model_type": "deepseek_v32"})
    assert "DynamicIndexedLayer" in str(exc.value) and "\n" not in str(exc.value)
