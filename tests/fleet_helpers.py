"""A real multi-node Ray cluster on this machine (Ray's own cluster_utils), kept lean for a 2-core
box, and the faults the fleet tests give its nodes. Used by tests/test_fleet_ray.py and by
benchmarks/fleet/three_nodes.py (the must-show run).

Each node is a real raylet with its own workers; what makes a node faulty is its environment,
set per node as a real host's would be (a corrupt vLLM native extension on its PYTHONPATH, a vLLM
interpreter that hangs at import).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VLLM_PYTHON = ROOT / ".venvs" / "vllm-0.32.0" / "bin" / "python"

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
