"""The two-model manager's decisions on the CPU (footprints from tensor sizes); the GPU
measurements are in suites/nan/test_two_models.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from harness.errors import UsageError
from harness.nan.twomodels import TwoModelManager, handoff_race


def _loaders():
    return {"small": lambda: nn.Linear(16, 16), "large": lambda: nn.Linear(256, 256)}  # 1 KiB vs 257 KiB


def test_both_resident_when_they_fit():
    manager = TwoModelManager(_loaders(), device="cpu", budget_bytes=10 * 2**20, headroom_bytes=0)
    footprints = manager.measure()
    assert footprints["large"].bytes == (256 * 256 + 256) * 4 and manager.mode == "resident"
    a = manager.get("small")
    manager.get("large")
    assert manager.get("small") is a and set(manager.resident) == {"small", "large"}
    assert [e.released for e in manager.events] == [[], []]
    manager.close()
    assert manager.resident == {}


def test_switched_when_they_do_not_fit():
    manager = TwoModelManager(_loaders(), device="cpu", budget_bytes=300 * 1024, headroom_bytes=64 * 1024)
    manager.measure()
    assert manager.mode == "switch"
    manager.get("large")
    manager.get("small")
    manager.get("large")
    assert [(e.to, e.released) for e in manager.events] == [("large", []), ("small", ["large"]), ("large", ["small"])]
    assert list(manager.resident) == ["large"] and all(e.latency_s >= e.load_s for e in manager.events)
    with pytest.raises(UsageError):
        manager.get("missing")


def test_handoff_race_refuses_cpu():
    with pytest.raises(UsageError, match="GPU"):
        handoff_race(None, None, torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long))
