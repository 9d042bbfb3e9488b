"""Every harness setting, resolved and validated in one place.

The pytest plugin hands its raw option values to :func:`resolve`; the library and the suites
only ever see the resulting :class:`Settings`. Environment variables give defaults so that CI
and users can set them once (HARNESS_VLLM_PYTHON, HARNESS_LLMCOMPRESSOR_PYTHON, HARNESS_CACHE_DIR,
HARNESS_REPORT_DIR).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .errors import UsageError
from .models import PRECISIONS, default_cache_dir, reference_names  # noqa: F401 (re-exported)
from .units import comma_list, parse_bytes

DEVICES = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
HW_LEVELS = ("quick", "full")

# Where the README's set-up command puts the CPU builds of vLLM (current, and the older one
# used by the upgrade rehearsal), relative to the project root.
DEFAULT_VLLM_VENV = Path(".venvs") / "vllm-0.32.0"
DEFAULT_BASELINE_VLLM_VENV = Path(".venvs") / "vllm-0.31.0"
# The quantizer's venv (llm-compressor pins its own transformers and compressed-tensors).
DEFAULT_LLMCOMPRESSOR_VENV = Path(".venvs") / "llmcompressor"


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # a model directory (absolute) or a reference config name
    device: str = "auto"
    vram_budget: int | None = None  # bytes
    precisions: tuple[str, ...] = PRECISIONS
    expect_gpu: bool = False
    report_dir: Path = Path("reports")
    vllm_python: Path | None = None
    vllm_python_explicit: bool = False  # given by the user: absence is a failure, not a skip
    baseline_vllm_python: Path | None = None
    endpoint: str | None = None  # base URL, without a trailing /v1
    served_model: str | None = None  # with --endpoint: --model as the name the server serves
    baseline: Path | None = None
    hw_level: str = "quick"
    llmcompressor_python: Path | None = None
    llmcompressor_python_explicit: bool = False  # given by the user: absence is a failure, not a skip
    cache_dir: Path = field(default_factory=lambda: default_cache_dir())


def parse_precisions(text: str | None) -> tuple[str, ...]:
    if not text:
        return PRECISIONS
    return comma_list(text, "--precisions", choices=PRECISIONS, lower=True)


def _python_in(venv: Path) -> Path | None:
    python = venv / "bin" / "python"
    return python if python.exists() else None


def _interpreter(value: str | None, env_var: str, default_venv: Path, flag: str) -> tuple[Path | None, bool]:
    """(python, given explicitly): the option, else the environment variable, else the default venv's."""
    explicit = value or os.environ.get(env_var)
    if not explicit:
        return _python_in(default_venv), False
    python = Path(explicit).expanduser()
    if not python.exists():
        raise UsageError(f"{flag}: {explicit!r} does not exist")
    return python, True


def _resolve_model(value: str | None) -> str | None:
    if not value:
        return None
    if value in reference_names() or value.startswith("tiny-"):
        return value
    path = Path(value).expanduser()
    if not path.exists():
        raise UsageError(
            f"--model: {value!r} does not exist (give a model directory, or one of: "
            f"{', '.join(reference_names())}, tiny-qwen2, tiny-llama)"
        )
    if not path.is_dir():
        raise UsageError(f"--model: {value!r} is not a directory")
    if not (path / "config.json").is_file():
        raise UsageError(f"--model: {value!r} has no config.json")
    return str(path.resolve())


def parse_endpoint(value: str, flag: str = "--endpoint") -> str:
    """An OpenAI-compatible base URL, with or without the SDK's trailing /v1 -> without it."""
    text = value.strip()
    if not re.match(r"^https?://[^\s/?#]+(/[^\s?#]*)?$", text):
        raise UsageError(f"{flag}: {value!r} is not an http(s) base URL (e.g. http://127.0.0.1:8000 or "
                         "http://127.0.0.1:8000/v1)")
    text = text.rstrip("/")
    return text[:-3] if text.endswith("/v1") else text


def _resolve_endpoint(value: str | None) -> str | None:
    return parse_endpoint(value) if value else None


