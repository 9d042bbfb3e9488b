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
- the CPU others used during the run itself: the busy time of the CPUs this process may run on
  (/proc/stat) less what the server's processes and the client's used (their /proc/PID/stat, reaped children included), in
  cores; `cpu_contention_run` = (K + that) / K. Idle samples miss a neighbour that starts and stops
  between them (a pytest-xdist worker beside the gate); this does not. It is measured only for a
  server on this machine whose processes are found (the owner of the listening port, when it is
  the server's own process and not a proxy, and its descendants): a server whose CPU could not be
  told apart would excuse itself.

Linux only; elsewhere the figures are None and the gate falls back to schedule and loop lag.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..env import usable_cores


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
    k = usable_cores()
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


@dataclass(frozen=True)
class CpuTimes:
    """CPU seconds so far: the whole machine's busy time and the watched processes' (None: unknown)."""
    wall: float
    machine_busy_s: float | None
    watched_s: float | None


def _ticks_per_s() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (AttributeError, ValueError, OSError):
        return 100.0


def _allowed_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def busy_seconds(stat: str, cpus: set[int] | None) -> float | None:
    """Busy time of the CPUs in `cpus` (None: all) from /proc/stat's text: everything but idle and
    I/O wait (steal included: a hypervisor's other guests are others too). Only the CPUs this
    process may run on count: in a container pinned to 2 of a host's 64 CPUs, /proc/stat still
    lists all 64, and the host's other jobs must not pass for contention."""
    total = None
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu"):
            continue
        if name == "cpu" and cpus is not None or name != "cpu" and (cpus is None or int(name[3:]) not in cpus):
            continue
        fields = [int(v) for v in rest.split()]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        guest = sum(fields[8:10])  # counted in user and nice already
        total = (total or 0) + sum(fields[:10]) - idle - guest
    return None if total is None else total / _ticks_per_s()


def _machine_busy_s() -> float | None:
    text = _read("/proc/stat")
    return busy_seconds(text, _allowed_cpus()) if text else None


def _stat_fields(pid: int) -> list[str] | None:
    text = _read(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    return text[text.rindex(")") + 2:].split()  # after "pid (comm) ": state is field 0


def _descendants(roots: set[int]) -> set[int]:
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))) is not None:
            parent[int(entry)] = int(fields[1])
    tree = {pid for pid in roots if pid in parent}
    grown = True
    while grown:
        more = {pid for pid, ppid in parent.items() if ppid in tree and pid not in tree}
        tree |= more
        grown = bool(more)
    return tree


def _process_cpu_s(pid: int) -> float:
    """utime + stime + cutime + cstime: a child that exited and was reaped moves into its parent's
    cutime, so a tree's sum only grows by what the tree ran."""
    fields = _stat_fields(pid)
    return sum(int(v) for v in fields[11:15]) / _ticks_per_s() if fields else 0.0


def cpu_times(server: set[int] | None, client: set[int]) -> CpuTimes:
    """The machine's busy seconds and the watched ones (None: the server is not watched): the
    server's processes with their descendants (vLLM's engine core is its API server's child), and
    the client's own processes without theirs (its worker processes are reaped into its cutime by
    the run's end; anything else it started, a CPU hog beside the bench say, is others')."""
    busy = _machine_busy_s()
    if server is None or busy is None:
        return CpuTimes(time.monotonic(), busy, None)
    watched = sum(_process_cpu_s(pid) for pid in _descendants(server) | client)
    return CpuTimes(time.monotonic(), busy, watched)


def others_during(before: CpuTimes, after: CpuTimes) -> dict:
    """Cores' worth of CPU the rest of the machine used between two cpu_times of the same roots."""
    wall = after.wall - before.wall
    if wall <= 0 or None in (before.machine_busy_s, after.machine_busy_s, before.watched_s, after.watched_s):
        return {"others_cpu_cores": None, "cpu_contention_run": None}
    others = max(0.0, (after.machine_busy_s - before.machine_busy_s) - (after.watched_s - before.watched_s)) / wall
    k = usable_cores()
    return {"others_cpu_cores": others, "cpu_contention_run": (k + others) / k}


LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::"}


def server_pids(base_url: str) -> set[int] | None:
    """The processes that own the listening socket of a server on this machine (None: the server is
    elsewhere, or its socket's owner cannot be read: not ours, another namespace, not Linux)."""
    from urllib.parse import urlsplit

    parts = urlsplit(base_url)
    if parts.hostname not in LOOPBACK:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (_read(table) or "").splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{cols[9]}]")
    if not inodes:
        return None
    owners = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in inodes:
                    owners.add(int(entry))
                    break
            except OSError:
                continue
    served = {pid for pid in owners if _is_server_process(pid)}
    return served or None


def _is_server_process(pid: int) -> bool:
    """The socket's owner is the server itself (vLLM's API server and the stand-in are Python
    processes), not a proxy in front of it (docker-proxy, nginx, an ssh tunnel): a proxy's
    descendants are not the server, and the server's CPU would be counted as others'."""
    raw = _read(f"/proc/{pid}/cmdline")
    argv = raw.split("\0") if raw else []
    if not argv or not argv[0]:
        return False
    # vLLM may retitle its processes ("VLLM::APIServer"): any case
    return os.path.basename(argv[0]).startswith("python") or any("vllm" in os.path.basename(a).lower() for a in argv[:2])
