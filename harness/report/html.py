"""Small HTML fragments (escaped tables, sections) shared by the pytest report and the CLI reports."""

from __future__ import annotations

import html
from typing import Any, Iterable

VERDICT_COLOURS = {"pass": "#1a7f37", "passed": "#1a7f37", "ok": "#1a7f37", "fit": "#1a7f37",
                   "fail": "#cf222e", "failed": "#cf222e", "error": "#cf222e", "oom": "#cf222e",
                   "warn": "#9a6700", "warning": "#9a6700", "skip": "#6e7781", "skipped": "#6e7781"}

TABLE_STYLE = (
    "<style>.harness-table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}"
    ".harness-table th,.harness-table td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top}"
    ".harness-table th{background:#f6f8fa}.harness-section h3{margin:16px 0 4px}</style>"
)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = "" if value is None else str(value)
    colour = VERDICT_COLOURS.get(text.lower()) if isinstance(value, str) else None
    escaped = html.escape(text)
    return f'<td style="color:{colour};font-weight:600">{escaped}</td>' if colour else f"<td>{escaped}</td>"


def table(title: str, rows: Iterable[dict[str, Any]]) -> str:
    rows = list(rows)
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(row.get(c)) for c in columns) + "</tr>" for row in rows)
    return (f'<div class="harness-section"><h3>{html.escape(title)}</h3>'
            f'<table class="harness-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>')


def section(title: str, fragment: str) -> str:
    """A titled block around trusted HTML produced by the harness itself (tables, inline SVG)."""
    return f'<div class="harness-section"><h3>{html.escape(title)}</h3>{fragment}</div>'


def page(title: str, body: str) -> str:
    """A complete self-contained HTML page (no external assets)."""
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>body{{font-family:system-ui,sans-serif;margin:24px;color:#1f2328}}</style>{TABLE_STYLE}"
            f"</head><body><h1>{html.escape(title)}</h1>{body}</body></html>")
