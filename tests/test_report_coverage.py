"""Reports state their coverage: a verdict over skipped checks says how many did not run and why;
the machine line of an --endpoint run describes the server that was tested; no Python reprs."""

from __future__ import annotations

import json
import re

from harness.memory.measured import families_truth
from harness.report import run_html, verdicts
from harness.serving.standin import run_standin


def _serving_run(outcomes: dict[str, int], message: str = "") -> dict:
    tests = []
    for outcome, n in outcomes.items():
        for i in range(n):
            tests.append({"nodeid": f"suites/serving/test_1_vllm_behaviour.py::test_{outcome}_{i}", "outcome": outcome,
                          "duration_s": 1.0, "message": message if outcome == "skipped" else None,
                          "markers": [], "record": {}})
    return {"schema_version": 1, "kind": "pytest-run", "suite": "serving", "status": "finished", "started": 1.8e9,
            "environment": {}, "settings": {}, "tests": tests, "tables": {}, "wall_s": 10.0}


def test_a_serving_verdict_over_skipped_checks_says_how_many_did_not_run_and_why():
    """Before: 'No breakage' (green) with 18 of 35 checks skipped and no baseline."""
    why = "--endpoint given: cannot start the 'old' server"
    (card,) = verdicts.for_run(_serving_run({"passed": 17, "skipped": 18}, why))
    assert card.answer == f"No breakage in 17 checks run; 18 skipped ({why})"
    assert card.state == "warn"  # not green: half the checks did not run
    assert f"18 skipped: {why}" in card.lines


def test_a_serving_verdict_with_every_check_run_is_green_and_counts_them():
    (card,) = verdicts.for_run(_serving_run({"passed": 12}))
    assert card.answer == "No breakage in 12 checks run" and card.state == "good"


def test_the_gate_verdict_also_says_what_was_skipped():
    data = _serving_run({"passed": 3, "skipped": 2}, "destructive: only on servers the harness started")
    data["tables"] = {"Upgrade rehearsal": [{"metric": "ttft_p50", "verdict": "unchanged", "change %": 1.0}]}
    (card,) = verdicts.for_run(data)
    assert card.answer.startswith("Not regressed; 2 skipped (destructive") and card.state == "warn"


def test_the_machine_line_of_an_endpoint_run_describes_the_server_tested(pytester, tmp_path):
    """Before: 'vLLM: not found' (the venv the run came from) right after testing a vLLM server.
    A real OpenAI-compatible server (the harness's stand-in, which answers /version) is tested."""
    pytester.makepyfile(test_x="def test_x(): pass")
    out = pytester.path / "reports"
    with run_standin(log_dir=tmp_path) as server:
        result = pytester.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider", "--endpoint",
                                               server.base_url + "/v1", "--report-dir", str(out))
    assert result.ret == 0
    assert any(line.startswith("harness: server tested: ") and "version standin-1" in line for line in result.outlines)
    data = json.loads((out / "latest.json").read_text())
    seen = data["machine"]["server"]
    assert seen["version"] == "standin-1" and "standin" in seen["models"] and seen["error"] is None
    assert "server tested: " in data["machine"]["line"] and "vLLM:" not in data["machine"]["line"]
    page = (out / "latest.html").read_text()
    line = re.search(r"server tested.{0,400}", page, re.S).group(0)
    assert "version standin-1 (its /version)" in line and "serving standin" in line
    assert "not found" not in page.split("server tested")[0].rsplit("<div", 1)[-1]


def test_a_report_of_no_server_keeps_the_local_vllm():
    page = run_html.render(_serving_run({"passed": 1}))
    assert "server tested" not in page and "vLLM" in page


def test_the_offload_line_of_the_vram_report_is_words_not_a_dict():
    """Before: `layers {'gpu': 2, 'cpu': 46, 'disk': 0}, oom=False`."""
    summary = families_truth.FamilySummary(offload=[{
        "arch": "qwen2.5-7b", "budget_bytes": 6 * 2**30, "layers_on": {"gpu": 2, "cpu": 46, "disk": 0}, "oom": False,
        "predicted_gpu_peak": 5 * 2**30, "measured_gpu_peak": 5 * 2**30, "predicted_ms": 900.0, "h2d_gbps": 12.0,
        "measured_ms": 950.0}])
    (line,) = families_truth.summary_lines(summary)
    assert "layers: 2 on GPU, 46 on CPU, 0 on disk; no OOM" in line
    assert "{" not in line and "oom=" not in line


def test_any_suite_verdict_over_skipped_checks_says_so():
    """The generic card (a suite without its own verdict): 'All passed' only when everything ran."""
    data = _serving_run({"passed": 4, "skipped": 2}, "no bitsandbytes")
    for t in data["tests"]:
        t["nodeid"] = t["nodeid"].replace("suites/serving/", "suites/quant/")
    (card,) = verdicts.for_run(data)
    assert card.answer == "All 4 checks run passed; 2 skipped (no bitsandbytes)" and card.state == "warn"
    data["tests"] = [t for t in data["tests"] if t["outcome"] == "passed"]
    (card,) = verdicts.for_run(data)
    assert card.answer == "All passed" and card.state == "good"
