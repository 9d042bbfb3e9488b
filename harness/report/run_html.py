"""A pytest run's results JSON -> its self-contained HTML report (the plugin writes it at the end
of every run; `python -m harness report reports/hw-....json --out X.html` re-renders it).

The first screen answers the question: the verdict strip, then the machine line and the counts.
Figures and tables follow (long tables folded behind a one-line summary), then pytest-benchmark
timings and every test; the environment and settings come last.
"""

from __future__ import annotations

from typing import Any

from . import figures, fmt, html, machine, server, verdicts

TITLE = "LLM harness"


def _counts_line(results: dict) -> str:
    tests = results.get("tests", [])
    counts: dict[str, int] = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    spent = sum(t.get("duration_s") or 0 for t in tests)
    parts = [f"<span><b>{len(tests)} test{'s' if len(tests) != 1 else ''}</b>: "
             + ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])) + "</span>"
             if tests else "<span><b>no test ran</b></span>"]
    parts.append(f"<span>time in tests {html.esc(fmt.duration(spent))}</span>")
    if results.get("wall_s"):
        parts.append(f"<span>wall time {html.esc(fmt.duration(results['wall_s']))}</span>")
    parts.append(f"<span>status {html.esc(results.get('status', 'unknown'))}</span>")
    return f'<div class="counts" id="counts">{"".join(parts)}</div>'


def _links(results: dict, index_href: str | None) -> str:
    items = []
    if index_href:
        items.append(f'<a href="{html.esc(index_href)}">← all runs</a>')
    for link in results.get("links", []):
        items.append(f'<a href="{html.esc(link["path"])}">{html.esc(link["title"])}</a>')
    return f'<nav class="links" id="links">{"".join(items)}</nav>' if items else ""


