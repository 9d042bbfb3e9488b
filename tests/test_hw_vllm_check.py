"""The vLLM import check names a native crash with its fix (suites/hw runs it on the real build)."""

import stat

from harness.hw.vllm_check import check_vllm_import


def _interpreter(tmp_path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_illegal_instruction_names_the_cpu_mismatch(tmp_path):
    result = check_vllm_import(_interpreter(tmp_path, "kill -ILL $$"))
    assert result.verdict == "fail"
    assert "SIGILL" in result.value
    assert "CPU instructions this machine lacks" in result.fix


def test_segfault_is_a_native_crash_not_a_missing_module(tmp_path):
    result = check_vllm_import(_interpreter(tmp_path, "echo 'Fatal Python error' >&2; kill -SEGV $$"))
    assert result.verdict == "fail"
    assert "SIGSEGV" in result.value and "Fatal Python error" in result.value
    assert "native code" in result.fix


def test_missing_vllm_says_install_it(tmp_path):
    python = _interpreter(tmp_path, "echo \"ModuleNotFoundError: No module named 'vllm'\" >&2; exit 1")
    result = check_vllm_import(python)
    assert result.verdict == "fail" and "not installed" in result.fix

