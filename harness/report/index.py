"""reports/index.html: every run in reports/ (suite, time, machine, versions, verdict) with links,
the serving pages, and trends across runs of the same machine (readiness over time, TTFT p50 per
vLLM version). Written by the plugin after every run; `python -m harness report --index DIR`."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from pathlib import Path

from .. import atomic
from . import fmt, html, machine, pages, plots, verdicts

MAX_JSON_BYTES = 50 * 2**20


def _load(path: Path) -> dict | None:
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def runs(report_dir: Path) -> list[tuple[Path, dict]]:
    """The pytest runs (results JSON of kind pytest-run) directly under report_dir, newest first."""
    out = []
    for path in Path(report_dir).glob("*.json"):
        if path.name == "latest.json":
            continue
        data = _load(path)
        if data and data.get("kind") == "pytest-run":
            out.append((path, data))
    return sorted(out, key=lambda pd: -(pd[1].get("started") or 0))


def bench_results(report_dir: Path) -> list[tuple[Path, dict]]:
    """Bench results files (schema_version 1 with runs[]) anywhere under report_dir."""
    out = []
    for path in sorted(Path(report_dir).rglob("*.json")):
        if path.parent == Path(report_dir) and path.name == "latest.json":
            continue
        data = _load(path)
        if data and data.get("schema_version") == 1 and isinstance(data.get("runs"), list) and "kind" not in data:
            out.append((path, data))
    return out


def _versions(data: dict) -> str:
    env = data.get("environment") or {}
    p = env.get("packages") or {}
    t = env.get("torch") or {}
    v = env.get("vllm") or {}
    parts = [f"torch {t.get('version') or 'missing'}", f"transformers {p.get('transformers') or 'missing'}"]
    if v.get("version"):
        parts.append(f"vLLM {v['version']}")
    return ", ".join(parts)


def _gpu(data: dict) -> str:
    parts = dict(machine.parts(data.get("environment") or {}))
    return parts.get("GPU", "none")


def _runs_table(report_dir: Path, found: list[tuple[Path, dict]]) -> str:
    rows = []
    for path, data in found:
        answer, state = verdicts.headline(data)
        colour, symbol = html.STATE_STYLE[state]
        page = data.get("html") or path.with_suffix(".html").name
        has_page = (Path(report_dir) / page).is_file()
        summary = data.get("summary") or {}
        counts = ", ".join(f"{n} {k}" for k, n in sorted(summary.items(), key=lambda kv: -kv[1])) or "no test"
        links = (f'<a href="{html.esc(page)}">report</a> · ' if has_page else "") + \
            f'<a href="{html.esc(path.name)}">JSON</a>'
        rows.append(
            f'<tr><td style="white-space:nowrap" data-v="{float(data.get("started") or 0)!r}">{html.esc(fmt.clock(data.get("started")))}</td>'
            f"<td>{html.esc(data.get('suite'))}</td><td>{html.esc(machine.identity(data))}</td>"
            f"<td>{html.esc(_gpu(data))}</td><td>{html.esc(_versions(data))}</td><td>{html.esc(counts)}</td>"
            f'<td><span class="st" style="color:{colour}">{symbol} {html.esc(answer)}</span></td><td>{links}</td></tr>')
    head = ("<tr><th>time</th><th>suite</th><th>machine</th><th>GPU</th><th>versions</th><th>tests</th>"
            "<th>verdict</th><th>open</th></tr>")
    table = f'<table class="harness-table" id="runs"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
    return html.table_fold("Runs", f"{len(rows)} runs, newest first", table, open_=True, table_id="runs")


def _pages_table(report_dir: Path) -> str:
    rows = []
    for path in sorted(Path(report_dir).rglob("*.html"), key=lambda p: -p.stat().st_mtime):
        rel = path.relative_to(report_dir).as_posix()
        if path.parent == Path(report_dir) or "screenshots" in path.parts:
            continue
        rows.append({"page": pages.title_of(path), "file": rel, "written": fmt.clock(path.stat().st_mtime)})
    if not rows:
        return ""
    body = "".join(f'<tr><td><a href="{html.esc(r["file"])}">{html.esc(r["page"])}</a></td>'
                   f'<td>{html.esc(r["file"])}</td><td>{html.esc(r["written"])}</td></tr>' for r in rows)
    table = (f'<table class="harness-table" id="pages"><thead><tr><th>page</th><th>file</th><th>written</th></tr>'
             f'</thead><tbody>{body}</tbody></table>')
    return html.table_fold("Serving and bench pages", f"{len(rows)} pages", table, open_=len(rows) <= 12,
                           table_id="pages")


def _latest_cards(found: list[tuple[Path, dict]]) -> list[html.Verdict]:
    """One card per machine: the newest answer of each suite run there (worst state first)."""
    rank = {"bad": 3, "warn": 2, "good": 1, "neutral": 0}
    per_machine: dict[str, dict[str, tuple[html.Verdict, float]]] = {}
    for _path, data in found:  # newest first
        latest = per_machine.setdefault(machine.identity(data), {})
        for card in verdicts.for_run(data):
            if card.question != "Did the run finish?" and card.question not in latest:
                latest[card.question] = (card, data.get("started") or 0)
    cards = []
    for name, latest in per_machine.items():
        if not latest:  # only interrupted runs there: nothing but "Did the run finish?"
            continue
        items = sorted(latest.values(), key=lambda cv: -rank.get(cv[0].state, 0))
        worst = items[0][0].state
        problems = [c for c, _ in items if c.state in ("bad", "warn")]
        answer = "All good" if not problems else f"{fmt.plural(len(problems), 'finding')} to read"
        lines = [f"{html.STATE_STYLE[c.state][1]} {c.question} {c.answer} ({fmt.clock(t)})" for c, t in items]
        cards.append(html.Verdict(f"Newest runs on {name}", answer, worst, lines))
    return cards


READINESS_LEVELS = {"Not ready": 0, "No GPU found": 1, "Ready, with caveats": 2, "Ready": 3}


def readiness_points(found: list[tuple[Path, dict]]) -> dict[str, list[tuple[float, float]]]:
    """machine -> [(time, readiness level)] over the runs that had hardware checks."""
    series: dict[str, list[tuple[float, float]]] = {}
    for _path, data in found:
        tests = verdicts.tests_by_suite(data).get("hw")
        if not tests:
            continue
        card = verdicts.hw(data, tests)
        series.setdefault(machine.identity(data), []).append((data.get("started") or 0,
                                                              READINESS_LEVELS.get(card.answer, 0)))
    return series


def ttft_by_version(benches: list[tuple[Path, dict]]) -> tuple[dict[str, list[float]], str]:
    """vLLM version -> TTFT p50 (ms) of each run at the most common workload and concurrency."""
    keyed = []
    for _path, data in benches:
        env = data.get("environment") or {}
        version = env.get("server_version")
        if not version:
            continue
        wl = data.get("workload") or {}
        for run in data["runs"]:
            p50 = (run.get("ttft_ms") or {}).get("p50")
            if p50 is None or run.get("concurrency") is None:
                continue
            key = (wl.get("input_len"), wl.get("output_len"), run["concurrency"], (env.get("machine") or {}).get("hostname"))
            keyed.append((key, str(version), float(p50)))
    if not keyed:
        return {}, ""
    key = Counter(k for k, _, _ in keyed).most_common(1)[0][0]
    groups: dict[str, list[float]] = {}
    for k, version, p50 in keyed:
        if k == key:
            groups.setdefault(version, []).append(p50)
    groups = dict(sorted(groups.items(), key=lambda kv: [int(x) if x.isdigit() else x for x in kv[0].split(".")]))
    label = f"input {key[0]} / output {key[1]} tokens, concurrency {key[2]}, host {key[3] or 'unknown'}"
    return groups, label


def _trends(found: list[tuple[Path, dict]], benches: list[tuple[Path, dict]]) -> str:
    parts = []
    ready = readiness_points(found)
    if any(len(p) >= 2 for p in ready.values()):
        parts.append(plots.trend(ready, title="Readiness over time (each hw run)", ylabel="",
                                 step=True, yticks={v: k for k, v in READINESS_LEVELS.items()}))
    else:
        parts.append(html.note("Readiness over time: drawn once a machine has two runs with hardware checks "
                               f"({sum(len(p) for p in ready.values())} so far)."))
    groups, label = ttft_by_version(benches)
    if groups:
        parts.append(plots.categories(groups, title=f"TTFT p50 per vLLM version ({label})", ylabel="TTFT p50, ms",
                                      xlabel="vLLM version (line: median of runs)"))
        parts.append(html.note(" · ".join(f"vLLM {v}: median {statistics.median(ys):.1f} ms over {len(ys)} runs"
                                          for v, ys in groups.items())))
    else:
        parts.append(html.note("TTFT per vLLM version: no bench results under this folder yet."))
    return html.section("Trends", f'<div class="figs">{"".join(parts)}</div>', level=2)


def render(report_dir: Path) -> str:
    report_dir = Path(report_dir)
    found = runs(report_dir)
    benches = bench_results(report_dir)
    body = [html.verdict_strip(_latest_cards(found) or [html.Verdict("What ran?", "No runs yet", "neutral",
                                                                     ["run pytest suites/hw to start"])])]
    machines = Counter(machine.identity(data) for _path, data in found)
    body.append(html.machine_line([(name, fmt.plural(n, "run")) for name, n in machines.most_common()]
                                  or [("machines", "none yet")]))
    body.append(_runs_table(report_dir, found))
    body.append(_pages_table(report_dir))
    body.append(_trends(found, benches))
    sub = f"{len(found)} runs and {len(benches)} bench results in {report_dir}"
    return html.page("LLM harness: all runs", "".join(body), subtitle=sub)


def write(report_dir: Path) -> Path:
    out = Path(report_dir) / "index.html"
    atomic.write_text(out, render(report_dir))
    return out
