"""`python -m harness fleet --address RAY_ADDRESS [options] -- <pytest args>`: the suites on every
node of a Ray cluster, one fleet report (per-node readiness, versions, figures, outliers).

Exits 0 when every node is ready and nothing stands out, 1 otherwise (a node not ready, dead or
timed out, or an outlier), 2 on bad usage (no Ray, an unreachable address, bad options).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..errors import UsageError

DEFAULT_ARGS = ["suites/hw"]


def add_arguments(parser) -> None:
    parser.add_argument("--address", default=os.environ.get("RAY_ADDRESS"),
                        help="the Ray cluster: host:port of its head (GCS), ray://host:port, or auto "
                             "(default: $RAY_ADDRESS)")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds each node's run may take before it is stopped and reported as timed out "
                             "(default 1800)")
    parser.add_argument("--root", default=None,
                        help="the harness checkout on every node, where pytest runs (default: this checkout's path)")
    parser.add_argument("--python", default=None,
                        help="the python that runs pytest on the nodes (default: the one Ray runs there)")
    parser.add_argument("--connect-timeout", type=float, default=30.0,
                        help="seconds to wait for the cluster to answer before giving up (default 30)")
    parser.add_argument("--gpu-nodes-only", action="store_true", help="skip nodes whose Ray resources hold no GPU")
    parser.add_argument("--report-dir", default=None, help="where the fleet report goes (default: reports/)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="after --: what pytest runs on every node (default: suites/hw)")


def _pytest_args(raw: list[str]) -> list[str]:
    args = raw[1:] if raw[:1] == ["--"] else list(raw)
    if any(a == "--report-dir" or a.startswith("--report-dir=") for a in args):
        raise UsageError("--report-dir is set per node by fleet; give fleet's own --report-dir before --")
    return args or list(DEFAULT_ARGS)


def run(args) -> int:
    from .. import settings as settings_mod
    from ..fleet import cluster, writer

    root = Path(__file__).resolve().parents[2]
    if not args.address:
        raise UsageError("--address: give the Ray cluster's address (host:port of its head) or set RAY_ADDRESS")
    for flag, value in (("--timeout", args.timeout), ("--connect-timeout", args.connect_timeout)):
        if value <= 0:
            raise UsageError(f"{flag}: {value:g} is not a positive number of seconds")
    pytest_args = _pytest_args(args.pytest_args)
    report_dir = settings_mod.resolve({"report_dir": args.report_dir}, root=root).report_dir
    node_root = args.root or str(root)

    ray = cluster.connect(args.address, args.connect_timeout)
    try:
        nodes = cluster.alive_nodes(ray)
        if args.gpu_nodes_only:
            nodes = [n for n in nodes if n.gpus > 0]
        if not nodes:
            raise UsageError("the cluster has no alive node" + (" with GPUs" if args.gpu_nodes_only else ""))
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_id = f"{stamp}-{os.getpid()}"
        started = time.time()
        meta = {"address": args.address, "pytest_args": pytest_args, "root": node_root, "run_id": run_id,
                "started": started, "started_text": time.strftime("%Y-%m-%d %H:%M:%S"), "timeout_s": args.timeout,
                "status": "running", "wall_s": None}
        print(f"[fleet] {len(nodes)} nodes: " + ", ".join(f"{n.name} ({n.ip}, {n.gpus:g} GPU)" for n in nodes)
              + f"; pytest {' '.join(pytest_args)}", file=sys.stderr, flush=True)
        printed: dict[str, tuple] = {}
        last: list = []

        def progress(outcomes) -> None:
            last[:] = outcomes
            meta["wall_s"] = round(time.time() - started, 1)
            writer.write(outcomes, meta, report_dir, stamp)
            for o in outcomes:
                done = len((o.results or {}).get("tests", []))
                if printed.get(o.node.node_id) != (o.state, done):
                    printed[o.node.node_id] = (o.state, done)
                    extra = f": {o.error}" if o.error and o.state not in ("running", "pending") else ""
                    print(f"[fleet] {o.node.name}: {o.state}, {done} tests done{extra}", file=sys.stderr, flush=True)

        try:
            outcomes = cluster.run_on_fleet(ray, nodes, node_root, pytest_args, args.python, args.timeout, run_id,
                                            on_progress=progress)
            meta["status"] = "finished"
        except KeyboardInterrupt:
            meta["status"] = "interrupted"
            writer.write(last, meta, report_dir, stamp, latest=True)
            print(f"[fleet] interrupted: partial report {report_dir / f'fleet-{stamp}.html'}", file=sys.stderr)
            raise
    finally:
        ray.shutdown()
    meta["wall_s"] = round(time.time() - started, 1)
    report = writer.write(outcomes, meta, report_dir, stamp, latest=True)
    for n in report.nodes:
        print(f"{n.name}: {n.verdict.upper()} - {n.reason}")
    for o in report.outliers:
        print(f"outlier: {o.node}: {o.what}: {o.detail}")
    print(f"fleet: {len(report.nodes)} nodes, " + ", ".join(f"{c} {v}" for v, c in report.counts.items())
          + f", {len(report.outliers)} outliers, wall {meta['wall_s']:.0f} s")
    print(f"report: {report_dir / f'fleet-{stamp}.html'} (JSON: {report_dir / f'fleet-{stamp}.json'})")
    return 0 if report.ok else 1
