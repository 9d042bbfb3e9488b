"""Memory tracker: torch allocator peaks, an NVML sampler thread, CUDA context size, host RSS peak.

    with MemoryTracker(device="cuda:0") as tracker:
        model(input_ids)
    tracker.result.peak_bytes      # torch.cuda.max_memory_allocated during the block (absolute)

On a CPU-only machine the same code runs and reports what it can (host RSS; the torch and NVML
fields are None). torch is imported lazily so that importing this module stays cheap.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass


@dataclass
class MemoryResult:
    device: str
    peak_bytes: int | None = None  # torch max_memory_allocated during the block (absolute)
    reserved_peak_bytes: int | None = None  # torch max_memory_reserved during the block
    start_bytes: int | None = None  # torch memory_allocated when the block began
    end_bytes: int | None = None  # torch memory_allocated when the block ended
    nvml_peak_bytes: int | None = None  # peak NVML usage seen by the sampler (process or device)
    nvml_scope: str | None = None  # "process" or "device": what nvml_peak_bytes counts
    nvml_samples: int = 0
    nvml_rate_hz: float | None = None
    context_bytes: int | None = None  # CUDA context + driver reservations of this process
    host_rss_peak_bytes: int | None = None
    host_rss_start_bytes: int | None = None
    host_rss_samples: int = 0  # how many times the sampler read the resident size
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def _rss_bytes() -> int | None:
    try:
        import psutil

        return int(psutil.Process(os.getpid()).memory_info().rss)
    except Exception:  # psutil missing or /proc unreadable: report nothing rather than guess
        return None


class NvmlReader:
    """Reads this process's GPU memory from NVML, or the device's used memory when per-process
    figures are not available (containers often hide them)."""

    def __init__(self, index: int):
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._pid = os.getpid()
        self.scope = "process" if self._process_bytes() is not None else "device"

    def _process_bytes(self) -> int | None:
        nv = self._nvml
        try:
            for proc in nv.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if proc.pid == self._pid and proc.usedGpuMemory is not None:
                    return int(proc.usedGpuMemory)
        except nv.NVMLError:
            return None
        return None

    def used_bytes(self) -> int | None:
        if self.scope == "process":
            value = self._process_bytes()
            if value is not None:
                return value
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def total_bytes(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).total)


def open_nvml(index: int) -> NvmlReader | None:
    try:
        return NvmlReader(index)
    except Exception:  # no driver, no library, no permission: the tracker reports without NVML
        return None


def cuda_context_bytes(device: str = "cuda:0") -> int | None:
    """Bytes this process holds on the GPU beyond what torch's allocator reserved: the CUDA context,
    loaded kernels and driver reservations. Initialises CUDA if needed. None without NVML/CUDA."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return None
    dev = torch.device(device)
    torch.zeros(1, device=dev)  # make sure the context exists
    reader = open_nvml(dev.index or 0)
    if reader is None or reader.scope != "process":
        free, total = torch.cuda.mem_get_info(dev)
        return None if reader is None else max(0, total - free - torch.cuda.memory_reserved(dev))
    return max(0, (reader.used_bytes() or 0) - torch.cuda.memory_reserved(dev))


class MemoryTracker:
    """Context manager measuring one operation. `interval_s` is the NVML/RSS sampling period
    (default 5 ms, i.e. ~200 Hz; the thread measures and reports its real rate)."""

    def __init__(self, device: str = "cuda:0", interval_s: float = 0.005, nvml: bool = True):
        self.device = device
        self.interval_s = interval_s
        self.result = MemoryResult(device=device)
        self._use_nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._reader: NvmlReader | None = None
        self._t0 = 0.0
        self.rss_samples = 0  # read while the block runs: a loaded machine can starve the sampler
        self._cuda = False

    def _sample_loop(self) -> None:
        peak_nvml = None
        peak_rss = self.result.host_rss_start_bytes
        n = 0
        t_start = time.perf_counter()
        while True:
            if self._reader is not None:
                used = self._reader.used_bytes()
                if used is not None and (peak_nvml is None or used > peak_nvml):
                    peak_nvml = used
                n += 1
            rss = _rss_bytes()
            if rss is not None:
                self.rss_samples += 1
                if peak_rss is None or rss > peak_rss:
                    peak_rss = rss
            if self._stop.wait(self.interval_s):
                break
        elapsed = time.perf_counter() - t_start
        self.result.nvml_peak_bytes = peak_nvml
        self.result.nvml_samples = n
        self.result.nvml_rate_hz = (n / elapsed) if (n and elapsed > 0) else None
        self.result.host_rss_peak_bytes = peak_rss
        self.result.host_rss_samples = self.rss_samples

    def __enter__(self) -> "MemoryTracker":
        import torch

        self._cuda = self.device.startswith("cuda") and torch.cuda.is_available()
        if self._cuda:
            dev = torch.device(self.device)
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            self.result.start_bytes = int(torch.cuda.memory_allocated(dev))
            if self._use_nvml:
                self._reader = open_nvml(dev.index or 0)
                if self._reader is not None:
                    self.result.nvml_scope = self._reader.scope
                    used = self._reader.used_bytes()
                    if used is not None and self._reader.scope == "process":
                        self.result.context_bytes = max(0, used - int(torch.cuda.memory_reserved(dev)))
        self.result.host_rss_start_bytes = _rss_bytes()
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample_loop, name="memory-sampler", daemon=True)
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        import torch

        if self._cuda:
            dev = torch.device(self.device)
            try:
                torch.cuda.synchronize(dev)
            except Exception:  # a failed kernel must not hide the original exception
                pass
            self.result.peak_bytes = int(torch.cuda.max_memory_allocated(dev))
            self.result.reserved_peak_bytes = int(torch.cuda.max_memory_reserved(dev))
            self.result.end_bytes = int(torch.cuda.memory_allocated(dev))
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.result.seconds = time.perf_counter() - self._t0
        return False
