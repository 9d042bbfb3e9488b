"""HTML pieces shared by every report: the page, the verdict strip, the machine line, tables that
fold away with a one-line summary (sortable and filterable, offline: a few lines of inline script).

Everything a caller passes as text is escaped here; only `section` takes trusted HTML (fragments
the harness made itself: other tables, inline SVG).
"""

from __future__ import annotations

import html
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable

from . import fmt

# Okabe-Ito: good (blue), bad (vermillion), caution (orange), neutral (grey). Each state also
# carries a word and a symbol, so colour is never the only signal.
STATE_STYLE = {
    "good": ("#0072B2", "✓"),
    "bad": ("#D55E00", "✗"),
    "warn": ("#E69F00", "!"),
    "neutral": ("#6e7781", "–"),
}
VERDICT_STATES = {"pass": "good", "passed": "good", "ok": "good", "fit": "good", "fits": "good", "yes": "good",
                  "ready": "good", "safe": "good", "refused": "good", "unchanged": "good", "improved": "good",
                  "fail": "bad", "failed": "bad", "error": "bad", "oom": "bad", "regressed": "bad", "no": "bad",
                  "warn": "warn", "warning": "warn", "inconclusive": "warn", "xpassed": "warn",
                  "skip": "neutral", "skipped": "neutral", "xfailed": "neutral"}
FOLD_ROWS = 30  # tables longer than this start folded

