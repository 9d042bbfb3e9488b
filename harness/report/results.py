"""The JSON results file of a suite run: written atomically after every test, so a run that is
interrupted or killed half way still leaves valid partial results on disk."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import atomic

SCHEMA_VERSION = 1


def write_json_atomic(path: str | Path, data: Any) -> None:
    atomic.write_json(path, data, default=_jsonable, allow_nan=False)


def _compact_json(data: Any) -> str:
    return json.dumps(data, default=_jsonable, allow_nan=False)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    if hasattr(value, "item"):  # numpy / torch scalars
        return value.item()
    return repr(value)


def sanitize(value: Any) -> Any:
    """Non-finite floats are not JSON: keep them readable as strings ("nan", "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    return value


@dataclass
class TestResult:
    nodeid: str
    outcome: str  # passed | failed | skipped | error | xfailed | xpassed
    duration_s: float
    message: str | None = None  # skip reason or the first line of the failure
    markers: list[str] = field(default_factory=list)
    record: dict[str, Any] = field(default_factory=dict)
    detail: str | None = None  # the full failure text (traceback), for the report's folded block


@dataclass
class RunResults:
    path: Path
    suite: str
    environment: dict[str, Any]
    settings: dict[str, Any]
    started: float = field(default_factory=time.time)
    status: str = "running"  # running | finished | interrupted
    tests: list[TestResult] = field(default_factory=list)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Added after schema 1 shipped (readers treat them as optional):
    machine: dict[str, Any] = field(default_factory=dict)  # line, host, gpu state and reason
    figures: list[dict[str, Any]] = field(default_factory=list)  # {kind, title, data}: drawn by the report
    fragments: list[dict[str, str]] = field(default_factory=list)  # {title, html}: record.html blocks
    links: list[dict[str, str]] = field(default_factory=list)  # {title, path}: pages this run produced
    benchmarks: list[dict[str, Any]] = field(default_factory=list)  # pytest-benchmark statistics
    html_path: str | None = None
    wall_s: float | None = None
    _test_texts: list[str] = field(default_factory=list, repr=False)  # each added test's JSON, made once

    def add_test(self, result: TestResult) -> None:
        self.tests.append(result)
        self._test_texts.append(_compact_json(sanitize(asdict(result))))
        self.write()

    def add_row(self, table: str, row: dict[str, Any]) -> None:
        self.tables.setdefault(table, []).append(row)

    def add_figure(self, kind: str, title: str, data: dict[str, Any]) -> None:
        self.figures.append({"kind": kind, "title": title, "data": data})

    def finish(self, interrupted: bool) -> None:
        self.status = "interrupted" if interrupted else "finished"
        self.wall_s = round(time.time() - self.started, 3)
        self.write()

    def summary(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tests:
            counts[t.outcome] = counts.get(t.outcome, 0) + 1
        return counts

    def to_dict(self, tests: bool = True) -> dict[str, Any]:
        """The results document; tests=False: all of it but the "tests" list."""
        return sanitize({
            "schema_version": SCHEMA_VERSION,
            "kind": "pytest-run",
            "suite": self.suite,
            "status": self.status,
            "started": self.started,
            "updated": time.time(),
            "summary": self.summary(),
            "environment": self.environment,
            "settings": self.settings,
            **({"tests": [asdict(t) for t in self.tests]} if tests else {}),
            "tables": self.tables,
            "machine": self.machine,
            "wall_s": self.wall_s,
            "html": self.html_path,
            "figures": self.figures,
            "fragments": self.fragments,
            "links": self.links,
            "benchmarks": self.benchmarks,
        })

    def write(self) -> None:
        """While running, after each test: the tests written before are not encoded again but
        spliced in as made (re-encoding them all after each of a fresh run's 1,604 tests took 28
        CPU-s, in the xdist controller); compact JSON. At the end, the whole document, indented."""
        if self.status == "running" and len(self._test_texts) == len(self.tests):
            head = _compact_json(self.to_dict(tests=False))
            atomic.write_text(self.path, f'{head[:-1]}, "tests": [{", ".join(self._test_texts)}]}}\n')
        else:
            write_json_atomic(self.path, self.to_dict())
