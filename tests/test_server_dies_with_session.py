"""Every server the harness starts dies with the process that started it, however that ends.

Seen: `timeout 900 python -m pytest suites/quant` (SIGTERM) left its vLLM server running 13 minutes
with parent 1. Each test here starts a real server through the launcher users go through (the
stand-in via run_standin, or a server that ignores SIGTERM and has a child, as vLLM's API server
with its engine core may) from a real pytest session or Python process, ends that process, and
asserts that no live process of the server's group is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 15.0
UP_WITHIN_S = 120.0  # the server's start on a loaded 2-core box

# A server that ignores SIGTERM (as a busy vLLM may, or one stuck in its own shutdown) with a child
# that ignores it too (an engine core the leader does not take down with it).
STUBBORN_SERVER = """
import http.server, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
"""

# The parent: starts the server as the harness does, says its group, then waits to be ended.
PARENT = """
import json, signal, sys, threading, time
from harness.serving.launcher import free_port, start_process
from harness.serving.standin import run_standin
kind, where, then, stubborn, logs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
signal.signal(signal.SIGINT, signal.default_int_handler)  # as at a terminal, also when started in the background

def serve():
    if kind == "standin":
        server = run_standin(log_dir=logs)
    else:
        port = free_port()
        server = start_process([sys.executable, "-c", stubborn, str(port)], port=port, health_path="/",
                               startup_timeout_s=120, name="stubborn", progress=False, log_path=f"{logs}/stubborn.log")
    with server as s:
        print(json.dumps({"pgid": s.pid}), flush=True)
        time.sleep(600)

if where == "thread":
    threading.Thread(target=serve, daemon=True).start()
    if then == "exit":  # a normal exit with the server still up in its thread: atexit's turn
        sys.stdin.readline()
        sys.exit(0)
    time.sleep(600)
else:
    serve()
"""

SESSION_TEST = """
import json, os, time
import pytest
from harness.serving.standin import run_standin

@pytest.fixture
def standin():
    with run_standin(log_dir=os.path.dirname(os.environ["TEARDOWN_MARK"])) as server:
        yield server
    open(os.environ["TEARDOWN_MARK"], "w").close()

def test_serves(standin):
    with open(os.environ["PGID_FILE"], "w") as f:
        json.dump({"pgid": standin.pid}, f)
    time.sleep(600)
"""


def live_members(pgid: int) -> list[str]:
    """The group's processes that are not zombies, as ps sees them."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True).stdout
    return [line.strip()[:120] for line in out.splitlines()
            if line.split()[1] == str(pgid) and not line.split()[2].startswith("Z")]


def wait_gone(pgid: int, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := live_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def assert_group_gone(pgid: int) -> float:
    started = time.monotonic()
    left = wait_gone(pgid, GONE_WITHIN_S)
    if left:
        os.killpg(pgid, signal.SIGKILL)  # do not leak it into the next test
    assert not left, f"still alive {GONE_WITHIN_S:.0f} s after the parent ended: {left}"
    return time.monotonic() - started


def env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


def start_parent(logs: Path, kind: str, where: str, then: str = "") -> tuple[subprocess.Popen, int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, kind, where, then, STUBBORN_SERVER, str(logs)], cwd=ROOT, env=env(),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = parent.stdout.readline()
    if not line:
        parent.kill()
        pytest.fail(f"the parent exited with {parent.wait()} before its server was up")
    pgid = json.loads(line)["pgid"]
    assert live_members(pgid), "the server is not running"
    return parent, pgid


@pytest.mark.parametrize("sig, where, kind", [
    (signal.SIGKILL, "main", "standin"),    # no teardown, no atexit: the death signal and the reaper
    (signal.SIGKILL, "thread", "standin"),  # no death signal from a worker thread: the reaper alone
    (signal.SIGKILL, "main", "stubborn"),   # SIGTERM ignored by leader and child: SIGKILL after the grace
    (signal.SIGTERM, "thread", "standin"),  # a command (harness gate) under `timeout`: Python dies at once
    (signal.SIGINT, "main", "standin"),     # Ctrl-C: KeyboardInterrupt unwinds the `with` (stop_group)
], ids=["sigkill-main-standin", "sigkill-thread-standin", "sigkill-main-stubborn", "sigterm-thread-standin",
        "sigint-main-standin"])
def test_server_group_dies_with_its_parent_process(sig, where, kind, tmp_path):
    parent, pgid = start_parent(tmp_path, kind, where)
    try:
        parent.send_signal(sig)
        parent.wait(timeout=30)
        assert_group_gone(pgid)
    finally:
        parent.kill()
        parent.wait()


def test_server_group_dies_on_a_normal_exit_that_left_it_running(tmp_path):
    parent, pgid = start_parent(tmp_path, "stubborn", "thread", then="exit")
    try:
        parent.stdin.write("\n")
        parent.stdin.flush()
        assert parent.wait(timeout=30) == 0
        assert_group_gone(pgid)
    finally:
        parent.kill()
        parent.wait()


@pytest.mark.slow  # ~30 s on a loaded 2-core box, most of it the inner session's environment probe
def test_sigterm_to_a_pytest_run_tears_its_servers_down_in_order(tmp_path):
    """The reported case: `timeout` sends SIGTERM to pytest. The plugin turns it into an interrupt,
    so the fixture that started the server tears it down, and the run ends as interrupted."""
    (tmp_path / "test_session.py").write_text(SESSION_TEST)
    pgid_file, mark = tmp_path / "pgid.json", tmp_path / "torn-down"
    # SIGTERM's disposition as a shell gives it, also when this test runs under a runner that ignores it
    session = subprocess.Popen([sys.executable, "-c", "import signal, sys, pytest; "
                                "signal.signal(signal.SIGTERM, signal.SIG_DFL); sys.exit(pytest.main(sys.argv[1:]))",
                                "-p", "no:cacheprovider", "-q", "-n0", "-s", "test_session.py"],
                               cwd=tmp_path, env={**env(), "PGID_FILE": str(pgid_file), "TEARDOWN_MARK": str(mark)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + UP_WITHIN_S
        while not pgid_file.exists() and session.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert pgid_file.exists(), f"the session's server never came up: {session.poll()} {session.stdout.read()}"
        time.sleep(0.2)  # the file is written in one go, but let its close land
        pgid = json.loads(pgid_file.read_text())["pgid"]
        session.send_signal(signal.SIGTERM)
        out, _ = session.communicate(timeout=60)
        assert_group_gone(pgid)
        assert mark.exists(), f"the fixture's teardown did not run:\n{out[-2000:]}"
        assert session.returncode == pytest.ExitCode.INTERRUPTED, out[-2000:]
        assert "SIGTERM" in out, out[-2000:]
    finally:
        session.kill()
        session.communicate()
