"""The fleet report as one self-contained HTML page: the verdict per node and the outliers on the
first screen, then each node's failures, versions, figures and log tail."""

from __future__ import annotations

import html

from ..report import html as report_html
from .aggregate import FIGURES, VERSIONS, FleetReport, NodeSummary

COLOURS = {"ready": "#1a7f37", "not ready": "#cf222e", "died": "#cf222e", "timed out": "#bc4c00",
           "error": "#cf222e", "interrupted": "#9a6700"}
STYLE = ("<style>.badge{display:inline-block;padding:1px 8px;border-radius:10px;color:#fff;font-weight:600}"
         ".fleet-summary{font-size:15px;margin:6px 0 14px}.outliers li{margin:2px 0}"
         "pre{background:#f6f8fa;padding:8px;overflow-x:auto;font-size:12px;max-height:24em}"
         ".muted{color:#6e7781}</style>")


def _e(value) -> str:
    return html.escape("" if value is None else str(value))


def _badge(verdict: str) -> str:
    return f'<span class="badge" style="background:{COLOURS.get(verdict, "#6e7781")}">{_e(verdict)}</span>'


def _figures_cell(node: NodeSummary) -> str:
    if not node.figures:
        return '<span class="muted">none (--hw-level full measures them)</span>'
    return "<br>".join(f"{_e(FIGURES[f.metric][2])} {_e(f.gpu)}: {f.value:.4g} {_e(f.unit)}" for f in node.figures)


def _nodes_table(report: FleetReport) -> str:
    head = ("<tr><th>node</th><th>verdict</th><th>why</th><th>tests</th><th>GPU probe</th><th>driver</th>"
            "<th>CUDA (driver max / torch)</th><th>torch</th><th>vLLM</th><th>figures</th></tr>")
    flagged = {(o.node, o.what) for o in report.outliers}
    rows = []
    for n in report.nodes:
        def version(key: str, label: str) -> str:
            value = _e(n.versions.get(key) or "-")
            return f'<td style="color:#cf222e;font-weight:600">{value}</td>' if (n.name, label) in flagged \
                else f"<td>{value}</td>"
        tests = ", ".join(f"{count} {outcome}" for outcome, count in sorted(n.tests.items())) or "none"
        gpus = f"{_e(n.gpu_state)}: {_e(n.gpu_reason)}"
        rows.append(
            f"<tr><td><b>{_e(n.name)}</b><br><span class='muted'>{_e(n.ip)} · {_e(n.host)} · "
            f"Ray GPUs {n.ray_gpus:g}</span></td><td>{_badge(n.verdict)}</td><td>{_e(n.reason)}</td>"
            f"<td>{_e(tests)}</td><td>{gpus}</td>{version('driver', 'NVIDIA driver')}"
            f"<td>{_e(n.versions.get('cuda_driver') or '-')} / {_e(n.versions.get('torch_cuda') or 'cpu')}</td>"
            f"<td>{_e(n.versions.get('torch') or '-')}</td>{version('vllm', 'vLLM')}<td>{_figures_cell(n)}</td></tr>")
    return f'<table class="harness-table"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _node_details(n: NodeSummary) -> str:
    parts = [f"<p>{_badge(n.verdict)} {_e(n.reason)}" + (f" · {n.seconds:.0f} s" if n.seconds else "") + "</p>"]
    if n.html_file:
        parts.append(f'<p>The node\'s own report: <a href="{_e(n.html_file)}">{_e(n.html_file)}</a></p>')
    if n.failures:
        parts.append(report_html.table("Failed checks", n.failures))
    parts.append(report_html.table("Versions", [{k: n.versions.get(k) or "-" for k in VERSIONS}]))
    if n.error:
        parts.append(f"<p><b>Error</b>: {_e(n.error)}</p>")
    if n.log_tail:
        parts.append(f"<details><summary>pytest output (last lines)</summary><pre>{_e(n.log_tail)}</pre></details>")
    return report_html.section(f"{n.name}", "".join(parts))


def render(report: FleetReport) -> str:
    meta = report.meta
    counts = " · ".join(f"{count} {verdict}" for verdict, count in report.counts.items())
    wall = f" · wall {meta['wall_s']:.0f} s" if meta.get("wall_s") is not None else ""
    status = meta.get("status", "finished")
    body = [STYLE,
            f'<p class="fleet-summary"><b>{len(report.nodes)} nodes</b>: {_e(counts)}{_e(wall)} · '
            f'{"all ready, no outlier" if report.ok else "<b>attention needed</b>"}'
            + (f" · run {_e(status)}" if status != "finished" else "") + "</p>",
            f'<p class="muted">pytest {_e(" ".join(meta.get("pytest_args", [])))} · Ray {_e(meta.get("address"))} '
            f'· {_e(meta.get("started_text", ""))}</p>']
    if report.outliers:
        items = "".join(f"<li><b>{_e(o.node)}</b>: {_e(o.what)}: {_e(o.detail)}</li>" for o in report.outliers)
        body.append(f'<h3>Outliers</h3><ul class="outliers">{items}</ul>')
    else:
        body.append('<h3>Outliers</h3><p class="muted">none: figures within 0.75 x their GPU model\'s median '
                    '(where two or more GPUs of a model reported), one driver and one vLLM version</p>')
    body.append("<h3>Nodes</h3>" + _nodes_table(report))
    body += [_node_details(n) for n in report.nodes]
    return report_html.page("Fleet report", "".join(body))
