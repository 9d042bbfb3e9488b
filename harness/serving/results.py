"""Bench results JSON (schema_version 1, docs/architecture.md): writing atomically, reading and validating
against the schema shipped beside this module (bench_results.schema.json), fingerprints."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
from pathlib import Path

from ..errors import UsageError

SCHEMA_VERSION = 1

# What must be equal for two results to be compared (compare refuses otherwise).
FINGERPRINT_FIELDS = ("model", "flags", "workload", "hardware", "server_version", "api")


def machine() -> dict:
    import psutil

    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_bytes": psutil.virtual_memory().total,
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def fingerprint(results: dict) -> dict:
    """The comparable identity of a results file: field -> canonical value."""
    env = results.get("environment") or {}
    workload = dict(results.get("workload") or {})
    for volatile in ("num_prompts", "concurrency", "request_rate", "repeats", "warmup", "timeout_s"):
        workload.pop(volatile, None)  # the set of runs may differ; compare matches runs itself
    mach = env.get("machine") or {}  # null in a file is allowed: no machine recorded
    return {
        "model": env.get("model_id") or env.get("model"),
        "flags": list(env.get("flags") or []),
        "workload": workload,
        "hardware": {k: mach.get(k) for k in ("cpu_model", "cpu_count", "gpu")},
        "server_version": env.get("server_version"),
        "api": workload.get("api"),
    }


def write_atomic(path: Path, data: dict) -> None:
    """Temp file, fsync, rename (harness.atomic): a reader never sees half a file."""
    from ..atomic import write_json

    write_json(path, data, default=str)


SCHEMA_FILE = Path(__file__).with_name("bench_results.schema.json")
_MAX_INT = 2**53  # beyond this JSON integers stop being exact floats


@functools.lru_cache(maxsize=4)
def _validator(schema_file: Path = SCHEMA_FILE):
    import jsonschema

    schema = json.loads(Path(schema_file).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 16 or abs(int(text)) > _MAX_INT:
        raise ValueError(f"integer {text[:20]}... is out of range")
    return int(text)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _where(error) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return path.lstrip(".") or "the top level"


def validate(data, name: str, schema_file: Path = SCHEMA_FILE, what: str = "bench results file") -> dict:
    """`data` checked against a shipped schema, or UsageError naming the first thing wrong, in one line."""
    if isinstance(data, dict) and isinstance(data.get("schema_version"), int) and not isinstance(data["schema_version"], bool) \
            and data["schema_version"] > SCHEMA_VERSION:
        raise UsageError(f"{name}: schema_version {data['schema_version']} is newer than this harness reads "
                         f"({SCHEMA_VERSION}): upgrade llm-harness to read it")
    import jsonschema

    try:
        error = jsonschema.exceptions.best_match(_validator(schema_file).iter_errors(data))
    except RecursionError:
        raise UsageError(f"{name}: not a results file (JSON nested too deeply)") from None
    if error is not None:
        message = " ".join(error.message.split())
        if len(message) > 160:
            message = message[:157] + "..."
        raise UsageError(f"{name}: not a valid {what} (schema_version {SCHEMA_VERSION}): {_where(error)}: {message}")
    return data


def read_json(path: str | Path):
    """The JSON value in a file; every way it can fail is a UsageError of one line (exit 2)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a results JSON") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not raw.strip():
        raise UsageError(f"{path}: empty file, not a results JSON")
    try:
        return json.loads(raw.decode("utf-8"), parse_float=_finite_float, parse_int=_bounded_int,
                          parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not JSON (not UTF-8 text)") from None
    except RecursionError:
        raise UsageError(f"{path}: not a results file (JSON nested too deeply)") from None
    except ValueError as exc:
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        hint = " (truncated? the file ends early)" if "Expecting" in text and raw.rstrip()[-1:] not in (b"}", b"]") else ""
        raise UsageError(f"{path}: not JSON{hint}: {text}") from None


def load(path: str | Path) -> dict:
    """Read and validate one bench results file, or a `vllm bench serve --save-result` file (converted,
    vllm_import.py); every problem is a UsageError of one line (exit 2)."""
    from .vllm_import import is_vllm_result, to_results

    data = read_json(path)
    if is_vllm_result(data):
        data = to_results(data, str(path))
    return validate(data, str(path))


def side_paths(text: str) -> list[str]:
    """One side of a comparison: a results file, or several joined by commas (their runs pooled,
    e.g. three `vllm bench serve --save-result` files as three repeats)."""
    if "," in text and not Path(text).exists():
        return [p for p in (part.strip() for part in text.split(",")) if p]
    return [text]


def load_side(text: str) -> dict:
    """The results of one side: one file, or several pooled (the first file's environment and
    workload; every run kept, numbered as repeats in order)."""
    paths = side_paths(text)
    datas = [load(p) for p in paths]
    if len(datas) == 1:
        return datas[0]
    first = fingerprint(datas[0])
    for path, data in zip(paths[1:], datas[1:]):
        if fingerprint(data) != first:
            raise UsageError(f"{path}: not the same configuration as {paths[0]}: a side's files must be repeats "
                             "of one benchmark")
    merged = dict(datas[0])
    runs, counts = [], {}
    for data in datas:
        for run in data.get("runs", []):
            key = (run.get("concurrency"), run.get("request_rate"))
            runs.append(dict(run, repeat=counts.get(key, 0)))
            counts[key] = counts.get(key, 0) + 1
    merged["runs"] = runs
    merged["valid"] = all(d.get("valid", True) for d in datas)
    merged["invalid_reasons"] = [r for d in datas for r in d.get("invalid_reasons") or []]
    return merged


def same_results(paths: list[str]) -> tuple[str, str] | None:
    """Two of `paths` naming the same file, or files with identical bytes (a copy): (first, second)."""
    seen: dict = {}
    for p in paths:
        try:
            st = os.stat(p)
            key_file = (st.st_dev, st.st_ino)
            digest = hashlib.sha256(Path(p).read_bytes()).hexdigest()
        except OSError:
            continue  # load() reports it
        for key in (key_file, digest):
            if key in seen:
                return seen[key], p
            seen[key] = p
    return None
