"""The one dataclass every readiness check returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

VERDICTS = ("pass", "fail", "skip", "warn")


@dataclass
class CheckResult:
    check: str  # short id, the same a user selects with -k
    verdict: str  # "pass" | "fail" | "skip" | "warn"
    value: str  # what was measured, human-readable
    expectation: str = ""  # what a ready machine shows
    fix: str = ""  # likely cause and what to do (failures and warnings)
    details: dict[str, Any] = field(default_factory=dict)  # raw figures for the JSON results

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} is not one of {VERDICTS}")
        for name in ("value", "expectation", "fix"):  # shown as text in the Readiness table
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"CheckResult.{name} must be text, got {type(getattr(self, name)).__name__}")

    @property
    def ok(self) -> bool:
        return self.verdict in ("pass", "warn", "skip")

    def line(self) -> str:
        """The one-line verdict a user reads first."""
        text = f"{self.check}: {self.verdict.upper()} - {self.value}"
        if self.verdict in ("fail", "warn") and self.expectation:
            text += f" (expected {self.expectation})"
        if self.verdict in ("fail", "warn") and self.fix:
            text += f". Fix: {self.fix}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def worst(results: list[CheckResult]) -> str:
    """The verdict of a group: fail beats warn beats pass beats skip."""
    order = {"fail": 3, "warn": 2, "pass": 1, "skip": 0}
    return max((r.verdict for r in results), key=order.__getitem__, default="skip")


def combine(check: str, results: list[CheckResult], expectation: str = "") -> CheckResult:
    """One result for a check run on several GPUs: worst verdict, values and fixes joined."""
    if len(results) == 1:
        return results[0]
    verdict = worst(results)
    fixes = sorted({r.fix for r in results if r.fix and r.verdict in ("fail", "warn")})
    return CheckResult(
        check,
        verdict,
        "; ".join(r.value for r in results),
        expectation or (results[0].expectation if results else ""),
        " ".join(fixes),
        {"per_gpu": [r.to_dict() for r in results]},
    )
