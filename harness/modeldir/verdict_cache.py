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

from pathlib import Path

from ..disk_cache import DiskCache, versions as installed_versions

_CACHE = DiskCache("check-dir", ("torch", "transformers", "jinja2", "safetensors"), switch="HARNESS_CHECKDIR_CACHE")


def versions() -> dict[str, str | None]:
    """The installed versions the verdicts depend on."""
    return installed_versions(_CACHE.packages)


def key(kind: str, what, source_module: str) -> str:
    """kind: "arch" / "template"; what: JSON-able inputs; source_module: a file name in this
    package whose code computes the verdict (its bytes are part of the key)."""
    return _CACHE.key({"kind": kind, "what": what}, [Path(__file__).with_name(source_module)])


def load(k: str):
    """The stored value, or None (absent, unreadable, disabled)."""
    return _CACHE.load(k)


def save(k: str, value) -> None:
    """Stored atomically; a cache that cannot be written is skipped."""
    _CACHE.save(k, value)
