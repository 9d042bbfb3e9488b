"""What a fleet node runs, without Ray: pytest in the node's checkout with a private report
directory; a suite that outlives its timeout is stopped (its whole process group) and returns
what it finished, having published its partial results on the way."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fleet_helpers import processes_with
from harness.fleet.node_run import RUN_MARKER, run_suite

ROOT = Path(__file__).resolve().parents[1]

SLOW_SUITE = '''
import subprocess, time

def test_quick(record):
    record(figure=42.0)

def test_hangs():
    subprocess.run(["sleep", "300"])  # a child of pytest: stopped with its group
'''


def test_timeout_stops_the_run_and_keeps_what_finished(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_slow.py").write_text(SLOW_SUITE)
    env = dict(os.environ, **{RUN_MARKER: f"node-run-test-{os.getpid()}"})
    # 10 s is ample for pytest to start and pass test_quick on a quiet box; a busy one that had not
    # even finished test_quick by then gets one more try at 30 s (the old fixed timeout, 20 s idle).
    for timeout_s in (10, 30):
        published = []
        out = run_suite(str(ROOT), [str(suite), "-q"], sys.executable, timeout_s=timeout_s,
                        publish=published.append, env=env, poll_s=0.2)
        if out["state"] != "timed out" or (out.get("results") or {}).get("tests"):
            break
    assert out["state"] == "timed out", out["log_tail"]
    tests = out["results"]["tests"]
    assert [(t["nodeid"].split("::")[-1], t["outcome"]) for t in tests] == [("test_quick", "passed")]
    # never "finished": killed mid-run ("running", its last snapshot) or stopped in order by a plugin that
    # takes SIGTERM as an interrupt ("interrupted")
    assert tests[0]["record"] == {"figure": 42.0} and out["results"]["status"] in ("running", "interrupted")
    assert published and published[-1]["results"]["tests"] == tests  # sent while it ran
    assert not processes_with(f"{RUN_MARKER}=node-run-test-{os.getpid()}"), "pytest or its sleep outlived the timeout"


def test_a_node_without_the_checkout_says_so(tmp_path):
    out = run_suite(str(tmp_path), ["suites/hw"], sys.executable, timeout_s=5, publish=lambda s: None,
                    env=dict(os.environ))
    assert out == {"state": "error", "error": f"no harness checkout at {tmp_path} on this node (fleet --root)"}
