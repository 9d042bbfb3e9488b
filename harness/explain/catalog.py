"""The libraries' own messages: match a pasted text against the templates mined from their raise
and logging call sites (scripts/explain_catalog.py -> harness/explain/data/catalog.json.gz).

A template is the message with its run-time fields as wildcards ("Target modules {*} not found in
the base model. Please check the target modules and try again."). Matching is indexed: every
template is filed under its two rarest literal words; a text's words pick the candidates, and only
those are tried, as a regex over a window around the word (literal parts in order, whitespace and
line wraps as any whitespace, each wildcard up to 300 characters). A text cut short (a title
line, a truncated paste) matches when its part of the template holds at least 60 % of the
template's literal characters and 24 of them.

The answer is the raise site: library, version, file, line, exception class, the `if` around
it, and the kind the catalog's rules map it to (None when no rule does).
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).parent / "data" / "catalog.json.gz"  # generated; gzip keeps the package small
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{3,}")
_WINDOW_BEFORE, _WINDOW_AFTER = 600, 2400
MIN_MATCHED = 24
MIN_SHARE = 0.6
MIN_CUT = 30  # a text that ends where the template is cut: this many literal characters


@dataclass
class Site:
    library: str
    version: str | None
    file: str
    line: int
    exception: str
    call: str
    kind: str | None
    condition: str | None
    template: str
    matched: str = "whole"  # or "cut": the text holds the template's first part only
    evidence: str = ""
    position: int = 0

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("position")
        return out

    def where(self) -> str:
        return f"{self.library} {self.version or '?'} {self.file}:{self.line}"


class Catalog:
    def __init__(self, data: dict):
        self.wild = data["wildcard"]
        self.versions = {b["library"]: b.get("version") for b in data["libraries"]}
        self.libraries = data["libraries"]
        self.rows = data["sites"]
        self.pieces = [[p.strip() for p in row[1].split(self.wild)] for row in self.rows]
        words = [set(_WORD.findall(" ".join(p))) for p in self.pieces]
        df = Counter(w for ws in words for w in ws)
        self.index: dict[str, list[int]] = {}
        for i, ws in enumerate(words):
            # the rarest word overall, and the rarest in the first piece (a cut text keeps the start)
            start = next((p for p in self.pieces[i] if p), "")[:60]
            first = {w for w in _WORD.findall(start) if w in ws and not start.endswith(w)}
            picks = sorted(ws, key=lambda w: (df[w], -len(w)))[:1] + sorted(first, key=lambda w: (df[w], -len(w)))[:1]
            for w in set(picks):
                self.index.setdefault(w, []).append(i)
        self._regex: dict[int, list[re.Pattern]] = {}

    def _pattern(self, i: int) -> tuple[re.Pattern, int]:
        """The template as a regex whose tail is optional word by word (a cut text matches its start);
        each wildcard is a group, so the literal characters a match covers can be counted."""
        if i not in self._regex:
            # steps: a piece's first word (after a wildcard: its first three words, so the lazy wildcard
            # stretches to where the piece really resumes), then each further word, each step optional
            steps: list[str] = []
            total = 0
            for k, piece in enumerate(self.pieces[i]):
                words = piece.split()
                total += sum(len(w) for w in words)
                if not words:
                    continue
                if k == 0 or not steps:
                    steps.append(re.escape(words[0]))
                    rest = words[1:]
                else:
                    head = r"\s+".join(re.escape(w) for w in words[:3])
                    steps.append(r"([^\n]{0,300}?)" + head)
                    rest = words[3:]
                steps.extend(r"\s+" + re.escape(w) for w in rest)
            body = ""
            for step in reversed(steps[1:]):
                body = f"(?:{step}{body})?"
            self._regex[i] = (re.compile(steps[0] + body), total)
        return self._regex[i]

    def match(self, text: str) -> Site | None:
        present = set(_WORD.findall(text))
        candidates = {i: w for w in present & self.index.keys() for i in self.index[w]}
        best: tuple | None = None
        for i, anchor in candidates.items():
            row = self.rows[i]
            pattern, total = self._pattern(i)
            for at in _last_occurrences(text, anchor):
                window_start = max(0, at - _WINDOW_BEFORE)
                window = text[window_start:at + _WINDOW_AFTER]
                for m in pattern.finditer(window):
                    used = len(re.sub(r"\s+", "", m.group(0))) - sum(len(re.sub(r"\s+", "", g or "")) for g in m.groups())
                    total_chars = len(re.sub(r"\s+", "", "".join(self.pieces[i])))
                    whole = used >= total_chars
                    rest = window[m.end():window.find("\n", m.end()) if "\n" in window[m.end():] else len(window)]
                    at_cut = len(rest.strip()) <= 25 and " " not in rest.strip()  # the text ends here, maybe mid-word
                    if used < MIN_MATCHED or not (whole or used >= MIN_SHARE * total_chars or (at_cut and used >= MIN_CUT)):
                        continue
                    # a real raise beats a warning; more of the template beats less; later beats earlier
                    key = (min(used, 400), row[5] == "raise", window_start + m.end())
                    if best is None or key > best[0]:
                        best = (key, i, whole, window_start + m.start(), window_start + m.end())
        if best is None:
            return None
        _, i, whole, start, end = best
        row = self.rows[i]
        line_start = text.rfind("\n", 0, start) + 1
        line_end = text.find("\n", end)
        evidence = text[line_start:line_end if line_end >= 0 else len(text)].strip()[:300]
        return Site(row[0], self.versions.get(row[0]), row[2], row[3], row[4], row[5], row[6], row[7], row[1],
                    "whole" if whole else "cut", evidence, end)


def _last_occurrences(text: str, word: str, limit: int = 3) -> list[int]:
    found, at = [], text.rfind(word)
    while at >= 0 and len(found) < limit:
        found.append(at)
        at = text.rfind(word, 0, at)
    return found


@lru_cache(maxsize=1)
def load() -> Catalog | None:
    if not DATA.is_file():
        return None
    return Catalog(json.loads(gzip.decompress(DATA.read_bytes()).decode("utf-8")))


def match(text: str) -> Site | None:
    catalog = load()
    return catalog.match(text) if catalog else None
