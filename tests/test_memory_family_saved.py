"""The family terms against autograd itself: on CPU, tiny models of the real transformers classes,
the bytes of every tensor saved for backward (torch.autograd.graph.saved_tensors_hooks, counted
once per storage, frozen parameters left out), with and without each trait. What the modeling
code keeps must be what harness.memory.family.families says it keeps."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from harness.memory.family import families as F  # noqa: E402
from harness.memory.fit.estimate import Query  # noqa: E402
from harness.memory.fit.shape import shape_from_config  # noqa: E402

DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=1000)
SEQ = 64


def config(model_type: str, **extra) -> dict:
    return dict(DIMS, model_type=model_type, **extra)


def frozen_model(cfg: dict, attn: str):
    """The config's model with random fp32 weights, in train mode, every weight frozen and the
    embeddings' output requiring grad (so the layers keep for backward what LoRA training keeps)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(cfg)
    hf = AutoConfig.for_model(data.pop("model_type"), **data)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf, dtype=torch.float32, attn_implementation=attn).train()
    for p in model.parameters():
        p.requires_grad_(False)
    model.get_input_embeddings().register_forward_hook(lambda mod, i, out: out.requires_grad_(True))
    return model


def saved_bytes(cfg: dict, attn: str) -> int:
    model = frozen_model(cfg, attn)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    ids = torch.randint(0, DIMS["vocab_size"], (1, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, labels=ids)
    return sum(seen.values())


def terms(cfg: dict) -> dict:
    shape = shape_from_config(cfg)
    q = Query("fp32", "train", seq_len=SEQ, grad_checkpointing=False)
    return F.train_terms(shape, shape.traits, q, act=4, logit_bytes=4, covered_scores=False)


GEMMA2 = config("gemma2", sliding_window=4096, query_pre_attn_scalar=16)


def test_attention_softcapping_keeps_tanh_of_every_layers_scores():
    capped = saved_bytes(dict(GEMMA2, attn_logit_softcapping=50.0, final_logit_softcapping=None), "eager")
    plain = saved_bytes(dict(GEMMA2, attn_logit_softcapping=None, final_logit_softcapping=None), "eager")
    on = F.traits_from_config(dict(GEMMA2, attn_logit_softcapping=50.0))
    off = F.traits_from_config(dict(GEMMA2, attn_logit_softcapping=None))
    per_score = F.eager_saved_bytes_per_score(on, 4) - F.eager_saved_bytes_per_score(off, 4)
    assert capped - plain == DIMS["num_hidden_layers"] * DIMS["num_attention_heads"] * SEQ * SEQ * per_score


def test_final_softcapping_keeps_one_more_logits_tensor():
    capped = saved_bytes(dict(GEMMA2, attn_logit_softcapping=None, final_logit_softcapping=30.0), "eager")
    plain = saved_bytes(dict(GEMMA2, attn_logit_softcapping=None, final_logit_softcapping=None), "eager")
    one_copy = SEQ * DIMS["vocab_size"] * 4
    assert capped - plain == one_copy
    # the estimate adds that saved copy at the loss's backward peak
    assert terms(dict(GEMMA2, final_logit_softcapping=30.0))["logits"] == one_copy


def test_qk_norms_keep_their_fp32_inputs():
    qwen3, llama = saved_bytes(config("qwen3"), "sdpa"), saved_bytes(config("llama"), "sdpa")
    assert qwen3 - llama == terms(config("qwen3"))["layer_saved"]


def test_gemma_four_norms_keep_two_more_inputs_a_layer():
    gemma3 = saved_bytes(config("gemma3_text", sliding_window=4096, query_pre_attn_scalar=16), "sdpa")
    qwen3 = saved_bytes(config("qwen3"), "sdpa")
    predicted = terms(config("gemma3_text", sliding_window=4096))["layer_saved"] - terms(config("qwen3"))["layer_saved"]
    # Gemma's norms multiply by (1 + weight), a fresh weight-sized tensor each: bytes, not activations
    small = 4 * ((4 * DIMS["num_hidden_layers"] + 1) * DIMS["hidden_size"] + 2 * DIMS["num_hidden_layers"] * DIMS["head_dim"])
    assert 0 <= (gemma3 - qwen3) - predicted <= small


def _step_peak(cfg: dict, attn: str) -> int:
    """Peak live bytes of one forward + backward on CPU, from the profiler's memory timeline."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfile
    model = frozen_model(cfg, attn)
    ids = torch.randint(0, cfg["vocab_size"], (1, SEQ), generator=torch.Generator().manual_seed(1))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        del out
    live = peak = 0
    for _t, action, _key, size in MemoryProfile(prof.profiler.kineto_results).timeline:
        live += size if "CREATE" in str(action) else -size if "DESTROY" in str(action) else 0
        peak = max(peak, live)
    return peak


def test_final_softcapping_raises_the_step_peak_by_one_logits_tensor():
    """Not two: cross-entropy's own gradients are freed before the soft-cap chain's come."""
    big_vocab = dict(GEMMA2, vocab_size=32000, num_hidden_layers=1, attn_logit_softcapping=None)
    capped = _step_peak(dict(big_vocab, final_logit_softcapping=30.0), "eager")
    plain = _step_peak(dict(big_vocab, final_logit_softcapping=None), "eager")
    one_copy = SEQ * 32000 * 4
    assert abs((capped - plain) - one_copy) <= 0.01 * one_copy
    assert terms(dict(big_vocab, final_logit_softcapping=30.0))["logits"] == one_copy
