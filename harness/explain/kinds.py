"""The kinds `explain` can answer with: one registry, filled by the recogniser modules.

Each recogniser module declares the kinds it yields, once, with `declare(...)` at its top;
harness.explain.KINDS (core.KINDS, complete once core has imported every recogniser), the
not-recognised line, the check every Finding passes, the JSON contract's tests and
docs/explain.md's table all read this registry. The
nine kinds of the design contract keep their names; a new family is a new `declare` beside its
recogniser. A kind also carries the general fix `explain` gives when only the library catalog
(harness.explain.catalog) recognised the message.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    title: str  # a few words: what the family is
    fix: str  # the general fix, for a message only the catalog knows


REGISTRY: dict[str, Kind] = {}


def declare(name: str, title: str, fix: str) -> str:
    if name in REGISTRY:
        raise ValueError(f"explain kind {name!r} declared twice")
    REGISTRY[name] = Kind(name, title, fix)
    return name
