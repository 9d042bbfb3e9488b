"""End to end through pytest: a failing readiness check fails its test with the fix in one line,
and lands in the JSON results and the Readiness table; GPU checks skip with the probe's reason.

The fault is real: the CPU build of vLLM with its native extension vllm._C replaced by garbage
(a copy of the package made of links, one file swapped), so `import vllm` works and vllm._C does not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.settings import DEFAULT_VLLM_VENV

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / DEFAULT_VLLM_VENV / "bin" / "python"


def _broken_vllm(tmp: Path) -> Path:
    site = next((ROOT / DEFAULT_VLLM_VENV / "lib").glob("python3*/site-packages"))
    shadow = tmp / "site"
    (shadow / "vllm").mkdir(parents=True)
    for dist in site.glob("vllm*.dist-info"):
        (shadow / dist.name).symlink_to(dist)
    for entry in (site / "vllm").iterdir():
        if entry.name.startswith("_C"):
            (shadow / "vllm" / entry.name).write_bytes(b"not a shared object\n")
        else:
            (shadow / "vllm" / entry.name).symlink_to(entry)
    return shadow


@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason=f"no vLLM venv at {VLLM_PYTHON} (scripts/test sets it up)")
def test_failed_check_carries_fix_into_results_and_readiness_table(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(_broken_vllm(tmp_path)))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/hw", "-q", "-p", "no:cacheprovider",
         "-k", "vllm_importable or arch_list", "--vllm-python", str(VLLM_PYTHON),
         "--report-dir", str(tmp_path / "reports")],
        cwd=ROOT, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 1, proc.stdout[-3000:]
    results = json.loads((tmp_path / "reports" / "latest.json").read_text())
    tests = {t["nodeid"].split("::")[-1]: t for t in results["tests"]}
    failed = tests["test_vllm_importable"]
    assert failed["outcome"] == "failed"
    assert "vllm_importable: FAIL" in failed["message"] and "Fix: vLLM's native extension is corrupt" in failed["message"]
    assert failed["record"]["verdict"] == "fail" and "vllm" in failed["record"]["value"]
    rows = {r["check"]: r for r in results["tables"]["Readiness"]}
    assert rows["vllm_importable"]["verdict"] == "fail" and "reinstall vLLM" in rows["vllm_importable"]["fix"]
    environment = results["environment"]
    if not environment["driver_present"]:  # CPU machine: the GPU check skipped with the probe's reason
        assert tests["test_arch_list"]["outcome"] == "skipped"
        assert tests["test_arch_list"]["message"] == results["machine"]["gpu"]["reason"]
        assert rows["arch_list"]["verdict"] == "skip"
    html = (tmp_path / "reports" / "latest.html").read_text()
    assert "Readiness" in html and "native extension is corrupt" in html
