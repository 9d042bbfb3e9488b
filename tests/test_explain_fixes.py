"""Computed fixes that start on the first try, and the kind whose fix is right where two fit: the
--max-model-len under the log's ceiling, half the profile run's tokens, the utilization under a
graph-capture OOM, which figure to add when the log lacks it, and a NaN from bf16 on a pre-Ampere
card (a NaN cause, not a driver mismatch)."""

from __future__ import annotations

import pytest

from harness.explain import explain
from harness.explain.vllm import start_margin

V0_KV = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored "
         "in KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
         "the engine.")


@pytest.mark.parametrize("ceiling, expected", [(7344, 7168), (4512, 4352), (131072, 128256), (1000, 976), (16, 16)])
def test_start_margin_is_under_the_ceiling_by_about_2_percent(ceiling, expected):
    assert start_margin(ceiling) == expected and start_margin(ceiling) <= ceiling


def test_kv_fix_gives_the_length_to_start_and_the_ceiling():
    result = explain(V0_KV)
    assert result.computed["max_model_len"] == 7344 and result.computed["max_model_len_to_start"] == 7168
    assert result.fix.startswith("start with --max-model-len 7168:") and "--max-model-len 7344 is the log's ceiling" in result.fix


PROFILE_OOM = ('  File "vllm/v1/worker/gpu_model_runner.py", line 2000, in profile_run\n'
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity "
               "of 15.77 GiB of which 10.19 MiB is free.")


def test_profile_run_oom_halves_the_logged_batched_tokens():
    result = explain("(EngineCore_DP0 pid=1) INFO 01-02 10:00:00 [core.py:1] max_num_batched_tokens=8192\n" + PROFILE_OOM)
    assert result.kind == "vllm_startup" and result.computed["max_num_batched_tokens"] == 4096
    assert "--max-num-batched-tokens 4096" in result.fix


def test_profile_run_oom_without_the_figure_says_which_to_add():
    result = explain("(EngineCore_DP0 pid=1) ERROR vllm start-up\n" + PROFILE_OOM)
    assert result.kind == "vllm_startup" and result.computed is None
    assert "add vLLM's config line, max_num_batched_tokens=" in result.fix


def test_plain_oom_without_batch_says_which_figures_to_add():
    result = explain("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                     "capacity of 7.79 GiB of which 1.10 GiB is free.")
    assert result.kind == "cuda_oom" and "per_device_train_batch_size" in result.fix and "--config" in result.fix


def test_nan_from_bf16_on_a_t4_is_nan_loss_and_names_the_other():
    text = ("GPU 0: Tesla T4\n--bf16 True\n{'loss': nan, 'grad_norm': nan, 'learning_rate': 2e-05, 'epoch': 0.1}\n"
            "ValueError: Your setup doesn't support bf16/gpu.")
    result = explain(text)
    assert result.kind == "nan_loss" and "pre-Ampere" in result.fix and "fp16" in result.fix
    assert [a["kind"] for a in result.also] == ["driver_cuda_mismatch"]
    assert explain("{'loss': nan, 'grad_norm': nan, 'epoch': 0.1}\n--bf16 True").fix.startswith("train in bf16")


def test_driver_message_without_its_version_asks_for_nvidia_smi_or_uses_it():
    cut = explain("RuntimeError: The NVIDIA driver on your system is too old")
    assert cut.kind == "driver_cuda_mismatch" and "CUDA Version" in cut.fix and cut.computed is None
    smi = explain("RuntimeError: The NVIDIA driver on your system is too old\n"
                  "| NVIDIA-SMI 470.82   Driver Version: 470.82   CUDA Version: 11.4 |")
    assert smi.computed["torch_index"].endswith("/cu118") and "cu118" in smi.fix
