"""Family traits (harness.memory.family.families): layouts from config fields match the meta-device
count, each trait adds what the modeling code keeps alive, unverified families say so, and the
VERIFIED table is backed by committed GPU rows."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from harness.memory.family import families as F
from harness.memory.family import registry
from harness.memory.fit.estimate import Query, estimate
from harness.memory.fit.shape import model_shape, shape_from_config, shape_from_meta
from harness.memory.fit.config_file import load_config

NEW = ("gemma-2-2b", "gemma-3-1b", "qwen3-1.7b")


@pytest.mark.parametrize("name", NEW)
def test_config_layout_equals_the_meta_device_count(name):
    config, _ = load_config(name)
    fast, meta = shape_from_config(config), shape_from_meta(config)
    assert fast.total_params == meta.total_params
    assert fast.tied == meta.tied and fast.embedding_params == meta.embedding_params
    assert fast.norm_params == meta.norm_params and fast.norm_tensors == meta.norm_tensors
    assert sorted((g.kind, g.in_features, g.out_features, g.count) for g in fast.linears) == \
        sorted((g.kind, g.in_features, g.out_features, g.count) for g in meta.linears)


def test_a_meta_shape_is_remembered_by_the_configs_content_not_its_identity():
    """shape_from_meta keeps what one meta forward counted: an equal config (another dict, keys in
    another order) gets it again; one field changed is counted anew."""
    config, _ = load_config("gemma-3-1b")
    first = shape_from_meta(config)
    assert shape_from_meta(dict(reversed(list(config.items())))) is first
    deeper = shape_from_meta({**config, "num_hidden_layers": config["num_hidden_layers"] + 1})
    assert deeper is not first and deeper.layers == first.layers + 1
    assert deeper.total_params > first.total_params and len(deeper.cache) == len(first.cache) + 1


def test_traits_read_from_the_configs():
    g2, g3, q3, llama = (model_shape(n).traits for n in ("gemma-2-2b", "gemma-3-1b", "qwen3-1.7b", "llama-3.2-1b"))
    assert (g2.attention, g2.attn_softcap, g2.final_softcap, g2.norms_per_layer) == ("eager", 50.0, 30.0, 4)
    assert g2.sliding_layers == 13  # every other of 26 layers
    assert g3.attention == "sdpa" and g3.qk_norm and g3.sliding_layers == 22  # 5 of every 6
    assert q3.qk_norm and not q3.final_softcap and q3.norms_per_layer == 2
    assert llama.differs == []
    moe = model_shape("qwen3-30b-a3b").traits
    assert moe.experts == 128 and moe.experts_per_token == 8


def test_fitted_families_get_no_family_terms():
    for name in ("llama-3.2-1b", "qwen2.5-1.5b", "phi-3-mini-4k", "mistral-7b-v0.3"):
        est = estimate(model_shape(name), Query("nf4-dq", "train", seq_len=1024, grad_checkpointing=False))
        assert "family_terms" not in est.breakdown, name


def _as_llama(shape):
    """The same tensor layout without the family's traits: what the generic path gave before."""
    return replace(shape, traits=F.traits_from_config({"model_type": "llama"}))


def test_gemma2_softcapping_and_eager_attention_add_what_they_keep():
    g2 = model_shape("gemma-2-2b")
    q = Query("nf4-dq", "train", seq_len=1024, grad_checkpointing=True, lora_r=8)
    with_traits, generic = estimate(g2, q), estimate(_as_llama(g2), q)
    logits_copy = 1024 * g2.vocab * 4  # one fp32 logits tensor
    # soft-capping keeps tanh's output: one more logits tensor at the loss's backward peak
    assert with_traits.breakdown["loss_logits"] - generic.breakdown["loss_logits"] == logits_copy
    assert with_traits.peak_bytes >= generic.peak_bytes + logits_copy
    # without checkpointing every layer keeps tanh's scores (the fp32 softmax the fit counts)
    nogc = replace(q, grad_checkpointing=False)
    fam = estimate(g2, nogc).breakdown["family_terms"]
    fam2 = estimate(g2, replace(nogc, seq_len=2048)).breakdown["family_terms"]
    scores = g2.layers * g2.heads * 1024 * 1024 * 4
    assert fam["layer_saved"] >= scores
    assert fam2["layer_saved"] > 3 * fam["layer_saved"]  # quadratic in the length, not linear


def test_eager_prefill_counts_the_scores_of_one_layer():
    g2 = model_shape("gemma-2-2b")
    est = estimate(g2, Query("bf16", "prefill", seq_len=4096, batch=2))
    # softmax: the bf16 input, its fp32 copy (ATen converts before _softmax) and the fp32 output
    assert est.breakdown["attention_scores"] == 2 * 8 * 4096 * 4096 * (2 + 4 + 4) + 2 * 2 * 4096 * 4096 * 2
    assert "attention_scores" not in estimate(model_shape("qwen3-1.7b"), Query("bf16", "prefill", seq_len=4096)).breakdown


