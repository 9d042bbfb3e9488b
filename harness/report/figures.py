"""Figures kept as data in a run's results (`record.figure(kind, title, data)`), drawn when the
report is rendered, so a report re-renders from its JSON with the current plots.

Kinds: `estimate_error` (points: precision, mode, measured_bytes, predicted_bytes, error),
`fit_map` (panels of precision x context cells, measured points), `lines` (series of x, y),
`memory_picture` (cases of components, predicted and measured bytes at the peak).
The builders below turn library results into that data.
"""

from __future__ import annotations

from typing import Any

from . import html, plots

CONTEXTS = [512, 1024, 2048, 4096, 8192, 16384, 32768]


def draw(figure: dict[str, Any]) -> str:
    kind, title, data = figure.get("kind"), figure.get("title", ""), figure.get("data") or {}
    try:
        if kind == "estimate_error":
            svg = plots.estimate_error(data["points"], data.get("tolerance"))
            return html.section(title, svg + html.note(data.get("note", "")))
        if kind == "fit_map":
            return html.section(title, plots.fit_map(data["panels"], data["budget_bytes"],
                                                     data.get("xlabel", "context, tokens (prefill, batch 1)"))
                                + html.note(data.get("note", "")))
        if kind == "memory_picture":
            return html.section(title, "".join(plots.memory_picture(c["components"], title=c["title"])
                                               for c in data["cases"]) + html.note(data.get("note", "")))
        if kind == "lines":
            series = {name: (xs, ys) for name, (xs, ys) in data["series"].items()}
            return html.section(title, plots.line_plot(series, title=title, xlabel=data.get("xlabel", ""),
                                                       ylabel=data.get("ylabel", ""), logx=data.get("logx", False)))
    except (KeyError, TypeError, ValueError) as exc:  # a figure must never hide the rest of the report
        return html.section(title, html.note(f"figure not drawn: {type(exc).__name__}: {exc}"))
    return html.section(title, html.note(f"figure kind {kind!r} is not known to this version of the report"))


# ---------------------------------------------------------------------------------------------
# Builders (library results -> figure data)


def estimate_error_data(rows: list[dict], tolerance: float | None = None) -> dict[str, Any]:
    """From harness.memory.measured.matrix_readback.evaluate(...).rows."""
    points = [{"arch": r["arch"], "precision": r["precision"], "mode": r["mode"], "seq_len": r.get("seq_len"),
               "batch": r.get("batch"), "measured_bytes": int(r["measured"]), "predicted_bytes": int(r["predicted"]),
               "error": round(float(r["error"]), 6)} for r in rows]
    return {"points": points, "tolerance": tolerance,
            "note": f"{len(points)} measured cases; dashed lines: the worst-case tolerance"
                    + (f" (±{100 * tolerance:g} %)" if tolerance else "") + ". Below zero: predicted too little."}


def fit_map_data(rows: list[dict], budget_bytes: int, context_bytes: int, headroom: float,
                 oom_budget_bytes: int | None = None, extra_models: list[str] | None = None,
                 focus: str | None = None, contexts: list[int] | None = None) -> dict[str, Any]:
    """Per model of `rows` (matrix rows with measured/predicted) and of `extra_models` (names or
    directories): precision x context cells with the predicted prefill peak at batch 1 and
    whether it fits `budget_bytes` after `context_bytes` with `headroom`; measured prefill cases
    at batch 1 as points (their own out-of-memory outcome when they were run under this budget)."""
    from ..memory.fit.budget import fits
    from ..memory.fit.estimate import Query, estimate
    from ..memory.fit.shape import model_shape

    contexts = contexts or CONTEXTS
    models = list(dict.fromkeys([r["arch"] for r in rows] + list(extra_models or [])))
    panels = []
    for model in models:
        shape = model_shape(model)
        mine = [r for r in rows if r["arch"] == model]
        precisions = sorted({r["precision"] for r in rows} or {"fp32", "bf16", "int8", "nf4"},
                            key=plots._precision_order)
        cells = []
        for p in precisions:
            row = []
            for c in contexts:
                peak = estimate(shape, Query(p, "prefill", seq_len=c, batch=1)).peak_bytes
                row.append({"predicted_bytes": int(peak), "fits": fits(peak, budget_bytes, context_bytes, headroom)})
            cells.append(row)
        measured = []
        for r in mine:
            if r["mode"] != "prefill" or r.get("batch") != 1:
                continue
            if oom_budget_bytes == budget_bytes and r.get("oom_under_budget") is not None:
                ok = not r["oom_under_budget"]
            else:
                ok = r["measured"] + context_bytes <= budget_bytes
            measured.append({"precision": r["precision"], "context": r["seq_len"], "fits": bool(ok),
                             "measured_bytes": int(r["measured"])})
        label = str(model) if len(str(model)) < 40 else "…" + str(model)[-38:]
        panels.append({"model": label, "precisions": precisions, "contexts": contexts, "cells": cells,
                       "measured": measured})
    note = (f"Budget {budget_bytes / 2**30:g} GiB, of which {context_bytes / 2**20:.0f} MiB go to the CUDA context; "
            f"a cell fits when the predicted peak plus {100 * headroom:g} % headroom fits in the rest. "
            "Points: cases measured on the GPU" + (" under this emulated budget" if oom_budget_bytes == budget_bytes
                                                   else ", compared with the budget") + ".")
    return {"budget_bytes": budget_bytes, "context_bytes": context_bytes, "headroom": headroom, "panels": panels,
            "focus": focus, "note": note}


TRAIN_CONTEXTS = [256, 512, 1024, 2048, 4096, 8192]


def train_fit_map_data(models: list[str], budget_bytes: int, context_bytes: int, headroom: float,
                       precisions=("bf16", "nf4-dq"), contexts: list[int] | None = None) -> dict[str, Any]:
    """The fit map of LoRA (bf16) and QLoRA (nf4-dq) training as users start it: rank 16 on every
    attention and MLP projection, gradient checkpointing, AdamW, batch 1; a cell fits when
    `plan --train` would say so (the planned bytes, fragmentation room included, plus the
    training reserve after the CUDA context)."""
    from ..memory.fit.budget import fit_verdict
    from ..memory.fit.estimate import Query, estimate
    from ..memory.fit.shape import model_shape

    def cell(e) -> dict:  # plan's rule: an unverified family's uncertainty kept free
        verdict = fit_verdict(e.planned_bytes, budget_bytes, context_bytes, headroom,
                              (e.verification or {}).get("uncertainty", 0.0))
        return {"predicted_bytes": int(e.planned_bytes), "fits": verdict == "fits", "verdict": verdict}

    contexts = contexts or TRAIN_CONTEXTS
    panels = []
    for model in models:
        shape = model_shape(model)
        cells = [[cell(e) for e in (estimate(shape, Query(p, "train", seq_len=c, batch=1)) for c in contexts)]
                 for p in precisions]
        panels.append({"model": str(model), "precisions": list(precisions), "contexts": contexts, "cells": cells,
                       "measured": []})
    note = (f"Budget {budget_bytes / 2**30:g} GiB, {context_bytes / 2**20:.0f} MiB of it CUDA context, "
            f"{100 * headroom:g} % training reserve; LoRA/QLoRA r16 on all projections, checkpointing, AdamW, batch 1.")
    return {"budget_bytes": budget_bytes, "context_bytes": context_bytes, "headroom": headroom, "panels": panels,
            "focus": None, "note": note, "xlabel": "context, tokens (LoRA / QLoRA training, batch 1)",
            "what": "longest LoRA/QLoRA training context, batch 1"}
