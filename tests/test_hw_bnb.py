"""bitsandbytes fault injection: a corrupt native library is caught although `import` succeeds.

The probe runs for real in a subprocess on the CPU (bitsandbytes 0.50 runs NF4 and int8 here):
once on the installed package, once on a copy whose native library is garbage. On the CPU
bitsandbytes then falls back to pure-torch kernels without a word, so the numbers alone cannot
tell; the probe must notice the stub library and name the loader's error.
"""

from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from harness.hw import bnb_probe
from harness.hw.compat import classify_bnb_error

spec = importlib.util.find_spec("bitsandbytes")
pytestmark = pytest.mark.skipif(spec is None, reason="bitsandbytes is not installed (pip install -e '.[gpu]')")


def _broken_copy(tmp: Path) -> Path:
    """bitsandbytes' package with every native library replaced by bytes that are not an ELF file."""
    package = Path(spec.origin).parent
    shadow = tmp / "bitsandbytes"
    shadow.mkdir()
    for entry in package.iterdir():
        if entry.name.startswith("libbitsandbytes_"):
            (shadow / entry.name).write_bytes(b"this is not a shared library\n" * 4)
        else:
            (shadow / entry.name).symlink_to(entry)
    return tmp


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """(healthy, broken): the broken one in a subprocess, the healthy one here meanwhile (torch is
    already imported here, which saves a second cold start)."""
    broken_env = dict(os.environ, PYTHONPATH=str(_broken_copy(tmp_path_factory.mktemp("broken-bnb"))))
    with ThreadPoolExecutor(1) as pool:
        broken = pool.submit(bnb_probe.run_probe, ["cpu"], None, broken_env)
        healthy = bnb_probe.probe_in_process(["cpu"])
        return healthy, broken.result()


def test_healthy_install_passes_all_three(probes):
    healthy, _ = probes
    assert bnb_probe.native_library_result(healthy).verdict == "pass"
    nf4 = bnb_probe.nf4_result(healthy, "cpu")
    assert nf4.verdict == "pass" and nf4.details["mismatch_fraction"] <= bnb_probe.NF4_TOLERANCE
    assert 0.05 < nf4.details["mean_rel_err"] < 0.15  # NF4's typical error: the round trip really quantized
    assert bnb_probe.int8_result(healthy, "cpu").verdict == "pass"


def test_corrupt_native_library_fails_with_reinstall_fix(probes):
    _, broken = probes
    assert broken.get("version")  # the import itself succeeded: import alone proves nothing
    r = bnb_probe.native_library_result(broken)
    assert r.verdict == "fail"
    assert "invalid ELF header" in r.value or "not an ELF" in r.value or "file too short" in r.value
    assert "corrupt" in r.fix and "pip install --force-reinstall" in r.fix
    for result in (bnb_probe.nf4_result(broken, "cpu"), bnb_probe.int8_result(broken, "cpu")):
        assert result.verdict == "fail" and "force-reinstall" in result.fix


def test_probe_that_crashes_or_cannot_import_fails_instead_of_raising(tmp_path):
    crashed = bnb_probe.run_probe(["cpu"], python=str(tmp_path / "no-such-python"))
    assert "cannot run" in crashed["crash"]
    assert bnb_probe.native_library_result(crashed).verdict == "fail"
    r = bnb_probe.native_library_result({"devices": ["cuda:0"], "crash": "probe exited -11: Segmentation fault"})
    assert r.verdict == "fail" and "python -m bitsandbytes" in r.fix


@pytest.mark.parametrize("text, words", [
    ("RuntimeError: No compatible CUDA binary found at /x/libbitsandbytes_cuda132.so", "upgrade bitsandbytes"),
    ("OSError: libcudart.so.13: cannot open shared object file: No such file or directory", "CUDA runtime"),
    ("OSError: /x/libbitsandbytes_cuda130.so: undefined symbol: cublasLtMatmul", "reinstall bitsandbytes for this torch"),
    ("RuntimeError: BNB_CUDA_VERSION='118' set but the binary is missing", "unset BNB_CUDA_VERSION"),
    ("CUDA error: no kernel image is available for execution on the device", "compute capability"),
])
def test_native_error_texts_map_to_their_fix(text, words):
    cause, fix = classify_bnb_error(text)
    assert words in fix, (cause, fix)
