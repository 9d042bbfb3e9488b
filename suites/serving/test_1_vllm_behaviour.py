"""vLLM behaviour under the harness's client, against both versions of the upgrade rehearsal
(old first, then new: the server pool starts each once)."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from harness.serving import metrics
from harness.serving.client import RequestSpec, run_load
from harness.serving.workload import Workload

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.alone, pytest.mark.server_kinds("old", "new")]  # measures time or contention: scripts/test runs it after the rest, alone


@pytest.fixture(scope="module", params=["old", "new"])
def served(request, server_pool):
    return server_pool.use(request.param)


def _one(served, spec: RequestSpec, timeout_s: float = 30.0):
    (record,) = asyncio.run(run_load(served.target(timeout_s), [spec], concurrency=1)).records
    return record


# A 1-token answer may decode to no visible text (half a UTF-8 character from a random model):
# the server still answered, which is what these probes ask.


def test_concurrency_sweep_has_zero_errors_and_exact_token_counts(served, bench, serving_dir, record):
    workload = Workload(input_len=64, output_len=32, num_prompts=16, seed=1)
    data = bench(served, workload, [1, 4, 16], out=serving_dir / f"sweep-{served.kind}.json")
    for run in data["runs"]:
        acct = run["token_accounting"]
        record.row("Concurrency sweep", {"server": served.kind, "concurrency": run["concurrency"],
                                         "TTFT p50 ms": run["ttft_ms"]["p50"], "TPOT p50 ms": run["tpot_ms"]["p50"],
                                         "output tok/s": run["output_throughput"],
                                         "server TTFT mean ms": run["server_metrics"]["ttft_mean_ms"],
                                         "tokens agree": acct["agree"]})
        assert run["requests_failed"] == 0, run["errors"]
        assert acct["usage_output_tokens"] == 16 * 32 == acct["metrics_generation_tokens"], acct
        assert acct["usage_input_tokens"] == 16 * 64 == acct["tokenizer_input_tokens"] == acct["metrics_prompt_tokens"], acct
        assert acct["agree"], acct["findings"]
    by_c = {r["concurrency"]: r["output_throughput"] for r in data["runs"]}
    assert by_c[16] > by_c[1], f"batching should raise throughput: {by_c}"


def test_over_long_prompt_gets_a_fast_4xx_and_the_server_still_answers(served, record):
    started = time.monotonic()
    bad = _one(served, served.spec(served.max_model_len, 1))
    elapsed = time.monotonic() - started
    record(over_long_status=bad.status, over_long_s=round(elapsed, 3), detail=(bad.error_detail or "")[:200])
    assert bad.error == "http_400", (bad.error, bad.error_detail)
    assert elapsed < 5.0
    good = _one(served, served.spec(16, 1, seed=1))
    assert good.answered and good.completion_tokens == 1, (good.error, good.error_detail)


def test_prompt_of_max_model_len_minus_one_works(served):
    rec = _one(served, served.spec(served.max_model_len - 1, 1, seed=2), timeout_s=120)
    assert rec.answered, (rec.error, rec.error_detail)
    assert (rec.prompt_tokens, rec.completion_tokens) == (served.max_model_len - 1, 1)


def test_after_a_stress_burst_health_and_a_real_request_agree(served, bench):
    burst = Workload(input_len=256, output_len=32, num_prompts=48, seed=3)
    data = bench(served, burst, [48], warmup=0)
    (run,) = data["runs"]
    assert run["requests_failed"] == 0, run["errors"]
    with urllib.request.urlopen(served.base_url + "/health", timeout=5) as resp:
        assert resp.status == 200
    started = time.monotonic()
    probe = _one(served, served.spec(8, 1, seed=4), timeout_s=15)
    assert probe.answered and probe.completion_tokens == 1, (probe.error, probe.error_detail)
    assert time.monotonic() - started < 10, "healthy by /health but slow to answer a real request"


def test_warm_prefix_cache_serves_the_shared_prefix(served, bench, record):
    # Same length both ways; the warm workload shares a 768-token prefix (6 KV blocks of 128 on
    # the CPU build), the cold one shares nothing. What is asserted is the server's own count of
    # prompt tokens served from the cache: every request after the first reuses the whole prefix.
    # The TTFT cut that follows is recorded for the report, not asserted (a timing on a shared box).
    # Fresh seeds: a long-lived server (--endpoint) may have cached any fixed prompt set already.
    seed = time.time_ns() % 1_000_000_007
    n, input_len, prefix_len = 10, 896, 768
    cold = bench(served, Workload(input_len=input_len, output_len=8, num_prompts=n, seed=seed), [1], warmup=0)
    warm = bench(served, Workload(input_len=input_len, output_len=8, num_prompts=n, prefix_len=prefix_len,
                                  seed=seed + 1), [1], warmup=0)
    c, w = cold["runs"][0], warm["runs"][0]
    cold_hit, warm_hit = c["server_metrics"]["prefix_cache_hit_rate"], w["server_metrics"]["prefix_cache_hit_rate"]
    record(cold_ttft_p50_ms=c["ttft_ms"]["p50"], warm_ttft_p50_ms=w["ttft_ms"]["p50"],
           cold_hit_rate=cold_hit, warm_hit_rate=warm_hit)
    record.row("Prefix cache", {"server": served.kind, "cold TTFT p50 ms": c["ttft_ms"]["p50"],
                                "warm TTFT p50 ms": w["ttft_ms"]["p50"],
                                "cold hit rate": cold_hit, "warm hit rate": warm_hit})
    assert c["requests_failed"] == w["requests_failed"] == 0
    assert (cold_hit or 0) < 0.01
    reused = (n - 1) * prefix_len / (n * input_len)
    assert warm_hit == pytest.approx(reused, abs=0.01)


def test_metric_names_the_harness_reads_exist(served, record):
    with urllib.request.urlopen(served.base_url + "/metrics", timeout=10) as resp:
        snap = metrics.parse(resp.read().decode())
    missing = [n for n in metrics.READ_NAMES if n not in snap.names()]
    record(vllm_metric_count=len([n for n in snap.names() if n.startswith("vllm:")]))
    assert not missing, f"/metrics lacks {missing}"


def test_gate_workload_three_repeats(served, serving_dir, gate_results, gate_bench, record):
    out = serving_dir / f"gate-{served.kind}.json"
    data = gate_bench(served, out)
    gate_results[served.kind] = out
    runs = data["runs"]
    assert len(runs) == 3 and len({r["concurrency"] for r in runs}) == 1
    assert all(r["requests_failed"] == 0 for r in runs), [r["errors"] for r in runs]
    assert data["complete"] and data["environment"]["server_version"]
    record(output_throughput=[round(r["output_throughput"], 1) for r in runs])
