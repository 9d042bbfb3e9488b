"""The fleet's verdicts from nodes' results: the figures and versions of a real H200 run
(tests/data/fleet/h200-xdist-hw.json: `pytest -n auto suites/hw --hw-level full` on a lent H200,
scripts/gpu/fleet.sh), copied to several nodes and changed the way a fleet differs: one card with
a slow memory copy, one host on another driver, one node dead half way."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from harness.fleet import html as fleet_html
from harness.fleet.aggregate import environment_from_dict, figures_of, fleet_report
from harness import env as env_mod

H200 = json.loads((Path(__file__).parent / "data" / "fleet" / "h200-xdist-hw.json").read_text())


def _node(name: str, results: dict | None, state: str = "finished", exit_code: int | None = 0, **extra) -> dict:
    node = {"node_id": f"{name}-0123456789abcdef", "ip": "10.0.0.1", "host": name, "name": name, "gpus": 1.0}
    return {"node": node, "state": state, "exit_code": exit_code, "results": results, **extra}


def _scaled(check: str, factor: float) -> dict:
    results = copy.deepcopy(H200)
    for t in results["tests"]:
        details = t["record"].get("details") or {}
        if t["record"].get("check") == check:
            for key in ("gbps", "tflops"):
                if key in details:
                    details[key] *= factor
    return results


def test_real_h200_run_reads_as_a_ready_node_with_its_figures():
    environment = environment_from_dict(H200["environment"])
    assert env_mod.gpu_readiness(environment).state == "ready"
    figures = {f.metric: round(f.value, 1) for f in figures_of(H200)}
    assert figures == {"d2d_bandwidth": 4243.8, "bf16_matmul_tflops": 793.7, "h2d_bandwidth": 55.0}
    report = fleet_report([_node("h200-a", H200)])
    node = report.nodes[0]
    assert node.verdict == "ready" and node.gpu_reason == "1 GPU(s): NVIDIA H200"
    assert node.versions["driver"] == "580.159.04" and node.versions["cuda_driver"] == "13.0"
    assert report.ok and not report.outliers  # one node: nothing to compare with


def test_slow_card_and_other_driver_are_outliers():
    other_driver = copy.deepcopy(H200)
    other_driver["environment"]["nvml"]["driver_version"] = "570.86.15"
    report = fleet_report([_node("h200-a", H200), _node("h200-b", _scaled("d2d_bandwidth", 0.6)),
                           _node("h200-c", other_driver), _node("h200-d", _scaled("bf16_matmul_tflops", 0.8))])
    found = {(o.node, o.what): o.detail for o in report.outliers}
    assert set(found) == {("h200-b", "D2D bandwidth on GPU0 (NVIDIA H200)"), ("h200-c", "NVIDIA driver")}
    assert found[("h200-b", "D2D bandwidth on GPU0 (NVIDIA H200)")].startswith("2546 GB/s is 0.60 x the median of 4")
    assert found[("h200-c", "NVIDIA driver")] == "570.86.15 here; the fleet: 580.159.04 on 3, 570.86.15 on 1 of 4 nodes"
    assert all(n.verdict == "ready" for n in report.nodes) and not report.ok  # ready, but not alike
    page = fleet_html.render(report)
    assert "0.60 x the median" in page and "570.86.15" in page


def test_a_split_fleet_has_no_majority_and_flags_both():
    other = copy.deepcopy(H200)
    other["environment"]["nvml"]["driver_version"] = "575.51.03"
    report = fleet_report([_node("a", H200), _node("b", other)])
    assert {(o.node, o.detail.endswith("(no majority)")) for o in report.outliers} == {("a", True), ("b", True)}


def test_dead_node_keeps_what_it_finished_and_failures_name_the_fix():
    partial = copy.deepcopy(H200)
    partial["tests"] = partial["tests"][:9]
    partial["status"] = "running"
    failing = copy.deepcopy(H200)
    bnb = next(t for t in failing["tests"] if t["nodeid"].endswith("test_bnb_native_library"))
    bnb.update(outcome="failed", message="bnb_native_library: FAIL - libbitsandbytes_cpu.so loaded")
    bnb["record"]["fix"] = "reinstall bitsandbytes with CUDA"
    report = fleet_report([
        _node("ok", H200),
        _node("dead", partial, state="died", exit_code=None, error="NodeDiedError: Task failed"),
        _node("broken", failing, exit_code=1),
        _node("late", None, state="timed out", exit_code=None, error="never started within 60 s"),
    ])
    by = {n.name: n for n in report.nodes}
    assert report.expected_tests == 26
    assert by["dead"].verdict == "died" and by["dead"].tests_done == 9
    assert by["dead"].reason == "died mid-run after 9 of 26 tests: NodeDiedError: Task failed"
    assert by["broken"].reason == "1 failed: bnb_native_library (fix: reinstall bitsandbytes with CUDA)"
    assert by["broken"].verdict == "not ready" and by["broken"].failures == [
        {"test": "test_bnb_native_library", "message": "bnb_native_library: FAIL - libbitsandbytes_cpu.so loaded",
         "fix": "reinstall bitsandbytes with CUDA"}]
    assert by["late"].verdict == "timed out" and by["late"].gpu_state == "unknown"
    assert report.counts == {"ready": 1, "not ready": 1, "died": 1, "timed out": 1}
    assert not report.outliers  # a node with no results has no versions to compare
    page = fleet_html.render(report)
    for text in ("died mid-run after 9 of 26 tests", "reinstall bitsandbytes with CUDA", "never started"):
        assert text in page
