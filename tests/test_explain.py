"""harness.explain on real messages from public issue threads, on noisy logs, and on text it must
not claim to know. The held-out set (tests/data/explain/held_out.json) is only measured, loosely,
here and in benchmarks/explain/held_out.py: no recogniser was written against it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.explain import explain
from harness.explain import KINDS
from harness.explain.text import normalise

DATA = Path(__file__).parent / "data" / "explain"
TRAIN = json.loads((DATA / "real_messages.json").read_text())["cases"]
HELD_OUT = json.loads((DATA / "held_out.json").read_text())["cases"]
HELD_OUT_2 = json.loads((DATA / "held_out_2.json").read_text())["cases"]  # collected after the recognisers
HELD_OUT_3 = json.loads((DATA / "held_out_3.json").read_text())["cases"]  # issue 44's kinds, after their recognisers


def _fix_names(result, words) -> bool:
    return any(w.lower() in result.fix.lower() for w in words)


@pytest.mark.parametrize("case", TRAIN, ids=[c["id"] for c in TRAIN])
def test_real_message_kind_and_fix(case):
    result = explain(case["text"])
    assert result.recognised, case["url"]
    assert result.kind == case["kind"], f"{case['url']}: {result.what_happened}"
    assert result.causes and all(c.evidence for c in result.causes)
    if case["fix_must"]:
        assert _fix_names(result, case["fix_must"]), f"{case['url']}: fix {result.fix!r} lacks {case['fix_must']}"


def test_real_messages_are_sourced_short_excerpts():
    every = TRAIN + HELD_OUT + HELD_OUT_2 + HELD_OUT_3
    for case in every:
        assert case["url"].startswith("https://github.com/") and case["kind"] in KINDS
        assert len(case["text"]) < 2500 and case["cause"]
    assert len({c["id"] for c in every}) == len(every) and len({c["url"] for c in every}) == len(every)
    ids = [c["id"] for c in TRAIN + HELD_OUT]
    assert len(ids) == len(set(ids)) and len(HELD_OUT) * 3 >= len(ids) - 3


def test_held_out_loosely():
    """Thresholds fixed before the first measurement; the figures themselves are the benchmark's."""
    results = [(c, explain(c["text"])) for c in HELD_OUT]
    recognised = [(c, r) for c, r in results if r.recognised]
    assert len(recognised) >= 0.6 * len(results)
    assert sum(r.kind == c["kind"] for c, r in recognised) >= 0.75 * len(recognised)


def test_held_out_3_goals():
    """Issue 44's goals on its held-out set: right kind on >= 85 %, no wrong kind (a confident wrong
    kind is worse than none). Measured first at 31/33 right, 0 wrong; the figures are the benchmark's."""
    results = [(c, explain(c["text"])) for c in HELD_OUT_3]
    assert sum(r.kind == c["kind"] for c, r in results) >= 0.85 * len(results)
    assert not [c["url"] for c, r in results if r.recognised and r.kind != c["kind"]]


# --- noisy logs: the same message under decorations must give the same answer -------------------

KV = ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
      "stored in KV cache (7344). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
      "initializing the engine.")


def _decorated(message: str) -> str:
    bar = "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.02s/it]"
    lines = [
        "\x1b[1;36m(EngineCore_DP0 pid=1234)\x1b[0;0m INFO 12-02 10:11:12 [gpu_model_runner.py:1772] Starting to load model",
        bar + "\r" + bar.replace("50%", "100%").replace("1/2", "2/2"),
    ]
    for part in message.split("\n"):
        lines.append(f"(EngineCore_DP0 pid=1234) \x1b[31mERROR\x1b[0m 12-02 10:11:14 [core.py:708] {part}")
    lines.append("(VllmWorker rank=0 pid=5678) [rank0]: Traceback (most recent call last):")
    return "\n".join(lines)


