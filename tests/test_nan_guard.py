"""Fast unit tests of the training guard on a small torch model: trips, atomic state, reload."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from harness import nan
from harness.errors import UsageError


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x, labels=None):
        logits = self.head(torch.tanh(self.body(x)))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)
        return out

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        return type("Out", (dict,), {"loss": property(lambda s: s.get("loss"))})(out)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"x": torch.randn(8, 4, generator=g), "labels": torch.randint(0, 2, (8,), generator=g)}


def test_guard_saves_every_step_atomically(tmp_path):
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with nan.TrainingGuard(model, opt, tmp_path, keep=2) as guard:
        for s in range(3):
            guard.train_step(_batch(s))
    assert guard.finding is None and guard.step == 3
    assert (tmp_path / "LAST_GOOD").read_text().strip() == "step-000003"
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-000002", "step-000003"]
    assert not list(tmp_path.glob(".*tmp"))
    meta = json.loads((tmp_path / "step-000003" / "state.json").read_text())
    assert meta["step"] == 3 and meta["parameters"] == 4


def test_guard_nan_loss_trips_and_keeps_weights(tmp_path):
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nan.TrainingGuard(model, opt, tmp_path) as guard:
        guard.train_step(_batch())
        before = {n: p.clone() for n, p in model.named_parameters()}
        bad = _batch(1)
        bad["x"][3, 1] = float("nan")
        with pytest.raises(nan.NonFiniteError) as caught:
            guard.train_step(bad)
    assert caught.value.finding.phase == "loss" and caught.value.finding.step == 2
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
    saved = json.loads((tmp_path / "finding.json").read_text())
    assert saved["phase"] == "loss" and saved["step"] == 2
    assert "last good state kept in" in str(caught.value)


def test_guard_names_first_nonfinite_gradient_despite_clipping(tmp_path):
    from harness.nan.inject import nan_in_backward

    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    nan_in_backward(model, "body")
    before = {n: p.clone() for n, p in model.named_parameters()}
    with nan.TrainingGuard(model, opt, None) as guard:
        with pytest.raises(nan.NonFiniteError):
            guard.train_step(_batch(), max_grad_norm=1.0)  # clipping spreads the NaN to head's grads too
    assert all(not torch.isfinite(p.grad).all() for p in model.parameters())
    assert guard.finding.phase == "backward" and guard.finding.module == "body", guard.finding
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_guard_catches_gradients_set_outside_autograd():
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nan.TrainingGuard(model, opt, None) as guard:
        model(**_batch())["loss"].backward()
        model.head.bias.grad[1] = float("inf")
        with pytest.raises(nan.NonFiniteError):
            guard.before_step()
    assert (guard.finding.module, guard.finding.tensor) == ("head", "bias.grad")


def test_guard_undoes_runaway_update(tmp_path):
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=1e6)
    with nan.TrainingGuard(model, opt, tmp_path, max_update_ratio=0.5) as guard:
        before = {n: p.clone() for n, p in model.named_parameters()}
        with pytest.raises(nan.NonFiniteError) as caught:
            guard.train_step(_batch())
    assert caught.value.finding.phase == "update" and "divergence" in caught.value.finding.note
    assert all(torch.equal(before[n], p) for n, p in model.named_parameters())


def test_load_last_good_restores_weights_and_optimizer(tmp_path):
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with nan.TrainingGuard(model, opt, tmp_path) as guard:
        guard.train_step(_batch(0))
        guard.train_step(_batch(1))
    expected = {n: p.clone() for n, p in model.named_parameters()}
    fresh = Model()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    meta = nan.load_last_good(tmp_path, fresh, fresh_opt)
    assert meta["step"] == 2
    assert all(torch.equal(expected[n], p) for n, p in fresh.named_parameters())
    assert all(int(s["step"]) == 2 for s in fresh_opt.state.values())
    with pytest.raises(UsageError):
        nan.load_last_good(tmp_path / "missing", fresh)


def test_guard_needs_trainable_parameters():
    model = Model().requires_grad_(False)
    with pytest.raises(UsageError):
        with nan.TrainingGuard(model, None, None):
            pass
