"""Fixtures of the VRAM suite: the committed GPU matrix (the budget fixture is the plugin's)."""

from __future__ import annotations

import measurements
import pytest

from harness.memory.measured.matrix_readback import evaluate, load_matrix


@pytest.fixture(scope="session")
def measured_matrix():
    rows, env = load_matrix(measurements.matrix_rows("vram/matrix"))
    if not rows:
        pytest.fail("measurements/vram/matrix/ holds no rows-*.json: the committed GPU matrix is missing")
    return rows, env


@pytest.fixture(scope="session")
def matrix_summary(measured_matrix):
    rows, env = measured_matrix
    return evaluate(rows, env)
