"""The root conftest's queue under `scripts/test`'s xdist run: the longest units are handed out first.
xdist's workers collect with their own --dist set to "no", and it is their collection order that the
loadscope scheduler queues, so the order must be made on the workers (it once was not: the two
longest units ran last)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_workers_queue_the_longest_units_first(pytester, monkeypatch):
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    tests = pytester.mkdir("tests")
    # alphabetical (collection) order: a_short, drift, estimate_uncertainty; LONGEST says the other way
    keys = ("VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS")
    for name in ("test_a_short", "test_drift", "test_estimate_uncertainty"):  # each says what it inherited
        (tests / f"{name}.py").write_text(
            "import json, os\n\ndef test_it():\n    worker = os.environ['PYTEST_XDIST_WORKER']\n"
            f"    open(os.path.join({str(pytester.path)!r}, worker + '-{name}'), 'w')"
            f".write(json.dumps({{k: os.environ.get(k) for k in {keys!r}}}))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    for key in keys:
        monkeypatch.delenv(key, raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope",
                                           "--no-loadscope-reorder", "-v", "tests")
    result.assert_outcomes(passed=3)
    ran = re.findall(r"\[(gw\d)\] .*PASSED tests/(test_\w+)\.py", result.stdout.str())
    by_worker = {}
    for worker, name in ran:
        by_worker.setdefault(worker, []).append(name)
    # each worker starts on one of the two longest units; the short one is queued behind one of them
    # (which worker takes it is xdist's choice: its first node gets a second unit at once)
    assert sorted(names[0] for names in by_worker.values()) == ["test_drift", "test_estimate_uncertainty"], ran
    assert sorted(sum(by_worker.values(), [])) == ["test_a_short", "test_drift", "test_estimate_uncertainty"], ran
    # every worker's environment, which the vLLM servers it starts inherit: vLLM's worker in-process, one
    # OpenMP thread
    for worker, names in by_worker.items():
        for name in names:
            seen = json.loads((pytester.path / f"{worker}-{name}").read_text())
            assert seen == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}, (worker, name)


def _tree(pytester, monkeypatch, files: dict[str, str]) -> None:
    shutil.copy(ROOT / "conftest.py", pytester.path / "conftest.py")
    for rel, text in files.items():
        path = pytester.path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


MARKED = "import pytest\n\n@pytest.mark.alone\ndef test_timed():\n    pass\n\ndef test_plain():\n    pass\n"


def test_the_serial_run_collects_only_the_files_that_mark_a_test_alone(pytester, monkeypatch):
    """scripts/test's `-m alone --only-alone-files`: the same alone tests as a whole-tree collection,
    and no other file imported (a file that would fail to import shows it was not collected)."""
    _tree(pytester, monkeypatch, {"tests/test_timed.py": MARKED,
                                  "tests/test_other.py": "raise SystemExit('collected')\n",
                                  "suites/s1/test_x.py": "import pytest\npytestmark = pytest.mark.alone\ndef test_x():\n    pass\n",
                                  "suites/s2/conftest.py": "raise SystemExit('collected')\n",
                                  "suites/s2/test_y.py": "def test_y():\n    pass\n"})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-m", "alone", "--only-alone-files", "-v", "tests", "suites")
    result.assert_outcomes(passed=2, deselected=1)
    assert {"tests/test_timed.py::test_timed", "suites/s1/test_x.py::test_x"} == set(
        re.findall(r"^(\S+::\S+) PASSED", result.stdout.str(), re.M))


def test_an_alone_mark_the_file_scan_cannot_see_stops_the_run(pytester, monkeypatch):
    """A test marked alone from outside its file (here a conftest hook) would be in neither of
    scripts/test's runs: the parallel run's collection refuses it, by name."""
    _tree(pytester, monkeypatch, {
        "tests/conftest.py": "import pytest\n\ndef pytest_collection_modifyitems(items):\n"
                             "    for item in items:\n        item.add_marker(pytest.mark.alone)\n",
        "tests/test_hidden.py": "def test_it():\n    pass\n"})
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope", "-m", "not alone", "tests")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "cannot see it" in result.stdout.str() and "tests/test_hidden.py" in result.stdout.str()
