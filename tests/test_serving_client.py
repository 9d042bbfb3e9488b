"""The load client against the calibration stand-in: figures match known timing, faults end in a
clear verdict within the timeout, never a hang."""

from __future__ import annotations

import asyncio
import time

import pytest

from harness.env import usable_cores
from harness.errors import CheckFailed, UsageError
from harness.serving.client import RequestSpec, Target, run_load
from harness.serving.runner import preflight
from harness.serving.client import make_session
from harness.serving.launcher import free_port
from harness.serving.standin import run_standin
from harness.serving.stats import SLO, summarize_run

pytestmark = pytest.mark.alone  # measures time or contention: scripts/test runs it after the rest, alone

TTFT_MS = 60.0
INTERVAL_MS = 15.0


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    with run_standin(ttft_ms=TTFT_MS, token_interval_ms=INTERVAL_MS, log_dir=tmp_path_factory.mktemp("standin")) as server:
        yield server


def _specs(n: int, out: int = 8) -> list[RequestSpec]:
    return [RequestSpec(prompt=f"w{i} alpha bravo", input_tokens=0, output_tokens=out) for i in range(n)]


def _load(server, model: str, n: int = 4, concurrency: int = 4, api: str = "completions", timeout: float = 10.0, out: int = 8):
    target = Target(server.base_url, model, api=api, timeout_s=timeout)
    return asyncio.run(run_load(target, _specs(n, out), concurrency=concurrency))


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_known_timing_is_measured(standin, api):
    load = _load(standin, "standin", n=8, concurrency=4, api=api, out=8)
    run = summarize_run(load, concurrency=4, request_rate=None)
    assert run["requests_ok"] == 8 and run["requests_failed"] == 0
    assert run["output_tokens"] == 64
    # TTFT = ttft + a random phase below one interval; the chat role-only delta is sent at once
    # and must not count as the first token.
    for r in load.records:
        assert len(r.chunk_s) == 8
        assert TTFT_MS * 0.95 <= 1000 * r.ttft_s <= TTFT_MS + INTERVAL_MS + 150
    assert run["itl_ms"]["p50"] == pytest.approx(INTERVAL_MS, abs=8)
    assert run["tpot_ms"]["p50"] == pytest.approx(INTERVAL_MS, abs=8)
    assert run["ttft_ms"]["count"] == 8 and run["ttft_ms"]["p50"] <= run["ttft_ms"]["max"]


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_ttft_is_the_first_token_even_when_it_decodes_to_nothing(standin, api):
    """vLLM's bench and the server's TTFT histogram count the first token, visible or not; the
    first visible text comes FAULT_AFTER_TOKENS intervals later here."""
    from harness.serving.standin import FAULT_AFTER_TOKENS

    load = _load(standin, "standin-invisible", n=4, concurrency=4, api=api, out=8)
    for r in load.records:
        assert r.ok and len(r.chunk_s) == 8 - FAULT_AFTER_TOKENS
        assert TTFT_MS * 0.95 <= 1000 * r.ttft_s <= TTFT_MS + INTERVAL_MS + 150
        assert r.chunk_s[0] - r.first_token_s >= (FAULT_AFTER_TOKENS - 0.5) * INTERVAL_MS / 1000


@pytest.mark.parametrize("model, label", [
    ("standin-http500", "http_500"),
    ("standin-error-frame", "error_frame"),
    ("standin-no-done", "no_done"),
    ("does-not-exist", "http_404"),
])
def test_faults_are_classified(standin, model, label):
    load = _load(standin, model, n=3, concurrency=3)
    assert [r.error for r in load.records] == [label] * 3
    run = summarize_run(load, concurrency=3, request_rate=None, slo=SLO(ttft_ms=10_000))
    assert run["requests_ok"] == 0 and run["errors"] == {label: 3}
    assert run["goodput"]["requests_good"] == 0 and run["goodput"]["fraction"] == 0.0


def test_error_frame_after_tokens_is_a_failure_not_a_success(standin):
    (record,) = _load(standin, "standin-error-frame", n=1, concurrency=1).records
    assert record.status == 200 and len(record.chunk_s) == 3
    assert record.error == "error_frame" and "mid-stream" in record.error_detail


def test_cut_connection_mid_stream(standin):
    (record,) = _load(standin, "standin-drop", n=1, concurrency=1).records
    assert record.error in ("connection", "no_done")
    assert len(record.chunk_s) == 3


def test_stalled_stream_times_out_on_time(standin):
    started = time.monotonic()
    load = _load(standin, "standin-stall", n=2, concurrency=2, timeout=1.5)
    elapsed = time.monotonic() - started
    assert [r.error for r in load.records] == ["timeout", "timeout"]
    assert all(1.4 <= r.e2e_s <= 3.0 for r in load.records)
    assert elapsed < 5


def test_unreachable_endpoint_fails_fast():
    from harness.serving.launcher import free_port

    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    load = asyncio.run(run_load(Target(url, "m", timeout_s=30), _specs(3), concurrency=3))
    assert [r.error for r in load.records] == ["connection"] * 3
    assert time.monotonic() - started < 5

    async def check():
        session = make_session()
        try:
            await preflight(session, Target(url, "m"))
        finally:
            await session.close()

    with pytest.raises(CheckFailed, match="cannot reach"):
        asyncio.run(check())


