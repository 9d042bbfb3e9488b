"""The load client over several worker processes, so that its capacity scales with cores.

One asyncio process saturates at a few dozen to hundreds of streams (issue 25: schedule lag p99
9 ms at concurrency 64 against a GPU vLLM). Here N processes each run their own event loop and
connections (client.run_load) on a share of ONE schedule, fixed before the clock starts:

- closed loop: the run's C slots are split into N contiguous ranges; request i belongs to slot
  i mod C, so every slot sends the same number of requests, and the ramp-up stays one ramp;
- open loop: the Poisson send times are drawn once here, and request i goes to worker i mod N
  (a concurrency cap is split like the slots).

How the peers do it (read before designing): vLLM's `bench serve` is one asyncio process; AIPerf
has a timing service that hands "credits" to worker processes over ZMQ, one per request.
Handing the whole schedule out up front costs no message per request (a credit's round trip is
itself schedule lag), and for fixed-length workloads a static split is as fair as a shared queue.

Every timestamp is time.monotonic() (system-wide on Linux): the parent picks a start instant a
little ahead, every worker waits for it, so all records share one t0 and merge into one run.
Workers stream finished records to the parent every 50 ms: a worker that dies mid-run loses only
its requests in flight, and the run says which worker died and how many requests it took along.
Each worker measures its own schedule lag, loop lag and CPU starvation; all are reported.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import os
import signal
import subprocess
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..errors import CheckFailed
from . import hostload
from .client import (LoadResult, RequestRecord, RequestSpec, Target, make_session, poisson_arrivals, preconnect,
                     run_load, span_s)

START_AHEAD_S = 0.25  # the common start lies this far after the last worker said ready
FLUSH_S = 0.05  # how often a worker sends its finished records
READY_TIMEOUT_S = 120.0


@dataclass
class WorkerShare:
    """One worker's part of the schedule."""

    worker: int
    indices: list[int]  # the requests' numbers in the whole run
    slots: int  # closed loop: its slots; rate mode: its share of the cap (0: uncapped)
    first_slot: int = 0
    all_slots: int = 1  # the run's slots over every worker (one ramp-up over all of them)
    arrivals: list[float] | None = None  # rate mode: the send times of `indices`


@dataclass
class WorkerReport:
    worker: int
    pid: int | None = None
    slots: int = 0
    indices: list[int] = field(default_factory=list)  # its share of the run's requests
    reported: int = 0  # finished requests it sent back
    loop_lag_s: list[float] = field(default_factory=list)
    host: dict = field(default_factory=dict)
    exitcode: int | None = None
    died: str | None = None  # why it stopped before reporting its whole share


def default_workers(cores: int, background_runnable: float | None) -> int:
    """Cores nobody else is using, less one for the parent (the bench itself), at least 1."""
    others = max(0.0, background_runnable or 0.0)
    return max(1, int(cores - math.ceil(others - 0.25) - 1))


def split_schedule(n: int, workers: int, concurrency: int | None, request_rate: float | None,
                   seed: int, arrivals: Sequence[float] | None = None) -> list[WorkerShare]:
    """Each worker's share of `n` requests (see the module doc); never a worker with nothing."""
    if request_rate or arrivals is not None:
        times = list(arrivals) if arrivals is not None else poisson_arrivals(n, request_rate, seed)
        w = max(1, min(workers, n, concurrency or n))
        caps = _split(concurrency, w) if concurrency else [0] * w
        return [WorkerShare(k, list(range(k, n, w)), caps[k], arrivals=[times[i] for i in range(k, n, w)])
                for k in range(w)]
    slots = min(concurrency, n)
    w = max(1, min(workers, slots))
    counts = _split(slots, w)
    firsts = [sum(counts[:k]) for k in range(w)]
    owner = [k for k in range(w) for _ in range(counts[k])]  # slot -> worker
    shares = [WorkerShare(k, [], counts[k], firsts[k], slots) for k in range(w)]
    for i in range(n):
        shares[owner[i % slots]].indices.append(i)
    return shares


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def child_main(read_fd: int, write_fd: int) -> None:
    """A worker process: take its job, say ready, wait for the start instant, run, stream back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    _, target, specs, share, ramp_up_s = inbox.recv()
    asyncio.run(_worker_main(inbox, outbox, target, specs, share, ramp_up_s))


async def _worker_main(inbox, outbox, target, specs, share: WorkerShare, ramp_up_s: float) -> None:
    """Open the share's connections, say ready, wait for the start instant, run."""
    session = make_session()
    try:
        if share.slots:  # closed loop: one connection per slot, open before the clock (client.preconnect)
            await preconnect(session, target, min(share.slots, len(specs)))
        outbox.send(("ready", os.getpid()))
        message = await asyncio.get_running_loop().run_in_executor(None, inbox.recv)
        if message[0] == "go":
            await _worker_run(outbox, target, specs, share, ramp_up_s, message[1], session)
    finally:
        await session.close()


_CHILD = "import sys; from harness.serving.workers import child_main; child_main(int(sys.argv[1]), int(sys.argv[2]))"


class _Worker:
    """A worker as a plain subprocess (not multiprocessing's spawn, which re-imports the caller's
    __main__ and so breaks scripts without a main guard), with two pickling pipes."""

    def __init__(self, job: tuple):
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(to_child), str(from_child)],
                                     pass_fds=(to_child, from_child), env=env, stdin=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self.send = Connection(from_parent, readable=False)
        self.recv = Connection(to_parent, writable=False)
        self.send.send(job)

    def stop(self) -> int | None:
        try:
            return self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()
        finally:
            self.send.close()
            self.recv.close()