def _table_summary(rows: list[dict]) -> str:
    errors = [r.get("error") for r in rows if isinstance(r.get("error"), str) and r["error"].endswith("%")]
    if errors:
        nums = sorted(abs(float(e.rstrip("% "))) for e in errors)
        return f"median |error| {nums[len(nums) // 2]:.2f} %, worst {nums[-1]:.2f} %"
    for column in ("verdict", "refused", "outcome", "mode"):
        values = [str(fmt.value(r.get(column))) for r in rows if column in r]
        if values:
            counts: dict[str, int] = {}
            for v in values:
                counts[v] = counts.get(v, 0) + 1
            if column in ("verdict", "outcome"):
                return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            return ", ".join(f"{n} with {column} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    columns = list(dict.fromkeys(c for r in rows for c in r))
    return "columns: " + ", ".join(columns[:6]) + (" ..." if len(columns) > 6 else "")


def _open(rows: list[dict]) -> bool:
    """Open short tables, unless they are mostly skipped checks (the verdict already says why)."""
    skips = sum(1 for r in rows if str(r.get("verdict", "")).lower() == "skip")
    return len(rows) <= html.FOLD_ROWS and skips < 0.8 * len(rows)


def _record_html(record: dict[str, Any]) -> str:
    short, long = [], []
    for key, value in record.items():
        text = fmt.value(value, key)
        if "\n" in text or len(text) > 160:
            long.append(html.fold(fmt.words(key), f"{len(text.splitlines())} lines", f"<pre>{html.esc(text)}</pre>"))
        else:
            short.append(f"{html.esc(fmt.words(key))}: {html.esc(text)}")
    return " · ".join(short) + "".join(long)


def _tests_table(tests: list[dict]) -> str:
    rows = []
    for t in tests:
        message = fmt.skip_reason(t.get("message")) if t["outcome"] == "skipped" else t.get("message")
        rows.append(
            f"<tr><td>{html.esc(t['nodeid'])}</td><td>{html.state_span(t['outcome'])}</td>"
            f'<td class="num" data-v="{float(t.get("duration_s") or 0)!r}">{html.esc(fmt.duration(t.get("duration_s")))}</td>'
            f"<td>{html.esc(message or '')}</td><td>{_record_html(t.get('record') or {})}</td></tr>")
    head = "<tr><th>test</th><th>outcome</th><th>duration</th><th>reason or failure</th><th>recorded</th></tr>"
    return f'<table class="harness-table" id="tests"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _failures(tests: list[dict]) -> str:
    blocks = []
    for t in tests:
        if t["outcome"] in verdicts.BAD_OUTCOMES:
            detail = t.get("detail") or t.get("message") or ""
            blocks.append(html.fold(t["nodeid"], t.get("message") or t["outcome"], f"<pre>{html.esc(detail)}</pre>"))
    return html.section("Failures", "".join(blocks), level=2) if blocks else ""


def _benchmarks(marks: list[dict]) -> str:
    if not marks:
        return ""
    rows = [{"timing": b["name"], "group": b.get("group") or "", "median_s": b["median_s"], "min_s": b["min_s"],
             "mean_s": b["mean_s"], "stddev_s": b["stddev_s"], "rounds": b["rounds"]} for b in marks]
    return html.section("Timings (pytest-benchmark)", html.note(
        "In-process steps timed by pytest-benchmark on this machine: not pass/fail thresholds. "
        "Keep them with --benchmark-autosave and compare runs with --benchmark-compare.")
        + html.table("Timings", rows, summary=f"slowest median {fmt.duration(max(b['median_s'] for b in marks))}",
                     open_=True), level=2)


def _environment(results: dict) -> str:
    env = results.get("environment") or {}
    rows = [{"item": "python packages", "value": ", ".join(f"{k} {v or 'missing'}" for k, v in
                                                          (env.get("packages") or {}).items())}]
    torch = env.get("torch") or {}
    rows.append({"item": "torch", "value": f"{torch.get('version')}, CUDA build {torch.get('cuda_build') or 'none'}, "
                                           f"arch list {', '.join(torch.get('arch_list') or []) or 'none'}"})
    for d in torch.get("devices") or []:
        rows.append({"item": f"cuda:{d['index']}", "value": f"{d['name']}, compute capability "
                     f"{'.'.join(str(x) for x in d['capability'])}, {fmt.value(d['total_memory'], 'total_memory')}"})
    vllm = env.get("vllm") or {}
    rows.append({"item": "vLLM", "value": vllm.get("version") or vllm.get("error") or "not probed"})
    nvml = env.get("nvml") or {}
    if nvml.get("reason"):
        rows.append({"item": "NVML", "value": nvml["reason"]})
    settings = [{"setting": k, "value": v} for k, v in (results.get("settings") or {}).items()]
    return (html.section("Environment", html.table("Probed stack", rows, open_=False,
                                                   summary="package versions, devices, vLLM")
                         + html.table("Settings", settings, open_=False, summary="options this run resolved"),
                         level=2))


def render(results: dict, index_href: str | None = "index.html") -> str:
    suite = results.get("suite", "run")
    env = results.get("environment") or {}
    host = (results.get("machine") or {}).get("host")
    body = [html.verdict_strip(verdicts.for_run(results)),
            html.machine_line(server.with_server(machine.parts(env, host), (results.get("machine") or {}).get("server"))),
            _counts_line(results),
            _links(results, index_href)]
    figs = [figures.draw(f) for f in results.get("figures", [])]
    figs += [html.section(f["title"], f["html"]) for f in results.get("fragments", [])]
    if figs:
        body.append(html.section("Figures", "".join(figs), level=2))
    tables = results.get("tables") or {}
    if tables:
        body.append(html.section("Tables", "".join(
            html.table(title, rows, summary=_table_summary(rows), open_=_open(rows)) for title, rows in tables.items()),
            level=2))
    body.append(_benchmarks(results.get("benchmarks") or []))
    tests = results.get("tests", [])
    body.append(_failures(tests))
    body.append(html.section("Tests", html.table_fold("Every test", f"{len(tests)} tests, "
                                                       + verdicts._counts(tests), _tests_table(tests),
                                                       open_=_open([{"verdict": t["outcome"].removesuffix("ped")}
                                                                    for t in tests])), level=2))
    body.append(_environment(results))
    body.append(f"<footer>{html.esc(TITLE)} · results schema {results.get('schema_version')} · "
                f"{html.esc(fmt.clock(results.get('started')))}</footer>")
    subtitle = f"{fmt.clock(results.get('started'))} · suite {suite} · {results.get('status', '')}"
    return html.page(f"{TITLE}: {suite}", "".join(body), subtitle=subtitle)

