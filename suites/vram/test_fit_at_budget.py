"""Will it fit at the chosen budget? The fit map: per model, precision x context, predicted to fit
or not at --vram-budget (default: the 6 GiB the H200 matrix was measured under), with the cases
measured on the GPU drawn on it. With --model, that model gets its own panel and the verdict."""

from __future__ import annotations

from harness.memory.fit.budget import DEFAULT_HEADROOM
from harness.report.figures import fit_map_data
from harness.report.fmt import size

AGREEMENT = 0.95  # map against the measured cases, as the planner test holds the planner


def test_fit_map_agrees_with_the_measured_cases(matrix_summary, measured_matrix, settings, record):
    _rows, env = measured_matrix
    emulated = int(env["budget_bytes"])
    budget = settings.vram_budget or emulated
    focus = settings.model if settings.model and not str(settings.model).startswith("tiny") else None
    data = fit_map_data(matrix_summary.rows, budget, int(env.get("context_bytes") or 0), DEFAULT_HEADROOM,
                        oom_budget_bytes=emulated, extra_models=[focus] if focus else None, focus=focus)
    if focus:
        data["focus"] = data["panels"][-1]["model"]
    record.figure("fit_map", f"Fit map at {size(budget)}", data)

    agree = total = 0
    for panel in data["panels"]:
        for point in panel["measured"]:
            cell = panel["cells"][panel["precisions"].index(point["precision"])][panel["contexts"].index(point["context"])]
            total += 1
            agree += cell["fits"] == point["fits"]
        for row in panel["cells"]:  # a longer context never fits where a shorter one did not
            fits = [c["fits"] for c in row]
            assert fits == sorted(fits, reverse=True), (panel["model"], fits)
    record(budget_bytes=budget, measured_points=total, map_agreement=agree / total if total else None)
    assert total >= 30, f"only {total} measured prefill cases at batch 1 fall on the map"
    assert agree / total >= AGREEMENT


TRAIN_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-1b", "qwen3-1.7b", "gemma-2-2b")


def test_training_fit_map_matches_plan_train(settings, record):
    """The fit card for LoRA/QLoRA training: every cell is plan --train's verdict, and a longer
    context never fits where a shorter one did not."""
    from harness.memory.fit import budget as B
    from harness.memory.fit.shape import model_shape
    from harness.report.figures import train_fit_map_data

    budget = settings.vram_budget or 6 * 2**30
    focus = settings.model if settings.model and not str(settings.model).startswith("tiny") else None
    models = list(TRAIN_MODELS) + ([focus] if focus else [])
    headroom = B.default_headroom("train")
    data = train_fit_map_data(models, budget, B.DEFAULT_CONTEXT_BYTES, headroom)
    record.figure("fit_map", f"Training fit map at {size(budget)}", data)
    for model, panel in zip(models, data["panels"]):
        plans = {p.precision: p for p in B.plan(model_shape(model), budget, train=True, precisions=tuple(panel["precisions"]))}
        for precision, row in zip(panel["precisions"], panel["cells"]):
            fits = [c["fits"] for c in row]
            assert fits == sorted(fits, reverse=True), (model, precision, fits)
            longest = max((c for c, ok in zip(panel["contexts"], fits) if ok), default=None)
            best = plans[precision].max_seq_len
            assert (longest is None) == (best is None or best < min(panel["contexts"])), (model, precision)
            if longest is not None:
                assert longest <= best < (panel["contexts"][panel["contexts"].index(longest) + 1]
                                          if longest != panel["contexts"][-1] else 10**9), (model, precision, best)
