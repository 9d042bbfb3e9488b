"""Fuzz `report` and `compare` through the command's main entry, in process: whatever the files
hold (arbitrary JSON, a valid bench results file or a pytest run's results file with parts
replaced, removed or retyped, truncated or random bytes), the answer is exit 0, 1 or 2 and never
an uncaught exception.

HARNESS_FUZZ_EXAMPLES sets the examples per test (default 60: CI time); HARNESS_FUZZ_OUT, a JSON
file to write the counts to (benchmarks/serving/fuzz_results.py uses both).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from harness.__main__ import main

from serving_results import make_results

EXAMPLES = int(os.environ.get("HARNESS_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("HARNESS_FUZZ_EXAMPLES"),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COUNTS: Counter = Counter()  # (command, exit code) -> inputs

VALID = make_results(seed=1, runs=3, requests=4)
OTHER_VALID = make_results(seed=2, runs=3, requests=4)


def _pytest_run() -> dict:
    """A pytest run's results as the plugin writes them (report renders these too)."""
    from harness import env as env_mod
    from harness.report.results import RunResults, TestResult

    run = RunResults(path=Path("unused.json"), suite="serving", environment=env_mod.probe_environment(None).to_dict(),
                     settings={"device": "auto", "endpoint": None})
    run.tests = [TestResult("suites/serving/test_x.py::test_a", "passed", 1.5, record={"ttft_ms": 12.5}),
                 TestResult("suites/serving/test_x.py::test_b", "failed", 0.2, "AssertionError: 3 != 4"),
                 TestResult("suites/serving/test_x.py::test_c", "skipped", 0.0, "destructive: never run against --endpoint")]
    run.tables = {"Concurrency sweep": [{"server": "new", "concurrency": 4, "TTFT p50 ms": 80.0, "verdict": "pass"}]}
    return run.to_dict()


PYTEST_RUN = _pytest_run()

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                           max_leaves=12)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


@st.composite
def mutated_results(draw):
    """A valid results file with 1-3 parts replaced by arbitrary JSON, removed, or emptied."""
    data = copy.deepcopy(draw(st.sampled_from([VALID, OTHER_VALID, PYTEST_RUN])))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "delete", "empty", "zero"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "empty":
            parent[path[-1]] = type(parent[path[-1]])() if isinstance(parent[path[-1]], (dict, list, str)) else None
        elif action == "zero":
            parent[path[-1]] = draw(st.sampled_from([0, 0.0, -1, 1e300, 2**60, "", [], {}]))
        else:
            parent[path[-1]] = draw(json_values)
    return json.dumps(data, allow_nan=True)


def _as_text(value) -> str:
    return json.dumps(value, allow_nan=True)


file_contents = st.one_of(
    mutated_results(),
    json_values.map(_as_text),
    st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
    st.integers(0, len(json.dumps(VALID)) - 1).map(lambda n: json.dumps(VALID)[:n]),  # truncated
    st.integers(1, 3000).map(lambda n: "[" * n + "]" * n),  # deep nesting
)


def _run(command: str, argv: list[str]) -> int:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main([command, *argv])  # an uncaught exception fails the example
    assert code in (0, 1, 2, 3), (code, err.getvalue())  # 3: compare UNDECIDED
    assert "Traceback" not in err.getvalue(), err.getvalue()
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
    COUNTS[(command, code)] += 1
    return code


@pytest.fixture(scope="module", autouse=True)
def counts(request):
    COUNTS.clear()
    yield COUNTS
    out = os.environ.get("HARNESS_FUZZ_OUT")
    if out:
        Path(out).write_text(json.dumps({f"{c} exit {code}": n for (c, code), n in sorted(COUNTS.items())}, indent=1))


# Found by the fuzzer: a model name holding a carriage return split the refusal over two lines.
CARRIAGE_RETURN_MODEL = json.dumps({**VALID, "environment": {**VALID["environment"], "model_id": "\r"}})


@FUZZ
@given(content=file_contents, candidate_side=st.booleans())
@example(content=CARRIAGE_RETURN_MODEL, candidate_side=False)
def test_compare_never_raises(content, candidate_side):
    with tempfile.TemporaryDirectory() as tmp:
        fuzzed, good = Path(tmp) / "fuzzed.json", Path(tmp) / "good.json"
        fuzzed.write_text(content, encoding="latin-1" if not content.isascii() else "utf-8")
        good.write_text(json.dumps(VALID))
        pair = [str(good), str(fuzzed)] if candidate_side else [str(fuzzed), str(good)]
        _run("compare", pair + ["--min-repeats", "1"])


# Found by the fuzzer: a pytest run's environment with "nvml": null crashed the Environment table.
NULL_NVML_RUN = json.dumps({**PYTEST_RUN, "environment": {**PYTEST_RUN["environment"], "nvml": None}})


@FUZZ
@given(content=file_contents, compare=st.booleans())
@example(content=NULL_NVML_RUN, compare=False)
def test_report_never_raises(content, compare):
    with tempfile.TemporaryDirectory() as tmp:
        fuzzed, good = Path(tmp) / "fuzzed.json", Path(tmp) / "good.json"
        fuzzed.write_text(content, encoding="latin-1" if not content.isascii() else "utf-8")
        good.write_text(json.dumps(OTHER_VALID))
        files = [str(good), str(fuzzed)] if compare else [str(fuzzed)]
        _run("report", files + (["--compare"] if compare else []) + ["--out", str(Path(tmp) / "r.html")])


def test_the_fuzzers_reached_both_sides_of_validation(counts, record):
    """Ran last in this module: most inputs are refused (exit 2), and some valid mutations got
    through to the comparison and the renderer (exit 0 or 1)."""
    record(**{f"{c}_exit_{code}": n for (c, code), n in counts.items()}, examples_per_test=EXAMPLES)
    for command in ("compare", "report"):
        refused = counts[(command, 2)]
        accepted = counts[(command, 0)] + counts[(command, 1)]
        assert refused > 0 and accepted > 0, dict(counts)
