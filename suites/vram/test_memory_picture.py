"""Where the memory goes, for one QLoRA step and one generation: the estimator's parts, drawn in
the vram report; beside them the parts measured from torch's allocator snapshot of the same case
on the H200 (the snapshot rows of measurements/vram/families/, runs 1-13), when that run is committed."""

from __future__ import annotations

import measurements
import pytest

from harness.memory.measured import families_truth as T
from harness.memory.fit.estimate import Query, estimate
from harness.memory.fit.picture import parts
from harness.memory.fit.shape import model_shape

CASES = (("gemma-2-2b", Query("nf4-dq", "train", seq_len=1024, lora_r=8, lora_targets=("all-linear",))),
         ("gemma-2-2b", Query("nf4-dq", "generate", seq_len=1024, new_tokens=32)))
TRACE_AGREEMENT = 0.02  # the snapshot's replayed peak against torch's max_memory_allocated
PART_AGREEMENT = 0.03  # each predicted part against the measured one, as a share of the measured peak
# (arch, mode, seq_len, batch) of recorded steps whose parts are known to miss PART_AGREEMENT, pinned
# at what they measure so that a regression still fails: phi-4-mini all-linear r64 128 x 1 (the
# ninth families run, measurements/vram/families/run-09) peaks in another phase than the estimate
# puts it in, its peak 2.9% above the prediction (docs/vram.md, "Where a training step's reserve goes")
PART_SHORTFALL = {("phi-4-mini", "train", 128, 1): 0.09}


def _snapshot_rows() -> list[dict]:
    return T.load_rows(measurements.families_runs())["snapshot"]


def _measured():
    rows = _snapshot_rows()
    return [T.picture_comparison(r) for r in rows if (r.get("snapshot") or {}).get("peak_by_category")]


def test_memory_picture_of_a_step_and_a_generation(record):
    measured = {(c["arch"], c["mode"]): c for c in _measured()}
    cases = []
    for arch, q in CASES:
        shape = model_shape(arch)
        est = estimate(shape, q)
        got = measured.get((arch, q.mode))
        if got:
            components = [dict(c) for c in got["components"]]
            title = (f"{arch} {q.precision} {q.mode}: predicted {got['predicted_peak'] / 2**30:.2f} GiB, "
                     f"measured {(got['measured_peak'] or 0) / 2**30:.2f} GiB")
        else:
            components = [{"component": p.component, "predicted": p.bytes, "measured": None}
                          for p in parts(est, shape, 0) if p.component != "CUDA context"]
            title = f"{arch} {q.precision} {q.mode}: predicted {est.peak_bytes / 2**30:.2f} GiB (no measured snapshot)"
        assert sum(c["predicted"] for c in components) > 0
        cases.append({"title": title, "components": components})
    record.figure("memory_picture", "Where the memory goes (one QLoRA step, one generation)",
                  {"cases": cases, "note": "measured: live bytes per allocation stack at the step's allocated peak "
                                           "(torch.cuda.memory._snapshot); predicted: harness estimate --explain"})
    for (arch, mode), got in measured.items():  # the step's timeline, as the allocator lived it
        timeline = got.get("timeline") or []
        if not timeline:
            continue
        xs = [p["event"] for p in timeline]
        names = ["total"] + sorted({k for p in timeline for k in p if k not in ("event", "total")})
        record.figure("lines", f"{arch} {mode}: allocated bytes over the step, by what allocated them",
                      {"series": {n: (xs, [p.get(n, 0) / 2**30 for p in timeline]) for n in names},
                       "xlabel": "allocator event", "ylabel": "GiB"})
    record(cases=len(cases), measured=len(measured))
    for got in _measured():  # every recorded step, per part, not only at the peak
        key = (got["arch"], got["mode"], got["seq_len"], got["batch"])
        allowed = max(PART_AGREEMENT, PART_SHORTFALL.get(key, 0))
        for c in got["components"]:
            assert abs(c["predicted"] - c["measured"]) <= allowed * got["measured_peak"], (key, c)


def test_snapshot_trace_replays_to_torchs_own_peak():
    rows = _snapshot_rows()
    if not rows:
        pytest.skip("no snapshot rows committed yet (measurements/vram/families/)")
    assert all("peak_by_category" in r["snapshot"] for r in rows), [r["snapshot"].get("error") for r in rows]
    for r in rows:
        snap = r["snapshot"]
        assert sum(snap["peak_by_category"].values()) == snap["peak_bytes"]
        if r.get("peak_bytes"):
            assert abs(snap["peak_bytes"] - r["peak_bytes"]) <= TRACE_AGREEMENT * r["peak_bytes"], r["arch"]
