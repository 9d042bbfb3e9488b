"""Traced training steps kept on disk, by everything that decides them: the config, the recipe, the
length and batch, the attention, the versions of torch / transformers / peft / bitsandbytes and the
tracer's own source. A trace does not depend on the card, so `plan --train` at another budget (or
`estimate --replay` after a plan) replays the steps it has already traced instead of tracing them
again. Gzipped JSON under the harness cache (HARNESS_CACHE_DIR, default ~/.cache/llm-harness).
A step the tracer could not take is kept too, as its one-line reason: with the same key the same
meta-device run fails the same way, so it is said again instead of tried again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from ... import atomic
from ...disk_cache import source_digest, versions
from ...models import default_cache_dir

FORMAT = 1


def _versions() -> dict[str, str | None]:
    return {**versions(("torch", "transformers", "peft", "bitsandbytes")),
            "step_trace": source_digest(Path(__file__).with_name("step_trace.py"))}


def recipe_key(config: dict, recipe, attention: str) -> str:
    """The cache folder of one recipe (recipe: an estimate.Query; its length and batch left out:
    each traced setting is a file in the folder)."""
    what = {"format": FORMAT, "config": config, "attention": attention, "versions": _versions(),
            "recipe": {k: getattr(recipe, k) for k in ("precision", "lora_r", "lora_targets", "grad_checkpointing",
                                                       "optimizer")}}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=list).encode()).hexdigest()


def _path(rk: str, seq_len: int, batch: int, suffix: str = ".json.gz") -> Path:
    return default_cache_dir() / "step-traces" / rk / f"{seq_len}x{batch}{suffix}"


def settings(rk: str) -> list[tuple[int, int]]:
    """The (seq_len, batch) settings of the recipe traced before."""
    out = []
    for p in (default_cache_dir() / "step-traces" / rk).glob("*x*.json.gz"):
        seq, _, batch = p.name.removesuffix(".json.gz").partition("x")
        if seq.isdigit() and batch.isdigit():
            out.append((int(seq), int(batch)))
    return sorted(out)


def load(rk: str, seq_len: int, batch: int):
    """The StepTrace stored for that setting, or None (absent or unreadable: traced again)."""
    from .step_trace import StepTrace

    try:
        data = json.loads(gzip.decompress(_path(rk, seq_len, batch).read_bytes()))
        return StepTrace([tuple(e) for e in data["events"]], int(data["train_at"]), bool(data.get("rounded", False)))
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None


def save(rk: str, seq_len: int, batch: int, trace) -> None:
    """Stored atomically; a cache that cannot be written is skipped (the trace is still used)."""
    blob = gzip.compress(json.dumps({"events": trace.events, "train_at": trace.train_at,
                                     "rounded": trace.rounded}).encode(), 3)
    try:
        atomic.write_bytes(_path(rk, seq_len, batch), blob)
    except OSError:
        pass


FAILED = ".failed.txt"


def load_failure(rk: str, seq_len: int, batch: int) -> str | None:
    """Why that setting could not be traced before, or None."""
    try:
        return _path(rk, seq_len, batch, FAILED).read_text().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def save_failure(rk: str, seq_len: int, batch: int, reason: str) -> None:
    """The reason a setting could not be traced (one line), stored like a trace."""
    try:
        atomic.write_bytes(_path(rk, seq_len, batch, FAILED), reason.encode() + b"\n")
    except OSError:
        pass
