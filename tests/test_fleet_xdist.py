"""`pytest -n N` (pytest-xdist): each worker gets a GPU of its own through CUDA_VISIBLE_DEVICES,
and the workers' results land in one JSON and one HTML that only the controller writes; a worker
that crashes is reported, and a replacement takes its place on a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.fleet.gpus import pick_gpu, visible_gpus
from harness.fleet.merge import Outbox, WorkerLedger

ROOT = Path(__file__).resolve().parents[1]
pytest.importorskip("xdist", reason="pytest-xdist is not installed")

SUITE = '''
import os
import pytest

@pytest.mark.parametrize("i", range(6))
def test_sees_its_gpu(i, record):
    record(seen=os.environ.get("CUDA_VISIBLE_DEVICES"), i=i)
    record.row("Seen", {"i": i, "cvd": os.environ.get("CUDA_VISIBLE_DEVICES")})

def test_fails(record):
    record(figure=1.5)
    assert False, "planted failure"

def test_worker_dies():
    os._exit(3)
'''


def test_workers_get_their_own_gpu_and_one_report(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_planted.py").write_text(SUITE)
    reports = tmp_path / "reports"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", str(suite), "-p", "no:cacheprovider",
                           "--report-dir", str(reports), "-q"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((reports / "latest.json").read_text())
    assert results["status"] == "finished"
    tests = results["tests"]
    assert results["summary"] == {"passed": 6, "failed": 1, "error": 1}, results["summary"]

    seen = [t for t in tests if "test_sees_its_gpu" in t["nodeid"]]
    # what the test saw in its own process is what the controller assigned to that worker
    assert all(t["record"]["seen"] == t["record"]["cuda_visible_devices"] for t in seen)
    by_worker = {t["record"]["xdist_worker"]: t["record"]["seen"] for t in seen}
    assert len(set(by_worker.values())) >= 1 and set(by_worker.values()) <= {"3", "5"}
    assert sorted(r["i"] for r in results["tables"]["Seen"]) == list(range(6))  # rows from every worker

    crashed = next(t for t in tests if t["nodeid"].endswith("test_worker_dies"))
    assert crashed["outcome"] == "error" and "crashed while running" in crashed["message"]
    workers = {r["worker"]: r for r in results["tables"]["Workers"]}
    dead = workers[crashed["record"]["xdist_worker"]]
    assert dead["status"].startswith("crashed") and dead["CUDA_VISIBLE_DEVICES"] == crashed["record"]["cuda_visible_devices"]
    # xdist starts a replacement at once; which GPU it gets depends on whether the other worker is
    # still running then (the rule itself: test_pick_gpu_balances_and_refills_a_crashed_workers_gpu)
    replacement = [w for w in workers.values() if w["worker"] not in ("gw0", "gw1")]
    assert len(replacement) == 1 and replacement[0]["CUDA_VISIBLE_DEVICES"] in ("3", "5")
    assert sum(w["tests"] for w in workers.values()) == len(tests)

    # only the controller wrote: one run's JSON and HTML, their latest.* copies and the index
    names = sorted(p.name for p in reports.iterdir() if p.name != "index.html")
    assert len(names) == 4 and {"latest.json", "latest.html"} <= set(names), names
    html = (reports / "latest.html").read_text()
    assert "<b>Seen</b>" in html and "<b>Workers</b>" in html and "planted failure" in html


def test_visible_gpus_read_cuda_visible_devices_as_cuda_does():
    assert visible_gpus(None, 2) == ["0", "1"]
    assert visible_gpus("1,0", 4) == ["1", "0"]
    assert visible_gpus("GPU-8a1b,2,-1,3", 4) == ["GPU-8a1b", "2"]  # CUDA stops at the first bad entry
    assert visible_gpus("", 4) == [] and visible_gpus("-1", 4) == []


def test_pick_gpu_balances_and_refills_a_crashed_workers_gpu():
    assert pick_gpu({}, []) is None
    assert pick_gpu({"gw0": "0"}, ["0", "1"]) == "1"
    assert pick_gpu({"gw0": "0", "gw1": "1"}, ["0", "1"]) == "0"  # more workers than GPUs: share, evenly
    ledger = WorkerLedger(["0", "1"], {"0": "H200", "1": "H200"})
    assert [ledger.assign(w) for w in ("gw0", "gw1")] == ["0", "1"]
    ledger.down("gw1", "Not properly terminated")
    assert ledger.assign("gw2") == "1" and ledger.workers["gw1"].status == "crashed"


def test_outbox_sends_each_row_once():
    box, tables, fragments, figures = Outbox(), {"T": [{"a": 1}]}, [("plot", "<svg/>")], []
    assert box.drain(tables, fragments, figures) == ([["T", {"a": 1}]], [["plot", "<svg/>"]], [])
    tables["T"].append({"a": float("nan")})
    tables["U"] = [{"b": Path("/x")}]
    figures.append({"kind": "lines", "title": "TTFT", "data": {"x": [1]}})
    assert box.drain(tables, fragments, figures) == ([["T", {"a": "nan"}], ["U", {"b": "/x"}]], [],
                                                     [{"kind": "lines", "title": "TTFT", "data": {"x": [1]}}])
    assert box.drain(tables, fragments, figures) == ([], [], [])
