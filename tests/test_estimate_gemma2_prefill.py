"""Gemma-2-2B prefill: the estimate against the committed H200 measurement (families run 1,
transformers 5.17, which ran Gemma-2 with SDPA), and its eager path (transformers >= 5.21 refuses
SDPA for Gemma-2) against the prefill traced on the meta device."""

from __future__ import annotations

import json

import pytest

import measurements
from harness.memory.fit.estimate import Query, estimate
from harness.memory.fit.shape import model_shape
from harness.memory.family.families import at_transformers


def _committed_prefill_rows() -> list[dict]:
    rows_dir = measurements.unpacked("vram/families/run-01") / "rows"
    out = []
    for name in ("003-infer-gemma-2-2b-nf4-dq.json", "004-infer-gemma-2-2b-bf16.json"):
        out += [r for r in json.loads((rows_dir / name).read_text())["rows"] if r["mode"] == "prefill"]
    env = json.loads((rows_dir.parent / "environment.json").read_text())
    return [dict(r, transformers=env["transformers"]) for r in out]


def test_prefill_meets_the_committed_measurement_at_its_attention():
    rows = _committed_prefill_rows()
    assert {(r["precision"], r["seq_len"], r["batch"]) for r in rows} >= {
        (p, s, b) for p in ("nf4-dq", "bf16") for s in (1024, 4096) for b in (1, 2)}
    shape = model_shape("gemma-2-2b")
    for r in rows:
        at_run = at_transformers(shape, r["transformers"])
        assert at_run.traits.attention == "sdpa"  # what 5.17 picked for Gemma-2
        est = estimate(at_run, Query(r["precision"], "prefill", seq_len=r["seq_len"], batch=r["batch"]))
        assert est.peak_bytes == pytest.approx(r["peak_bytes"], rel=0.03), r


def test_eager_prefill_costs_what_the_meta_device_trace_says():
    """The installed transformers runs Gemma-2 eagerly: the scores of one layer at the softmax."""
    import torch

    from harness.memory.replay import step_trace as S
    from harness.memory.replay.allocator_replay import live_bytes_peak
    from harness.memory.fit.config_file import load_config

    shape = model_shape("gemma-2-2b")
    assert shape.traits.attention == "eager"
    model = S._meta_model(load_config("gemma-2-2b")[0], "eager", torch.bfloat16).eval()
    rec = S._Recorder()
    rec.stand_for(list(model.parameters()) + list(model.buffers()))
    with torch.no_grad(), S._dispatch_mode(rec):
        out = model(input_ids=torch.zeros((2, 4096), dtype=torch.long, device="meta"), use_cache=True, logits_to_keep=1)
        del out
    traced = live_bytes_peak(rec.events)
    est = estimate(shape, Query("bf16", "prefill", seq_len=4096, batch=2))
    assert est.peak_bytes - est.breakdown["weights"] == pytest.approx(traced, rel=0.03)