def test_sliding_layers_decode_with_a_window_sized_cache():
    g3 = model_shape("gemma-3-1b")  # window 512, 22 of 26 layers sliding
    q = Query("bf16", "generate", seq_len=8192, new_tokens=64)
    est, generic = estimate(g3, q), estimate(replace(_as_llama(g3), cache=None), q)  # every layer full
    assert est.breakdown["decode_peak"] < generic.breakdown["decode_peak"]
    # after decode steps a sliding layer's storage holds `window` tokens (a view of its last cat)
    per_token = 2 * 1 * 256 * 2  # K and V, one KV head of 256, bf16
    assert est.breakdown["kv_cache"] == per_token * (4 * 8255 + 22 * 512) + 22 * 8
    short = estimate(g3, Query("bf16", "generate", seq_len=200, new_tokens=64)).breakdown["kv_cache"]
    assert short == per_token * 26 * 263 + 22 * 8  # inside the window: everything


def test_unverified_family_says_so_and_how_it_was_computed():
    v = estimate(model_shape("gemma-2-2b"), Query("nf4-dq", "train")).verification
    assert v["verified"] is False and "unverified for gemma2 training" in v["note"]
    assert "config fields" in v["path"] and "final-logit soft-capping" in v["path"]
    ok = estimate(model_shape("qwen2.5-0.5b"), Query("bf16", "prefill")).verification
    assert ok["verified"] is True and "note" not in ok and "qwen2.5-0.5b" in ok["measured_on"]
    moe = estimate(model_shape("qwen3-30b-a3b"), Query("nf4-dq", "weights")).verification
    assert moe["verified"] is False and "meta device" in moe["path"] and "experts stay unquantized" in moe["path"]


def test_moe_experts_stay_unquantized_under_bitsandbytes():
    moe = model_shape("qwen3-30b-a3b")
    nf4 = estimate(moe, Query("nf4-dq", "weights")).breakdown["weights"]
    bf16 = estimate(moe, Query("bf16", "weights")).breakdown["weights"]
    assert nf4 > 0.9 * bf16  # 3-D expert parameters are not nn.Linear: transformers leaves them bf16


def _archs_with_rows(pattern: str, mode: str | None) -> set[str]:
    archs = set()
    import measurements

    for path in measurements.HERE.joinpath("vram").glob(pattern):
        for row in json.loads(path.read_text())["rows"]:
            if row.get("peak_bytes") and (mode is None or row.get("mode") == mode):
                archs.add(row["arch"])
    return archs


def test_the_verified_table_is_backed_by_committed_gpu_rows():
    import measurements
    from harness.memory.measured.families_truth import load_rows

    family_rows = load_rows([measurements.unpacked(e["name"]) for e in measurements.entries("families-run")])
    inference = (_archs_with_rows("matrix/rows-*.json", "prefill") | _archs_with_rows("holdout/rows-*.json", "prefill")
                 | {r["arch"] for r in family_rows["infer"]})
    training = _archs_with_rows("truth/train_rows.json", None) | {r["arch"] for r in family_rows["train"] if r.get("peak_bytes")}
    for entry in registry.FAMILIES:
        family, (infer_ok, train_ok), archs = entry.model_type, entry.verified, set(entry.verified_by)
        assert archs or not (infer_ok or train_ok), family
        assert all(model_shape(a).family == family for a in archs)
        if infer_ok:
            assert archs & inference, family
        if train_ok:
            assert archs & training, family


