"""The pytest plugin end to end, in a separate pytest process: options, skips, reports."""

import json

import pytest

GPU_TEST = """
import pytest

@pytest.mark.gpu
def test_needs_gpu():
    pass

def test_records(record):
    record(peak_bytes=123, precision="nf4")
    record.row("Readiness", {"check": "driver", "verdict": "pass"})
"""


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider", *args)


def test_bad_vram_budget_is_one_line(pytester):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = run(pytester, "--vram-budget", "banana")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.strip()]
    assert errors == ["ERROR: --vram-budget: 'banana' is not a size (examples: 6GiB, 8GB, 6144MiB)"]


def test_missing_model_is_one_line(pytester):
    pytester.makepyfile(test_x="def test_x(): pass")
    result = run(pytester, "--model", "/nonexistent/model")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "Traceback" not in result.stderr.str()
    assert any("--model: '/nonexistent/model' does not exist" in line for line in result.errlines)


def test_gpu_test_skips_with_probe_reason_and_reports_are_written(pytester):
    pytester.makepyfile(test_gpu=GPU_TEST)
    result = run(pytester, "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*no NVIDIA driver found*"])
    result.stdout.fnmatch_lines(["harness: GPU: none | driver: none | CUDA driver max: - | torch CUDA: cpu-only build*"])
    reports = pytester.path / "reports"
    data = json.loads((reports / "latest.json").read_text())
    assert data["status"] == "finished" and data["summary"] == {"passed": 1, "skipped": 1}
    by_id = {t["nodeid"].split("::")[-1]: t for t in data["tests"]}
    assert by_id["test_needs_gpu"]["message"].startswith("no NVIDIA driver found")
    assert by_id["test_records"]["record"] == {"peak_bytes": 123, "precision": "nf4"}
    assert data["tables"]["Readiness"] == [{"check": "driver", "verdict": "pass"}]
    html = (reports / "latest.html").read_text()
    assert "Readiness" in html and "cpu-only build" in html
    assert "<script src=" not in html and "<link rel=\"stylesheet\" href=" not in html  # self-contained
    named = sorted(p.name for p in reports.iterdir() if not p.name.startswith("latest") and p.name != "index.html")
    assert len(named) == 2 and named[0].endswith(".html") and named[1].endswith(".json")


def test_expect_gpu_turns_the_skip_into_a_failure(pytester):
    pytester.makepyfile(test_gpu=GPU_TEST)
    result = run(pytester, "--expect-gpu")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*--expect-gpu: no NVIDIA driver found*"])


def test_interrupted_run_leaves_valid_partial_reports(pytester):
    pytester.makepyfile(test_int="""
        def test_first(record):
            record(done=True)
        def test_interrupt():
            raise KeyboardInterrupt
        def test_never():
            pass
    """)
    result = run(pytester)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    data = json.loads((pytester.path / "reports" / "latest.json").read_text())
    assert data["status"] == "interrupted"
    assert [t["nodeid"].split("::")[-1] for t in data["tests"]] == ["test_first"]
    assert "test_first" in (pytester.path / "reports" / "latest.html").read_text()


def test_report_dir_option_and_suite_name(pytester):
    suite = pytester.mkpydir("suites")
    hw = suite / "hw"
    hw.mkdir()
    (hw / "test_a.py").write_text("def test_a(): pass\n")
    result = run(pytester, "suites/hw", "--report-dir", str(pytester.path / "out"))
    result.assert_outcomes(passed=1)
    names = sorted(p.name for p in (pytester.path / "out").iterdir())
    assert any(n.startswith("hw-") and n.endswith(".html") for n in names)
    assert "latest.html" in names


def test_vllm_marker_fails_when_the_given_interpreter_has_no_vllm(pytester):
    import sys

    pytester.makepyfile(test_v="""
        import pytest
        @pytest.mark.vllm
        def test_serve(): pass
    """)
    result = run(pytester, f"--vllm-python={sys.executable}")  # one token: a bare path would move the rootdir
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*vLLM is not installed in*"])


def test_a_plain_run_over_testpaths_is_named_all(pytester):
    pytester.makeini("[pytest]\ntestpaths = suites tests\n")
    for folder, name in (("suites/hw", "test_hw.py"), ("tests", "test_own.py")):
        (pytester.path / folder).mkdir(parents=True)
        (pytester.path / folder / name).write_text("def test_one(): pass\n")
    result = run(pytester)
    result.assert_outcomes(passed=2)
    names = [p.name for p in (pytester.path / "reports").iterdir()]
    assert any(n.startswith("all-") and n.endswith(".json") for n in names), names
