"""The regression gate on real vLLM, in the words and exit codes of `compare` and `gate` (OK 0,
REGRESSED 1, UNDECIDED 3): the interleaved gate passes the server against itself, and compare catches a real
slowdown (the same server restarted with --max-num-seqs 1). A seeded burst crashes the engine of
the CPU build (before the restart, so that the crashed server is the one restarted anyway); last,
the slow server is killed in the middle of a bench: failed requests and a written report, not a
hang. Crashing, killing and restarting are `destructive`: never against --endpoint."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.serving import results

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.alone, pytest.mark.server_kinds("new")]  # measures time or contention: scripts/test runs it after the rest, alone

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def baseline_path(server_pool, gate_results, gate_bench, serving_dir) -> Path:
    """The new server's gate results (made by the behaviour suite, or here when run alone)."""
    if "new" not in gate_results:
        out = serving_dir / "gate-new.json"
        gate_bench(server_pool.use("new"), out)
        gate_results["new"] = out
    return gate_results["new"]


def _verdict(proc: subprocess.CompletedProcess) -> str:
    """The last line a gate command printed: its verdict (OK / REGRESSED / UNDECIDED ...)."""
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if lines else proc.stderr.strip()


def test_gate_passes_vllm_against_itself(baseline_path, server_pool, serving_dir, gate_workload, record):
    """The interleaved gate (`harness gate`) with the same server on both sides: A/A blocks until
    every metric is decided; green only on OK (exit 0). UNDECIDED (exit 3) fails: the suite could
    not establish it, and says what more it needed. Up to 60 blocks, within the 420 s budget: on the
    2-core box two A/A gates in a row stopped UNDECIDED at 30 blocks (96 s), ttft_p50 "about 35 more
    blocks" from deciding; against a fresh server six decided in 8-22."""
    served = server_pool.use("new")
    w, concurrency = gate_workload
    proc = _cli("gate", "--baseline-endpoint", served.base_url, "--candidate-endpoint", served.base_url,
                "--model", served.model, *(["--tokenizer", str(served.tokenizer_dir)] if served.tokenizer_dir else []),
                "--concurrency", str(concurrency), "--num-prompts", str(w.num_prompts),
                "--input-len", str(w.input_len), "--output-len", str(w.output_len), "--max-blocks", "60",
                "--budget-s", "420", "--noise-model", str(serving_dir / "gate-noise.json"),
                "--out", str(serving_dir / "gate-self.json"), "-q", timeout=600)
    record(table=proc.stdout, verdict=_verdict(proc))
    assert proc.returncode != 1, _verdict(proc)
    assert proc.returncode == 0 and _verdict(proc).startswith("OK"), proc.stdout + proc.stderr


def test_against_the_given_baseline(settings, baseline_path, serving_dir, record):
    """--baseline FILE: this run's gate results against a stored bench results file."""
    if settings.baseline is None:
        pytest.skip("no --baseline given")
    proc = _cli("compare", str(settings.baseline), str(baseline_path), "--json", str(serving_dir / "baseline.compare.json"))
    record(table=proc.stdout, verdict=_verdict(proc))
    assert proc.returncode != 2, f"not comparable: {proc.stderr.strip()}"
    assert proc.returncode == 0, _verdict(proc)


