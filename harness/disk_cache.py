"""Answers that cost imports, kept on disk by everything that decides them.

An answer that is a pure function of its inputs, of the installed versions of the libraries that
compute it and of the source of the code that does is stored under the sha256 of all three; a
later process asking the same question reads it instead of importing the libraries. Gzipped JSON
under the harness cache (HARNESS_CACHE_DIR, default ~/.cache/llm-harness), a folder for each kind
of answer. A file that cannot be read is a miss and one that cannot be written is skipped: the
answer is computed either way.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from . import atomic
from .env import probe_packages
from .models import default_cache_dir

FORMAT = 1
OFF = ("0", "off", "no", "false")


@functools.lru_cache(maxsize=None)
def versions(packages: tuple[str, ...]) -> dict[str, str | None]:
    """The installed versions of those distributions (read once a process: importlib.metadata is slow)."""
    return probe_packages(packages)


@functools.lru_cache(maxsize=None)
def source_digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


@dataclass(frozen=True)
class DiskCache:
    folder: str  # under the harness cache
    packages: tuple[str, ...]  # the distributions whose versions decide the answers
    switch: str | None = None  # an environment variable that turns the cache off (0, off, no, false)

    def enabled(self) -> bool:
        return self.switch is None or os.environ.get(self.switch, "1").lower() not in OFF

    def key(self, what: Any, sources: Sequence[Path]) -> str:
        """what: the question, JSON-able; sources: the files of the code that answers it."""
        blob = {"format": FORMAT, "folder": self.folder, "what": what, "versions": versions(self.packages),
                "sources": [source_digest(Path(s)) for s in sources]}
        return hashlib.sha256(json.dumps(blob, sort_keys=True, default=repr).encode()).hexdigest()

    def _path(self, key: str) -> Path:
        return default_cache_dir() / self.folder / f"{key}.json.gz"

    def load(self, key: str) -> Any:
        """The stored answer, or None (absent, unreadable, or the cache turned off)."""
        if not self.enabled():
            return None
        try:
            return json.loads(gzip.decompress(self._path(key).read_bytes()))
        except (OSError, ValueError, EOFError):
            return None

    def save(self, key: str, value: Any) -> None:
        """Stored atomically (another process reads the old file or the new one, never half)."""
        if not self.enabled():
            return
        try:
            atomic.write_bytes(self._path(key), gzip.compress(json.dumps(value).encode(), 3))
        except (OSError, TypeError, ValueError):
            pass
