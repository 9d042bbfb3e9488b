"""The root conftest's queue under `scripts/test`'s xdist run: the longest units are handed out first.
xdist's workers collect with their own --dist set to "no", and it is their collection order that the
loadscope scheduler queues, so the order must be made on the workers (it once was not: the two
longest units ran last)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_workers_queue_the_longest_units_first(pytester, monkeypatch):
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    tests = pytester.mkdir("tests")
    # alphabetical (collection) order: a_short, drift, estimate_uncertainty; LONGEST says the other way
    for name in ("test_a_short", "test_drift", "test_estimate_uncertainty"):
        (tests / f"{name}.py").write_text("def test_it():\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope",
                                           "--no-loadscope-reorder", "-v", "tests")
    result.assert_outcomes(passed=3)
    ran = re.findall(r"\[(gw\d)\] .*PASSED tests/(test_\w+)\.py", result.stdout.str())
    by_worker = {}
    for worker, name in ran:
        by_worker.setdefault(worker, []).append(name)
    # the first unit to the first worker, the second to the second, the last one queued after them
    assert sorted(by_worker.values()) == [["test_drift"], ["test_estimate_uncertainty", "test_a_short"]], ran
