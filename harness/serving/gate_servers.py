"""Where the gate's two vLLM servers run: both up at once when memory allows, otherwise one at a
time (alternating starts: A B | B A | A B ..., so a side measured twice in a row is started once).

The memory check is vLLM's own start-up check, read from vLLM 0.32's code:
- on a GPU, a server asks `total x --gpu-memory-utilization` (default 0.92, config/cache.py) and
  refuses to start when the free memory is less (v1/worker/utils.py `request_memory`);
- on the CPU build with an explicit KV space (VLLM_CPU_KVCACHE_SPACE, which the launcher sets to
  1 GiB unless the caller does, or --kv-cache-memory-bytes), the server holds that KV space plus
  its own process memory: the candidate is taken to need what the running baseline holds (the
  resident memory of its process group, measured) plus 1 GiB of headroom;
- on the CPU build without one, it asks `total x --gpu-memory-utilization` of the node's memory
  and refuses when less is available (v1/worker/cpu_worker.py).
The check runs with the baseline already up, so the answer needs no model of the baseline.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .launcher import ServerProcess, launch_vllm

GIB = 1024 ** 3
HEADROOM = 1 * GIB  # beside the baseline's own footprint, for the candidate on the CPU build
MODES = ("auto", "both", "alternate")


@dataclass
class ServerSpec:
    python: str
    model_dir: Path
    flags: list[str]
    served_name: str
    log_dir: Path
    env: dict = field(default_factory=dict)


@dataclass
class MemoryCheck:
    fits: bool
    why: str


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _flag(flags: list[str], name: str) -> str | None:
    for i, f in enumerate(flags):
        if f == name and i + 1 < len(flags):
            return flags[i + 1]
        if f.startswith(name + "="):
            return f.split("=", 1)[1]
    return None


def cpu_build(python: str | Path) -> bool:
    """The venv holds the vllm-cpu distribution (its dist-info), not a CUDA build."""
    venv = Path(python).parent.parent
    return any(venv.glob("lib/python*/site-packages/vllm_cpu-*.dist-info"))


def meminfo(key: str, path: Path = Path("/proc/meminfo")) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def group_rss(pgid: int, proc: Path = Path("/proc")) -> int:
    """Resident bytes of every process in process group `pgid` (vLLM's API server, engine core and
    workers; shared pages counted in each, so an upper bound)."""
    total = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return total


def gpu_memory() -> tuple[int, int] | None:
    """(total, free) bytes of the first visible GPU from nvidia-smi; None without one."""
    index = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    try:
        out = subprocess.run(["nvidia-smi", "-i", index, "--query-gpu=memory.total,memory.free",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20).stdout
        total, free = (int(x) * 1024 ** 2 for x in out.strip().splitlines()[0].split(","))
        return total, free
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None


def second_fits(first: ServerProcess, second: ServerSpec) -> MemoryCheck:
    """Can the candidate start beside the running baseline? vLLM's own rule (module docstring)."""
    util = float(_flag(second.flags, "--gpu-memory-utilization") or 0.92)
    if not cpu_build(second.python):
        device = gpu_memory()
        if device is None:
            return MemoryCheck(False, "no GPU memory figure (nvidia-smi) for a CUDA build: one server at a time")
        total, free = device
        need = total * util
        return MemoryCheck(need <= free, f"the candidate asks {util:g} x {_gib(total)} = {_gib(need)} of GPU memory, "
                                         f"{_gib(free)} free with the baseline up")
    available = meminfo("MemAvailable")
    kv = second.env.get("VLLM_CPU_KVCACHE_SPACE", os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    if (kv and kv != "0") or _flag(second.flags, "--kv-cache-memory-bytes"):
        held = group_rss(first.pid)
        need = held + HEADROOM
        return MemoryCheck(need <= available, f"the baseline server holds {_gib(held)}; the candidate needs about as "
                                              f"much + {_gib(HEADROOM)}, {_gib(available)} available")
    need = meminfo("MemTotal") * util
    return MemoryCheck(need <= available, f"the candidate asks {util:g} x {_gib(meminfo('MemTotal'))} = {_gib(need)}, "
                                          f"{_gib(available)} available with the baseline up")


class Servers:
    """The two sides' servers. `up(side)` returns (base URL, environment) with that side's server
    running; in alternating mode it first tears the other down (its whole process group) and waits
    for the new one to be healthy. `starts` records every start."""

    def __init__(self, specs: dict[str, ServerSpec], mode: str):
        self.specs, self.mode = specs, mode
        self.check: MemoryCheck | None = None
        self.starts: list[dict] = []
        self._up: dict[str, tuple[contextlib.ExitStack, ServerProcess]] = {}

    def _start(self, side: str) -> ServerProcess:
        spec = self.specs[side]
        stack = contextlib.ExitStack()
        t0 = time.monotonic()
        server = stack.enter_context(launch_vllm(spec.python, spec.model_dir, spec.flags, env=spec.env or None,
                                                 log_dir=spec.log_dir, served_model_name=spec.served_name))
        self._up[side] = (stack, server)
        self.starts.append({"side": side, "pid": server.pid, "port": server.port, "startup_s": round(time.monotonic() - t0, 1)})
        return server

    def _stop(self, side: str) -> None:
        stack, server = self._up.pop(side)
        stack.close()
        # the launcher's SIGKILL leaves members dying or unreaped for a moment; the next server
        # starts only once the memory of this one is free
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(server.pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.2)

    def open(self) -> None:
        """Start the baseline; in auto mode decide from memory whether the candidate joins it."""
        first = self._start("baseline")
        if self.mode == "auto":
            self.check = second_fits(first, self.specs["candidate"])
            self.mode = "both" if self.check.fits else "alternate"
        if self.mode == "both":
            self._start("candidate")

    def running(self, side: str) -> tuple[str, dict]:
        """(base URL, environment) of `side`'s server if it is up now, else ("", {})."""
        if side not in self._up:
            return "", {}
        server = self._up[side][1]
        return server.base_url, server.environment()

    def up(self, side: str) -> tuple[str, dict]:
        if side not in self._up:
            for other in list(self._up):
                self._stop(other)
            self._start(side)
        server = self._up[side][1]
        return server.base_url, server.environment()

    def describe(self) -> str:
        what = ("both servers up" if self.mode == "both" else
                "one server at a time (alternating starts, each waited for and torn down)")
        how = f"from memory: {self.check.why}" if self.check else "as asked (--servers)"
        return f"servers: {what}, {how}"

    def close(self) -> None:
        for side in list(self._up):
            self._stop(side)
