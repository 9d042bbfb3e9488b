"""Bench results (one or more JSON files) -> one self-contained HTML page (inline SVG, no network).

Used by `python -m harness report`, the serving gate and the upgrade rehearsal. The first screen
answers: with two files, did the candidate regress (regressed / not / inconclusive, from the
gate's noise model); for each file, did every request succeed and do the token counts agree.
Then TTFT p50/p99 and throughput against concurrency with 95 % intervals (baseline and candidate
side by side), the change of every metric with its interval, a per-request timeline, and the
server's queue and KV-cache use over time (not drawn, with a note, when too few samples).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from . import fmt, html, pages, plots, sweep_section

MIN_SERVER_SAMPLES = 5
RESAMPLES = 400


def _label(path: str, data: dict) -> str:
    env = data.get("environment", {})
    version = env.get("server_version")
    return f"{Path(path).stem}" + (f" (server {version})" if version else "")


def _level(run: dict) -> str:
    return f"rate {run['request_rate']:g}/s" if run.get("request_rate") else f"concurrency {run.get('concurrency')}"


# ---------------------------------------------------------------------------------------------
# Figures with intervals


def _percentile(values: list[float], q: float) -> float:
    from ..serving.stats import percentile

    return percentile(values, q)


def _ttft_requests(run: dict) -> list[float]:
    return [r["ttft_ms"] for r in run.get("requests") or [] if not r.get("error") and r.get("ttft_ms") is not None]


def level_points(data: dict, seed: int = 0) -> dict[str, list[dict]]:
    """Per concurrency level: TTFT p50 and p99 over the pooled requests of every repeat (95 %
    bootstrap interval over requests), output throughput as the mean over repeats (interval
    over repeats when there are several)."""
    rng = random.Random(seed)
    by_level: dict[Any, list[dict]] = {}
    for run in data.get("runs", []):
        if run.get("concurrency") is not None and not run.get("request_rate"):
            by_level.setdefault(run["concurrency"], []).append(run)
    out: dict[str, list[dict]] = {"ttft p50": [], "ttft p99": [], "throughput": []}
    for level, runs in sorted(by_level.items()):
        pooled = [x for r in runs for x in _ttft_requests(r)]
        for q, key in ((50, "ttft p50"), (99, "ttft p99")):
            if pooled:
                boots = sorted(_percentile(rng.choices(pooled, k=len(pooled)), q) for _ in range(RESAMPLES))
                out[key].append({"x": level, "y": _percentile(pooled, q), "lo": boots[int(0.025 * RESAMPLES)],
                                 "hi": boots[int(0.975 * RESAMPLES) - 1], "n": len(pooled)})
            else:
                vals = [r["ttft_ms"][f"p{q}"] for r in runs if r["ttft_ms"].get(f"p{q}") is not None]
                if vals:
                    out[key].append({"x": level, "y": sum(vals) / len(vals), "lo": None, "hi": None, "n": len(vals)})
        thr = [r["output_throughput"] for r in runs]
        point = {"x": level, "y": sum(thr) / len(thr), "lo": None, "hi": None, "n": len(thr)}
        if len(thr) >= 2:
            boots = sorted(sum(rng.choices(thr, k=len(thr))) / len(thr) for _ in range(RESAMPLES))
            point.update(lo=boots[int(0.025 * RESAMPLES)], hi=boots[int(0.975 * RESAMPLES) - 1])
        out["throughput"].append(point)
    return out


def _level_figures(labels: list[str], datas: list[dict]) -> str:
    ttft: dict[str, list[dict]] = {}
    thr: dict[str, list[dict]] = {}
    for label, data in zip(labels, datas):
        pts = level_points(data)
        if pts["ttft p50"]:
            ttft[f"{label} p50"] = pts["ttft p50"]
            ttft[f"{label} p99"] = pts["ttft p99"]
        if pts["throughput"]:
            thr[label] = pts["throughput"]
    if not ttft and not thr:
        return ""
    repeats = max((len([r for r in d.get("runs", []) if r.get("concurrency") == lvl])
                   for d in datas for lvl in {r.get("concurrency") for r in d.get("runs", [])}), default=1)
    figs = []
    if ttft:
        figs.append(plots.ci_plot(ttft, title="TTFT against concurrency (p50 solid, p99 dashed)",
                                  xlabel="concurrent streams", ylabel="TTFT, ms"))
    if thr:
        figs.append(plots.ci_plot(thr, title="Output throughput against concurrency", xlabel="concurrent streams",
                                  ylabel="output tokens/s"))
    note = ("Error bars: 95 % bootstrap interval (TTFT: over the requests of every repeat; throughput: over "
            f"repeats). {repeats} repeat(s) per level" + ("; one repeat gives no throughput interval." if repeats < 2
                                                         else "."))
    return html.section("TTFT and throughput against concurrency", f'<div class="figs">{"".join(figs)}</div>'
                        + html.note(note), level=2)


def _server_series(run: dict, label: str) -> str:
    series = run.get("server_timeseries") or []
    if len(series) < MIN_SERVER_SAMPLES:
        return html.note(f"{label}: server queue and KV-cache use not drawn: {fmt.plural(len(series), 'sample')} of "
                         f"/metrics over a {fmt.duration(run.get('duration_s'))} run (at least {MIN_SERVER_SAMPLES} "
                         "needed; bench samples every 100 ms).")
    return plots.server_series(series, title=f"Server queue and KV-cache use, {label}")


# ---------------------------------------------------------------------------------------------
# Verdicts


def _comparison(datas: list[dict], comparison: Any, compare: bool | None) -> tuple[Any, str | None]:
    """(Comparison or None, text to show): computed here when two files came without one."""
    from ..errors import UsageError
    from ..serving import compare as cmp
    from ..serving import results

    text = comparison if isinstance(comparison, str) else None
    if comparison is not None and not isinstance(comparison, str):
        return comparison, text
    if len(datas) != 2 or compare is False:
        return None, text
    try:
        return cmp.compare(datas[0], datas[1], allow=results.FINGERPRINT_FIELDS, min_repeats=1), text
    except UsageError as exc:
        return None, (text + "\n" if text else "") + f"not compared: {exc}"


def _gate_verdict(result, labels: list[str]) -> html.Verdict:
    changes = result.changes
    regressed = [c for c in changes if c.verdict == "regressed"]
    unsure = [c for c in changes if c.verdict.startswith("inconclusive")]
    broke = [b for b in result.behaviours if b.startswith("REGRESSION")]
    lines = [f"{c.metric} at {c.level}: {_signed(c.change)} (95 % interval "
             f"{_signed(c.ci_low)} to {_signed(c.ci_high)}, threshold "
             f"{fmt.percent(c.threshold)}): {c.verdict}" for c in regressed + unsure][:6]
    lines += broke
    for field, (old, new) in result.allowed_differences.items():
        lines.append(f"differs, allowed: {field} {_plain(old)} → {_plain(new)}")
    question = f"Did {labels[1]} regress against {labels[0]}?"
    if regressed or broke:
        return html.Verdict(question, "Regressed", "bad", lines)
    if unsure:
        return html.Verdict(question, "Inconclusive", "warn", lines + ["the interval straddles the threshold: "
                                                                       "repeat with more requests or repeats"])
    ok = f"{len(changes)} metric comparisons within their thresholds"
    return html.Verdict(question, "Not regressed", "good", [ok] + lines)


def _memory_verdict(kv: Any) -> html.Verdict:
    state, answer = {"OK": ("good", "Not regressed"), "REGRESSED": ("bad", "Regressed")}.get(
        kv.decision, ("warn", "Undecided"))
    lines = [kv.line()] + ([f"the plan's cause: {kv.cause}"] if kv.cause else [])
    return html.Verdict("Did the KV cache capacity drop?", answer, state, lines)


def _plain(value: Any) -> str:
    if isinstance(value, list):
        return " ".join(str(v) for v in value) or "none"
    return fmt.value(value)


def _requests_verdict(label: str, data: dict) -> html.Verdict:
    runs = data.get("runs", [])
    ok = sum(r["requests_ok"] for r in runs)
    failed = sum(r["requests_failed"] for r in runs)
    errors: dict[str, int] = {}
    for r in runs:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    tokens_bad = [f for r in runs for f in r.get("token_accounting", {}).get("findings", [])]
    client = [r for r in runs if r.get("client_bound")]
    lines = [f"{ok:,} requests succeeded, {failed:,} failed over {fmt.plural(len(runs), 'run')}"]
    if errors:
        lines.append("errors: " + ", ".join(f"{k} × {v}" for k, v in errors.items()))
    lines.append("token counts agree (server usage, client tokenizer, /metrics)" if not tokens_bad
                 else f"token counts disagree: {tokens_bad[0]}")
    if client:
        lines.append(f"{fmt.plural(len(client), 'run')} client-bound: {client[0]['client_bound_reasons'][0]}")
    if data.get("complete") is False:
        lines.append("incomplete: the bench was interrupted")
    state = "bad" if failed or tokens_bad else "warn" if client or data.get("complete") is False else "good"
    answer = f"{failed:,} requests failed" if failed else "Succeeded, client-bound" if client else \
        "Every request succeeded"
    return html.Verdict(f"Did every request to {label} succeed?", answer, state, lines)


# ---------------------------------------------------------------------------------------------
# Tables


def _runs_rows(labels: list[str], datas: list[dict]) -> list[dict]:
    rows = []
    for label, data in zip(labels, datas):
        for run in data.get("runs", []):
            rows.append({
                "results": label, "level": _level(run), "repeat": run.get("repeat", 0) + 1,
                "ok": run["requests_ok"], "failed": run["requests_failed"],
                "errors": ", ".join(f"{k} × {v}" for k, v in run["errors"].items()) or "none",
                "TTFT p50 ms": run["ttft_ms"]["p50"], "TTFT p99 ms": run["ttft_ms"]["p99"],
                "TPOT p50 ms": run["tpot_ms"]["p50"], "ITL p50 ms": run["itl_ms"]["p50"],
                "E2E p50 ms": run["e2e_ms"]["p50"], "output tok/s": _unit(run["output_throughput"], "tok/s"),
                "requests/s": _unit(run["request_throughput"], "req/s"),
                "goodput req/s": _unit(run.get("goodput", {}).get("request_goodput"), "req/s"),
                "server TTFT mean ms": (run.get("server_metrics") or {}).get("ttft_mean_ms"),
                "schedule lag p99 ms": run.get("schedule_lag_ms", {}).get("p99"),
                "client-bound": "warn" if run.get("client_bound") else "no",
                "tokens": "ok" if run.get("token_accounting", {}).get("agree") else "fail",
            })
    return rows


def _unit(value: float | None, unit: str) -> str | None:
    return None if value is None else f"{fmt.number(value)} {unit}"


def _comparison_rows(result) -> list[dict]:
    return [{"level": c.level, "metric": c.metric, "baseline": _metric(c.metric, c.baseline),
             "candidate": _metric(c.metric, c.candidate), "change": _signed(c.change),
             "95 % interval": "-" if c.ci_low is None else f"{_signed(c.ci_low)} to {_signed(c.ci_high)}",
             "threshold": fmt.percent(c.threshold), "verdict": c.verdict} for c in result.changes]


def _signed(fraction: float | None) -> str:
    return "-" if fraction is None else fmt.percent(fraction, signed=True)


def _metric(name: str, value: float | None) -> str:
    if value is None:  # a metric compare could not measure
        return "-"
    if "throughput" in name:
        return f"{fmt.number(value)} {'tok/s' if name.startswith('output') else 'req/s'}"
    return f"{fmt.number(value)} ms"


def _configuration(label: str, data: dict) -> str:
    env = data.get("environment", {})
    startup = env.get("startup") or {}
    rows = [{"field": "server version", "value": env.get("server_version")},
            {"field": "model", "value": env.get("model_id") or env.get("model")},
            {"field": "server flags", "value": " ".join(env.get("flags") or []) or "none"},
            {"field": "startup", "value": "; ".join(f"{fmt.words(k)} {fmt.value(v, k)}" for k, v in startup.items())
             or "not started by the harness"},
            {"field": "workload", "value": "; ".join(f"{fmt.words(k)} {fmt.value(v, k)}"
                                                    for k, v in (data.get("workload") or {}).items())},
            {"field": "machine", "value": "; ".join(f"{fmt.words(k)} {fmt.value(v, k)}"
                                                   for k, v in (env.get("machine") or {}).items())},
            {"field": "complete", "value": data.get("complete")}]
    return html.table(f"Configuration: {label}", rows, open_=False, summary=f"server {env.get('server_version')}, "
                      f"model {env.get('model_id') or env.get('model')}")


def _largest_run(data: dict) -> dict | None:
    runs = data.get("runs", [])
    # closed loop: the highest concurrency; open loop (concurrency None, or a cap): the highest rate
    return max(runs, key=lambda r: (r.get("concurrency") or 0, r.get("request_rate") or 0,
                                    r.get("repeat", 0))) if runs else None


def render(paths: list[str], datas: list[dict], comparison: Any = None, *, compare: bool | None = None,
           title: str | None = None, index_href: str | None = None, memory: Any = None) -> str:
    """`comparison`: a harness.serving.compare.Comparison, a text table, or None. With two files
    and `compare` not False, a comparison is computed here (any fingerprint difference allowed and
    shown; the gate's default thresholds). `memory`: an upgrade rehearsal's KV gate
    (harness.serving.upgrade_kv.KvUpgrade): a verdict card and the logged-vs-planned table."""
    labels = [_label(p, d) for p, d in zip(paths, datas)]
    result, text = _comparison(datas, comparison, compare)
    cards = [_gate_verdict(result, labels)] if result is not None else []
    cards += [_memory_verdict(memory)] if memory is not None else []
    cards += [_requests_verdict(label, data) for label, data in zip(labels, datas)]
    nav = (f'<a href="{html.esc(index_href)}">← all runs</a>' if index_href else "") + pages.BACKLINK_MARK
    body = [html.verdict_strip(cards), f'<nav class="links" id="links">{nav}</nav>']
    servers = " · ".join(f"<b>{html.esc(label)}</b> {html.esc(_server_line(d))}" for label, d in zip(labels, datas))
    body.append(f'<div class="machine" id="machine">{servers}</div>')
    if result is not None and result.changes:
        body.append(html.section("Change from baseline", plots.change_forest([c.to_json() for c in result.changes])
                                 + html.table("Comparison", _comparison_rows(result), open_=True,
                                              summary=f"{len(result.changes)} metric comparisons")
                                 + ("".join(html.note(b) for b in result.behaviours)), level=2))
    if memory is not None:
        body.append(html.table("Memory: what each start-up logged beside the plan", memory.rows(), open_=True,
                               summary=memory.line()))
    if result is not None and not text:
        from ..serving.compare import format_table

        text = format_table(result)
    if text:
        body.append(html.fold("Comparison as text", "the table `harness compare` prints",
                              f"<pre>{html.esc(text)}</pre>"))
    body.append(_level_figures(labels, datas))
    body.append(sweep_section.section(labels, datas))
    per_file = []
    for label, data in zip(labels, datas):
        run = _largest_run(data)
        if run is None:
            continue
        parts = []
        if run.get("requests"):
            parts.append(plots.timeline(run["requests"], title=f"Per-request timeline, {_level(run)}, "
                                                                f"repeat {run.get('repeat', 0) + 1}"))
        else:
            parts.append(html.note("Per-request timeline not drawn: the results keep no per-request events "
                                   "(bench --no-requests)."))
        parts.append(_server_series(run, f"{_level(run)}, repeat {run.get('repeat', 0) + 1}"))
        per_file.append(html.section(label, f'<div class="figs">{"".join(parts)}</div>'))
    if per_file:
        body.append(html.section("Requests and server over time (largest level, last repeat)", "".join(per_file),
                                 level=2))
    rows = _runs_rows(labels, datas)
    body.append(html.section("Runs", html.table("Every run", rows, summary=f"{len(rows)} runs")
                             + _findings(labels, datas), level=2))
    body.append(html.section("Configuration", "".join(_configuration(label, d) for label, d in zip(labels, datas)),
                             level=2))
    return html.page(title or _default_title(datas, result), "".join(body), subtitle=" vs ".join(labels))


def _default_title(datas: list[dict], result) -> str:
    if result is None:
        return "Serving benchmark" if len(datas) == 1 else "Serving benchmarks"
    differs = result.allowed_differences
    if "server_version" in differs:
        old, new = differs["server_version"]
        return f"Serving: upgrade rehearsal, vLLM {old} → {new}"
    if differs:
        return "Serving: regression gate (" + ", ".join(f"{k} differ" for k in differs) + ")"
    return "Serving: regression gate"


def _server_line(data: dict) -> str:
    env = data.get("environment", {})
    machine = env.get("machine") or {}
    gpu = machine.get("gpu") or f"{machine.get('cpu_model', 'CPU')} × {machine.get('cpu_count', '?')} cores"
    return f"vLLM {env.get('server_version') or 'unknown'}, {env.get('model_id') or env.get('model')}, on {gpu}"


def _findings(labels: list[str], datas: list[dict]) -> str:
    rows = [{"results": label, "level": _level(r), "finding": f}
            for label, d in zip(labels, datas) for r in d.get("runs", [])
            for f in (r.get("token_accounting", {}).get("findings", []) + r.get("client_bound_reasons", [])
                      + r.get("timing_warnings", []))]
    return html.table("Findings", rows, summary="token disagreements and client warnings") if rows else ""
