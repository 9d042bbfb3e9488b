"""bench's summary block in `vllm bench serve`'s words, and the built-in dataset workloads."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from harness.serving import datasets, prompts
from harness.serving.client import Target, make_session
from harness.serving.standin import run_standin
from harness.serving.summary import format_results, summaries
from harness.serving.workload import Workload
from harness.settings import DEFAULT_VLLM_VENV

ROOT = Path(__file__).resolve().parents[1]
VLLM_SERVE = ROOT / DEFAULT_VLLM_VENV / "lib" / "python3.11" / "site-packages" / "vllm" / "benchmarks" / "serve.py"


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "bench", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=180)


def test_the_summary_block_uses_vllms_names_and_the_runs_figures(tmp_path):
    out = tmp_path / "b.json"
    with run_standin(ttft_ms=20, token_interval_ms=5, tokenize=True, log_dir=tmp_path) as server:
        proc = _bench("--endpoint", server.base_url, "--model", "standin", "--concurrency", "2", "--num-prompts", "8",
                      "--input-len", "32", "--output-len", "6", "--repeats", "2", "--slo", "ttft_ms=500",
                      "--out", str(out), "-q")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "============ Serving Benchmark Result ============" and lines[-1].startswith("OK: 16 of 16")
    labels = [line[:40].rstrip() for line in lines if line[:40].rstrip().endswith(":")]
    expected = ["Successful requests:", "Failed requests:", "Maximum request concurrency:", "Benchmark duration (s):",
                "Total input tokens:", "Total generated tokens:", "Request throughput (req/s):",
                "Request goodput (req/s):", "Output token throughput (tok/s):", "Total token throughput (tok/s):"]
    assert labels[:len(expected)] == expected
    for short in ("TTFT", "TPOT", "ITL", "E2EL"):
        assert [f"Mean {short} (ms):", f"Median {short} (ms):", f"P99 {short} (ms):"] == [
            label for label in labels if short in label and "(ms)" in label]
    if VLLM_SERVE.is_file():  # the names are vLLM's own, as its serve.py prints them
        source = VLLM_SERVE.read_text()
        for label in expected:
            assert f'"{label}"' in source, label
        for header in ("Time to First Token", "Time per Output Token (excl. 1st token)", "Inter-token Latency",
                       "End-to-end Latency"):
            assert f'"{header}"' in source
        assert 'f"Mean {metric_name} (ms):"' in source and 'f"P{p_word} {metric_name} (ms):"' in source
    data = json.loads(out.read_text())
    (s,) = summaries(data)
    ttfts = [q["ttft_ms"] for r in data["runs"] for q in r["requests"]]
    assert s["completed"] == 16 and s["mean_ttft_ms"] == pytest.approx(statistics.fmean(ttfts))
    assert s["output_throughput"] == pytest.approx(16 * 6 / sum(r["duration_s"] for r in data["runs"]))
    assert f"{s['mean_ttft_ms']:.2f}" in format_results(data)


def test_datasets_draw_the_lengths_they_promise():
    fields = datasets.workload_fields("random", 100, None, 0.5)
    lengths = Workload(input_len=100, output_len=40, num_prompts=400, **fields).lengths()
    assert all(50 <= i <= 150 and 20 <= o <= 60 for i, o in lengths)
    assert max(i for i, _ in lengths) - min(i for i, _ in lengths) > 80  # spread over the range
    assert datasets.workload_fields("random", 100, None, None)["input_dist"] == "fixed"  # vLLM's default ratio 0
    share = Workload(input_len=200, output_len=100, num_prompts=2000, **datasets.workload_fields("sharegpt-synthetic", 200, None, None))
    ins = [i for i, _ in share.lengths()]
    assert statistics.median(ins) < statistics.fmean(ins) and max(ins) > 2 * 200  # long-tailed, like chat logs
    assert min(ins) > share.prefix_len  # room beside the system prefix
    assert datasets.workload_fields("prefix", 128, None, None)["prefix_len"] == 64
    assert Workload(input_len=64, output_len=8, num_prompts=2).to_json().get("dataset") is None  # old fingerprints hold


def test_a_prefix_is_shared_across_every_drawn_length(tmp_path):
    workload = Workload(input_len=120, output_len=4, num_prompts=12, seed=3,
                        **datasets.workload_fields("sharegpt-synthetic", 120, 40, 0.5))

    async def build():
        session = make_session()
        try:
            target = Target(server.base_url, "standin")
            cal = await prompts.calibrate(session, target, None, "auto")
            return await prompts.build_specs(session, target, workload, cal)
        finally:
            await session.close()

    with run_standin(tokenize=True, log_dir=tmp_path) as server:
        specs = asyncio.run(build())
    assert len({s.requested_input_tokens for s in specs}) > 3  # several lengths
    assert all(s.input_tokens == s.requested_input_tokens for s in specs)
    heads = {" ".join(s.prompt.split()[:20]) for s in specs}
    assert len(heads) == 1, heads  # one system prefix for all


@pytest.mark.parametrize("args, words", [
    (["--dataset", "bogus"], "--dataset"),
    (["--dataset", "random", "--random-range-ratio", "1.5"], "--random-range-ratio"),
    (["--random-range-ratio", "0.3"], "--random-range-ratio goes with"),
    (["--dataset", "random", "--input-dist", "normal"], "leave out --input-dist"),
])
def test_bad_dataset_options_are_one_line_exit_2(tmp_path, args, words):
    proc = _bench("--endpoint", "http://127.0.0.1:9", "--model", "x", "--num-prompts", "4", "--input-len", "32",
                  "--output-len", "4", "--out", str(tmp_path / "x.json"), *args)
    assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
