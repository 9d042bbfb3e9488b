"""vLLM's KV cache as predicted (harness.memory.vllm.vllm_plan) against what the server logged.

Every server the suite starts is recorded in reports/serving/kv_plan.json by the pool. On the CPU
build vLLM sizes the cache from VLLM_CPU_KVCACHE_SPACE, so the prediction must be exact; on a CUDA
build the plan for the card the server runs on must be within 3%. This
file runs after test_1_* so the "new" server is still up: it costs no extra start.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.alone, pytest.mark.server_kinds("new")]  # measures time or contention: scripts/test runs it after the rest, alone

GPU_TOLERANCE_PCT = 3.0


def test_kv_cache_tokens_and_max_concurrency_are_predicted_exactly(server_pool, serving_dir, record):
    served = server_pool.use("new")
    if served.process is None:
        pytest.skip("--endpoint given: the server's KV settings are not known here")
    records = json.loads((serving_dir / "kv_plan.json").read_text())
    mine = [r for r in records if r["server"] == served.kind and r["flags"] == served.process.flags]
    assert mine, f"no KV plan recorded for the {served.kind!r} server"
    last = mine[-1]
    record(predicted_kv_tokens=last.get("predicted_kv_cache_tokens"), logged_kv_tokens=last["logged_kv_cache_tokens"],
           predicted_max_concurrency=last.get("predicted_max_concurrency"),
           logged_max_concurrency=last["logged_max_concurrency"])
    record.row("vLLM KV cache: predicted vs logged", last)
    if last["device"] == "gpu":
        if last.get("predicted_kv_cache_tokens") is None:
            pytest.skip("a CUDA build on a card this process cannot see (no torch device, no NVML)")
        # The plan's bar on a GPU (measured on the H200: measurements/vllm_plan/)
        assert abs(last["error_pct"]) <= GPU_TOLERANCE_PCT, last
        return
    assert last["predicted_kv_cache_tokens"] == last["logged_kv_cache_tokens"], last
    assert last["predicted_max_concurrency"] == last["logged_max_concurrency"], last
