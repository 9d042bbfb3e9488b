"""vLLM's CPU build on an AMX host: its bf16 attention runs AMX instructions without asking Linux
for the tile state and the worker dies with SIGILL at the first forward; the launcher puts
harness/serving/amx_site/ on the server's PYTHONPATH there, whose sitecustomize asks in every
process (harness.serving.launcher.amx_env)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.serving.launcher import AMX_SITE, amx_env

ARCH_GET_XCOMP_PERM, XTILEDATA = 0x1022, 18
_ASK = ("import ctypes; m = ctypes.c_ulong(0); "
        f"ctypes.CDLL(None).syscall(158, {ARCH_GET_XCOMP_PERM}, ctypes.byref(m)); print(m.value)")


def _host_has_amx() -> bool:
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def test_amx_env_only_where_the_cpu_has_amx_tiles(tmp_path):
    with_amx, without = tmp_path / "amx", tmp_path / "plain"
    with_amx.write_text("processor : 0\nflags : fpu avx512f amx_bf16 amx_tile amx_int8\n")
    without.write_text("processor : 0\nflags : fpu avx512f avx512_bf16\n")
    assert amx_env(with_amx)["PYTHONPATH"].split(os.pathsep)[0] == str(AMX_SITE)
    assert amx_env(without) == {} and amx_env(tmp_path / "missing") == {}
    assert (AMX_SITE / "sitecustomize.py").is_file()


@pytest.mark.skipif(not _host_has_amx() or sys.platform != "linux", reason="this host's CPU has no AMX tiles")
def test_a_process_started_with_amx_site_holds_the_tile_permission():
    """What the server's processes get: the kernel's own answer (ARCH_GET_XCOMP_PERM) in a fresh
    interpreter, with and without the site directory."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plain = int(subprocess.run([sys.executable, "-c", _ASK], env=env, capture_output=True, text=True,
                               check=True).stdout)
    granted = int(subprocess.run([sys.executable, "-c", _ASK], env={**env, "PYTHONPATH": str(AMX_SITE)},
                                 capture_output=True, text=True, check=True).stdout)
    assert granted >> XTILEDATA & 1, f"permission mask {granted:#x}"
    assert not plain >> XTILEDATA & 1, f"a plain interpreter already holds it ({plain:#x}): the test proves nothing"