def test_moe_offload_plan_says_whole_layers_cross_the_bus(capsys):
    from harness.__main__ import main

    assert main(["plan", "--config", "qwen3-30b-a3b", "--budget", "8GiB", "--offload", "--precision", "bf16",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plans"][0]["fits"] is False
    off = out["offload"]
    assert "8 of 128 experts" in off["moe_note"] and off["bytes_on_gpu"] < 8 * 2**30
    # every offloaded byte is copied per token, experts included
    assert off["bytes_on_cpu"] + off["bytes_on_disk"] > 40 * 2**30


def test_gemma2_attention_follows_the_transformers_version():
    # transformers 5.17 and 5.20 declare Gemma2PreTrainedModel._supports_sdpa = True (from_pretrained
    # picks SDPA, which ignores the soft-cap); 5.21 on declare False (eager)
    assert [F.attention_implementation("gemma2", v) for v in ("5.17.0", "5.20.1", "5.21.0", "5.24.0", None)] == \
        ["sdpa", "sdpa", "eager", "eager", "eager"]
    assert F.attention_implementation("gemma3_text", "5.24.0") == "sdpa"
    g2 = model_shape("gemma-2-2b")
    old = F.at_transformers(g2, "5.17.0")
    q = Query("bf16", "prefill", seq_len=4096, batch=2)
    assert "attention_scores" not in estimate(old, q).breakdown  # no scores block under SDPA
    assert estimate(old, q).peak_bytes < estimate(g2, q).peak_bytes
    v = estimate(old, Query("nf4-dq", "train")).verification
    assert v["verified"] is True and "gemma-2-2b" in v["measured_on"] and "ignored by SDPA" in v["path"]


def test_window_masked_layers_save_repeated_kv_not_a_scores_block():
    g3 = model_shape("gemma-3-1b")  # window 512, 22 of 26 layers sliding, 4 heads on 1 KV head
    inside, past = (Query("nf4-dq", "train", seq_len=n, lora_r=8, grad_checkpointing=False) for n in (256, 1024))
    assert F.sdpa_masked_layers(g3, 256) == 0 and F.sdpa_masked_layers(g3, 1024) == 22
    b = estimate(g3, past).breakdown
    assert b["repeated_kv"] == 22 * 2 * 3 * 256 * 1024 * 4  # K and V copied to the 3 other heads, fp32
    assert b["attention_masks"] == 22 * 1024 * 1024 * (4 + 1)  # in the 22 masked layers only
    assert estimate(g3, inside).breakdown["repeated_kv"] == 0


def test_fused_qkv_is_not_kept_when_kv_are_repeated():
    phi4, phi3 = model_shape("phi-4-mini"), model_shape("phi-3-mini-4k")  # fused qkv; GQA and MHA
    q = Query("nf4-dq", "train", seq_len=1024, grad_checkpointing=False)
    assert estimate(phi4, q).breakdown["fused_qkv_saved"] == 0  # fp32 GQA: the math kernel repeats K/V
    assert estimate(phi4, replace(q, precision="bf16")).breakdown["fused_qkv_saved"] > 0  # flash keeps the view
    assert estimate(phi3, q).breakdown["fused_qkv_saved"] > 0  # MHA: SDPA saves the value view


def _this_year_errors() -> dict[tuple[str, str], list[float]]:
    """(family, "inference" | "train") -> (estimate - peak) / peak over the rows of the families runs
    drawn as data (their jobs name no job set of the driver's), re-estimated now."""
    from dataclasses import fields

    import measurements
    from harness.memory.measured.families_truth import load_rows
    from harness.memory.measured.matrix_readback import row_query
    from harness.memory.measured.train_matrix import TrainCase

    runs = [measurements.unpacked(e["name"]) for e in measurements.entries("families-run")]
    envs = {r: next(r.rglob("environment.json"), None) for r in runs}
    runs = [r for r, env in envs.items() if env and json.loads(env.read_text()).get("job_set") == "this-year"]
    assert runs, "no families run of this year's job set is committed"
    keys = {f.name for f in fields(TrainCase)}
    errors: dict[tuple[str, str], list[float]] = {}
    rows = load_rows(runs)
    for kind, group in (("infer", "inference"), ("train", "train")):
        for r in rows[kind]:
            if not r.get("peak_bytes") or r.get("budget_bytes") or r.get("mode") == "weights":
                continue
            shape = model_shape(r["arch"])
            q = TrainCase(**{k: r[k] for k in keys if k in r}).query() if kind == "train" else row_query(r)
            errors.setdefault((shape.family, group), []).append(
                (estimate(shape, q).peak_bytes - r["peak_bytes"]) / r["peak_bytes"])
    return errors


def test_this_years_families_stay_inside_what_the_estimate_claims():
    """A verified family meets the goals on its rows (median |error| <= 2%, worst <= 5%); an
    unverified one's stated uncertainty covers its worst under-prediction: no measured row is a
    fit the estimate's own margin would have promised wrongly."""
    errors = _this_year_errors()
    assert {f for f, _ in errors} >= {"gemma3_text", "gemma4_text", "qwen3_5_text", "lfm2", "gpt_oss", "granitemoehybrid"}
    for (family, group), errs in errors.items():
        mode = "train" if group == "train" else "prefill"
        v = F.verification(family, mode, "config")
        if v["verified"]:
            assert sorted(abs(e) for e in errs)[len(errs) // 2] <= 0.02 and max(abs(e) for e in errs) <= 0.05, (family, group)
        else:
            assert -min(errs) <= v["uncertainty"], (family, group, min(errs), v["uncertainty"])
