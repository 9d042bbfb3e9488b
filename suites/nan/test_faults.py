"""Each injected fault is detected and located (issue 5, cases 1-8 except the GPU stream race,
which lives in test_two_models.py). Every case is a LoRA or QLoRA (nf4) run of the tiny model,
on the CPU and, where one is usable, on the GPU."""

from __future__ import annotations

import math

import pytest
import torch

from harness import nan
from harness.nan import lora
from harness.nan import inject
from harness.nan.twomodels import cache_from_tensors, continue_from_cache, prefix_cache


def _trainable(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _all_finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.is_floating_point())


# -- case 1 ---------------------------------------------------------------------------------

@pytest.mark.bnb
def test_case1_all_padding_labels(lora_model, nan_device, tmp_path, record):
    from transformers import Trainer, TrainingArguments

    def arguments(out):
        return TrainingArguments(output_dir=str(out), per_device_train_batch_size=2, max_steps=6, learning_rate=1e-3,
                                 logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
                                 use_cpu=nan_device == "cpu", logging_nan_inf_filter=True,
                                 train_sampling_strategy="sequential")

    per_step = arguments(tmp_path / "probe").train_batch_size  # 2 x the GPUs the Trainer uses
    bad_rows = list(range(4 * per_step, 5 * per_step))  # the whole batch of step 5: padding-only labels
    generator = torch.Generator().manual_seed(1)
    samples = []
    for i in range(6 * per_step):
        ids = torch.randint(10, 2000, (16,), generator=generator)
        labels = ids.clone()
        if i in bad_rows:
            labels[:] = nan.IGNORE_INDEX
        samples.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})

    problems = nan.check_labels(samples)
    assert [(p.index, p.reason) for p in problems] == [(i, "all labels ignored") for i in bad_rows]
    with pytest.raises(nan.BadLabelsError, match=f"#{bad_rows[0]}"):
        nan.require_labels_ok(samples)

    model = lora_model("nf4")
    bad = {k: torch.stack([samples[i][k] for i in bad_rows]).to(nan_device) for k in samples[0]}
    where = nan.first_nonfinite(model, bad)
    assert where is not None and where.phase == "loss", where
    assert "no target" in where.note

    def trainer(callbacks, out):
        return Trainer(model=model, args=arguments(out), train_dataset=samples, callbacks=callbacks)

    # Unguarded, the Trainer's logging_nan_inf_filter hides the NaN of step 5 in its logs.
    plain = trainer([], tmp_path / "plain")
    plain.train()
    logged = [e["loss"] for e in plain.state.log_history if "loss" in e]
    assert len(logged) == 6 and all(math.isfinite(x) for x in logged)

    model = lora_model("nf4")
    guard = nan.NanGuardCallback(tmp_path / "guard")
    guarded = trainer([guard], tmp_path / "guarded")
    with pytest.raises(nan.NonFiniteError) as caught:
        guarded.train()
    finding = caught.value.finding
    assert (finding.phase, finding.tensor, finding.step) == ("loss", "loss", 5)
    assert (tmp_path / "guard" / "LAST_GOOD").read_text().strip() == "step-000004"
    record(case=1, phase=finding.phase, step=finding.step, hidden_by_filter=logged[4], samples_flagged=bad_rows)


# -- case 2 ---------------------------------------------------------------------------------

def test_case2_divergence_caught_before_weights_turn_nan(lora_model, make_batch, nan_device, tmp_path, record):
    batch = make_batch(rows=4, seq=32)
    # LoRA on q/k: a runaway update overflows the attention logits, then everything is NaN.
    model = lora_model("fp32", targets=("q_proj", "k_proj"))
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e4)  # no clipping
    with pytest.raises(nan.NonFiniteError) as caught:
        with nan.TrainingGuard(model, optimizer, tmp_path / "guard") as guard:
            for _ in range(30):
                guard.train_step(batch)
    finding = caught.value.finding
    assert finding.phase == "update" and "divergence" in finding.note, finding
    assert _all_finite(model)
    saved = _trainable(model)
    nan.load_last_good(tmp_path / "guard", model)
    assert _same(saved, _trainable(model))  # the weights left in memory are the last good ones

    # The same run without the guard runs away: on the CPU its weights turn NaN (attention logits
    # overflow); a GPU's fused attention may saturate instead, but the weights still blow up.
    model = lora_model("fp32", targets=("q_proj", "k_proj"))
    weights = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(weights, lr=1e4)

    def norm() -> float:
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(w.detach()) for w in weights])))

    start = norm()
    turned, growth = None, 1.0
    for step in range(1, 31):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if not _all_finite(model):
            turned = step
            break
        growth = max(growth, norm() / start)
    assert turned is not None or growth > 10, f"the unguarded run did not diverge (growth {growth:.3g}x)"
    assert turned is None or finding.step < turned
    if nan_device == "cpu":
        assert turned is not None
    record(case=2, caught_at_step=finding.step, unguarded_nonfinite_at_step=turned, unguarded_weight_growth=growth,
           note=finding.note)


