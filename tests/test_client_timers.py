"""The load client's timers: a scheduled send wakes up on time, not up to a selector tick late;
the loop-lag probe shows stalls without spinning; the client stamps when it wrote each request."""

from __future__ import annotations

import asyncio
import random
import selectors
import time
from pathlib import Path

import pytest

from harness.serving import client, server_stamps
from harness.serving.client import RequestRecord, RequestSpec, Target, run_load
from harness.serving.standin import run_standin

# the old call_later wake-up: p50 ~0.6-0.7, p99 ~1.05 ms on an idle loop (whole-ms rounding makes it
# late at every percentile). The median, not p99 or p90: this VM now and then wakes a thread late
# whatever asked (on the idle box, over 120 punctual wake-ups 8-20 ms ahead: p50 0.002 ms, p90
# 0.11-0.38 ms, p99 0.4-2.7 ms), which is the machine, not the client's timer
PUNCTUAL_P50_MS = 0.3


def _run_delay_s() -> float | None:
    """This thread's time waiting for a CPU so far (schedstat), None where the kernel has none."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return None


def test_the_epoll_selector_waits_whole_milliseconds():
    """The fact _wake_at works around: selectors rounds a 0.1 ms wait up to epoll_wait's 1 ms."""
    if not hasattr(selectors, "EpollSelector"):
        pytest.skip("no epoll here")
    with selectors.EpollSelector() as sel:
        waits = []
        for _ in range(5):
            start = time.monotonic()
            sel.select(0.0001)
            waits.append(time.monotonic() - start)
    assert min(waits) >= 0.00099, waits
    with selectors.EpollSelector() as sel:  # the first wait past _EXACT_S gets one ms more
        over = client._EXACT_S + 1e-3
        start = time.monotonic()
        sel.select(over)
        assert time.monotonic() - start >= over + 0.00099
    loop = asyncio.new_event_loop()
    try:
        if type(loop._selector).__name__ == "EpollSelector":
            assert client.wake_margin_s(loop) == pytest.approx(1e-3 + client._SLACK_S)
    finally:
        loop.close()


async def _lateness(samples: int, ahead_s: tuple[float, float] = (0.001, 0.003)) -> list[tuple[float, float | None]]:
    """(wake-up - due, the CPU wait during it) for `samples` wake-ups `ahead_s` ahead, random phase."""
    loop = asyncio.get_running_loop()
    rng = random.Random(5)
    out = []
    for _ in range(samples):
        due = time.monotonic() + rng.uniform(*ahead_s)
        before = _run_delay_s()
        fut = loop.create_future()
        client._wake_at(loop, due, fut)
        woke = await fut
        after = _run_delay_s()
        out.append((woke - due, None if before is None else after - before))
    return out


