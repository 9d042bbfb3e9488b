"""Traced training steps kept on disk, by everything that decides them: the config, the recipe, the
length and batch, the attention, the versions of torch / transformers / peft / bitsandbytes and the
tracer's own source. A trace does not depend on the card, so `plan --train` at another budget (or
`estimate --replay` after a plan) replays the steps it has already traced instead of tracing them
again. Gzipped JSON under the harness cache (HARNESS_CACHE_DIR, default ~/.cache/llm-harness).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from ..models import default_cache_dir

FORMAT = 1


def _versions() -> dict[str, str | None]:
    out = {}
    for name in ("torch", "transformers", "peft", "bitsandbytes"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    source = Path(__file__).with_name("step_trace.py").read_bytes()
    out["step_trace"] = hashlib.sha256(source).hexdigest()[:16]
    return out


def key(config: dict, recipe, attention: str) -> str:
    """The cache key of one traced setting (recipe: an estimate.Query with its seq_len and batch)."""
    what = {"format": FORMAT, "config": config, "attention": attention, "versions": _versions(),
            "recipe": {k: getattr(recipe, k) for k in ("precision", "seq_len", "batch", "lora_r", "lora_targets",
                                                       "grad_checkpointing", "optimizer")}}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=list).encode()).hexdigest()


def _path(k: str) -> Path:
    return default_cache_dir() / "step-traces" / f"{k}.json.gz"


def load(k: str):
    """The StepTrace stored under k, or None (absent or unreadable: traced again)."""
    from .step_trace import StepTrace

    try:
        data = json.loads(gzip.decompress(_path(k).read_bytes()))
        return StepTrace([tuple(e) for e in data["events"]], int(data["train_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save(k: str, trace) -> None:
    """Stored atomically; a cache that cannot be written is skipped (the trace is still used)."""
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = gzip.compress(json.dumps({"events": trace.events, "train_at": trace.train_at}).encode(), 3)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".trace-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)
        os.replace(tmp, path)
    except OSError:
        pass