@pytest.mark.parametrize("wrap", [
    _decorated,
    lambda m: "\n".join(f"vllm-1  | {line}" for line in m.split("\n")),
    lambda m: "\n".join(f"[2026-01-28T23:59:42Z] ^[[0;36m(EngineCore_DP0 pid=972)^[[0;0m ^[[31mERROR^[[0m "
                        f"^[[90m01-28 15:59:42^[[0m ^[[90m[core.py:935]^[[0m {line}" for line in m.split("\n")),
    lambda m: "Processed prompts:   6%|█▋   | 29/512 [00:08<02:31,  3.19it/s]" + m,
    lambda m: "\n".join(f"[rank0]: {line}" for line in m.split("\n")),
], ids=["vllm-prefixes", "docker", "caret-ansi-ci", "glued-progress-bar", "torchrun"])
def test_decorations_do_not_change_the_answer(wrap):
    plain, noisy = explain(KV), explain(wrap(KV))
    assert noisy.recognised and noisy.kind == plain.kind == "vllm_startup"
    assert noisy.computed["max_model_len"] == plain.computed["max_model_len"] == 7344


def test_normalise_strips_prefixes_and_keeps_the_message():
    text = normalise("(VllmWorker rank=1 pid=42) INFO 06-28 06:11:45 distributed_gpu_executor.py:45] # GPU blocks: 378\n"
                     "Oct 04 13:19:39 llm sd-webui-forge-start[394]: RuntimeError: boom\n"
                     "[ 1843.308145] NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.\n"
                     "│ ❱ 20 │   │   raise RuntimeError('''   │")
    assert text.split("\n") == ["# GPU blocks: 378", "RuntimeError: boom",
                                "NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.",
                                "20 │   │   raise RuntimeError('''"]


def test_killed_glued_to_a_progress_bar_is_host_oom():
    log = "Loading checkpoint shards:   0%|          | 0/2 [00:00<?, ?it/s]Killed\n"
    result = explain(log)
    assert result.kind == "host_oom" and "RAM" in result.fix


# --- what explain must not claim -------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nKeyError: 'input_ids'",
    # vLLM's start-up info line (a successful start), not the error
    "INFO 08-30 [gpu_worker.py:276] Free memory on device (110.37/121.69 GiB) on startup. Desired GPU memory "
    "utilization is (0.87, 105.87 GiB).",
    "{'loss': 1.2345, 'grad_norm': 0.8123, 'learning_rate': 2e-05, 'epoch': 0.5}",
    "To avoid CUDA out of memory errors, reduce the batch size in config.yaml.",
    "The job was killed by the user at 10:00 and restarted.",
    "INFO: nccl-tests all_reduce_perf: busbw 180 GB/s, no errors",
])
def test_text_without_a_failure_is_not_recognised(text):
    result = explain(text)
    assert not result.recognised and result.kind is None and result.causes == [] and result.computed is None


# --- figures from the log and computed fixes --------------------------------------------------------

def test_cuda_oom_figures_and_fragmentation_fix():
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of "
           "15.77 GiB of which 514.19 MiB is free. Process 562167 has 15.25 GiB memory in use. Of the allocated "
           "memory 13.73 GiB is allocated by PyTorch, and 736.86 MiB is reserved by PyTorch but unallocated.")
    result = explain(log)
    f = result.figures_from_log
    assert result.kind == "cuda_oom"
    assert f["tried"] == 546 * 1024**2 and f["free"] == round(514.19 * 1024**2)
    assert f["reserved_unallocated"] == round(736.86 * 1024**2)
    assert "expandable_segments:True" in result.fix and "fragmentation" in result.causes[0].cause


def test_cuda_oom_without_fragmentation_asks_for_a_smaller_step():
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of "
           "7.79 GiB of which 1.00 GiB is free. Of the allocated memory 6.2 GiB is allocated by PyTorch, and "
           "20.00 MiB is reserved by PyTorch but unallocated.\n    loss.backward()")
    result = explain(log)
    assert "expandable_segments" not in result.causes[0].cause
    assert "25% of the current batch" in result.fix  # (1.00 GiB + 20 MiB) / 4 GiB, from the log's figures


def test_old_oom_format_is_read():
    log = ("RuntimeError: CUDA out of memory. Tried to allocate 70.00 MiB (GPU 0; 6.00 GiB total capacity; 5.16 GiB "
           "already allocated; 0 bytes free; 5.31 GiB reserved in total by PyTorch)")
    f = explain(log).figures_from_log
    assert f["total"] == 6 * 1024**3 and f["free"] == 0
    assert f["reserved_unallocated"] == round(5.31 * 1024**3) - round(5.16 * 1024**3)