async def _worker_run(conn, target, specs, share: WorkerShare, ramp_up_s: float, start_at: float,
                      session) -> None:
    pending: list[RequestRecord] = []
    done = asyncio.Event()

    async def flusher() -> None:
        while not done.is_set():
            await asyncio.sleep(FLUSH_S)
            if pending:
                conn.send(("records", pending[:]))
                pending.clear()

    flush = asyncio.create_task(flusher())
    load = await run_load(target, specs, concurrency=share.slots or None, indices=share.indices,
                          arrivals=share.arrivals, ramp_up_s=ramp_up_s, start_at=start_at,
                          ramp_slots=(share.first_slot, share.all_slots), on_record=pending.append,
                          session=session)
    done.set()
    await flush
    if pending:
        conn.send(("records", pending[:]))
    conn.send(("done", {"loop_lag_s": load.loop_lag_s, "host": load.host}))
    conn.close()


async def run_load_workers(
    target: Target,
    specs: Sequence[RequestSpec],
    *,
    workers: int,
    concurrency: int | None = None,
    request_rate: float | None = None,
    ramp_up_s: float = 0.0,
    seed: int = 0,
    arrivals: Sequence[float] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    records: list[RequestRecord] | None = None,
) -> LoadResult:
    """run_load's schedule over `workers` processes; the same LoadResult, merged, plus `workers`."""
    shares = split_schedule(len(specs), workers, concurrency, request_rate, seed, arrivals)
    records = records if records is not None else []
    procs = [_Worker(("job", target, [specs[i] for i in share.indices], share, ramp_up_s)) for share in shares]
    reports = [WorkerReport(s.worker, slots=s.slots, indices=s.indices) for s in shares]
    loop = asyncio.get_running_loop()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(shares), thread_name_prefix="client-collector")
    total, finished = len(specs), [0]

    def tick(count: int) -> None:
        finished[0] += count
        if on_progress:
            on_progress(finished[0], total)

    try:
        await asyncio.gather(*(loop.run_in_executor(pool, _await_ready, p.recv, r) for p, r in zip(procs, reports)))
        start_at = time.monotonic() + START_AHEAD_S
        started_wall = time.time() + START_AHEAD_S
        for proc in procs:
            proc.send.send(("go", start_at))
        await asyncio.gather(*(loop.run_in_executor(pool, _collect, p.recv, r, records, loop, tick)
                               for p, r in zip(procs, reports)))
    except BaseException:  # interrupted: the records streamed so far stay in `records`
        for proc in procs:
            proc.proc.terminate()
        raise
    finally:
        _stop(procs, reports)
        pool.shutdown(wait=False, cancel_futures=True)
    records.sort(key=lambda r: r.index)
    return LoadResult(records=records, loop_lag_s=[x for r in reports for x in r.loop_lag_s],
                      started_wall=started_wall, duration_s=span_s(records), host=merge_host(reports),
                      t0=start_at, workers=[worker_summary(r, records) for r in reports])


def _await_ready(conn, report: WorkerReport) -> None:
    if not conn.poll(READY_TIMEOUT_S):
        raise CheckFailed(f"client worker {report.worker} did not start within {READY_TIMEOUT_S:g} s")
    try:
        kind, pid = conn.recv()
    except (EOFError, OSError):
        raise CheckFailed(f"client worker {report.worker} died while starting (see its traceback above)") from None
    report.pid = pid


def _collect(conn, report: WorkerReport, records: list, loop, tick) -> None:
    """Receive one worker's records until it says done or its pipe closes (it died)."""
    while True:
        try:
            kind, payload = conn.recv()
        except (EOFError, OSError):
            report.died = "its pipe closed before it reported the end of its share"
            return
        if kind == "records":
            records.extend(payload)
            report.reported += len(payload)
            loop.call_soon_threadsafe(tick, len(payload))
        elif kind == "done":
            report.loop_lag_s, report.host = payload["loop_lag_s"], payload["host"]
            return


def _stop(procs: list[_Worker], reports: list[WorkerReport]) -> None:
    for proc, report in zip(procs, reports):
        report.exitcode = proc.stop()
        if report.died and report.exitcode:
            report.died = (f"killed by signal {-report.exitcode}" if report.exitcode < 0
                           else f"exit code {report.exitcode}")


def merge_host(reports: list[WorkerReport]) -> dict:
    """The most starved worker speaks for the client (its lateness is in the merged records)."""
    hosts = [r.host for r in reports if r.host]
    out: dict = {}
    for key in ("client_cpu_share", "client_runqueue_share", "cpu_pressure_share"):
        values = [h[key] for h in hosts if isinstance(h.get(key), (int, float))]
        out[key] = max(values) if values else None
    values = [h["runnable_mean"] for h in hosts if isinstance(h.get("runnable_mean"), (int, float))]
    out["runnable_mean"] = sum(values) / len(values) if values else None
    return out


def worker_summary(report: WorkerReport, records: Sequence[RequestRecord]) -> dict:
    from .stats import summary

    own = set(report.indices)
    mine = [r for r in records if r.index in own]
    lag = summary(r.schedule_lag_s for r in mine)
    loop_lag = summary(report.loop_lag_s)
    return {
        "worker": report.worker, "pid": report.pid, "slots": report.slots, "requests": len(report.indices),
        "reported": report.reported, "lost": len(report.indices) - report.reported,
        "schedule_lag_ms": {k: lag[k] for k in ("p50", "p99", "max")},
        "loop_lag_ms": {k: loop_lag[k] for k in ("p50", "p99", "max")},
        "client_cpu_share": report.host.get("client_cpu_share"),
        "client_runqueue_share": report.host.get("client_runqueue_share"),
        "died": report.died, "exitcode": report.exitcode,
    }