@pytest.mark.destructive
def test_engine_crash_mid_stream_is_never_counted_as_success(server_pool, record):
    """Seeded sampling in a burst whose prefills get chunked kills the CPU build's engine (0.31.0
    and 0.32.0: "CPU Generator does not use offset"). The streams are HTTP 200 and end in an
    in-band error frame: each must count as a failure, and /health must agree with a real request.
    Should a version survive it, every request must then be a full success."""
    import asyncio
    import urllib.error
    import urllib.request
    from collections import Counter

    from harness.serving.client import RequestSpec, run_load
    from harness.serving.workload import Workload

    served = server_pool.use("new")
    specs = served.specs(Workload(input_len=256, output_len=32, num_prompts=48, seed=11))
    for i, spec in enumerate(specs):
        spec.seed = i
    load = asyncio.run(run_load(served.target(60), specs, concurrency=48))
    errors = Counter(r.error for r in load.records)
    for r in load.records:
        if r.ok:
            assert r.completion_tokens == 32 and r.chunk_s, r
        else:
            assert r.error in ("error_frame", "http_500", "connection", "no_done"), (r.error, r.error_detail)
    try:
        with urllib.request.urlopen(served.base_url + "/health", timeout=10) as resp:
            health = resp.status
    except urllib.error.HTTPError as exc:
        health = exc.code
    except OSError:  # the crash took the whole server down (docs/architecture.md): nothing listens any more
        health = None
    (probe,) = asyncio.run(run_load(served.target(30), [RequestSpec(specs[0].prompt, 256, 1)], concurrency=1)).records
    cause = sorted(set(re.findall(r"RuntimeError: [^\n]{0,80}", served.process.log_text()))) if served.process else []
    record(errors=dict(errors), health=health, probe=probe.error or "ok", cause=cause[:2])
    record.row("Engine faults", {"server": served.kind, "seeded burst": dict(errors), "/health after": health,
                                 "real request after": probe.error or "ok", "log": "; ".join(cause[:1])})
    assert (health == 200) == probe.answered, f"/health says {health} but a real request got {probe.error}"
    server_pool.stop("new")  # a dead engine is no use to anyone after this


@pytest.mark.server_kinds("new-max-num-seqs-1")
@pytest.mark.destructive  # restarts the server with other flags
def test_gate_catches_max_num_seqs_1(baseline_path, server_pool, gate_bench, serving_dir, record):
    served = server_pool.use("new-max-num-seqs-1")
    slow = serving_dir / "gate-new-max-num-seqs-1.json"
    gate_bench(served, slow)
    # Without leave to differ in flags, the gate refuses: the configs are not the same.
    refused = _cli("compare", str(baseline_path), str(slow))
    assert refused.returncode == 2 and "flags" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    proc = _cli("compare", str(baseline_path), str(slow), "--allow-diff", "flags",
                "--json", str(serving_dir / "gate-slow.compare.json"))
    record(table=proc.stdout)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert _verdict(proc).startswith("REGRESSED: ")
    changes = json.loads((serving_dir / "gate-slow.compare.json").read_text())["changes"]
    regressed = {c["metric"] for c in changes if c["decision"] == "REGRESSED"}
    assert "output_throughput" in regressed or "ttft_p50" in regressed, regressed
    report = serving_dir / "gate.html"
    assert _cli("report", str(baseline_path), str(slow), "--compare", "--out", str(report)).returncode == 0


@pytest.mark.server_kinds("new-max-num-seqs-1")
@pytest.mark.destructive
def test_server_killed_mid_run_gives_failed_requests_and_a_report(server_pool, serving_dir, record):
    served = server_pool.use("new-max-num-seqs-1")  # one request at a time: a long, killable run
    out = serving_dir / "killed-mid-run.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bench = subprocess.Popen(
        [sys.executable, "-m", "harness", "bench", "--endpoint", served.base_url, "--model", served.model,
         "--tokenizer", str(served.tokenizer_dir), "--concurrency", "4", "--num-prompts", "200",
         "--input-len", "32", "--output-len", "64", "--timeout", "20", "--warmup", "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        time.sleep(4.0)
        assert bench.poll() is None, "the bench ended before the kill: make the workload longer"
        killed_at = time.monotonic()
        served.process.kill(grace_s=0)  # SIGKILL of the whole process group: a crash
        _, stderr = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
    ended_after = time.monotonic() - killed_at
    record(bench_ended_s_after_kill=round(ended_after, 2), stderr_tail=stderr[-300:])
    assert bench.returncode == 1, stderr
    assert ended_after < 25
    data = results.load(out)
    (run,) = data["runs"]
    assert run["requests_failed"] > 0 and set(run["errors"]) <= {"connection", "no_done", "timeout"}, run["errors"]
    assert run["requests_ok"] + run["requests_failed"] == 200
    assert "requests failed" in stderr.strip().splitlines()[-1]
