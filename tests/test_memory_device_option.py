"""--device cuda:N names a device that must exist: otherwise a one-line usage error naming the
devices there are, not a silent CPU run."""

from __future__ import annotations

import pytest

from harness import settings as s
from harness.errors import UsageError

def test_check_device_names_the_devices_there_are():
    with pytest.raises(UsageError, match=r"--device: cuda:7 does not exist here \(devices: cpu\)"):
        s.check_device("cuda:7", [], [])
    with pytest.raises(UsageError, match=r"devices: cpu, cuda:0 \(NVIDIA H200\), cuda:1 \(driver only\)"):
        s.check_device("cuda:3", [(0, "NVIDIA H200")], [0, 1])
    for ok in ("cpu", "auto", "cuda", "cuda:0"):
        s.check_device(ok, [(0, "NVIDIA H200")], [0])
    s.check_device("cuda:1", [], [0, 1])  # the driver has it, torch cannot use it: the GPU checks diagnose


def test_pytest_device_that_is_not_there_is_a_usage_error(pytester, monkeypatch):
    import os
    from pathlib import Path

    root = str(Path(s.__file__).resolve().parents[1])  # this checkout's harness, not an installed one
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    pytester.makepyfile(test_x="def test_x(): pass")
    result = pytester.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider", "--device", "cuda:7")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("ERROR: --device: cuda:7 does not exist here (devices: cpu")