# -- case 3 ---------------------------------------------------------------------------------

def test_case3_fp16_overflow_located(lora_model, make_batch, record):
    model = lora_model("fp16")
    batch = make_batch()
    assert nan.first_nonfinite(model, batch) is None
    target = inject.module_name(model, "layers.1.mlp.up_proj.base_layer")
    inject.scale_weight(model, target, 1e6)
    where = nan.first_nonfinite(model, batch)
    assert where is not None and where.phase == "forward"
    assert where.module == target and where.inf > 0 and where.dtype == "float16", where
    record(case=3, module=where.module, inf=where.inf, nan=where.nan)


# -- case 4 ---------------------------------------------------------------------------------

@pytest.mark.bnb
def test_case4_inf_in_lora_weight_located(lora_model, make_batch, record):
    model = lora_model("nf4")
    batch = make_batch()
    assert nan.first_nonfinite(model, batch) is None
    param = inject.set_parameter_value(model, "layers.0.self_attn.q_proj.lora_A.default.weight", float("inf"))
    where = nan.first_nonfinite(model, batch)
    assert where is not None and where.phase == "forward"
    assert where.module == inject.module_name(model, "layers.0.self_attn.q_proj.lora_A.default"), where
    scanned = nan.nonfinite_tensors(model)
    assert [f"{f.module}.{f.tensor}" for f in scanned] == [param]
    record(case=4, module=where.module)


# -- case 5 and the saved state -------------------------------------------------------------

def test_case5_nan_gradients_bf16_stopped_before_the_optimizer(lora_model, make_batch, tmp_path, record):
    model = lora_model("bf16")
    batch = make_batch()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    down_proj = inject.module_name(model, "layers.1.mlp.down_proj")
    with pytest.raises(nan.NonFiniteError) as caught:
        with nan.TrainingGuard(model, optimizer, tmp_path / "guard") as guard:
            for step in range(1, 5):
                if step == 3:
                    inject.nan_in_backward(model, down_proj)
                    weights, adam = _trainable(model), {k: v["exp_avg"].clone() for k, v in optimizer.state.items()}
                guard.train_step(batch, max_grad_norm=1.0)  # clipping would smear the NaN everywhere
    finding = caught.value.finding
    assert (finding.phase, finding.step) == ("backward", 3)
    assert finding.module.startswith(down_proj) and finding.tensor.endswith(".grad"), finding
    assert _same(weights, _trainable(model))  # the optimizer never wrote the NaN
    assert all(torch.equal(adam[k], v["exp_avg"]) for k, v in optimizer.state.items())
    where = nan.first_nonfinite(model, batch)
    assert where.phase == "backward" and where.module.startswith(down_proj), where
    record(case=5, parameter=f"{finding.module}.{finding.tensor}", step=finding.step, first_nonfinite=where.where)


def test_guard_state_reloads_and_training_resumes(lora_model, make_batch, tmp_path, record):
    batches = [make_batch(seed=s) for s in range(4)]
    model = lora_model("fp32")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with pytest.raises(nan.NonFiniteError):
        with nan.TrainingGuard(model, optimizer, tmp_path / "guard") as guard:
            guard.train_step(batches[0])
            guard.train_step(batches[1])
            guard.train_step(inject.ignore_all_labels(batches[2]))  # NaN loss: stop, state of step 2 kept
    assert guard.step == 2
    optimizer.zero_grad(set_to_none=True)
    with nan.TrainingGuard(model, optimizer, tmp_path / "continued") as guard:
        expected = [guard.train_step(batches[2]), guard.train_step(batches[3])]
    expected_weights = _trainable(model)

    resumed = lora_model("fp32")
    resumed_optimizer = torch.optim.AdamW([p for p in resumed.parameters() if p.requires_grad], lr=1e-3)
    meta = nan.load_last_good(tmp_path / "guard", resumed, resumed_optimizer)
    assert meta["step"] == 2
    assert all(int(s["step"]) == 2 for s in resumed_optimizer.state.values())
    with nan.TrainingGuard(resumed, resumed_optimizer, tmp_path / "resumed") as guard:
        losses = [guard.train_step(batches[2]), guard.train_step(batches[3])]
    assert losses == pytest.approx(expected, rel=1e-4)
    got = _trainable(resumed)
    assert all(torch.allclose(got[k], expected_weights[k], atol=1e-5) for k in got)
    record(resumed_from_step=meta["step"], losses=losses)