def test_preflight_names_the_served_models(standin):
    async def check():
        session = make_session()
        try:
            await preflight(session, Target(standin.base_url, "nope"))
        finally:
            await session.close()

    with pytest.raises(UsageError, match=r"'nope' is not served .* standin"):
        asyncio.run(check())


def test_poisson_rate_mode_keeps_its_schedule(standin):
    target = Target(standin.base_url, "standin", timeout_s=10)
    load = asyncio.run(run_load(target, _specs(20, out=2), request_rate=40.0, seed=3))
    run = summarize_run(load, concurrency=None, request_rate=40.0)
    assert run["requests_ok"] == 20
    arrivals = sorted(r.scheduled_s for r in load.records)
    assert arrivals[0] == 0.0 and 0.1 < arrivals[-1] < 2.0  # 19 exponential gaps of mean 25 ms
    assert run["schedule_lag_ms"]["p50"] < 20


def test_metrics_and_usage_agree_on_the_standin(standin):
    from harness.serving import metrics
    from harness.serving.workload import Workload
    from harness.serving.runner import BenchConfig, run_bench

    cfg = BenchConfig(target=Target(standin.base_url, "standin", timeout_s=10),
                      workload=Workload(input_len=5, output_len=4, num_prompts=6), concurrencies=[2],
                      warmup=1, quiet=True)
    data = run_bench(cfg)
    (run,) = data["runs"]
    acct = run["token_accounting"]
    assert acct["agree"], acct["findings"]
    assert acct["metrics_generation_tokens"] == acct["usage_output_tokens"] == 24
    assert acct["metrics_prompt_tokens"] == acct["usage_input_tokens"] == 30
    assert run["server_metrics"]["ttft_count"] == 6
    assert metrics.PROMPT_TOKENS in data["environment"]["metric_names"]


def test_a_blocked_event_loop_is_reported_as_client_bound(standin):
    async def main():
        async def hog():  # an overloaded client: the loop is blocked 30 ms out of every 50
            while True:
                await asyncio.sleep(0.02)
                time.sleep(0.03)

        hogging = asyncio.create_task(hog())
        try:
            return await run_load(Target(standin.base_url, "standin", timeout_s=10), _specs(30, out=4),
                                  request_rate=100.0, seed=1)
        finally:
            hogging.cancel()

    run = summarize_run(asyncio.run(main()), concurrency=None, request_rate=100.0)
    assert run["requests_ok"] == 30
    assert run["client_bound"] and run["schedule_lag_ms"]["p99"] > 10
    assert run["loop_lag_ms"]["p99"] > 10 and run["timing_warnings"]


def test_the_client_measures_its_own_cpu_starvation_and_the_machines_contention(standin):
    import subprocess
    import sys

    from harness.serving.runner import BenchConfig, run_bench
    from harness.serving.workload import Workload

    if not sys.platform.startswith("linux"):
        pytest.skip("schedstat, PSI and /proc/loadavg are Linux's")
    load = _load(standin, "standin", n=12, concurrency=4, out=20)
    host = load.host
    assert host["runnable_mean"] >= 1  # the reader itself runs
    assert 0 <= host["client_runqueue_share"] <= 1.5 and 0 < host["client_cpu_share"] <= 1.5
    run = summarize_run(load, concurrency=4, request_rate=None)
    noise = run["client_noise"]
    assert 0 <= noise["client_time_share"] < 1 and noise["schedule_lag_share"] <= noise["client_time_share"]

    def contention(hogs: int) -> float:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
        try:
            cfg = BenchConfig(target=Target(standin.base_url, "standin", timeout_s=10), quiet=True, warmup=0,
                              workload=Workload(input_len=5, output_len=2, num_prompts=2), concurrencies=[2])
            noise = run_bench(cfg)["runs"][0]["client_noise"]
            assert noise["cpu_contention_run"] >= 1.0  # the stand-in's process was found and watched
            return noise["cpu_contention"]
        finally:
            for hog in busy:
                hog.kill()
                hog.wait()

    # Measured with the server idle: others' busy loops raise it, by about one per core each.
    quiet, hogged = contention(0), contention(3)
    assert quiet >= 1.0 and hogged > quiet + 0.5, (quiet, hogged)


