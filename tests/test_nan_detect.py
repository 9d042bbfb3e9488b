"""Fast unit tests of harness.nan: tensor statistics, masks, caches, labels, first_nonfinite on
small torch modules, and the injection helpers."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from harness import nan
from harness.nan import inject
from harness.errors import UsageError


def test_tensor_stats_counts_and_first_index():
    t = torch.zeros(2, 3, 4)
    t[1, 2, 3] = float("nan")
    t[1, 0, 1] = float("inf")
    stats = nan.tensor_stats(t)
    assert (stats["count"], stats["nan"], stats["inf"], stats["first_index"]) == (2, 1, 1, (1, 0, 1))
    assert nan.tensor_stats(torch.zeros(3)) is None
    assert nan.tensor_stats(torch.tensor([1, 2])) is None  # integers cannot be non-finite


def test_tensor_stats_ignores_masked_positions_only():
    t = torch.zeros(2, 5, 3)
    t[0, 0] = float("nan")  # a padded row
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[0, 0] = False
    assert nan.tensor_stats(t, valid) is None
    t[1, 4, 2] = float("nan")
    stats = nan.tensor_stats(t, valid)
    assert stats["count"] == 1 and stats["first_index"] == (1, 4, 2) and stats["checked"] == 27


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self.head = nn.Linear(4, 3)

    def forward(self, input_ids, attention_mask=None, labels=None):
        x = torch.nn.functional.one_hot(input_ids, 4).float()
        logits = self.head(self.inner(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return out


def _batch(labels=True):
    ids = torch.tensor([[0, 1, 2], [3, 2, 1]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), **({"labels": ids % 3} if labels else {})}


def test_first_nonfinite_clean_model_is_none_and_grads_untouched():
    model = Tiny()
    assert nan.first_nonfinite(model, _batch()) is None
    assert all(p.grad is None for p in model.parameters())


def test_first_nonfinite_names_the_innermost_module():
    model = Tiny()
    with torch.no_grad():  # in the bias: an inf weight times a ReLU zero is NaN, and the zeros follow the seed
        model.inner[2].bias[1] = float("inf")
    found = nan.first_nonfinite(model, _batch())
    assert (found.phase, found.module, found.tensor) == ("forward", "inner.2", "output")
    assert found.inf > 0 and "inner.2.output" in found.describe()


def test_first_nonfinite_loss_phase_with_no_targets():
    batch = _batch()
    batch["labels"] = torch.full_like(batch["labels"], -100)
    found = nan.first_nonfinite(Tiny(), batch)
    assert found.phase == "loss" and found.module == ""


def test_first_nonfinite_backward_phase():
    model = Tiny()
    inject.nan_in_backward(model, "inner.0")
    found = nan.first_nonfinite(model, _batch())
    assert found.phase == "backward"
    assert found.module.startswith("inner.0") or found.module == "inner", found
    assert nan.first_nonfinite(model, _batch(labels=False)) is None  # no labels: no backward


def test_first_nonfinite_rejects_bad_batch():
    with pytest.raises(UsageError):
        nan.first_nonfinite(Tiny(), {"x": 1})


def test_masked_positions_do_not_alarm():
    model = Tiny()
    batch = _batch(labels=False)
    batch["attention_mask"][1, 0] = 0
    inject.fill_masked_positions(model, "inner", batch["attention_mask"])
    assert nan.first_nonfinite(model, batch) is None
    batch["attention_mask"][1, 0] = 1
    assert nan.first_nonfinite(model, batch) is None  # the mask captured by the hook is the old one
    inject.fill_positions(model, "head", [(0, 2)])
    assert nan.first_nonfinite(model, batch).module == "head"


def test_check_labels_all_ignored_and_after_the_shift():
    samples = [{"labels": [5, 6, 7]}, {"labels": [-100, -100]}, {"labels": [4, -100, -100]}, {"labels": [-100, 3]}]
    problems = nan.check_labels(samples)
    assert [(p.index, p.reason, p.labelled) for p in problems] == [
        (1, "all labels ignored", 0), (2, "no target after the shift", 1)]
    assert [p.index for p in nan.check_labels(samples, shift=False)] == [1]
    tensor = torch.tensor([[1, 2], [-100, -100]])
    assert [p.index for p in nan.check_labels(tensor)] == [1]
    assert [p.index for p in nan.check_labels({"labels": tensor})] == [1]
    with pytest.raises(nan.BadLabelsError, match="1 sample"):
        nan.require_labels_ok(tensor)
    nan.require_labels_ok(torch.tensor([[1, 2]]))


def test_nonfinite_in_cache_legacy_and_mask():
    keys = [torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4, 3)]
    values = [torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4, 3)]
    legacy = tuple(zip(keys, values))
    assert nan.nonfinite_in_cache(legacy) == []
    values[1][0, 1, 0, 2] = float("nan")  # position 0 of layer 1
    findings = nan.nonfinite_in_cache(legacy)
    assert [(f.layer, f.kind, f.count, f.first_index) for f in findings] == [(1, "value", 1, (0, 1, 0, 2))]
    mask = torch.tensor([[0, 1, 1, 1]])  # position 0 is padding
    assert nan.nonfinite_in_cache(legacy, attention_mask=mask) == []
    with pytest.raises(UsageError):
        nan.nonfinite_in_cache("not a cache")


def test_nonfinite_in_dynamic_cache_and_poison():
    from transformers import DynamicCache

    from harness.nan.twomodels import cache_from_tensors

    cache = cache_from_tensors([torch.zeros(1, 2, 3, 4)] * 3, [torch.zeros(1, 2, 3, 4)] * 3)
    assert isinstance(cache, DynamicCache) and nan.nonfinite_in_cache(cache) == []
    inject.poison_cache(cache, layer=2, kind="key", value=float("inf"), index=(0, 1, 2, 3))
    (finding,) = nan.nonfinite_in_cache(cache)
    assert (finding.layer, finding.kind, finding.inf, finding.nan) == (2, "key", 1, 0)
    with pytest.raises(UsageError):
        inject.poison_cache(cache, layer=7)


def test_nonfinite_tensors_model_and_state_dict():
    model = Tiny()
    assert nan.nonfinite_tensors(model) == []
    name = inject.set_parameter_value(model, "inner.2.bias", float("nan"), (1,))
    (finding,) = nan.nonfinite_tensors(model)
    assert (finding.module, finding.tensor, finding.count) == ("inner.2", "bias", 1) and name == "inner.2.bias"
    state = {"a.weight": torch.ones(2), "b.weight": torch.tensor([1.0, math.inf]), "q": torch.tensor([1], dtype=torch.uint8)}
    assert [f.module for f in nan.nonfinite_tensors(state)] == ["b"]


def test_ignore_all_labels_keep_first():
    batch = _batch()
    out = inject.ignore_all_labels(batch, rows=[1], keep_first=True)
    assert out["labels"][1].tolist() == [batch["labels"][1, 0].item(), -100, -100]
    assert torch.equal(out["labels"][0], batch["labels"][0])
    assert nan.count_targets(out["labels"]).tolist() == [2, 0]
