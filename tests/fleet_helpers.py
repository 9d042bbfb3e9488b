"""A real multi-node Ray cluster on this machine (Ray's own cluster_utils), kept lean for a 2-core
box, and the faults the fleet tests give its nodes. Used by tests/test_fleet_ray.py and by
benchmarks/fleet/three_nodes.py (the must-show run).

Each node is a real raylet with its own workers; what makes a node faulty is its environment,
set per node as a real host's would be (a corrupt vLLM native extension on its PYTHONPATH, a vLLM
interpreter that hangs at import).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

from harness.settings import DEFAULT_VLLM_VENV

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / DEFAULT_VLLM_VENV / "bin" / "python"

# Lean nodes: one CPU, a fake GPU resource (what the fleet asks for; the probe still finds no
# driver here), the smallest object store Ray accepts, no dashboard.
NODE = {"num_cpus": 1, "num_gpus": 1, "object_store_memory": 80 * 2**20}
# A killed node is marked dead within ~2 s instead of Ray's default ~30 s.
FAST_DEATH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
              "health_check_timeout_ms": 1000, "health_check_failure_threshold": 3}


def node_checkout(tmp: Path) -> Path:
    """What a node holds: the harness and suites/hw from this tree, and no vLLM venv of its own
    (so a node's vLLM is only what its environment names). This tree's .venvs stays out: a CPU
    build of vLLM dies with SIGILL on a machine without AVX-512, which would make every node fail."""
    root = tmp / "checkout"
    shutil.copytree(ROOT / "harness", root / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "suites" / "hw", root / "suites" / "hw", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy2(ROOT / name, root / name)
    return root


def hanging_vllm_python(tmp: Path, real: Path = VLLM_PYTHON) -> Path:
    """A vLLM interpreter whose `import vllm._C` hangs (a stuck NFS home, say) until its caller
    dies; everything else runs the real interpreter. It exits once its parent is gone, so a
    killed node leaves nothing behind."""
    path = tmp / "hanging-vllm-python"
    path.write_text("#!/bin/sh\n"
                    'case "$*" in *vllm._C*)\n'
                    "  i=0; while [ $i -lt 1200 ] && kill -0 $PPID 2>/dev/null; do sleep 0.1; i=$((i+1)); done;;\n"
                    "esac\n"
                    f'exec "{real}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@contextlib.contextmanager
def local_cluster(nodes: list[dict]):
    """Start one Ray node per entry (the first is the head): {"name", "env"}; yields (cluster,
    {name: node}). Everything is torn down on exit, also after a failure."""
    from ray.cluster_utils import Cluster

    cluster = None
    try:
        head = nodes[0]
        cluster = Cluster(initialize_head=True, connect=False, head_node_args={
            **NODE, "node_name": head["name"], "env_vars": head.get("env") or {},
            "include_dashboard": False, "_system_config": FAST_DEATH})
        started = {head["name"]: cluster.head_node}
        for spec in nodes[1:]:
            started[spec["name"]] = cluster.add_node(**NODE, node_name=spec["name"], env_vars=spec.get("env") or {})
        yield cluster, started
    finally:
        if cluster is not None:
            cluster.shutdown()


def processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose environment holds `marker` (e.g. HARNESS_FLEET_RUN=<id>)."""
    pids = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _node_tests(report_dir: Path, name: str) -> int:
    """Tests node `name` has finished so far, from the partial fleet report the CLI rewrites."""
    runs = sorted(report_dir.glob("fleet-2*.json"))
    try:
        report = json.loads(runs[-1].read_text()) if runs else {}
    except (OSError, ValueError):
        return 0
    return next((n["tests_done"] for n in report.get("nodes", []) if n["name"] == name), 0)


def three_node_run(tmp: Path, report_dir: Path, timeout_s: float = 150) -> dict:
    """The must-show run: `harness fleet` on node-a (healthy, no vLLM of its own), node-b (a corrupt
    vLLM native extension) and node-c (hangs in the vLLM import check and is killed once it has
    reported finished tests). Returns the CLI's exit code, output and the wall times."""
    from test_hw_suite_wiring import _broken_vllm

    checkout = node_checkout(tmp)
    nodes = [{"name": "node-a"},
             {"name": "node-b", "env": {"HARNESS_VLLM_PYTHON": str(VLLM_PYTHON),
                                        "PYTHONPATH": str(_broken_vllm(tmp))}},
             {"name": "node-c", "env": {"HARNESS_VLLM_PYTHON": str(hanging_vllm_python(tmp))}}]
    t_start = time.monotonic()
    proc = None
    with local_cluster(nodes) as (cluster, started):
        try:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "harness", "fleet", "--address", cluster.address, "--timeout", str(timeout_s),
                 "--root", str(checkout), "--report-dir", str(report_dir), "--", "suites/hw", "-q"],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            while _node_tests(report_dir, "node-c") < 1:
                if proc.poll() is not None:
                    raise AssertionError(f"fleet ended before node-c reported: {proc.communicate()}")
                if time.monotonic() - t0 > timeout_s:
                    raise AssertionError("node-c never reported a finished test")
                time.sleep(0.3)
            killed_at = time.monotonic() - t0
            cluster.remove_node(started["node-c"], allow_graceful=False)
            stdout, stderr = proc.communicate(timeout=timeout_s)
            wall = time.monotonic() - t0
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"returncode": proc.returncode, "stdout": stdout, "stderr": stderr, "fleet_wall_s": round(wall, 1),
            "node_c_killed_at_s": round(killed_at, 1), "cluster_start_s": round(t0 - t_start, 1),
            "total_s": round(time.monotonic() - t_start, 1)}
