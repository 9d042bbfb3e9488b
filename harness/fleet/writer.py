"""The fleet run's files: reports/fleet-<stamp>.json and .html (rewritten atomically as nodes
report, so an interrupted run leaves what it had), each node's own pytest JSON and HTML under
reports/fleet-<stamp>/, and copies as reports/fleet-latest.{json,html}."""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .. import atomic
from ..report.results import write_json_atomic
from . import html as fleet_html
from .aggregate import FleetReport, fleet_report


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "node"


def write(outcomes: list, meta: dict[str, Any], report_dir: Path, stamp: str, latest: bool = False) -> FleetReport:
    """Build the report from cluster.NodeOutcome objects and write its files; returns it."""
    dicts = [asdict(o) for o in outcomes]
    report = fleet_report(dicts, meta)
    node_dir = report_dir / f"fleet-{stamp}"
    for summary, outcome in zip(report.nodes, dicts):
        if outcome.get("html"):
            path = node_dir / f"{_safe(summary.name)}.html"
            if not path.exists():
                atomic.write_text(path, outcome["html"])
            summary.html_file = f"{node_dir.name}/{path.name}"
        if outcome.get("results") and outcome.get("state") not in ("pending", "running"):
            write_json_atomic(node_dir / f"{_safe(summary.name)}.json", outcome["results"])
    json_path, html_path = report_dir / f"fleet-{stamp}.json", report_dir / f"fleet-{stamp}.html"
    write_json_atomic(json_path, report.to_dict())
    atomic.write_text(html_path, fleet_html.render(report))
    if latest:
        atomic.write_text(report_dir / "fleet-latest.json", json_path.read_text(encoding="utf-8"))
        atomic.write_text(report_dir / "fleet-latest.html", html_path.read_text(encoding="utf-8"))
    return report