# -- case 6 on one device ---------------------------------------------------------------------

def test_case6_poisoned_cache_detected_and_rebuilt_clean(lora_model, make_batch, record):
    model = lora_model("fp32", init_nonzero=True).eval()
    ids = make_batch(rows=1, seq=24)["input_ids"]
    prefix, following = ids[:, :20], ids[:, 20:]
    reference = continue_from_cache(model, prefix_cache(model, prefix), following)

    cache = prefix_cache(model, prefix)
    assert nan.nonfinite_in_cache(cache) == []
    inject.poison_cache(cache, layer=1, kind="value", index=(0, 1, 5, 3))
    findings = nan.nonfinite_in_cache(cache)
    assert [(f.layer, f.kind, f.count) for f in findings] == [(1, "value", 1)]
    poisoned = continue_from_cache(model, cache, following)
    assert not torch.isfinite(poisoned).all()

    rebuilt = prefix_cache(model, prefix)
    assert nan.nonfinite_in_cache(rebuilt) == []
    logits = continue_from_cache(model, rebuilt, following)
    assert torch.allclose(logits, reference, atol=1e-4)
    legacy = tuple((layer.keys, layer.values) for layer in rebuilt.layers)
    assert nan.nonfinite_in_cache(legacy) == []
    copy = cache_from_tensors([k for k, _ in legacy], [v for _, v in legacy])
    inject.poison_cache(copy, layer=0, kind="key", value=float("inf"))
    assert [(f.layer, f.kind) for f in nan.nonfinite_in_cache(copy)] == [(0, "key")]
    record(case=6, findings=[f.describe() for f in findings])


# -- case 7 ---------------------------------------------------------------------------------

@pytest.mark.bnb
def test_case7_masked_padding_rows_no_false_alarm(lora_model, make_batch, nan_device, tmp_path, record):
    model = lora_model("nf4")
    batch = make_batch(rows=2, seq=16)
    pad = 4
    batch["attention_mask"][:, :pad] = 0  # left padding
    batch["labels"][:, : pad + 1] = nan.IGNORE_INDEX  # padding, and the first real token (never a target)
    norm = inject.module_name(model, "model.norm")
    handle = inject.fill_masked_positions(model, norm, batch["attention_mask"])

    assert nan.first_nonfinite(model, batch) is None
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with nan.TrainingGuard(model, optimizer, tmp_path / "guard") as guard:
        losses = [guard.train_step(batch) for _ in range(2)]
    assert all(math.isfinite(x) for x in losses) and guard.finding is None

    # Controls: the detector is not blind. A padded row whose logits feed a real target is a real
    # fault (it reaches the loss); a NaN at an unmasked position is found where it was written.
    leaking = {**batch, "labels": batch["labels"].clone()}
    leaking["labels"][:, pad] = batch["input_ids"][:, pad]
    where = nan.first_nonfinite(model, leaking)
    assert where is not None and where.phase == "loss"
    handle.remove()
    inject.fill_positions(model, norm, [(1, pad + 2)])
    where = nan.first_nonfinite(model, batch)
    assert where.phase == "forward" and where.module == norm and where.first_index[:2] == (1, pad + 2)
    record(case=7, losses=losses)


# -- case 8 ---------------------------------------------------------------------------------

def test_case8_merged_nan_caught_before_saving_and_by_the_scan(lora_model, tmp_path, record):
    from safetensors.torch import load_file

    model = lora_model("fp32", init_nonzero=True)
    param = inject.set_parameter_value(model, "layers.1.mlp.down_proj.lora_B.default.weight", float("nan"), (3, 2))
    assert [f"{f.module}.{f.tensor}" for f in nan.nonfinite_tensors(model)] == [param]

    with pytest.raises(ValueError, match="NaN"):
        lora.merge_and_save(model, tmp_path / "safe", safe_merge=True)
    assert not list((tmp_path / "safe").glob("*.safetensors"))

    lora.merge_and_save(model, tmp_path / "unsafe", safe_merge=False)
    findings = nan.nonfinite_tensors(load_file(str(tmp_path / "unsafe" / "model.safetensors")))
    assert [f"{f.module}.{f.tensor}" for f in findings] == ["model.layers.1.mlp.down_proj.weight"]
    assert findings[0].count == findings[0].shape[1] or findings[0].count > 0
    record(case=8, merged_findings=[f.describe() for f in findings])
