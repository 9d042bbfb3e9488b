"""A measured GPU matrix read back: its rows, the figure the estimator predicts, the estimator's query for a
row, the accelerate anchor, and prediction errors and planner agreement over the rows.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def load_matrix(paths) -> tuple[list[dict], dict]:
    """Rows (and the environment of the first file) from rows files (the committed H200 matrix is
    the repository's measurements/vram/matrix/, which its reader passes in)."""
    rows: list[dict] = []
    env: dict = {}
    for p in paths:
        data = json.loads(Path(p).read_text())
        env = env or data.get("environment", {})
        rows += data["rows"]
    return rows, env


def measured_bytes(row: dict) -> int | None:
    """The figure the estimator predicts: the absolute allocator peak of the operation; for a
    load, the bytes the load added (cuBLAS workspaces of earlier cases are not the model's)."""
    if not row.get("peak_bytes") or row.get("error") or row.get("invalid"):
        return None
    if row["mode"] == "weights":
        return row["peak_bytes"] - (row.get("start_bytes") or 0)
    return row["peak_bytes"]


def row_query(row: dict):
    """The estimator's query for a row of this matrix or of the fresh-process training matrix
    (which names its LoRA recipe, `targets`, and its optimizer)."""
    from ..fit.estimate import Query
    from ..fit.lora import DEFAULT_LORA_TARGETS

    targets = DEFAULT_LORA_TARGETS
    if row.get("lora_targets"):
        targets = tuple(row["lora_targets"])
    return Query(row["precision"], row["mode"], seq_len=max(1, row["seq_len"]), batch=row["batch"],
                 new_tokens=row.get("new_tokens") or 0, lora_r=row.get("lora_r") or 16,
                 lora_targets=targets, grad_checkpointing=bool(row.get("grad_checkpointing", True)),
                 optimizer=row.get("optimizer") or "adamw_torch")


def accelerate_anchor(shape, row: dict) -> int:
    """accelerate estimate-memory on the same case: the model size at the dtype (all parameters,
    fp32 size / 1, 2, 4, 8), times 4 for training with Adam (its 'Training using Adam' column)."""
    from ..fit.weights import accelerate_style_bytes

    size = accelerate_style_bytes(shape, row["precision"])
    return 4 * size if row["mode"] == "train" else size


@dataclass
class MatrixSummary:
    rows: list[dict]
    n: int
    median_abs_error: float
    worst_abs_error: float
    accelerate_median_abs_error: float
    accelerate_worst_abs_error: float
    budget_cases: int
    budget_agreement: float
    context_bytes: int
    headroom: float

    def by_group(self) -> dict[str, tuple[int, float, float]]:
        groups: dict[str, list[float]] = {}
        for r in self.rows:
            groups.setdefault(f"{r['precision']}/{r['mode']}", []).append(abs(r["error"]))
        return {k: (len(v), statistics.median(v), max(v)) for k, v in sorted(groups.items())}


def evaluate(rows: list[dict], env: dict | None = None, calibration=None, headroom: float | None = None) -> MatrixSummary:
    from ..fit.budget import DEFAULT_HEADROOM, fits
    from ..fit.estimate import estimate
    from ..family.families import at_transformers
    from ..fit.shape import model_shape

    env = env or {}
    headroom = DEFAULT_HEADROOM if headroom is None else headroom
    context = int(env.get("context_bytes") or 0)
    budget = env.get("budget_bytes")
    shapes: dict[str, Any] = {}
    out = []
    agree = total = 0
    for row in rows:
        m = measured_bytes(row)
        if m is None:
            continue
        version = row.get("transformers") or env.get("transformers")  # the attention that version picked
        shape = shapes.setdefault((row["arch"], version), at_transformers(model_shape(row["arch"]), version))
        pred = estimate(shape, row_query(row), calibration=calibration).peak_bytes
        acc = accelerate_anchor(shape, row)
        r = dict(row, measured=m, predicted=pred, error=(pred - m) / m, accelerate=acc,
                 accelerate_error=(acc - m) / m)
        if budget and row.get("oom_under_budget") is not None:
            r["planner_fits"] = fits(pred, budget, context, headroom)
            r["actually_fits"] = not row["oom_under_budget"]
            total += 1
            agree += r["planner_fits"] == r["actually_fits"]
        out.append(r)
    errs = [abs(r["error"]) for r in out]
    acc_errs = [abs(r["accelerate_error"]) for r in out]
    return MatrixSummary(
        rows=out, n=len(out),
        median_abs_error=statistics.median(errs) if errs else float("nan"),
        worst_abs_error=max(errs) if errs else float("nan"),
        accelerate_median_abs_error=statistics.median(acc_errs) if acc_errs else float("nan"),
        accelerate_worst_abs_error=max(acc_errs) if acc_errs else float("nan"),
        budget_cases=total, budget_agreement=(agree / total) if total else float("nan"),
        context_bytes=context, headroom=headroom,
    )
