"""bitsandbytes, proven by computing: native library loaded, NF4 round trip, int8 matmul.

`import bitsandbytes` succeeds even when its native library failed to load (it swaps in a stub
that raises on first call, or silently falls back to slow pure-torch kernels on CPU), so only
running its kernels and checking the numbers proves anything. The probe runs in a subprocess
(`python -m harness.hw.bnb_probe --device cuda:0`): a crash in native code then takes down
the probe, not the test session, and a test can run it in a deliberately broken environment.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .compat import classify_bnb_error
from .result import CheckResult

NF4_TOLERANCE = 1e-3  # fraction of elements allowed to differ from the reference (rounding ties)


def _first_line(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def probe_in_process(devices: list[str]) -> dict:
    """The same probe in this process (no isolation from a native crash): for callers that already
    import bitsandbytes."""
    return _probe(devices)


def _probe(devices: list[str]) -> dict:
    out: dict = {"devices": devices}
    import logging

    logged: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())

    logging.getLogger("bitsandbytes").addHandler(_Keep())
    try:
        import bitsandbytes as bnb
        from bitsandbytes import cextension
    except Exception as exc:
        out["import_error"] = _first_line(exc)
        return out
    out["version"] = bnb.__version__
    lib = cextension.lib
    if isinstance(lib, cextension.ErrorHandlerMockBNBNativeLibrary):
        out["native_library"] = None
        try:  # on CPU bitsandbytes swallows the loader's error: load again to get its words
            cextension.get_native_library()
            reason = ""
        except Exception as exc:
            reason = _first_line(exc)
        out["native_error"] = (reason or " | ".join(m.splitlines()[0] for m in logged if m.strip())
                               or "native library not loaded")
    else:
        out["native_library"] = getattr(getattr(lib, "_lib", None), "_name", "loaded")
    out["backend"] = cextension.BNB_BACKEND

    out["results"] = {device: _kernels(device) for device in devices}
    return out


def _kernels(device: str) -> dict:
    import bitsandbytes.functional as F
    import torch

    res: dict = {}
    gen = torch.Generator().manual_seed(0)
    # NF4 round trip against a pure-torch reference: nearest code point of x / blockwise absmax.
    try:
        blocksize = 64
        x = torch.randn(1024, 512, generator=gen, dtype=torch.float32)
        q, state = F.quantize_4bit(x.to(device), blocksize=blocksize, quant_type="nf4")
        deq = F.dequantize_4bit(q, state, quant_type="nf4").float().cpu()
        code = F.get_4bit_type("nf4", device="cpu").float()
        blocks = x.reshape(-1, blocksize)
        absmax = blocks.abs().amax(dim=1, keepdim=True)
        idx = ((blocks / absmax).unsqueeze(-1) - code).abs().argmin(dim=-1)
        ref = (code[idx] * absmax).reshape_as(x)
        tol = 1e-5 * absmax.max().item()
        mismatch = ((deq - ref).abs() > tol).float().mean().item()
        res["nf4"] = {"mismatch_fraction": mismatch, "max_abs_err": (deq - x).abs().max().item(),
                      "mean_rel_err": ((deq - x).abs().mean() / x.abs().mean()).item(),
                      "ok": bool(mismatch <= NF4_TOLERANCE)}
    except Exception as exc:
        res["nf4"] = {"ok": False, "error": _first_line(exc)}
    # int8 matmul is exact: compare with int64 on the CPU.
    try:
        a = torch.randint(-127, 128, (256, 512), generator=gen, dtype=torch.int8)
        b = torch.randint(-127, 128, (128, 512), generator=gen, dtype=torch.int8)
        got = F.int8_linear_matmul(a.to(device), b.to(device)).cpu().long()
        ref = a.long() @ b.long().T
        wrong = int((got != ref).sum().item())
        res["int8"] = {"wrong_elements": wrong, "elements": ref.numel(), "ok": wrong == 0}
    except Exception as exc:
        res["int8"] = {"ok": False, "error": _first_line(exc)}
    return res


def run_probe(devices: list[str], python: str | None = None, env: dict | None = None, timeout: float = 180) -> dict:
    """Run the probe in a subprocess; never raises: a crash is returned as {"crash": ...}."""
    cmd = [python or sys.executable, "-m", "harness.hw.bnb_probe"]
    for device in devices:
        cmd += ["--device", device]
    root = str(Path(__file__).resolve().parents[2])
    run_env = dict(os.environ if env is None else env)
    run_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, run_env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=run_env)
    except subprocess.TimeoutExpired:
        return {"devices": devices, "crash": f"bitsandbytes probe timed out after {timeout:.0f} s"}
    except OSError as exc:
        return {"devices": devices, "crash": f"cannot run {cmd[0]}: {exc.strerror or exc}"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-3:]
        return {"devices": devices, "crash": f"probe exited {proc.returncode}: {' | '.join(tail) or 'no output'}"}
    return json.loads(lines[-1])


def _bnb_fail(check: str, value: str, text: str) -> CheckResult:
    cause, fix = classify_bnb_error(text)
    return CheckResult(check, "fail", f"{value}: {text}", "a working native library", f"{cause}: {fix}")


def native_library_result(probe: dict) -> CheckResult:
    check, exp = "bnb_native_library", "bitsandbytes imports and loads its native library for this device"
    if "crash" in probe:
        return _bnb_fail(check, "probe crashed", probe["crash"])
    if "import_error" in probe:
        return _bnb_fail(check, "import failed", probe["import_error"])
    if not probe.get("native_library"):
        return _bnb_fail(check, f"bitsandbytes {probe.get('version')} imported but its native library did not load",
                         probe.get("native_error") or "")
    return CheckResult(check, "pass", f"bitsandbytes {probe['version']} ({probe.get('backend')}): "
                       f"{Path(str(probe['native_library'])).name}", exp, details=probe)


def _kernel_result(probe: dict, device: str, check: str, exp: str, kernel: str, label: str,
                   describe, fix: str) -> CheckResult:
    """One kernel's verdict from the probe: the native library first, then that kernel's result."""
    lib = native_library_result(probe)
    if lib.verdict == "fail":
        return CheckResult(check, "fail", lib.value, exp, lib.fix, probe)
    result = probe.get("results", {}).get(device, {}).get(kernel, {"error": f"no result for {device}"})
    if "error" in result:
        return _bnb_fail(check, f"{label} raised", result["error"])
    value = describe(result)
    if result["ok"]:
        return CheckResult(check, "pass", value, exp, details=result)
    return CheckResult(check, "fail", value, exp, fix, result)


def nf4_result(probe: dict, device: str) -> CheckResult:
    return _kernel_result(
        probe, device, "bnb_4bit_roundtrip",
        f"NF4 quantize/dequantize equals the reference (<= {NF4_TOLERANCE:.1%} ties)", "nf4", "NF4 round trip",
        lambda r: (f"{r['mismatch_fraction']:.2%} of elements off the reference; mean relative error "
                   f"{r['mean_rel_err']:.3f} on {device}"),
        "bitsandbytes' 4-bit kernels compute wrong values on this device: reinstall bitsandbytes, "
        "and if it persists run the memory checks (--hw-level full)")


def int8_result(probe: dict, device: str) -> CheckResult:
    return _kernel_result(
        probe, device, "bnb_int8_matmul", "int8 matmul equals the exact int64 product", "int8", "int8 matmul",
        lambda r: f"{r['wrong_elements']} of {r['elements']} elements wrong on {device}",
        "the int8 kernels compute wrong values: reinstall bitsandbytes; if it persists, the GPU "
        "is suspect (run --hw-level full)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", action="append", help="cpu, cuda:N; repeat for several (default cuda:0)")
    args = parser.parse_args(argv)
    print(json.dumps(_probe(args.device or ["cuda:0"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
