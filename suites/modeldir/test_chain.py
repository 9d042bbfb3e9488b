"""The good chain: LoRA on the tiny model (or --model) -> merge_and_unload -> save -> check-dir -> transformers -> vLLM."""

from __future__ import annotations

import json
import urllib.request

import pytest

from harness.modeldir import check_dir

from variants import sharded


def test_chain_trains_and_merges(chain, record):
    assert all(l == l for l in chain.losses) and chain.losses[-1] < chain.losses[0], chain.losses
    assert (chain.peft_logits - chain.base_logits).abs().max() > 1e-2  # the adapter changes the model
    record(losses=chain.losses, chain_seconds=chain.seconds)


def test_merged_dir_passes_check_dir(chain, record):
    report = check_dir(chain.merged_dir, deep=True)
    assert report.ok and report.findings == [], report.findings
    record(findings=len(report.findings), bytes_read=report.bytes_read)


def test_sharded_merged_dir_passes(chain, tmp_path):
    out = tmp_path / "sharded"
    sharded(chain, out)
    assert len(list(out.glob("model-*.safetensors"))) >= 3
    report = check_dir(out, deep=True)
    assert report.ok, report.findings


def test_merged_reloads_with_the_peft_logits(chain, record):
    import torch

    from harness.models import load_model

    merged = load_model(chain.merged_dir, "fp32", "cpu")
    with torch.no_grad():
        logits = merged(chain.input_ids).logits.float()
    diff = float((logits - chain.peft_logits).abs().max())
    record(max_abs_logit_diff=diff)
    assert diff < 1e-4, diff


@pytest.mark.vllm
@pytest.mark.slow
def test_merged_dir_serves_in_vllm(chain, vllm_python, settings, record):
    from harness.serving.launcher import launch_vllm

    # Eager: what is checked is that vLLM loads the directory and answers; its torch.compile
    # warm-up (about 35 s on 2 cores) says nothing about the directory.
    with launch_vllm(vllm_python, chain.merged_dir, flags=["--max-model-len", "512", "--enforce-eager"],
                     log_dir=settings.report_dir / "logs", served_model_name="merged") as server:
        body = json.dumps({"model": "merged", "prompt": "The model loads", "max_tokens": 8,
                           "temperature": 0}).encode()
        request = urllib.request.Request(server.base_url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            answer = json.loads(resp.read())
    choice = answer["choices"][0]
    assert answer["usage"]["completion_tokens"] >= 1 and isinstance(choice["text"], str), answer
    record(vllm_startup_s=server.startup.startup_s, completion=choice["text"])
