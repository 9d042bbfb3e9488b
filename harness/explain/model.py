"""The plain dataclasses `explain` returns: a finding per recognised failure, one explanation."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Cause:
    cause: str
    evidence: str  # the line(s) of the text that show it, or what the rule rests on


@dataclass
class Finding:
    """One recognised failure. `score` orders findings (a fatal error beats a warning); `position`
    (offset of its last evidence) breaks ties: the later line is nearer the failure."""

    kind: str
    what_happened: str
    causes: list[Cause]
    fix: str
    score: int = 50
    position: int = 0
    figures_from_log: dict[str, Any] = field(default_factory=dict)
    computed: dict[str, Any] | None = None
    source: dict[str, Any] | None = None  # the library raise site the catalog matched (harness.explain.catalog)

    def __post_init__(self):
        from .kinds import REGISTRY

        if self.kind not in REGISTRY:
            raise ValueError(f"explain kind {self.kind!r} is not declared (harness.explain.kinds.declare)")


@dataclass
class Explanation:
    recognised: bool
    kind: str | None
    what_happened: str
    causes: list[Cause]
    fix: str
    computed: dict[str, Any] | None
    figures_from_log: dict[str, Any] = field(default_factory=dict)
    also: list[dict[str, str]] = field(default_factory=list)  # other failures the text shows
    source: dict[str, Any] | None = None  # library, version, file, line of the raise site the text matches

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Context:
    """What the user told `explain` besides the text: a model config and the card's memory."""

    config: str | None = None  # DIR, config.json or a reference name (harness/configs)
    gpu_memory: str | None = None  # a size (6GiB) or a card name (t4, rtx-3060-6gb)
