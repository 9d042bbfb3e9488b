"""The estimator against the W4A16 checkpoint measured on an H200 (scripts/gpu/quant.py; the
figures are committed in measured/): stored, held by transformers after from_pretrained (packed),
and after the first forward (decompressed to bf16). Runs anywhere: no GPU needed to compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.memory.fit import estimate as E
from harness.memory.fit.shape import model_shape
from harness.memory.fit.weights import w4a16_linear_bytes

MEASURED = json.loads((Path(__file__).resolve().parents[2] / "measurements" / "quant" / "h200-qwen2.5-1.5b.json").read_text())


def _stored_prediction(shape, asym: bool) -> int:
    linear = sum(g.count * w4a16_linear_bytes(g.in_features, g.out_features, zero_points=asym, rounded=False)
                 for g in shape.linears)
    return linear + 2 * (shape.embedding_params + shape.lm_head_params + shape.norm_params + shape.bias_params)


@pytest.mark.parametrize("method,asym", [("gptq", False), ("awq", True)])
def test_stored_w4a16_bytes_are_exact(method, asym, record):
    shape = model_shape(MEASURED["run1"]["arch"])
    measured = MEASURED["run1"][method]["stored"]["measured_bytes"]
    assert _stored_prediction(shape, asym) == measured
    record(measured_bytes=measured)


def test_transformers_holds_it_packed_then_decompressed_within_2_percent(record):
    shape = model_shape(MEASURED["run2"]["arch"])
    est = E.estimate(shape, E.Query("w4a16", "weights")).breakdown
    loaded = MEASURED["run2"]["gptq"]["transformers_loaded"]
    after_load = est["weights"] / loaded["held_bytes"] - 1
    after_forward = est["transformers_decompressed_weights"] / loaded["after_forward_held_bytes"] - 1
    record(after_load_error=round(after_load, 5), after_forward_error=round(after_forward, 5))
    assert abs(after_load) < 0.02 and abs(after_forward) < 0.02
    assert loaded["tensor_bytes_by_device"].get("cuda:int32", 0) > 0  # packed on the GPU after load
