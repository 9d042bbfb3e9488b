"""LoRA targets and optimizer states: the estimator against peft, torch and bitsandbytes run for real
on CPU (tiny models of three layouts: separate q/k/v, fused qkv_proj, GPT-2 Conv1D)."""

from __future__ import annotations

import pytest

from harness.errors import UsageError
from harness.memory.fit import estimate as E
from harness.memory.fit.calibration import CALIBRATION, calibration_key
from harness.memory.fit.lora import (adapter_bytes, check_lora_targets, lora_params, optimizer_name,
                                     resolve_lora_targets)
from harness.memory.fit.shape import model_shape

TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128}


def _config(family: str) -> dict:
    if family == "gpt2":
        return {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256,
                "n_positions": 128, "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2}
    cfg = dict(TINY, model_type=family)
    if family == "phi3":
        cfg.update(num_key_value_heads=4, pad_token_id=0)
    return cfg


def _peft_model(config: dict, targets):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    data = dict(config)
    cfg = AutoConfig.for_model(data.pop("model_type"), **data)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.05, task_type="CAUSAL_LM",
                      target_modules=targets if targets == "all-linear" else list(targets))
    return get_peft_model(model, lora)


def _wrapped(model) -> int:
    return sum(1 for _, m in model.named_modules() if hasattr(m, "lora_A") and len(m.lora_A) > 0)


@pytest.mark.parametrize("family,targets", [
    ("qwen2", ("q_proj", "k_proj", "v_proj", "o_proj")),
    ("qwen2", "all-linear"),
    ("qwen2", ("self_attn.q_proj", "mlp.down_proj")),
    ("phi3", ("q_proj", "k_proj", "v_proj", "o_proj")),  # peft wraps o_proj only: q/k/v are fused
    ("phi3", ("qkv_proj", "gate_up_proj")),
    ("phi3", "all-linear"),
    ("gpt2", ("c_attn",)),  # Conv1D
    ("gpt2", "all-linear"),
])
def test_resolution_matches_what_peft_wraps(family, targets):
    config = _config(family)
    shape = model_shape(config)
    resolved = resolve_lora_targets(shape, targets)
    model = _peft_model(config, targets)
    trainable, _ = model.get_nb_trainable_parameters()
    assert resolved.modules == _wrapped(model)
    assert lora_params(shape, 4, targets) == trainable


