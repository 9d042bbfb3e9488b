"""The kinds `explain` can answer with: one registry, filled by the recogniser modules.

Each recogniser module declares the kinds it yields, once, with `declare(...)` at its top; the CLI's
help, the JSON contract's check (tests) and docs/explain.md's table all read `all_kinds()`. The
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


def all_kinds() -> tuple[str, ...]:
    from . import core  # noqa: F401  (importing core imports every recogniser module, which declares its kinds)

    return tuple(REGISTRY)


def kind(name: str) -> Kind:
    all_kinds()
    return REGISTRY[name]
