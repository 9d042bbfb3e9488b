"""Pages a run produced besides its own report (the serving gate, the upgrade rehearsal, bench
reports), and the links between them: the run report lists them, each page links back."""

from __future__ import annotations

import os
import re
from pathlib import Path

from .. import atomic

BACKLINK_MARK = "<!--harness:backlinks-->"
_TITLE = re.compile(r"<title>(.*?)</title>", re.S | re.I)
RUN_REPORT = re.compile(r"^[a-z0-9+_-]+-\d{8}-\d{6}\.html$")


def title_of(path: Path) -> str:
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:4000]
    except OSError:
        return path.name
    match = _TITLE.search(head)
    import html

    return html.unescape(match.group(1)).strip() if match else path.stem


def produced_since(report_dir: Path, since: float, exclude: set[str] | None = None) -> list[tuple[str, str]]:
    """(path relative to report_dir, page title) of every HTML page under report_dir written
    since `since`, except run reports, latest.html, index.html and `exclude`."""
    exclude = set(exclude or ()) | {"latest.html", "index.html"}
    out = []
    for path in sorted(Path(report_dir).rglob("*.html")):
        rel = path.relative_to(report_dir).as_posix()
        if rel in exclude or (path.parent == Path(report_dir) and RUN_REPORT.match(path.name)):
            continue
        if "screenshots" in path.parts:
            continue
        try:
            if path.stat().st_mtime + 1 < since:
                continue
        except OSError:
            continue
        out.append((rel, title_of(path)))
    return out


def add_backlink(page: Path, target: Path, label: str) -> bool:
    """Put a link to `target` where `page` marked room for it (bench_html pages do)."""
    try:
        text = page.read_text(encoding="utf-8")
    except OSError:
        return False
    if BACKLINK_MARK not in text:
        return False
    href = os.path.relpath(target, page.parent).replace(os.sep, "/")
    import html

    link = f'<a href="{html.escape(href)}">← {html.escape(label)}</a>'
    atomic.write_text(page, text.replace(BACKLINK_MARK, link + BACKLINK_MARK, 1))
    return True
