"""Bench results JSON (schema_version 1, design.md): writing atomically, reading, fingerprints."""

from __future__ import annotations

import hashlib
import json
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
    env = results.get("environment", {})
    workload = dict(results.get("workload", {}))
    for volatile in ("num_prompts", "concurrency", "request_rate", "repeats", "warmup", "timeout_s"):
        workload.pop(volatile, None)  # the set of runs may differ; compare matches runs itself
    mach = env.get("machine", {})
    return {
        "model": env.get("model_id") or env.get("model"),
        "flags": list(env.get("flags") or []),
        "workload": workload,
        "hardware": {k: mach.get(k) for k in ("cpu_model", "cpu_count", "gpu")},
        "server_version": env.get("server_version"),
        "api": workload.get("api"),
    }


def fingerprint_hash(fp: dict) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def write_atomic(path: Path, data: dict) -> None:
    """Temp file, fsync, rename (harness.atomic): a reader never sees half a file."""
    from ..atomic import write_json

    write_json(path, data, default=str)


def load(path: str | Path) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a results JSON") from None
    except ValueError as exc:
        raise UsageError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("schema_version") != SCHEMA_VERSION or not isinstance(data.get("runs"), list):
        raise UsageError(f"{path}: not a bench results file (schema_version {SCHEMA_VERSION} with runs[])")
    return data