@pytest.mark.parametrize("ahead_s", [(0.001, 0.003), (0.008, 0.02)])
def test_a_timer_scheduled_wake_up_is_punctual(ahead_s):
    """Median lateness <= 0.3 ms on an idle loop, never early. A sample during which this thread
    waited for a CPU (another process's turn: the box's load, not the timer) is set aside."""
    got = asyncio.run(_lateness(120, ahead_s))
    assert min(late for late, _ in got) >= 0, "a wake-up came before its due time"
    clean = sorted(late for late, waited in got if waited is None or waited < 50e-6)
    if len(clean) < len(got) // 3:
        pytest.skip(f"only {len(clean)} of {len(got)} wake-ups ran without waiting for a CPU (box too busy)")
    p50 = clean[len(clean) // 2]
    assert p50 * 1000 <= PUNCTUAL_P50_MS, f"lateness p50 {p50 * 1000:.3f} ms over {len(clean)} clean wake-ups"


def test_punctual_wake_ups_cost_at_most_a_margin_of_cpu_each():
    """Each wake-up yields at most the wake margin (~1.05 ms); between wake-ups the loop sleeps."""
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        start = time.thread_time()
        for _ in range(40):
            fut = loop.create_future()
            client._wake_at(loop, time.monotonic() + 0.005, fut)
            await fut
        return (time.thread_time() - start) / 40, client.wake_margin_s(loop)

    cpu, margin = asyncio.run(main())
    assert cpu <= margin + 0.0003, f"{cpu * 1000:.2f} ms of CPU per wake-up, margin {margin * 1000:.2f} ms"


def test_a_cancelled_wake_up_stops_yielding():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        client._wake_at(loop, time.monotonic() + 0.0005, fut)
        fut.cancel()
        await asyncio.sleep(0.002)  # check() runs once more, sees the cancel, does not raise

    asyncio.run(main())


QUIET_S = 1.0  # long enough that the probe's first arming and the loop's start-up do not weigh in
# the probe costs 2.7-3.5% of a core on the idle 2-core VM (a bound at 3% failed 1 run in 8); a
# probe that yields until due, the design it must not fall back to, costs 8.4%
PROBE_CPU_SHARE = 0.05


def test_the_loop_lag_probe_shows_a_stall_and_costs_little():
    async def main() -> tuple[list[float], float]:
        samples: list[float] = []
        stop = asyncio.Event()
        start = time.thread_time()
        probe = asyncio.create_task(client._probe_loop_lag(samples, stop))
        await asyncio.sleep(QUIET_S)
        quiet_cpu = time.thread_time() - start
        time.sleep(0.05)  # the loop stalls 50 ms
        await asyncio.sleep(0.05)
        stop.set()
        await probe
        return samples, quiet_cpu

    samples, cpu = asyncio.run(main())
    assert max(samples) >= 0.035, f"a 50 ms stall was not seen: max lag {max(samples) * 1000:.1f} ms"
    assert min(samples) >= 0
    assert cpu <= QUIET_S * PROBE_CPU_SHARE, f"the probe used {cpu / QUIET_S:.1%} of a core"


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_the_client_stamps_when_it_wrote_each_request(tmp_path, api):
    with run_standin(ttft_ms=20, token_interval_ms=5, log_dir=tmp_path) as server:
        specs = [RequestSpec(prompt=f"w{i} alpha", input_tokens=0, output_tokens=2) for i in range(6)]
        load = asyncio.run(run_load(Target(server.base_url, "standin", api=api), specs, concurrency=3))
    for r in load.records:
        assert r.ok and r.written_s is not None, r
        assert r.sent_s <= r.written_s < r.first_token_s, r


def test_the_send_delay_splits_into_the_clients_write_and_the_servers_read():
    t0 = 100.0
    recs = [RequestRecord(index=i, scheduled_s=0, sent_s=0.001 * i, written_s=0.001 * i + 0.0005 * i,
                          first_token_s=0.050, end_s=0.1, chunk_s=[0.05], request_id=f"r{i}") for i in range(3)]
    recs[2].written_s = None  # not traced: in the send delay, not in its split
    stamps = [{"request_id": f"r{i}", "arrival_s": t0 + 0.001 * i + 0.002, "first_token_s": t0 + 0.047,
               "ttft_s": 0.045} for i in range(3)]
    out = server_stamps.summarize(recs, t0, {"boot_id": server_stamps._boot_id(), "requests": stamps})
    assert out["send_delay_ms"]["count"] == 3 and out["client_write_ms"]["count"] == 2
    assert out["client_write_ms"]["min"] == pytest.approx(0.0) and out["client_write_ms"]["max"] == pytest.approx(0.5)
    assert out["server_read_ms"]["max"] == pytest.approx(2.0) and out["server_read_ms"]["min"] == pytest.approx(1.5)


def test_an_outside_clients_ttfts_are_matched_by_the_same_function():
    """vllm bench serve gives a TTFT per request id and no send stamps (gpu_serving.py): the same
    summarize matches it, with its excess and no send split."""
    stamps = [{"request_id": "vb-0", "arrival_s": 1.0, "first_token_s": 1.04, "ttft_s": 0.045},
              {"request_id": "vb-1", "arrival_s": 1.0, "first_token_s": 1.04, "ttft_s": 0.045},
              {"request_id": "vb-2", "arrival_s": 1.0, "first_token_s": None, "ttft_s": None}]
    out = server_stamps.summarize({"vb-0": 0.050, "vb-1": 0.060, "vb-2": 0.07, "vb-9": 0.08}, None,
                                  {"boot_id": server_stamps._boot_id(), "requests": stamps})
    assert out["requests_ok"] == 4 and out["matched"] == 2 and out["ttft_ms"]["p50"] == pytest.approx(45)
    assert out["client_excess_ms"]["min"] == pytest.approx(5) and out["client_excess_ms"]["max"] == pytest.approx(15)
    assert out["same_clock"] and out["send_delay_ms"] is None and out["client_write_ms"] is None
    assert server_stamps.summarize({"vb-0": 0.05}, None, None) is None


def test_the_gpu_benchs_level_line_shows_the_send_delay_split(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks" / "vllm_plan"))
    from gpu_serving import level_line

    t0 = 100.0
    recs = [RequestRecord(index=i, scheduled_s=0, sent_s=0.001 * i, written_s=0.0015 * i, first_token_s=0.050,
                          end_s=0.1, chunk_s=[0.05], request_id=f"r{i}") for i in range(2)]
    stamps = [{"request_id": f"r{i}", "arrival_s": t0 + 0.001 * i + 0.002, "first_token_s": t0 + 0.047,
               "ttft_s": 0.045} for i in range(2)]
    data = {"boot_id": server_stamps._boot_id(), "requests": stamps}
    hist = {"server_ttft_p50": {"ms": 40.0}, "server_ttft_mean_ms": 41.0}
    row = {"concurrency": 16, "harness_workers": 4,
           "harness": {"ttft_ms": {"p50": 50.0, "p99": 60.0}, "schedule_lag_ms": {"p50": 0.01, "p99": 0.1},
                       "output_throughput": 900.0, "client_bound": False,
                       "server_http_ttft": server_stamps.summarize(recs, t0, data)} | hist,
           "vllm": {"median_ttft_ms": 52.0, "p99_ttft_ms": 63.0, "output_throughput": 890.0,
                    "server_http_ttft": server_stamps.summarize({"r0": 0.052}, None, data)} | hist}
    line = level_line(row)
    # send delay 2.0 ms for both; client write 0 and 0.5 ms, server read 2.0 and 1.5 ms
    assert line.startswith("c=16: ") and "harness send delay p50 2.00 ms (client write 0.25, server read 1.75)" in line
    # the harness's TTFT 50 and 49 ms over the server's 45; vllm bench's 52
    assert "client excess p50 harness 4.50 vllm 7.00 ms" in line and line.endswith("not client-bound")