def test_a_target_that_matches_nothing_is_named():
    shape = model_shape(_config("phi3"))
    note = check_lora_targets(shape, ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert "q_proj, k_proj, v_proj match no module" in note and "qkv_proj" in note and "only o_proj" in note
    assert check_lora_targets(shape, ("qkv_proj",)) is None
    with pytest.raises(UsageError, match="no module to wrap"):
        check_lora_targets(shape, ("q_proj",))
    with pytest.raises(ValueError):  # and peft indeed refuses
        _peft_model(_config("phi3"), ("q_proj",))


def test_fused_targets_cost_what_peft_trains_at_real_size():
    """phi-3-mini-4k with the tutorial's q,k,v,o: one adapter per layer, not four."""
    shape = model_shape("phi-3-mini-4k")
    attn = resolve_lora_targets(shape, ("q_proj", "k_proj", "v_proj", "o_proj"))
    assert attn.kinds == ("o_proj",) and attn.modules == 32
    assert lora_params(shape, 8, ("q_proj", "k_proj", "v_proj", "o_proj")) == 32 * 8 * (3072 + 3072)


@pytest.mark.parametrize("optimizer", ["adamw_torch", "adamw_8bit"])
def test_optimizer_states_match_a_real_step(optimizer):
    """The state bytes the estimator models against a real optimizer step (bitsandbytes' 8-bit
    AdamW runs on CPU; its min_8bit_size rule keeps small tensors in fp32)."""
    import torch

    from harness.memory.measured.train_matrix import _optimizer_state_bytes, make_optimizer
    from harness.models import bitsandbytes_problem

    if optimizer != "adamw_torch" and bitsandbytes_problem():
        pytest.skip(bitsandbytes_problem())
    # hidden 1024: rank-4 lora_A tensors reach bitsandbytes' 4096-element threshold for 8-bit states
    config = dict(_config("qwen2"), hidden_size=1024, intermediate_size=2048, num_attention_heads=8,
                  num_key_value_heads=4)
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj")
    model = _peft_model(config, targets)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, params)
    ids = torch.randint(3, 250, (1, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    measured, paged = _optimizer_state_bytes(opt, "cpu")
    shape = model_shape(config)
    r = 4  # the rank _peft_model uses
    ad = adapter_bytes(shape, r, resolve_lora_targets(shape, targets), optimizer)
    tensors = 2 * sum(g.count for g in resolve_lora_targets(shape, targets).groups)
    # the estimator rounds each allocation to the CUDA allocator's 512-byte blocks
    assert 0 <= ad["optimizer_states"] - measured <= 4 * 512 * tensors, (ad, measured)
    assert paged == 0 and ad["paged_optimizer_states"] == 0
    if optimizer == "adamw_8bit":  # lora_A in 8 bits, the smaller lora_B of k/v in 32
        fp32 = adapter_bytes(shape, r, resolve_lora_targets(shape, targets))["optimizer_states"]
        assert measured < 0.7 * fp32


def test_paged_states_leave_the_allocator_by_size():
    """bitsandbytes pages only tensors of >= 1e5 elements: rank 64 adapters of a 1.5B model page
    their lora_A of the MLP, rank 8 attention adapters page nothing."""
    shape = model_shape("qwen2.5-1.5b")
    small = adapter_bytes(shape, 8, resolve_lora_targets(shape, ("q_proj", "v_proj")), "paged_adamw_32bit")
    assert small["paged_optimizer_states"] == 0
    big = adapter_bytes(shape, 64, resolve_lora_targets(shape, "all-linear"), "paged_adamw_32bit")
    torch_adamw = adapter_bytes(shape, 64, resolve_lora_targets(shape, "all-linear"), "adamw_torch")
    assert big["paged_optimizer_states"] > 0
    assert big["optimizer_states"] + big["paged_optimizer_states"] == pytest.approx(
        torch_adamw["optimizer_states"], rel=0.01)
    q = dict(precision="nf4-dq", mode="train", seq_len=512, lora_r=64, lora_targets=("all-linear",))
    assert (E.estimate(shape, E.Query(**q, optimizer="paged_adamw_32bit")).peak_bytes
            < E.estimate(shape, E.Query(**q, optimizer="adamw_torch")).peak_bytes)


def test_unknown_optimizer_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown optimizer 'sgd'"):
        optimizer_name("sgd")
    assert optimizer_name("paged_adamw") == "paged_adamw_32bit"


@pytest.fixture(scope="module")
def fit_calibration():
    """benchmarks/vram/fit_calibration.py, the script that wrote CALIBRATION's training keys."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "vram" / "fit_calibration.py"
    spec = importlib.util.spec_from_file_location("fit_calibration", path)
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    return fit


@pytest.fixture(scope="module")
def run1_rows(fit_calibration):
    """The committed H200 rows of the fresh-process training matrix (run 1), read once."""
    import measurements

    return fit_calibration.train_rows([measurements.truth_runs()["run1"]])


def _fit_rows(rows):
    from harness.memory.measured.train_matrix import HOLDOUT_ARCHS

    return [r for r in rows if r["arch"] not in HOLDOUT_ARCHS]


def test_committed_calibration_is_the_fit_without_the_holdouts(fit_calibration, run1_rows):
    """Refit the training keys from the committed H200 rows, leaving the held-out architectures
    out: the coefficients in calibration.CALIBRATION predict every run-1 row, held-out ones included,
    as that fit does (so the held-out figures of suites/vram are out of sample).

    Predictions are compared, not coefficients: two of train/4bit/gc's phase-two features are
    nearly collinear, so lstsq's coefficients there depend on the OpenBLAS kernel of the CPU
    (Haswell gives tok_i 0.678, AVX-512 SkylakeX 0.420) while every prediction moves by at most
    0.004% of the measured peak. A fit that saw the held-out architectures moves their
    predictions by up to 1.4%, so 0.05% tells the two apart."""
    refit = fit_calibration.fit(_fit_rows(run1_rows))
    assert set(refit) == {k for k in CALIBRATION if k.startswith("train/")}
    refitted = dict(CALIBRATION, **refit)
    drift = []
    for row in run1_rows:
        shape, query = model_shape(row["arch"]), fit_calibration.query(row)
        committed = E.estimate(shape, query).peak_bytes
        drift.append((abs(committed - E.estimate(shape, query, calibration=refitted).peak_bytes)
                      / fit_calibration.measured(row), row["arch"], calibration_key(query)))
    assert len(drift) >= 90
    assert max(drift)[0] <= 0.0005, max(drift)


@pytest.mark.parametrize("gc", [True, False], ids=["checkpointing", "no-checkpointing"])
def test_attention_only_recipe_out_of_sample(fit_calibration, run1_rows, gc):
    """The tutorials' recipe (LoRA on q/k/v/o only) held out of the fit as well: fitted on the
    all-linear rows alone, the estimator predicts every attention-only row of run 1 (all
    architectures) within the issue's goal. Without checkpointing this needs the exact LoRA-input
    term (train_transient.saved_activations): all-linear inputs are a fixed mix of hidden and
    intermediate widths, so a fitted coefficient cannot tell them apart (it was 10.9% off)."""
    calibration = dict(CALIBRATION)
    calibration.update(fit_calibration.fit([r for r in _fit_rows(run1_rows) if r["targets"] != "attn"]))
    attn = [r for r in run1_rows if r["targets"] == "attn" and r["grad_checkpointing"] is gc]
    median, worst, n = fit_calibration.report(attn, calibration)
    assert n >= 15
    assert median <= 0.03 and worst <= 0.10, (median, worst)