def test_free_memory_gives_the_utilization_that_starts():
    log = ("ValueError: Free memory on device cuda:0 (19.77/22.05 GiB) on startup is less than desired GPU memory "
           "utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.")
    result = explain(log)
    u = result.computed["gpu_memory_utilization"]
    assert u == 0.88 and u * 22.05 <= 19.77  # vLLM's own start condition holds at the computed value


def test_cpu_backend_free_memory_variant():
    log = ("ValueError: Available memory on node 0 (3.10/23.40 GiB) on startup is less than desired CPU memory "
           "utilization (0.9, 21.06 GiB).")
    result = explain(log)
    assert result.kind == "vllm_startup" and result.computed["gpu_memory_utilization"] == 0.12


def test_driver_too_old_names_the_torch_build():
    result = explain("RuntimeError: The NVIDIA driver on your system is too old (found version 11040).")
    assert result.computed["driver_cuda"] == "11.4" and result.computed["torch_index"].endswith("/cu118")
    ancient = explain("AssertionError: The NVIDIA driver on your system is too old (found version 9000).")
    assert ancient.computed["torch_index"] is None and "update the NVIDIA driver" in ancient.fix


def test_hardware_xid_outranks_the_nccl_error_it_caused():
    log = ("NCCL WARN Cuda failure 'unspecified launch failure'\nRuntimeError: NCCL error: unhandled cuda error\n"
           "[ 74889.644138] NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.")
    result = explain(log)
    assert result.kind == "gpu_hardware" and {"kind": "nccl"}.items() <= result.also[0].items()


def test_illegal_memory_access_is_said_to_be_software():
    result = explain("RuntimeError: CUDA error: an illegal memory access was encountered")
    assert result.kind == "gpu_hardware" and "usually software" in result.causes[0].cause


def test_kv_message_of_vllm_v1():
    log = ("ValueError: To serve at least one request with the model's max seq len (131072), (16.00 GiB KV cache is "
           "needed, which is larger than the available KV cache memory (9.18 GiB). Based on the available memory, the "
           "estimated maximum model length is 75168. Try increasing `gpu_memory_utilization`")
    result = explain(log)
    assert result.computed["max_model_len"] == 75168 and "--max-model-len 75168" in result.fix


def test_config_and_gpu_memory_bring_a_planned_fix():
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "7.79 GiB of which 1.10 GiB is free.\n    loss.backward()")
    result = explain(log, config="qwen2.5-0.5b", gpu_memory="rtx-3070-8gb")
    computed = result.computed
    assert computed["source"].startswith("prediction") and computed["mode"] == "train"
    assert computed["best"] is not None and "python -m harness plan --config qwen2.5-0.5b" in result.fix


def test_vllm_failure_with_config_runs_the_vllm_planner():
    result = explain(KV + "\ngpu_memory_utilization=0.9", config="qwen2.5-0.5b", gpu_memory="t4")
    planned = result.computed["vllm_plan"]
    assert "error" not in planned, planned  # the planner's public API answered
    assert planned["source"].startswith("prediction") and planned["card"].startswith("Tesla T4")
    assert result.computed["max_model_len"] == 7344  # the log's figure stays apart from the prediction


def test_source_lines_in_a_traceback_are_not_the_error():
    log = ("Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n"
           "    except torch.cuda.OutOfMemoryError:\n  File \"train.py\", line 41, in <module>\n"
           "KeyError: 'labels'")
    assert not explain(log).recognised


def test_driver_for_a_cuda_13_torch():
    """The brief's example: a CUDA 12.8 driver under a cu130 torch -> the cu128 build, or driver >= 580."""
    result = explain("RuntimeError: The NVIDIA driver on your system is too old (found version 12080).")
    assert result.computed["torch_index"].endswith("/cu128") and ">= 580" in result.fix


