"""A failed or errored test's report row carries explain's diagnosis of its error text (in its
record, which the HTML report's "recorded" column shows); a test failing for an unknown reason,
and a passing test, carry none."""

from __future__ import annotations

import json

pytest_plugins = ["pytester"]

SUITE = '''
import pytest

OOM = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 5.80 GiB of which "
       "300.00 MiB is free. Of the allocated memory 5.1 GiB is allocated by PyTorch, and 40.00 MiB is reserved "
       "by PyTorch but unallocated.")

def test_oom():
    raise RuntimeError(OOM)

@pytest.fixture
def vllm_server():
    raise RuntimeError("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens "
                       "that can be stored in KV cache (7344).")

def test_errors_in_setup(vllm_server):
    pass

def test_plain_failure():
    assert 1 + 1 == 3

def test_passes():
    pass
'''


def test_failed_and_errored_rows_carry_the_explanation(pytester):
    pytester.makepyfile(test_suite=SUITE)
    pytester.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider")
    data = json.loads((pytester.path / "reports" / "latest.json").read_text())
    rows = {t["nodeid"].split("::")[-1]: t for t in data["tests"]}
    assert rows["test_oom"]["outcome"] == "failed"
    assert rows["test_oom"]["record"]["explanation"].startswith("[cuda_oom]")
    assert rows["test_errors_in_setup"]["outcome"] == "error"
    assert "--max-model-len 7344" in rows["test_errors_in_setup"]["record"]["explanation"]
    assert "explanation" not in (rows["test_plain_failure"]["record"] or {})
    assert "explanation" not in (rows["test_passes"]["record"] or {})
    assert "[cuda_oom]" in (pytester.path / "reports" / "latest.html").read_text()
