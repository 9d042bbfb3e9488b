"""What the client can see of CPU starvation during a run, beside its own schedule and loop lag.

- its event-loop thread's wait for a CPU (the kernel's schedstat run delay): time the client was
  runnable but not running, so its timestamps were late;
- the machine's CPU pressure (PSI, /proc/pressure/cpu "some"): the share of time at least one
  runnable task waited for a CPU;
- the machine's CPU contention from others: runnable tasks (/proc/loadavg) sampled while the
  server is idle, just before and after a run, so that the server's own threads never count.
  A CPU-bound server that wants the machine's K cores, beside B other runnable tasks, gets about
  K / (K + B) of them: `cpu_contention` = (K + B) / K (1.0 on a quiet machine, 1.5 with one busy
  loop on 2 cores). PSI saturates near 100% on a busy small machine; this does not.

Linux only; elsewhere the figures are None and the gate falls back to schedule and loop lag.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CpuSnapshot:
    wall: float  # time.monotonic()
    thread_run_ns: int | None
    thread_wait_ns: int | None
    pressure_some_us: int | None


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def snapshot() -> CpuSnapshot:
    """Call from the event loop's thread (schedstat is per thread)."""
    run = wait = psi = None
    text = _read("/proc/thread-self/schedstat")
    if text:
        parts = text.split()
        if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
            run, wait = int(parts[0]), int(parts[1])
    text = _read("/proc/pressure/cpu")
    if text:
        for line in text.splitlines():
            if line.startswith("some"):
                for item in line.split():
                    if item.startswith("total="):
                        psi = int(item[6:])
    return CpuSnapshot(time.monotonic(), run, wait, psi)


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def runnable() -> int | None:
    """Tasks running or ready to run right now, the reader included (/proc/loadavg's 4th field)."""
    text = _read("/proc/loadavg")
    try:
        return int(text.split()[3].split("/")[0]) if text else None
    except (IndexError, ValueError):
        return None


def in_run(samples: list[int]) -> dict:
    """Runnable tasks sampled during a run (the server's and the client's included): context only."""
    return {"runnable_mean": sum(samples) / len(samples) if samples else None}


def background(samples: list[int]) -> dict:
    """Contention from others, from runnable counts taken while the server was idle (each count
    includes the one reading it, which stands in for nothing else: it is taken off)."""
    if not samples:
        return {"background_runnable": None, "cpu_contention": None}
    others = max(0.0, sum(samples) / len(samples) - 1)
    k = cores()
    return {"background_runnable": others, "cpu_contention": (k + others) / k}


async def sample_runnable(duration_s: float = 0.2, interval_s: float = 0.05) -> list[int]:
    import asyncio

    out = []
    for _ in range(max(1, round(duration_s / interval_s))):
        count = runnable()
        if count is not None:
            out.append(count)
        await asyncio.sleep(interval_s)
    return out


def delta(before: CpuSnapshot, after: CpuSnapshot) -> dict:
    """Shares of the wall time between two snapshots (None where the kernel does not say)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return {"client_cpu_share": None, "client_runqueue_share": None, "cpu_pressure_share": None}

    def share(a, b, scale):
        return None if a is None or b is None else max(0.0, (b - a) / scale / wall)

    return {
        "client_cpu_share": share(before.thread_run_ns, after.thread_run_ns, 1e9),
        "client_runqueue_share": share(before.thread_wait_ns, after.thread_wait_ns, 1e9),
        "cpu_pressure_share": share(before.pressure_some_us, after.pressure_some_us, 1e6),
    }
