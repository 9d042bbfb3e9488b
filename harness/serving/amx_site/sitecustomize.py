"""Put on a vLLM server's PYTHONPATH by harness.serving.launcher on hosts with AMX (docs/serving.md,
"vLLM on an AMX host"): every Python process of the server, its spawned workers too, asks Linux for
the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) before anything runs.
vLLM's CPU attention picks its AMX kernel for bf16 whenever the CPU reports AMX, but never makes
that request (torch and oneDNN make it only for their own kernels), and an AMX instruction in a
process without the permission dies with SIGILL: the worker exits -4 at the first forward.
A sitecustomize of the venv's own is imported after this one, as Python would have."""

import ctypes
import platform

if platform.machine() == "x86_64":
    try:
        ctypes.CDLL(None, use_errno=True).syscall(158, 0x1023, 18)  # SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XTILEDATA
    except (OSError, AttributeError):
        pass


def _chain() -> None:
    """Import the next sitecustomize on sys.path, the one this file shadows, if there is one."""
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or ".") == here:
            continue
        candidate = os.path.join(entry or ".", "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


_chain()
