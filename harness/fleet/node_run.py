"""What runs on one node of the fleet: pytest on the node's own checkout, its results JSON sent
back as it grows, and the final results, HTML and log tail returned.

Standard library only, and no harness import: Ray ships this module to the nodes by value
(cloudpickle), so a node needs Ray and a checkout of the harness with its venv, nothing of this
machine's code version. The plugin rewrites the run's JSON atomically after every test; the node
reads it whenever it changes and publishes it, so a node that dies mid-run has already sent what
it finished.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

RUN_MARKER = "HARNESS_FLEET_RUN"  # in the environment of every pytest a fleet run starts
LOG_TAIL_LINES = 40


class Board:
    """The driver-side mailbox (a Ray actor on the driver's node): each node's latest snapshot."""

    def __init__(self) -> None:
        self.snapshots: dict[str, dict[str, Any]] = {}

    def update(self, node_id: str, snapshot: dict[str, Any]) -> None:
        self.snapshots[node_id] = {**self.snapshots.get(node_id, {}), **snapshot}

    def read(self) -> dict[str, dict[str, Any]]:
        return self.snapshots


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL pytest when the Ray worker that started it dies (a node
    taken down, a task cancelled), so no run outlives its task."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _results_file(report_dir: Path) -> Path | None:
    runs = [p for p in report_dir.glob("*.json") if p.name != "latest.json" and not p.name.startswith(".")]
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def _read_json(path: Path | None) -> dict | None:
    import json

    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # between the plugin's atomic renames there is always a whole file; be safe anyway


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_suite(root: str, pytest_args: list[str], python: str | None, timeout_s: float,
              publish: Callable[[dict], None], env: dict[str, str], poll_s: float = 0.5) -> dict[str, Any]:
    """pytest in `root` with a private --report-dir; returns state, exit code, results, HTML, log tail.

    state: finished (pytest exited; its exit code says how it went), timed out (killed at
    timeout_s, with what it finished), error (it could not run here).
    """
    if not (Path(root) / "harness").is_dir():
        return {"state": "error", "error": f"no harness checkout at {root} on this node (fleet --root)"}
    report_dir = Path(tempfile.mkdtemp(prefix="harness-fleet-"))
    log_path = report_dir / "pytest.log"
    cmd = [python or sys.executable, "-m", "pytest", *pytest_args, "--report-dir", str(report_dir),
           "-p", "no:cacheprovider"]
    start = time.monotonic()
    state, sent_mtime, results = "finished", None, None
    try:
        with open(log_path, "wb") as log:
            on_main = threading.current_thread() is threading.main_thread()
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_die_with_parent if on_main and sys.platform == "linux" else None)
            while True:
                try:
                    proc.wait(timeout=poll_s)
                    break
                except subprocess.TimeoutExpired:
                    pass
                path = _results_file(report_dir)
                mtime = path.stat().st_mtime_ns if path and path.exists() else None
                if mtime is not None and mtime != sent_mtime:
                    snapshot = _read_json(path)
                    if snapshot is not None:
                        sent_mtime, results = mtime, snapshot
                        publish({"results": snapshot, "updated": time.time()})
                if time.monotonic() - start > timeout_s:
                    state = "timed out"
                    for sig in (signal.SIGTERM, signal.SIGKILL):
                        try:
                            os.killpg(proc.pid, sig)
                            proc.wait(timeout=10)
                            break
                        except (ProcessLookupError, subprocess.TimeoutExpired):
                            continue
                    break
        final = _read_json(_results_file(report_dir)) or results
        html_path = report_dir / "latest.html"
        html = html_path.read_text(encoding="utf-8", errors="replace") if html_path.is_file() else None
        out = {"state": state, "exit_code": proc.returncode, "results": final, "html": html,
               "log_tail": _tail(log_path), "seconds": round(time.monotonic() - start, 2),
               "command": cmd}
        if final is None and state == "finished":
            out["state"] = "error"
            lines = [ln for ln in out["log_tail"].splitlines() if ln.strip()]
            out["error"] = f"pytest exited {proc.returncode} without results: {lines[-1] if lines else 'no output'}"
        return out
    finally:
        shutil.rmtree(report_dir, ignore_errors=True)


def node_task(board, node_id: str, root: str, pytest_args: list[str], python: str | None,
              timeout_s: float, run_id: str) -> dict[str, Any]:
    """The Ray task pinned to one node: who and where it is, then the suite run."""
    import ray  # present on every Ray worker

    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    info = {"node_id": node_id, "host": socket.gethostname(), "pid": os.getpid(), "ray_gpu_ids": gpu_ids,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "started": time.time()}

    def publish(update: dict) -> None:
        board.update.remote(node_id, update)

    publish({"state": "running", **info})
    env = dict(os.environ, PYTHONUNBUFFERED="1", **{RUN_MARKER: run_id})
    if not gpu_ids and env.get("CUDA_VISIBLE_DEVICES") == "":
        env.pop("CUDA_VISIBLE_DEVICES")  # Ray hides every GPU from a task that asked for none
    result = run_suite(root, pytest_args, python, timeout_s, publish, env)
    return {**info, **result}
