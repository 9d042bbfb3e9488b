"""The multi-process load client against the calibration stand-in: one schedule split across
worker processes, one clock, one merged run; a worker that dies leaves its finished requests."""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from harness.serving.client import RequestSpec, Target, poisson_arrivals
from harness.serving.standin import run_standin
from harness.serving.stats import summarize_run
from harness.serving.workers import default_workers, run_load_workers, split_schedule

pytestmark = pytest.mark.alone  # measures time or contention: scripts/test runs it after the rest, alone

TTFT_MS = 40.0
INTERVAL_MS = 10.0


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    with run_standin(ttft_ms=TTFT_MS, token_interval_ms=INTERVAL_MS, log_dir=tmp_path_factory.mktemp("standin")) as server:
        yield server


def _specs(n: int, out: int = 8) -> list[RequestSpec]:
    return [RequestSpec(prompt=f"w{i} alpha bravo", input_tokens=0, output_tokens=out) for i in range(n)]


def _max_in_flight(records) -> int:
    events = sorted([(r.sent_s, 1) for r in records] + [(r.end_s, -1) for r in records])
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("n, workers, concurrency", [(10, 3, 4), (7, 8, 16), (100, 4, 10), (5, 2, 1)])
def test_closed_loop_split_gives_every_slot_its_share_and_no_worker_nothing(n, workers, concurrency):
    shares = split_schedule(n, workers, concurrency, None, seed=0)
    slots = min(n, concurrency)
    assert all(s.indices and s.slots >= 1 for s in shares)
    assert sum(s.slots for s in shares) == slots and len(shares) == min(workers, slots)
    assert sorted(i for s in shares for i in s.indices) == list(range(n))
    assert [s.first_slot for s in shares] == [sum(x.slots for x in shares[:k]) for k in range(len(shares))]
    # requests per slot differ by at most one, whichever worker holds the slot
    per_slot = [len(s.indices) / s.slots for s in shares]
    assert max(per_slot) - min(per_slot) <= 1


def test_rate_split_keeps_the_one_poisson_schedule_and_splits_the_cap():
    shares = split_schedule(50, 3, 7, 20.0, seed=5)
    want = poisson_arrivals(50, 20.0, 5)
    got = sorted((i, t) for s in shares for i, t in zip(s.indices, s.arrivals))
    assert [t for _, t in got] == want and [i for i, _ in got] == list(range(50))
    assert sorted(s.slots for s in shares) == [2, 2, 3]


def test_default_workers_leaves_cores_to_others():
    assert default_workers(16, 0.0) == 15
    assert default_workers(16, 3.0) == 12
    assert default_workers(2, 0.0) == 1 and default_workers(2, 5.0) == 1


def test_workers_share_one_clock_and_keep_the_concurrency(standin):
    target = Target(standin.base_url, "standin", timeout_s=20)
    load = asyncio.run(run_load_workers(target, _specs(24), workers=2, concurrency=6))
    run = summarize_run(load, concurrency=6, request_rate=None)
    assert run["requests_ok"] == 24 and run["workers"] == 2 and run["worker_failures"] == []
    assert [r.index for r in load.records] == list(range(24))
    assert _max_in_flight(load.records) <= 6
    # both workers' first sends were due at the one start instant and happened at it
    by_index = {r.index: r for r in load.records}
    for share in split_schedule(24, 2, 6, None, seed=0):
        assert 0 <= min(by_index[i].sent_s for i in share.indices) < 0.5
    for w in load.workers:
        assert w["requests"] == w["reported"] == 12 and w["lost"] == 0 and w["schedule_lag_ms"]["p50"] is not None
    for r in load.records:
        assert len(r.chunk_s) == 8 and TTFT_MS * 0.95 <= 1000 * r.ttft_s <= TTFT_MS + INTERVAL_MS + 250


def test_each_workers_first_request_starts_at_the_common_instant(standin):
    target = Target(standin.base_url, "standin", timeout_s=20)
    load = asyncio.run(run_load_workers(target, _specs(4), workers=4, concurrency=4))
    # one request per worker, four processes, all due at t0: sent within a short time of it
    assert len(load.workers) == 4
    assert all(0 <= r.sent_s < 0.25 for r in load.records), [r.sent_s for r in load.records]
    assert max(r.sent_s for r in load.records) - min(r.sent_s for r in load.records) < 0.25


