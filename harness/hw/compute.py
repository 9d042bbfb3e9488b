"""Quick compute checks on a GPU: an allocation that reads back, a matmul against float64 on the
CPU, and the PCIe link read while copies run. torch is imported inside each function."""

from __future__ import annotations

import time

from .result import CheckResult

MATMUL_N = 1024
FP32_TOL = 1e-5  # relative Frobenius error of an fp32 (TF32 off) matmul against float64
BF16_TOL = 1e-2  # bf16 inputs carry 8 mantissa bits: ~3e-3 is typical


def check_allocation(device: str, nbytes: int = 256 * 2**20) -> CheckResult:
    """Allocate, write a pattern, read it back on the CPU: every element must match."""
    import torch

    from harness.units import format_bytes

    exp = f"{format_bytes(nbytes)} allocated, written and read back intact"
    n = nbytes // 4
    try:
        t0 = time.perf_counter()
        x = torch.arange(n, dtype=torch.int32, device=device)
        x.bitwise_xor_(0x5A5A5A5A)
        back = x.cpu()
        torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - t0
    except Exception as exc:  # OOM, illegal address, launch failure
        return CheckResult("allocation", "fail", f"{device}: {type(exc).__name__}: {str(exc).splitlines()[0]}", exp,
                           "the GPU could not allocate or run a trivial kernel: check free memory (other "
                           "processes), then the kernel log for Xid errors; reset the GPU or reboot")
    want = torch.arange(n, dtype=torch.int32).bitwise_xor_(0x5A5A5A5A)
    wrong = int((back != want).sum())
    value = f"{device}: {format_bytes(nbytes)}, {wrong} wrong elements, {elapsed * 1000:.0f} ms"
    if wrong:
        return CheckResult("allocation", "fail", value, exp,
                           "memory read back differs from what was written: run --hw-level full (whole-memory "
                           "write/verify), check ECC and retired pages; the card may need service",
                           {"wrong": wrong})
    return CheckResult("allocation", "pass", value, exp, details={"wrong": 0, "seconds": elapsed})


def matmul_errors(device: str, n: int = MATMUL_N, seed: int = 0) -> dict[str, float]:
    """Relative Frobenius error of fp32 (TF32 off) and bf16 GPU matmuls against float64 on the CPU."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen, dtype=torch.float64)
    b = torch.randn(n, n, generator=gen, dtype=torch.float64)
    ref = a @ b
    norm = ref.norm().item()
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # no TF32: the fp32 result must be fp32-accurate
    try:
        fp32 = (a.float().to(device) @ b.float().to(device)).double().cpu()
    finally:
        torch.set_float32_matmul_precision(old)
    ref_bf16 = a.bfloat16().double() @ b.bfloat16().double()  # what bf16 inputs should give
    bf16 = (a.bfloat16().to(device) @ b.bfloat16().to(device)).double().cpu()
    return {
        "fp32_rel_err": ((fp32 - ref).norm() / norm).item(),
        "bf16_rel_err": ((bf16 - ref_bf16).norm() / ref_bf16.norm()).item(),
        "nonfinite": int((~torch.isfinite(fp32)).sum() + (~torch.isfinite(bf16)).sum()),
    }


def check_matmul(device: str, errors: dict[str, float] | None = None) -> CheckResult:
    exp = f"fp32 relative error <= {FP32_TOL:g}, bf16 <= {BF16_TOL:g} against float64 on the CPU"
    try:
        errors = errors or matmul_errors(device)
    except Exception as exc:
        return CheckResult("matmul", "fail", f"{device}: {type(exc).__name__}: {str(exc).splitlines()[0]}", exp,
                           "cuBLAS could not run: check torch's CUDA build against the driver (driver_cuda_compat)")
    value = (f"{device}: {MATMUL_N}x{MATMUL_N} fp32 rel err {errors['fp32_rel_err']:.1e}, "
             f"bf16 rel err {errors['bf16_rel_err']:.1e}")
    if errors["nonfinite"] or errors["fp32_rel_err"] > FP32_TOL or errors["bf16_rel_err"] > BF16_TOL:
        return CheckResult("matmul", "fail", value, exp,
                           "the GPU computes wrong matmul results: check clocks/temperature (overclocked or "
                           "overheating cards miscompute), run --hw-level full; if it persists the card is faulty",
                           errors)
    return CheckResult("matmul", "pass", value, exp, details=errors)


def nvml_index(torch_index: int) -> int:
    """NVML numbers every GPU; torch only those CUDA_VISIBLE_DEVICES shows: match them by UUID."""
    import pynvml as N
    import torch

    uuid = str(getattr(torch.cuda.get_device_properties(torch_index), "uuid", "") or "")
    if not uuid:
        return torch_index
    N.nvmlInit()
    try:
        for i in range(N.nvmlDeviceGetCount()):
            nv = N.nvmlDeviceGetUUID(N.nvmlDeviceGetHandleByIndex(i))
            if uuid in (nv.decode() if isinstance(nv, bytes) else nv):
                return i
    finally:
        N.nvmlShutdown()
    return torch_index


def pcie_under_load(device: str, seconds: float = 0.3, nbytes: int = 64 * 2**20) -> dict[str, int]:
    """Max PCIe generation/width NVML reports while pinned host-to-device copies run."""
    import pynvml as N
    import torch

    idx = torch.device(device).index or 0
    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    N.nvmlInit()
    try:
        handle = N.nvmlDeviceGetHandleByIndex(nvml_index(idx))
        gen = width = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                dev.copy_(host, non_blocking=True)
            gen = max(gen, N.nvmlDeviceGetCurrPcieLinkGeneration(handle))
            width = max(width, N.nvmlDeviceGetCurrPcieLinkWidth(handle))
            torch.cuda.synchronize(device)
        return {"pcie_gen": gen, "pcie_width": width}
    finally:
        N.nvmlShutdown()
