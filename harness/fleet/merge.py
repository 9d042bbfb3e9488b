"""One report from several pytest-xdist workers: the workers send, the controller writes.

A worker keeps its results in memory only (`WorkerResults`), and with each test report sends the
table rows and HTML blocks its tests added since the last one (`Outbox`); whatever is added after
its last test goes with the worker's final output. The controller adds them to its own results,
which it alone writes, and keeps a ledger of which worker ran on which GPU and how it ended
(`WorkerLedger`), shown as the report's Workers table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..report.results import RunResults, _jsonable, sanitize
from .gpus import pick_gpu

WORKERS_TABLE = "Workers"
RECORD_WORKER = "xdist_worker"  # keys added to each test's record: which worker ran it, on which GPU
RECORD_GPU = "cuda_visible_devices"


class WorkerResults(RunResults):
    """A worker's results: kept for its fixtures and hooks, never written (the controller writes)."""

    def write(self) -> None:
        pass


def plain(value: Any) -> Any:
    """Only what JSON (and so xdist's channel) can carry: dicts, lists, text, numbers, None."""
    return json.loads(json.dumps(sanitize(value), default=_jsonable, allow_nan=False))


@dataclass
class Outbox:
    """What of a worker's tables, HTML blocks and figures the controller has not been sent yet."""

    sent_rows: dict[str, int] = field(default_factory=dict)
    sent_fragments: int = 0
    sent_figures: int = 0

    def drain(self, tables: dict[str, list[dict]], fragments: list, figures: list) -> tuple[list, list, list]:
        rows = []
        for table, table_rows in tables.items():
            start = self.sent_rows.get(table, 0)
            rows += [[table, row] for row in table_rows[start:]]
            self.sent_rows[table] = len(table_rows)
        new_fragments = [list(f) for f in fragments[self.sent_fragments:]]
        self.sent_fragments = len(fragments)
        new_figures = figures[self.sent_figures:]
        self.sent_figures = len(figures)
        return plain(rows), plain(new_fragments), plain(new_figures)


@dataclass
class WorkerState:
    worker: str
    gpu: str | None
    gpu_name: str | None
    status: str = "running"  # running | finished | crashed
    error: str | None = None


class WorkerLedger:
    """The controller's view of its workers: the GPU each got, and how each ended."""

    def __init__(self, gpus: list[str], gpu_names: dict[str, str] | None = None):
        self.gpus = gpus
        self.gpu_names = gpu_names or {}
        self.workers: dict[str, WorkerState] = {}

    def assign(self, worker: str) -> str | None:
        live = {w: s.gpu for w, s in self.workers.items() if s.status == "running" and s.gpu is not None}
        gpu = pick_gpu(live, self.gpus)
        self.workers[worker] = WorkerState(worker, gpu, self.gpu_names.get(gpu) if gpu is not None else None)
        return gpu

    def down(self, worker: str, error: Any) -> None:
        state = self.workers.setdefault(worker, WorkerState(worker, None, None))
        state.status = "finished" if error is None else "crashed"
        text = "" if error is None else str(error).strip()
        state.error = None if error is None else (text.splitlines()[-1][:300] if text else "no reason given")

    def rows(self, tests: list) -> list[dict[str, Any]]:
        """One row per worker: its GPU, its tests' outcomes, how it ended."""
        rows = []
        for w, state in self.workers.items():
            outcomes: dict[str, int] = {}
            for t in tests:
                if t.record.get(RECORD_WORKER) == w:
                    outcomes[t.outcome] = outcomes.get(t.outcome, 0) + 1
            rows.append({
                "worker": w,
                "CUDA_VISIBLE_DEVICES": state.gpu if state.gpu is not None else "(inherited)",
                "GPU": state.gpu_name or "",
                "tests": sum(outcomes.values()),
                "outcomes": ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())),
                "status": state.status if state.error is None else f"{state.status}: {state.error}",
            })
        return rows

    def summary_line(self) -> str:
        parts = []
        for w, s in self.workers.items():
            where = f"GPU {s.gpu}" + (f" ({s.gpu_name})" if s.gpu_name else "") if s.gpu is not None else "no GPU assigned"
            parts.append(f"{w} on {where}, {s.status}")
        return "; ".join(parts)


def gpu_names(visible: list[str], nvml_gpus: list[dict]) -> dict[str, str]:
    """Names of the visible GPUs, matched to NVML's list by index or UUID."""
    names = {}
    for entry in visible:
        for g in nvml_gpus:
            if entry == str(g.get("index")) or (g.get("uuid") and entry in (g["uuid"], g["uuid"].removeprefix("GPU-"))):
                names[entry] = g.get("name")
    return names
