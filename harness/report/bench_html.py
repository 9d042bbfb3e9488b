"""Bench results (one or more JSON files) -> one self-contained HTML page (inline SVG, no network)."""

from __future__ import annotations

import html as _html
from pathlib import Path

from . import html, plots


def _label(path: str, data: dict) -> str:
    env = data.get("environment", {})
    version = env.get("server_version")
    return f"{Path(path).stem}" + (f" (server {version})" if version else "")


def _by_concurrency(data: dict) -> dict:
    """concurrency -> mean over repeats of (ttft p50, ttft p99, output throughput)."""
    out: dict = {}
    for run in data.get("runs", []):
        if run.get("concurrency") is None or run["ttft_ms"].get("p50") is None:
            continue
        out.setdefault(run["concurrency"], []).append(run)
    table = {}
    for c, runs in sorted(out.items()):
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
        table[c] = (mean([r["ttft_ms"]["p50"] for r in runs]), mean([r["ttft_ms"]["p99"] for r in runs]),
                    mean([r["output_throughput"] for r in runs]))
    return table


def _timeline_svg(run: dict, title: str, limit: int = 200) -> str:
    keys = ("scheduled_s", "dispatched_s", "sent_s", "end_s")
    reqs = [r for r in (run.get("requests") or []) if all(k in r for k in keys)][:limit]
    if not reqs:
        return ""
    fig, ax = plots.new_figure((7.0, max(2.0, min(8.0, 0.04 * len(reqs) + 1.5))))
    for i, r in enumerate(reqs):
        first = r["sent_s"] + r["ttft_ms"] / 1000 if r.get("ttft_ms") is not None else r["end_s"]
        if r["dispatched_s"] > r["scheduled_s"]:
            ax.plot([r["scheduled_s"], r["sent_s"]], [i, i], color="#d4a72c", linewidth=2)
        ax.plot([r["sent_s"], first], [i, i], color="#cf222e" if r.get("error") else "#8250df", linewidth=2)
        ax.plot([first, r["end_s"]], [i, i], color="#cf222e" if r.get("error") else "#2da44e", linewidth=2)
    return plots.finish(fig, ax, title=title, ylabel="request", legend=False,
                        xlabel="seconds since run start (yellow: schedule lag, purple: waiting for first token, "
                               "green: streaming, red: failed)")


def render(paths: list[str], datas: list[dict], comparison: str | None = None) -> str:
    body = []
    # Overview table, one row per run.
    rows = []
    for path, data in zip(paths, datas):
        for run in data.get("runs", []):
            rows.append({
                "results": _label(path, data),
                "concurrency": run.get("concurrency"),
                "rate/s": run.get("request_rate"),
                "repeat": run.get("repeat", 0) + 1,
                "ok": run["requests_ok"],
                "failed": run["requests_failed"],
                "errors": ", ".join(f"{k} x{v}" for k, v in run["errors"].items()) or "",
                "TTFT p50 ms": run["ttft_ms"]["p50"],
                "TTFT p99 ms": run["ttft_ms"]["p99"],
                "TPOT p50 ms": run["tpot_ms"]["p50"],
                "ITL p50 ms": run["itl_ms"]["p50"],
                "E2E p50 ms": run["e2e_ms"]["p50"],
                "output tok/s": run["output_throughput"],
                "req/s": run["request_throughput"],
                "goodput req/s": run.get("goodput", {}).get("request_goodput"),
                "server TTFT mean ms": (run.get("server_metrics") or {}).get("ttft_mean_ms"),
                "lag p99 ms": run.get("schedule_lag_ms", {}).get("p99"),
                "client-bound": "warn" if run.get("client_bound") else "",
                "tokens": "ok" if run.get("token_accounting", {}).get("agree") else "fail",
            })
    body.append(html.table("Runs", rows))
    findings = [{"results": _label(p, d), "concurrency": r.get("concurrency"), "finding": f}
                for p, d in zip(paths, datas) for r in d.get("runs", [])
                for f in (r.get("token_accounting", {}).get("findings", []) + r.get("client_bound_reasons", [])
                          + r.get("timing_warnings", []))]
    if findings:
        body.append(html.table("Findings", findings))
    if comparison:
        body.append(html.section("Comparison", f"<pre>{_html.escape(comparison)}</pre>"))

    ttft, thr = {}, {}
    for path, data in zip(paths, datas):
        table = _by_concurrency(data)
        if len(table) >= 1:
            xs = list(table)
            ttft[_label(path, data) + " p50"] = (xs, [v[0] for v in table.values()])
            ttft[_label(path, data) + " p99"] = (xs, [v[1] for v in table.values()])
            thr[_label(path, data)] = (xs, [v[2] for v in table.values()])
    if ttft:
        body.append(html.section("TTFT and throughput against concurrency",
                                 plots.line_plot(ttft, title="TTFT", xlabel="concurrency", ylabel="ms", logx=True)
                                 + plots.line_plot(thr, title="Output throughput", xlabel="concurrency",
                                                   ylabel="tokens/s", logx=True)))
    for path, data in zip(paths, datas):
        label = _label(path, data)
        runs = data.get("runs", [])
        if not runs:
            continue
        last = max(runs, key=lambda r: (r.get("concurrency") or 0, r.get("repeat", 0)))
        reqs = [r for r in last.get("requests") or [] if not r.get("error")]
        parts = []
        if reqs:
            parts.append(plots.histogram([r["ttft_ms"] for r in reqs if r.get("ttft_ms") is not None],
                                         title=f"TTFT distribution, concurrency {last.get('concurrency')}", xlabel="ms"))
            parts.append(plots.histogram([r["e2e_ms"] for r in reqs], title="E2E latency distribution", xlabel="ms"))
        if last.get("requests"):
            parts.append(_timeline_svg(last, f"Per-request timeline, concurrency {last.get('concurrency')}"))
        series = last.get("server_timeseries") or []
        if series:
            ts = [s["t_s"] for s in series]
            lines = {name: (ts, [s.get(key) or 0 for s in series])
                     for name, key in (("running", "running"), ("waiting", "waiting"))}
            parts.append(plots.line_plot(lines, title="Server queue (vllm:num_requests_running / waiting)",
                                         xlabel="seconds since run start", ylabel="requests", markers=False))
            parts.append(plots.line_plot({"KV cache usage": (ts, [100 * (s.get("kv_cache_usage") or 0) for s in series])},
                                         title="Server KV-cache usage", xlabel="seconds since run start",
                                         ylabel="%", markers=False))
        env = data.get("environment", {})
        facts = [{"field": k, "value": str(v)} for k, v in (
            ("server version", env.get("server_version")), ("model", env.get("model")),
            ("flags", " ".join(env.get("flags") or [])), ("startup", env.get("startup")),
            ("workload", data.get("workload")), ("machine", env.get("machine")),
            ("complete", data.get("complete")))]
        body.append(html.section(label, html.table("Configuration", facts) + "".join(parts)))
    return html.page("Serving benchmark", "".join(body))