_ids = itertools.count(1)

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;color:#1f2328;background:#fff}
main{max-width:1240px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:4px 0 2px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}.sub{color:#57606a;font-size:13px;margin:0 0 12px}
.verdicts{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0 12px}
.verdict{flex:1 1 330px;border:1px solid #d0d7de;border-left:8px solid var(--c);border-radius:6px;padding:8px 12px;background:#f6f8fa}
.verdict .q{font-size:12px;color:#57606a;text-transform:uppercase;letter-spacing:.04em}
.verdict .a{font-size:20px;font-weight:700;color:var(--c);margin:2px 0 4px}
.verdict ul{margin:2px 0 0;padding-left:18px;font-size:13px}.verdict li{margin:2px 0}
.verdict .fix{color:#57606a}
.machine{font-size:13px;background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:6px 10px;margin:0 0 8px}
.machine b{font-weight:600}.counts{font-size:13px;margin:4px 0 8px}.counts span{margin-right:12px}
.links{font-size:13px;margin:6px 0}.links a{margin-right:14px}
.harness-table{border-collapse:collapse;margin:6px 0 14px;font-size:13px}
.harness-table th,.harness-table td{border:1px solid #d0d7de;padding:3px 8px;text-align:left;vertical-align:top;max-width:560px;overflow-wrap:anywhere}
.harness-table th{background:#f6f8fa;position:sticky;top:0;white-space:nowrap}.harness-table td.num{text-align:right;font-variant-numeric:tabular-nums}
.harness-table th.sortable{cursor:pointer}.harness-table th.sortable:after{content:" ↕";color:#8c959f}
.st{font-weight:600;white-space:nowrap}
details.fold{overflow-x:auto;margin:8px 0;border:1px solid #d0d7de;border-radius:6px;padding:4px 10px}
details.fold>summary{cursor:pointer;font-size:14px;padding:3px 0}details.fold>summary b{font-weight:600}
details.fold>summary .sum{color:#57606a}.filter{margin:6px 0;padding:3px 6px;font-size:13px;width:260px}
pre{background:#f6f8fa;border:1px solid #d0d7de;border-radius:6px;padding:8px;overflow:auto;font-size:12px;max-height:420px}
.note{font-size:13px;color:#57606a;margin:4px 0 10px}.figs{display:flex;flex-wrap:wrap;gap:8px}
.figs svg{max-width:100%;height:auto}.harness-section{margin:8px 0}
footer{margin-top:32px;font-size:12px;color:#57606a}
"""

# Sort on header click (numbers by their raw value), filter rows by a text box. No network, no eval.
SCRIPT = """
(function(){
function key(td){var v=td.getAttribute('data-v');return v===null?td.textContent.trim().toLowerCase():parseFloat(v);}
document.querySelectorAll('table.harness-table').forEach(function(t){
  var ths=t.querySelectorAll('thead th');
  ths.forEach(function(th,i){th.classList.add('sortable');th.addEventListener('click',function(){
    var body=t.tBodies[0];if(!body)return;var rows=Array.prototype.slice.call(body.rows);
    var dir=th.getAttribute('data-dir')==='asc'?-1:1;th.setAttribute('data-dir',dir===1?'asc':'desc');
    rows.sort(function(a,b){var x=key(a.cells[i]||a),y=key(b.cells[i]||b);
      if(typeof x==='number'&&typeof y==='number')return (x-y)*dir;return String(x)<String(y)?-dir:String(x)>String(y)?dir:0;});
    rows.forEach(function(r){body.appendChild(r);});});});});
document.querySelectorAll('input.filter').forEach(function(box){
  var t=document.getElementById(box.getAttribute('data-table'));if(!t)return;
  box.addEventListener('input',function(){var q=box.value.toLowerCase();
    Array.prototype.forEach.call(t.tBodies[0].rows,function(r){r.style.display=r.textContent.toLowerCase().indexOf(q)<0?'none':'';});});});
})();
"""

TABLE_STYLE = f"<style>{CSS}</style>"


def esc(text: Any) -> str:
    return html.escape("" if text is None else str(text))


def state_of(word: str) -> str:
    return VERDICT_STATES.get(str(word).strip().lower(), "neutral")


def state_span(word: str) -> str:
    colour, symbol = STATE_STYLE[state_of(word)]
    return f'<span class="st" style="color:{colour}">{symbol} {esc(word)}</span>'


@dataclass
class Verdict:
    """One card of the verdict strip: the question, the answer in a few words, and details."""

    question: str
    answer: str
    state: str  # good | bad | warn | neutral
    lines: list[str] = field(default_factory=list)
    fixes: list[str] = field(default_factory=list)  # same length as lines, "" where there is none

    def to_html(self) -> str:
        colour, symbol = STATE_STYLE.get(self.state, STATE_STYLE["neutral"])
        items = []
        for i, line in enumerate(self.lines):
            fix = self.fixes[i] if i < len(self.fixes) else ""
            items.append(f"<li>{esc(line)}" + (f' <span class="fix">fix: {esc(fix)}</span>' if fix else "") + "</li>")
        ul = f"<ul>{''.join(items)}</ul>" if items else ""
        return (f'<div class="verdict" data-state="{esc(self.state)}" style="--c:{colour}">'
                f'<div class="q">{esc(self.question)}</div><div class="a">{symbol} {esc(self.answer)}</div>{ul}</div>')


def verdict_strip(verdicts: Iterable[Verdict]) -> str:
    return f'<section class="verdicts" id="verdict">{"".join(v.to_html() for v in verdicts)}</section>'


def _cell(v: Any, column: str, verdict_columns: set[str]) -> str:
    text = fmt.value(v, column)
    attrs = ""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        attrs = f' class="num" data-v="{float(v)!r}"' if v == v else ' class="num"'
    if column.lower() in verdict_columns and isinstance(v, str) and v.strip().lower() in VERDICT_STATES:
        return f"<td>{state_span(v)}</td>"
    if "\n" in text:
        return f"<td><pre>{esc(text)}</pre></td>"
    return f"<td{attrs}>{esc(text)}</td>"


def header(column: str) -> str:
    """A column key as a header: `median_s` -> `median` (the cells carry the unit)."""
    text = str(column)
    for suffix in ("_bytes", "_ms", "_s"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    return text.replace("_", " ")


def table_html(rows: list[dict[str, Any]], table_id: str | None = None,
               columns: list[str] | None = None) -> str:
    if columns is None:
        columns = []
        for row in rows:
            columns += [c for c in row if c not in columns]
    verdict_columns = {"verdict", "outcome", "refused", "result", "tokens", "state"}
    head = "".join(f"<th>{esc(header(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(row.get(c), c, verdict_columns) for c in columns) + "</tr>" for row in rows)
    ident = f' id="{esc(table_id)}"' if table_id else ""
    return f'<table class="harness-table"{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def table(title: str, rows: Iterable[dict[str, Any]], summary: str | None = None, open_: bool | None = None,
          columns: list[str] | None = None) -> str:
    """A titled table, folded behind its one-line summary when it is long (FOLD_ROWS)."""
    rows = list(rows)
    table_id = f"t{next(_ids)}"
    is_open = len(rows) <= FOLD_ROWS if open_ is None else open_
    count = f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
    line = f"{count}: {summary}" if summary else count
    box = f'<input class="filter" data-table="{table_id}" placeholder="filter rows" aria-label="filter rows">' \
        if len(rows) > FOLD_ROWS else ""
    return (f'<details class="fold harness-section"{" open" if is_open else ""}><summary><b>{esc(title)}</b> '
            f'<span class="sum">— {esc(line)}</span></summary>{box}{table_html(rows, table_id, columns)}</details>')


def table_fold(title: str, summary: str, table: str, open_: bool = False, table_id: str = "tests") -> str:
    """A table made by the caller (with id `table_id`), folded, with a filter box."""
    box = f'<input class="filter" data-table="{esc(table_id)}" placeholder="filter rows" aria-label="filter rows">'
    return fold(title, summary, box + table, open_)


def section(title: str, fragment: str, level: int = 3) -> str:
    """A titled block around trusted HTML produced by the harness itself (tables, inline SVG)."""
    return f'<div class="harness-section"><h{level}>{esc(title)}</h{level}>{fragment}</div>'


def fold(title: str, summary: str, fragment: str, open_: bool = False) -> str:
    return (f'<details class="fold"{" open" if open_ else ""}><summary><b>{esc(title)}</b> '
            f'<span class="sum">— {esc(summary)}</span></summary>{fragment}</details>')


def note(text: str) -> str:
    return f'<p class="note">{esc(text)}</p>'


def machine_line(parts: list[tuple[str, str]]) -> str:
    inner = " · ".join(f"<b>{esc(k)}</b> {esc(v)}" for k, v in parts)
    return f'<div class="machine" id="machine">{inner}</div>'


def page(title: str, body: str, subtitle: str = "") -> str:
    """A complete self-contained HTML page: inline style and script, no external asset."""
    sub = f'<p class="sub">{esc(subtitle)}</p>' if subtitle else ""
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{esc(title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{esc(title)}</h1>{sub}{body}</main><script>{SCRIPT}</script></body></html>")