def test_two_failures_the_specific_one_wins_and_the_other_is_listed():
    log = ("bin .../bitsandbytes/libbitsandbytes_cpu.so\nUserWarning: The installed version of bitsandbytes was "
           "compiled without GPU support.\nLoading checkpoint shards:  50%|#####     | 1/2 [00:04<00:04]\nKilled")
    result = explain(log)
    assert result.kind == "host_oom" and [a["kind"] for a in result.also] == ["bnb_setup"]


def test_host_oom_with_config_sizes_the_load():
    result = explain("Loading checkpoint shards:  38%|###  | 3/8 [00:02<00:03,  1.28it/s]Killed", config="qwen2.5-0.5b")
    c = result.computed
    assert result.kind == "host_oom" and c["source"].startswith("prediction")
    assert c["bf16_bytes"] > 0 and abs(c["fp32_bytes"] / c["bf16_bytes"] - 2) < 0.01  # 4 vs 2 bytes a weight


@pytest.mark.parametrize("text, kind, must", [
    ("ValueError: User-specified max_model_len (65536) is greater than the derived max_model_len "
     "(max_position_embeddings=32768 or model_max_length=None in model's config.json).", "vllm_startup",
     "--max-model-len 32768"),
    ("ValueError: Model architectures ['Qwen9ForCausalLM'] are not supported for now.", "vllm_startup", "upgrade vLLM"),
    ("ImportError: libcudart.so.12: cannot open shared object file: No such file or directory", "driver_cuda_mismatch",
     "LD_LIBRARY_PATH"),
    ("RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env "
     "variable CUDA_VISIBLE_DEVICES after program start.", "driver_cuda_mismatch", "nvidia_uvm"),
    ("RuntimeError: FlashAttention only supports Ampere GPUs or newer.", "driver_cuda_mismatch", "sdpa"),
    ("Error named symbol not found at line 74 in file /src/csrc/ops.cu", "bnb_setup", "upgrade bitsandbytes"),
    ("ValueError: NaNs detected in the merged weights. The adapter default seems to be broken", "nan_loss", "bf16"),
    ("ValueError: The checkpoint you are trying to load has model type `qwen3` but Transformers does not recognize "
     "this architecture.", "model_dir", "upgrade transformers"),
])
def test_more_library_messages(text, kind, must):
    result = explain(text)
    assert result.kind == kind and must in result.fix, result.fix


def test_batch_in_the_log_gives_the_batch_at_which_the_request_fits():
    log = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of "
           "7.79 GiB of which 600.00 MiB is free. Of the allocated memory 6.5 GiB is allocated by PyTorch, and "
           "100.00 MiB is reserved by PyTorch but unallocated.\n"
           "python train.py --per_device_train_batch_size 8 --max_seq_length 1024\n    loss.backward()")
    result = explain(log, config="qwen2.5-0.5b")
    assert result.figures_from_log["batch"] == 8 and result.figures_from_log["seq_len"] == 1024
    assert result.computed["batch_for_failed_request"] == 3  # 8 x (600 + 100) MiB / 1536 MiB = 3.6
    assert result.computed["best"]["at_seq_len"] == 1024  # the planner plans at the log's sequence length


@pytest.mark.parametrize("text, must", [
    ("(EngineCore_DP0 pid=77) INFO 12-02 10:11:12 [gpu_model_runner.py:2000] Capturing CUDA graphs (mixed prefill-decode"
     ", PIECEWISE): 45%|████▌     | 30/67\n(EngineCore_DP0 pid=77) ERROR 12-02 10:11:13 [core.py:708] "
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 7.75 GiB "
     "of which 20.00 MiB is free.", "--enforce-eager"),
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla T4 GPU has "
     "compute capability 7.5. You can use float16 instead by explicitly setting the `dtype` flag in CLI, for example: "
     "--dtype=half.", "--dtype half"),
    ("INFO 12-02 10:11:12 [api_server.py:1000] vLLM API server version 0.11.0\nOSError: Can't load tokenizer for "
     "'/models/merged'. If you were trying to load it from 'https://huggingface.co/models', make sure you don't have "
     "a local directory with the same name.", "--tokenizer"),
])
def test_vllm_start_up_families(text, must):
    result = explain(text)
    assert result.kind == "vllm_startup" and must in result.fix, result.fix