def check_device(device: str, torch_devices: list[tuple[int, str]], nvml_indices: list[int]) -> None:
    """An explicit cuda:N must exist on this machine: raise UsageError naming the devices there are.

    `torch_devices`: (index, name) of the GPUs torch sees; `nvml_indices`: the GPUs the driver
    sees. A GPU the driver has but torch cannot use still exists: the GPU checks diagnose it."""
    if not device.startswith("cuda:"):
        return
    index = int(device.split(":", 1)[1])
    known = {i for i, _ in torch_devices} | set(nvml_indices)
    if index in known:
        return
    names = ["cpu"] + [f"cuda:{i} ({name})" for i, name in sorted(torch_devices)]
    names += [f"cuda:{i} (driver only)" for i in sorted(set(nvml_indices) - {i for i, _ in torch_devices})]
    raise UsageError(f"--device: {device} does not exist here (devices: {', '.join(names)})")


def resolve(options: Mapping[str, Any], root: Path | None = None) -> Settings:
    """Validate raw option values (None = not given) into Settings; raises UsageError.

    `root` is the project root (pytest's rootdir): reports/ and .venvs/ default to it.
    """
    root = Path(root or Path.cwd()).resolve()
    device = (options.get("device") or "auto").lower()
    if not DEVICES.match(device):
        raise UsageError(f"--device: {device!r} is not one of auto, cpu, cuda, cuda:N")

    budget = options.get("vram_budget")
    vram_budget = parse_bytes(budget, "--vram-budget") if budget else None

    hw_level = (options.get("hw_level") or "quick").lower()
    if hw_level not in HW_LEVELS:
        raise UsageError(f"--hw-level: {hw_level!r} is not one of {', '.join(HW_LEVELS)}")

    vllm_python, explicit = _interpreter(options.get("vllm_python"), "HARNESS_VLLM_PYTHON",
                                         root / DEFAULT_VLLM_VENV, "--vllm-python")
    baseline_vllm_python, _ = _interpreter(options.get("baseline_vllm_python"), "HARNESS_BASELINE_VLLM_PYTHON",
                                           root / DEFAULT_BASELINE_VLLM_VENV, "--baseline-vllm-python")

    llmcompressor_python, llmcompressor_explicit = _interpreter(
        options.get("llmcompressor_python"), "HARNESS_LLMCOMPRESSOR_PYTHON",
        root / DEFAULT_LLMCOMPRESSOR_VENV, "--llmcompressor-python")

    baseline = options.get("baseline")
    if baseline:
        baseline = Path(baseline).expanduser()
        if not baseline.is_file():
            raise UsageError(f"--baseline: {str(baseline)!r} is not a file")

    report_dir = options.get("report_dir") or os.environ.get("HARNESS_REPORT_DIR")
    report_dir = Path(report_dir).expanduser().resolve() if report_dir else root / "reports"
    if report_dir.exists() and not report_dir.is_dir():
        raise UsageError(f"--report-dir: {str(report_dir)!r} is not a directory")

    endpoint = _resolve_endpoint(options.get("endpoint"))
    model, served_model = options.get("model"), None
    if endpoint and model:
        # --model names the served model; a local directory of that name also gives its tokenizer.
        served_model = model
        path = Path(model).expanduser()
        local = model in reference_names() or model.startswith("tiny-") or (path / "config.json").is_file()
        model = model if local else None
    return Settings(
        model=_resolve_model(model),
        device=device,
        vram_budget=vram_budget,
        precisions=parse_precisions(options.get("precisions")),
        expect_gpu=bool(options.get("expect_gpu")),
        report_dir=report_dir,
        vllm_python=vllm_python,
        vllm_python_explicit=explicit,
        baseline_vllm_python=baseline_vllm_python,
        endpoint=endpoint,
        served_model=served_model,
        baseline=baseline,
        hw_level=hw_level,
        llmcompressor_python=llmcompressor_python,
        llmcompressor_python_explicit=llmcompressor_explicit,
    )