def test_busy_time_counts_only_the_cpus_this_process_may_run_on():
    """A container pinned to 2 of a host's CPUs still reads every CPU in /proc/stat: the host's
    other jobs on the other CPUs must not pass for contention."""
    from harness.serving.hostload import _ticks_per_s, busy_seconds

    #       user nice system idle iowait irq softirq steal guest guest_nice
    stat = ("cpu  700 0 300 900 100 0 0 0 50 0\n"
            "cpu0 100 0 50 300 50 0 0 0 0 0\n"
            "cpu1 100 0 50 300 50 0 0 0 0 0\n"
            "cpu2 500 0 200 300 0 0 0 0 50 0\n"
            "intr 12345\nctxt 999\n")
    tick = _ticks_per_s()
    assert busy_seconds(stat, {0, 1}) == pytest.approx(300 / tick)  # cpu2's 700 busy ticks left out
    assert busy_seconds(stat, None) == pytest.approx(1000 / tick)  # guest time is in user already
    assert busy_seconds(stat, {7}) is None  # none of ours listed: unknown, not zero


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_the_cpu_others_use_during_a_run_counts_and_the_watched_processes_do_not(standin):
    """hostload.cpu_times/others_during: the server's tree (a busy child, as vLLM's engine core is
    the API server's) never excuses the server; a busy loop outside it counts as others' CPU,
    whether it is a neighbour nobody here started (the other xdist worker) or one the client's own
    process started beside the bench (a CPU hog)."""
    import os
    import signal
    import subprocess
    import sys

    from harness.serving import hostload

    if not sys.platform.startswith("linux"):
        pytest.skip("/proc/stat and /proc/PID/stat are Linux's")
    server = hostload.server_pids(standin.base_url)
    assert server and standin.pid in server  # the owner of the listening port is found
    assert hostload.server_pids("http://192.0.2.1:8000") is None  # a server elsewhere: not watched
    port = free_port()  # a proxy in front of a server (docker-proxy, nginx, ssh -L) is not the server
    proxy = subprocess.Popen(["bash", "-c", f'exec -a docker-proxy "{sys.executable}" -m http.server --bind 127.0.0.1 {port}'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not _listening(port):
            time.sleep(0.1)
        assert _listening(port) and hostload.server_pids(f"http://127.0.0.1:{port}") is None
    finally:
        proxy.kill()
        proxy.wait()

    spin = "while True: pass"
    engine_parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                                      f"subprocess.Popen([sys.executable, '-c', {spin!r}]); time.sleep(60)"])
    hog = subprocess.Popen([sys.executable, "-c", spin])  # the client's child, not the server's
    shell = subprocess.run(["sh", "-c", f"{sys.executable} -c '{spin}' >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    neighbour = int(shell.stdout)  # reparented away from us: nobody's descendant here

    def cpu_s(pid: int) -> float:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(engine := hostload._descendants({engine_parent.pid})) < 2:
            time.sleep(0.05)
        engine_pid = max(engine - {engine_parent.pid})
        watched_server = {engine_parent.pid}
        pids = (engine_pid, hog.pid, neighbour)
        before, cpu_0 = hostload.cpu_times(watched_server, {os.getpid()}), [cpu_s(p) for p in pids]
        time.sleep(1.5)
        after, cpu_1 = hostload.cpu_times(watched_server, {os.getpid()}), [cpu_s(p) for p in pids]
    finally:
        for pid in [neighbour, *(hostload._descendants({engine_parent.pid}) - {engine_parent.pid})]:
            os.kill(pid, signal.SIGKILL)  # the engine before its parent: orphaned, it is nobody's to find
        for proc in (hog, engine_parent):
            proc.kill()
            proc.wait()
    wall = after.wall - before.wall
    used = [(b - a) / wall for a, b in zip(cpu_0, cpu_1)]
    others = hostload.others_during(before, after)
    assert all(u > 0.2 for u in used), used  # each of the three really ran
    assert (after.watched_s - before.watched_s) / wall >= 0.9 * used[0]  # the engine is the server's
    assert others["others_cpu_cores"] >= 0.9 * (used[1] + used[2]) - 0.05, (others, used)  # hog and neighbour are not
    assert others["cpu_contention_run"] == pytest.approx(1 + others["others_cpu_cores"] / usable_cores())
    assert hostload.cpu_times(None, {os.getpid()}).watched_s is None  # no server found: nothing to tell apart


def test_preconnect_opens_every_slots_connection_before_the_clock():
    """A closed loop's first burst must not pay a TCP connect per slot inside the measured schedule:
    after preconnect(n) the server has accepted n connections, and n concurrent requests on the
    same session accept no more (a real keep-alive HTTP/1.1 server counting its accepts)."""
    from harness.serving.client import preconnect

    accepted = []

    async def handle(reader, writer):
        accepted.append(writer.get_extra_info("peername"))
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head:
                break
            await asyncio.sleep(0.05)  # held open long enough that concurrent requests need their own
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n"
                         b"Connection: keep-alive\r\n\r\n{\"data\":[]}")
            await writer.drain()

    async def scenario():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        target = Target(f"http://127.0.0.1:{port}", "m")
        async with make_session() as session:
            answered = await preconnect(session, target, 8)
            after_preconnect = len(accepted)
            async def get():
                async with session.get(target.base_url + "/v1/models") as resp:
                    return await resp.read()

            for _ in range(2):  # the pool serves a burst as wide as itself, again and again
                await asyncio.gather(*(get() for _ in range(8)))
        server.close()
        return answered, after_preconnect, len(accepted)

    answered, after_preconnect, total = asyncio.run(scenario())
    assert (answered, after_preconnect) == (8, 8)
    assert total == 8, f"the burst opened {total - 8} connection(s) of its own"
