"""Fixtures of the VRAM suite: the emulated budget and the committed GPU matrix."""

from __future__ import annotations

import pytest

from harness.budget import apply_budget, release_budget
from harness.vram_matrix import evaluate, load_matrix


@pytest.fixture
def vram_budget(settings, device):
    """With --vram-budget on a CUDA device: torch's allocator is capped at budget - CUDA context
    for the test (a real N-GiB card loses the context before torch gets anything), lifted after.
    Yields the BudgetState, or None when no budget was asked for or the device is the CPU."""
    if not settings.vram_budget or not str(device).startswith("cuda"):
        yield None
        return
    state = apply_budget(settings.vram_budget, device)
    try:
        yield state
    finally:
        release_budget(state)


@pytest.fixture(scope="session")
def measured_matrix():
    rows, env = load_matrix()
    if not rows:
        pytest.fail("suites/vram/measured/matrix/ holds no rows-*.json: the committed GPU matrix is missing")
    return rows, env


@pytest.fixture(scope="session")
def matrix_summary(measured_matrix):
    rows, env = measured_matrix
    return evaluate(rows, env)