def test_rate_mode_over_workers_sends_on_schedule(standin):
    target = Target(standin.base_url, "standin", timeout_s=20)
    load = asyncio.run(run_load_workers(target, _specs(30, out=4), workers=2, request_rate=25.0, seed=3))
    assert [r.scheduled_s for r in load.records] == poisson_arrivals(30, 25.0, 3)
    run = summarize_run(load, concurrency=None, request_rate=25.0)
    assert run["requests_ok"] == 30
    assert run["schedule_lag_ms"]["p50"] < 50


def test_a_worker_killed_mid_run_leaves_its_finished_requests_and_says_so(standin):
    target = Target(standin.base_url, "standin", timeout_s=20)
    killed = []

    def kill_one(done: int, total: int) -> None:
        if done >= 6 and not killed:
            children = [p for p in psutil.Process().children() if "child_main" in " ".join(p.cmdline())]
            victim = children[0]
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.pid)

    load = asyncio.run(run_load_workers(target, _specs(40, out=16), workers=2, concurrency=4, on_progress=kill_one))
    run = summarize_run(load, concurrency=4, request_rate=None)
    dead = [w for w in load.workers if w["died"]]
    assert killed and len(dead) == 1 and dead[0]["pid"] == killed[0]
    assert "signal 9" in dead[0]["died"]
    alive = [w for w in load.workers if not w["died"]][0]
    assert alive["reported"] == alive["requests"] == 20
    assert 0 < dead[0]["reported"] < 20 and run["requests_lost"] == 20 - dead[0]["reported"]
    assert run["requests_ok"] == 20 + dead[0]["reported"]
    assert len(run["worker_failures"]) == 1 and f"pid {killed[0]}" in run["worker_failures"][0]


def _bench_cli(standin, out, *extra, env=None):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-m", "harness", "bench", "--endpoint", standin.base_url, "--model",
                           "standin", "--num-prompts", "16", "--input-len", "8", "--output-len", "8",
                           "--out", str(out), *extra], capture_output=True, text=True, cwd=root, timeout=120,
                          env={**os.environ, **(env or {})})


def test_bench_with_workers_merges_one_results_file(standin, tmp_path):
    import json

    out = tmp_path / "r.json"
    proc = _bench_cli(standin, out, "--concurrency", "1,4", "--workers", "2", env={"HARNESS_REPORT_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    c1, c4 = data["runs"]
    assert c1["workers"] == 1 and c4["workers"] == 2  # never more workers than slots
    assert [w["requests"] for w in c4["client_workers"]] == [8, 8] and c4["requests_ok"] == 16
    assert sorted(r["index"] for r in c4["requests"]) == list(range(16))
    assert data["environment"]["client"]["workers"] == 2 and "2 client workers" in proc.stderr


def test_bench_warns_when_the_run_asks_more_than_the_saved_calibration(standin, tmp_path):
    import json

    from harness.serving import capacity
    from harness.serving.results import machine

    saved = {"machine": capacity.machine_key(machine()), "measured": "test", "tokens_per_s": {"1": 50.0, "2": 90.0}}
    (tmp_path / capacity.CAPACITY_FILE).write_text(json.dumps(saved))
    out = tmp_path / "r.json"
    proc = _bench_cli(standin, out, "--concurrency", "4", "--workers", "1", env={"HARNESS_REPORT_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    warning = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "~50 tokens/s" in warning[0] and "[calibration " in warning[0]
    check = json.loads(out.read_text())["runs"][0]["client_capacity"]
    # 4 streams at the warm-up's ~10 ms per token ask ~400 tokens/s of a client good for 50
    assert check["capacity_tokens_per_s"] == 50.0 and 200 < check["predicted_tokens_per_s"] < 800
    # another machine's calibration is not this one's: a quick estimate, said so, and no warning
    saved["machine"]["hostname"] = "elsewhere"
    (tmp_path / capacity.CAPACITY_FILE).write_text(json.dumps(saved))
    proc = _bench_cli(standin, out, "--concurrency", "4", "--workers", "1", env={"HARNESS_REPORT_DIR": str(tmp_path)})
    check = json.loads(out.read_text())["runs"][0]["client_capacity"]
    assert check["source"].startswith("quick estimate") and check["warning"] is None
    assert not [line for line in proc.stderr.splitlines() if line.startswith("warning:")]


def test_capacity_interpolates_and_scales_past_what_was_measured():
    from harness.serving.capacity import Capacity

    cap = Capacity("t", {1: 100.0, 2: 180.0, 4: 300.0})
    assert cap.at(2) == 180.0 and cap.at(3) == 240.0
    assert cap.at(8) == pytest.approx(300 * (1 + 0.8 * 4 / 4))
    assert Capacity("t", {}).at(4) is None
