"""check-dir's verdicts that cost imports, kept on disk by everything that decides them.

Two verdicts need transformers (and torch) only to be computed, not to be used: the
architecture's parameter shapes (consistency.expected_model: transformers' config class and
model class on the meta device, about 2 s of CPU to import) and a chat template rendering
cleanly (transformers' jinja2 sandbox, 0.5 s). Each is a pure function of its inputs and the
installed versions, so it is stored under the sha256 of: the config dict (or the template text
and special tokens), the versions of torch / transformers / jinja2, and the source of the module
that computes it. A later check of the same architecture or template reads the answer instead
of importing the libraries. Only clean outcomes are stored: a config transformers refuses or a
template that fails is computed again every time (its finding carries the library's sentence).
Gzipped JSON under the harness cache (HARNESS_CACHE_DIR, default ~/.cache/llm-harness);
HARNESS_CHECKDIR_CACHE=0 turns it off. A cache that cannot be read or written is skipped.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path

from ..env import probe_packages

FORMAT = 1
_SOURCES: dict[str, str] = {}


def enabled() -> bool:
    return os.environ.get("HARNESS_CHECKDIR_CACHE", "1") not in ("0", "off", "no", "false")


def key(kind: str, what, source_module: str) -> str:
    """kind: "arch" / "template"; what: JSON-able inputs; source_module: a file name in this
    package whose code computes the verdict (its bytes are part of the key)."""
    blob = {"format": FORMAT, "kind": kind, "what": what, "versions": versions(), "source": _source(source_module)}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=repr).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str | None]:
    """The installed versions the verdicts depend on (read once a process: importlib.metadata is slow)."""
    return probe_packages(("torch", "transformers", "jinja2", "safetensors"))


def _source(name: str) -> str:
    if name not in _SOURCES:
        _SOURCES[name] = hashlib.sha256(Path(__file__).with_name(name).read_bytes()).hexdigest()[:16]
    return _SOURCES[name]


def _path(k: str) -> Path:
    from ..models import default_cache_dir

    return default_cache_dir() / "check-dir" / f"{k}.json.gz"


def load(k: str):
    """The stored value, or None (absent, unreadable, disabled)."""
    if not enabled():
        return None
    try:
        return json.loads(gzip.decompress(_path(k).read_bytes()))
    except (OSError, ValueError, EOFError):
        return None


def save(k: str, value) -> None:
    """Stored atomically; a cache that cannot be written is skipped."""
    if not enabled():
        return
    path = _path(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".verdict-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(gzip.compress(json.dumps(value).encode(), 3))
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        pass
