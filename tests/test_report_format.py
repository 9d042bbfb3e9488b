"""Plain formatting in reports: no Python reprs, a unit on every measured number, counts that
match the tests that ran; verdicts read from results; a report re-renders from its JSON."""

from __future__ import annotations

import re

import pytest

from harness.report import fmt, html, run_html, verdicts


@pytest.mark.parametrize("key,value,text", [
    ("peak_bytes", 6_825_984, "6.51 MiB"),
    ("measured", 2 * 2**30, "2.00 GiB"),
    ("chain_seconds", 4.2, "4.2 s"),
    ("duration_s", 125, "2 min 05 s"),
    ("ttft_ms", 38.123456, "38.12 ms"),
    ("median_abs_error", 0.0043, "0.43 %"),
    ("error", -0.0152, "-1.52 %"),
    ("budget_agreement", 0.995, "99.5 %"),
    ("nvml_rate_hz", 176.8, "176.8 Hz"),
    ("lora r", None, fmt.DASH),
    ("refused", True, "yes"),
    ("errors", {"connection": 3, "no_done": 1}, "connection: 3; no done: 1"),
    ("disagreements", ["a", "b"], "a, b"),
    ("cause", [], fmt.DASH),
])
def test_values_are_plain_text_with_units(key, value, text):
    assert fmt.value(value, key) == text


def test_skip_reason_from_an_old_tuple_repr():
    old = "('/x/suites/vram/test_vram.py', 141, 'Skipped: no NVIDIA driver found')"
    assert fmt.skip_reason(old) == "no NVIDIA driver found"


def test_table_cells_never_show_python_reprs():
    page = html.table("t", [{"seeded burst": {"error_frame": 48}, "lora r": None, "ok": False,
                             "pair": ("a", "b")}])
    cells = re.findall(r"<td[^>]*>(.*?)</td>", page)
    assert cells == ["error frame: 48", fmt.DASH, "no", "a, b"]


def _results(outcomes: list[str], **extra) -> dict:
    tests = [{"nodeid": f"suites/hw/test_quick.py::test_{i}", "outcome": o, "duration_s": 1.0, "message": None,
              "markers": [], "record": {}} for i, o in enumerate(outcomes)]
    return {"schema_version": 1, "kind": "pytest-run", "suite": "hw", "status": "finished", "started": 1.8e9,
            "environment": {}, "settings": {}, "tests": tests, "tables": {}, "wall_s": 15.2} | extra


def test_counts_line_counts_every_test_that_ran():
    page = run_html.render(_results(["passed"] * 11 + ["skipped"] * 4))
    counts = re.search(r'<div class="counts" id="counts">(.*?)</div>', page).group(1)
    assert "15 tests</b>: 11 passed, 4 skipped" in counts
    assert "time in tests 15.0 s" in counts and "wall time 15.2 s" in counts


def test_hw_verdict_names_each_failing_check_and_its_fix():
    rows = [{"check": "driver", "value": "driver 470", "expectation": ">= 525", "verdict": "fail",
             "fix": "update the NVIDIA driver"},
            {"check": "bf16", "value": "capability 9.0", "expectation": "", "verdict": "pass", "fix": ""}]
    data = _results(["failed", "passed"], tables={"Readiness": rows},
                    machine={"gpu": {"state": "ready", "reason": "1 GPU(s): H200"}})
    data["tests"][0]["nodeid"] = "suites/hw/test_quick.py::test_driver"
    (card,) = verdicts.for_run(data)
    assert card.answer == "Not ready" and card.state == "bad"
    assert card.lines == ["driver: driver 470"] and card.fixes == ["update the NVIDIA driver"]


def test_serving_verdict_regressed_inconclusive_not():
    def card(verdict_words):
        rows = [{"metric": f"m{i}", "verdict": v, "change %": 30.0} for i, v in enumerate(verdict_words)]
        data = _results(["passed"], tables={"Upgrade rehearsal": rows})
        data["tests"][0]["nodeid"] = "suites/serving/test_3_upgrade.py::test_upgrade_rehearsal_report"
        return verdicts.for_run(data)[0].answer

    assert card(["unchanged", "regressed"]) == "Regressed"
    assert card(["unchanged", "inconclusive"]) == "Inconclusive"
    assert card(["unchanged", "improved"]) == "Not regressed"


def test_an_interrupted_run_says_so_first():
    cards = verdicts.for_run(_results(["passed"], status="interrupted"))
    assert cards[0].answer == "Interrupted"


def test_the_results_file_after_each_test_is_the_document_so_far(tmp_path):
    """RunResults writes after every test without encoding the earlier ones again: each file on the
    way is valid JSON equal to to_dict() (non-finite numbers as strings), and the last is indented."""
    import json
    import math

    from harness.report.results import RunResults, TestResult

    run = RunResults(path=tmp_path / "r.json", suite="t", environment={"gpu": None}, settings={"x": 1})
    run.add_row("table", {"ratio": math.inf})
    for i, record in enumerate(({}, {"peak": math.nan, "path": tmp_path}, {"rows": [1, (2, 3)]})):
        run.add_test(TestResult(f"t.py::test_{i}", "passed", 0.1 * i, record=record))
        on_disk = json.loads(run.path.read_text())
        assert on_disk == json.loads(json.dumps(run.to_dict() | {"updated": on_disk["updated"]}, default=str))
        assert [t["nodeid"] for t in on_disk["tests"]] == [f"t.py::test_{j}" for j in range(i + 1)]
    assert on_disk["tests"][1]["record"] == {"peak": "nan", "path": str(tmp_path)}
    assert on_disk["tables"]["table"] == [{"ratio": "inf"}] and on_disk["status"] == "running"
    run.finish(interrupted=False)
    assert json.loads(run.path.read_text())["status"] == "finished" and "\n " in run.path.read_text()
