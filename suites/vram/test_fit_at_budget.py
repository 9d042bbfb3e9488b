"""Will it fit at the chosen budget? The fit map: per model, precision x context, predicted to fit
or not at --vram-budget (default: the 6 GiB the H200 matrix was measured under), with the cases
measured on the GPU drawn on it. With --model, that model gets its own panel and the verdict."""

from __future__ import annotations

from harness.memory.budget import DEFAULT_HEADROOM
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
