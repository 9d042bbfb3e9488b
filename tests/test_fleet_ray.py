"""`python -m harness fleet` against a real three-node Ray cluster on this machine: node-a healthy
(and without vLLM), node-b with a corrupt vLLM native extension (a real hw check fails there),
node-c killed while its suite runs. The fleet report names the fault, the dead node with what it
finished, and node-a's missing vLLM as a version outlier; nothing hangs, and no pytest outlives
its node. Also: the one-line errors without Ray or a cluster.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_helpers import ROOT, VLLM_PYTHON, processes_with, three_node_run

pytest.importorskip("ray", reason="the fleet extra is not installed (pip install -e '.[fleet]')")
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON.exists(),
                                reason=f"no vLLM venv at {VLLM_PYTHON} (scripts/test sets it up)")


def _fleet(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "fleet", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@needs_vllm
def test_three_nodes_fault_and_killed_node_are_named(tmp_path):
    reports = tmp_path / "reports"
    run = three_node_run(tmp_path, reports)
    stdout = run["stdout"]
    print(f"three-node fleet run: {run['fleet_wall_s']} s wall (cluster start {run['cluster_start_s']} s)\n{stdout}")
    assert run["returncode"] == 1, stdout + run["stderr"][-3000:]
    report = json.loads((reports / "fleet-latest.json").read_text())
    assert report["kind"] == "fleet-run" and report["status"] == "finished" and not report["ok"]
    by_name = {n["name"]: n for n in report["nodes"]}
    assert set(by_name) == {"node-a", "node-b", "node-c"}

    a, b, c = by_name["node-a"], by_name["node-b"], by_name["node-c"]
    assert a["verdict"] == "ready" and a["tests_done"] == report["expected_tests"] > 10
    assert a["gpu_state"] == "absent" and a["ray_gpus"] == 1  # a declared Ray GPU; the probe finds no driver here
    assert [(o["node"], o["what"]) for o in report["outliers"]] == [("node-a", "vLLM")]
    assert report["outliers"][0]["detail"] == "none here; the fleet: 0.32.0 on 2, none on 1 of 3 nodes"
    assert b["verdict"] == "not ready" and [f["test"] for f in b["failures"]] == ["test_vllm_importable"]
    assert "native extension is corrupt" in b["failures"][0]["fix"]
    assert c["verdict"] == "died" and c["state"] == "died"
    assert 1 <= c["tests_done"] < report["expected_tests"], c
    assert "died mid-run after" in c["reason"] and c["versions"]["torch"]  # its partial results came back
    # each node's own pytest report is kept beside the fleet report; the dead node's partial JSON too
    assert (reports / a["html_file"]).is_file() and "node-c.json" in os.listdir(reports / Path(a["html_file"]).parent)

    assert "node-b: NOT READY - 1 failed: vllm_importable" in stdout
    assert "node-c: DIED - died mid-run after" in stdout
    html = (reports / "fleet-latest.html").read_text()
    for text in ("node-b", "native extension is corrupt", "node-c", "died mid-run after", "attention needed"):
        assert text in html, text
    assert not processes_with(f"HARNESS_FLEET_RUN={report['run_id']}"), "a node's pytest outlived the run"


def test_errors_are_one_line_without_a_cluster_or_ray(tmp_path):
    refused = _fleet("--address", "127.0.0.1:1", "--report-dir", str(tmp_path))
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert "cannot reach a Ray cluster at 127.0.0.1:1" in refused.stderr

    no_ray = subprocess.run(
        [sys.executable, "-c", "import sys; sys.modules['ray'] = None; from harness.__main__ import main; "
                               "sys.exit(main(['fleet', '--address', '127.0.0.1:1']))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert no_ray.returncode == 2 and no_ray.stderr.strip() == \
        "harness fleet: error: Ray is not installed: pip install -e '.[fleet]'"

    with socket.socket() as not_ray:  # a port that answers TCP but is no Ray head: ray.init would retry for minutes
        not_ray.bind(("127.0.0.1", 0))
        not_ray.listen()
        port = not_ray.getsockname()[1]
        silent = _fleet("--address", f"127.0.0.1:{port}", "--connect-timeout", "5", "--report-dir", str(tmp_path))
    assert silent.returncode == 2 and silent.stderr.strip().splitlines()[-1] == (
        f"harness fleet: error: cannot connect to the Ray cluster at 127.0.0.1:{port}: no answer within 5 s "
        "(is it the head's GCS port, 6379 by default?)")

    own_dir = _fleet("--address", "127.0.0.1:1", "--", "suites/hw", "--report-dir", "x")
    assert own_dir.returncode == 2 and "--report-dir is set per node by fleet" in own_dir.stderr
    assert not list(tmp_path.iterdir())  # nothing written for a run that never started
