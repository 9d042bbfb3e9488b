"""The harness's pytest plugin: options, markers, fixtures and report hooks.

This is the only pytest-aware module; everything it does is a call into the library.
"""

from __future__ import annotations

import pytest

from . import settings as settings_mod
from .errors import UsageError

MARKERS = {
    "gpu": "needs a usable NVIDIA GPU (skips without a driver, fails when the driver is there but torch cannot use it)",
    "multi_gpu": "needs two or more GPUs",
    "bnb": "needs bitsandbytes with a working native library",
    "vllm": "needs a vLLM interpreter (--vllm-python) or a running server (--endpoint)",
    "slow": "takes more than a few seconds",
}


def pytest_addoption(parser):
    group = parser.getgroup("harness", "LLM harness")
    group.addoption("--model", default=None,
                    help="model directory, or a reference name (qwen2.5-0.5b, ...; tiny-qwen2, tiny-llama); default: embedded models")
    group.addoption("--device", default=None, help="auto (default), cpu, cuda or cuda:N")
    group.addoption("--vram-budget", default=None,
                    help="run GPU fixtures inside this budget, e.g. 6GiB (emulates a small card on a large one)")
    group.addoption("--precisions", default=None,
                    help=f"comma list of precisions to run (default all: {','.join(settings_mod.PRECISIONS)})")
    group.addoption("--expect-gpu", action="store_true", default=False,
                    help="fail, rather than skip, GPU checks when no usable GPU is found")
    group.addoption("--report-dir", default=None, help="where HTML and JSON reports go (default: reports/)")
    group.addoption("--vllm-python", default=None,
                    help="python interpreter of the venv holding vLLM (default: .venvs/vllm-0.32.0/bin/python)")
    group.addoption("--baseline-vllm-python", default=None,
                    help="python of an older vLLM venv for the upgrade rehearsal (default: .venvs/vllm-0.31.0/bin/python)")
    group.addoption("--endpoint", default=None,
                    help="an already running OpenAI-compatible server to test instead of starting vLLM")
    group.addoption("--baseline", default=None, help="bench results JSON to compare this run's serving figures against")
    group.addoption("--hw-level", default=None, help="hardware check depth: quick (default) or full")


def pytest_configure(config):
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    options = {
        name: config.getoption(name)
        for name in ("model", "device", "vram_budget", "precisions", "expect_gpu", "report_dir",
                     "vllm_python", "baseline_vllm_python", "endpoint", "baseline", "hw_level")
    }
    try:
        config.harness_settings = settings_mod.resolve(options, root=config.rootpath)
    except UsageError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session")
def settings(request) -> settings_mod.Settings:
    return request.config.harness_settings
