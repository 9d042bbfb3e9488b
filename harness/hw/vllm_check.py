"""vLLM importable in its own interpreter, native extension included, and its version."""

from __future__ import annotations

import json
import re
import subprocess
import time

from .result import CheckResult

# `import vllm` alone is lazy; vllm._C is the compiled extension that breaks when vLLM and torch
# disagree (undefined symbol) or the build does not fit the machine.
_IMPORT = (
    "import json, vllm\n"
    "import vllm._C\n"
    "import torch\n"
    "print(json.dumps({'version': vllm.__version__, 'torch': torch.__version__, 'native': vllm._C.__file__}))\n"
)


def check_vllm_import(python: str | None, timeout: float = 180) -> CheckResult:
    check, exp = "vllm_importable", "`import vllm` and its native extension vllm._C load in the vLLM interpreter"
    if not python:
        return CheckResult(check, "skip", "no vLLM interpreter (--vllm-python)", exp)
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
        error = lines[-1] if lines else (f"killed by signal {-proc.returncode}, no output" if proc.returncode < 0
                                         else f"exit code {proc.returncode}, no output")
        if re.search(r"invalid ELF header|file too short|not an ELF", error):
            fix = "vLLM's native extension is corrupt: reinstall vLLM (pip install --force-reinstall) in its venv"
        elif "undefined symbol" in error:
            fix = "vLLM's native extension was built for another torch: reinstall vLLM with the torch it pins"
        elif "No module named 'vllm'" in error:
            fix = f"vLLM is not installed in {python}: install it into that venv (see README)"
        elif "torchvision" in error or "operator torchvision" in error:
            fix = "a PyPI torchvision beside vLLM's torch: pip uninstall -y torchvision torchaudio torchcodec"
        else:
            fix = "reinstall vLLM in its own venv (see README), then re-run"
        return CheckResult(check, "fail", f"{python}: {error}", exp, fix, {"stderr_tail": lines[-10:]})
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return CheckResult(check, "fail", f"{python} printed no version ({proc.stdout.strip()[:80]!r}): not a Python "
                           "interpreter with vLLM?", exp, "point --vllm-python at the venv's python")
    info["import_seconds"] = round(seconds, 2)
    return CheckResult(check, "pass", f"vLLM {info['version']} (torch {info['torch']}) imports in {seconds:.1f} s",
                       exp, details=info)
