"""The serving page's open-loop section: offered rate against achieved throughput and goodput,
the saturation point and the highest rate meeting the SLO (harness/serving/sweep.py)."""

from __future__ import annotations

from . import html, plots


def section(labels: list[str], datas: list[dict]) -> str:
    """'' when no file holds an open-loop sweep."""
    from ..serving import sweep

    parts = []
    for label, data in zip(labels, datas):
        summary = data.get("sweep") or sweep.summarize(data.get("runs") or [], {}, 0.9)
        if not summary or len(summary["points"]) < 2:
            continue
        points = summary["points"]
        xs = [p["offered_rate"] for p in points]
        series = {"achieved (requests/s)": (xs, [p["request_throughput"] for p in points]),
                  "offered (requests/s)": (xs, xs)}
        if summary.get("slo"):
            series["goodput (requests/s within the SLO)"] = (xs, [p["request_goodput"] for p in points])
        fig = plots.line_plot(series, title=f"{label}: open-loop rate sweep", xlabel="offered rate (requests/s)",
                              ylabel="requests/s", logx=True)
        ttft = plots.line_plot({"TTFT p50": (xs, [p["ttft_p50_ms"] or 0 for p in points]),
                                "TTFT p99": (xs, [p["ttft_p99_ms"] or 0 for p in points])},
                               title=f"{label}: TTFT against the offered rate", xlabel="offered rate (requests/s)",
                               ylabel="ms", logx=True)
        rows = [{"offered /s": p["offered_rate"], "achieved req/s": round(p["request_throughput"], 2),
                 "output tok/s": round(p["output_throughput"], 1), "goodput req/s": round(p["request_goodput"], 2),
                 "within SLO": f"{100 * p['good_fraction']:.0f}%", "failed": p["requests_failed"],
                 "TTFT p99 ms": None if p["ttft_p99_ms"] is None else round(p["ttft_p99_ms"], 1),
                 "client-bound": "yes" if p["client_bound"] else ""} for p in points]
        parts.append(html.section(label, html.note(sweep.line(summary)) + f'<div class="figs">{fig}{ttft}</div>'
                                  + html.table("Rates", rows, summary=f"{len(rows)} rates", open_=True)))
    return html.section("Open-loop rate sweep", "".join(parts), level=2) if parts else ""
