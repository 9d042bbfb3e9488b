"""What the client can see of CPU starvation during a run, beside its own schedule and loop lag.

- its event-loop thread's wait for a CPU (the kernel's schedstat run delay): time the client was
  runnable but not running, so its timestamps were late;
- the machine's CPU pressure (PSI, /proc/pressure/cpu "some"): the share of time at least one
  runnable task waited for a CPU, i.e. how contended the cores that the server shares were.

Linux only; elsewhere the figures are None and the gate falls back to schedule and loop lag.
"""

from __future__ import annotations

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
