"""The machine's verdict at the end of a readiness run: one line, and the exit code that agrees.

READY                                   exit 0  every check that ran passed (warnings and not-run
                                                checks counted in the line)
CPU-only: no NVIDIA device, ...         exit 0  no NVIDIA GPU on the PCI bus and no driver; the GPU
                                                checks skipped (--expect-gpu makes this a failure)
NOT READY: <root cause>                 exit 1  a check failed, or a GPU is there that cannot be used
NO VERDICT: <why>                       exit 1  no check ran (or the run was interrupted: pytest's code)
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Skips that are the run's choice, not a gap in what was checked.
BY_DESIGN = ("full level only", "needs 2 GPUs")


@dataclass
class CheckOutcome:
    check: str  # test name without test_
    outcome: str  # passed, failed, error, skipped
    message: str = ""
    warned: bool = False


@dataclass
class MachineVerdict:
    word: str  # READY, CPU-only, NOT READY, NO VERDICT
    line: str
    exit_code: int
    outcomes: list[CheckOutcome] = field(default_factory=list)


def _checks(n: int) -> str:
    return f"{n} check" if n == 1 else f"{n} checks"


def decide(outcomes: list[CheckOutcome], gpu_state: str, gpu_reason: str, pci_read: bool,
           interrupted: bool = False, deselected: int = 0) -> MachineVerdict:
    """The verdict over the checks' outcomes and the probe's GPU readiness (ready/absent/broken)."""
    failed = [o for o in outcomes if o.outcome in ("failed", "error")]
    passed = [o for o in outcomes if o.outcome == "passed"]
    gaps = [o for o in outcomes if o.outcome == "skipped" and not any(b in o.message for b in BY_DESIGN)]
    selection = f"; {len(outcomes)} of {len(outcomes) + deselected} checks selected" if deselected else ""
    if failed:
        first = failed[0]
        more = f" (+{len(failed) - 1} more failed: {', '.join(o.check for o in failed[1:])})" if len(failed) > 1 else ""
        return MachineVerdict("NOT READY", f"NOT READY: {first.message or first.check + ' failed'}{more}", 1, outcomes)
    if interrupted:
        return MachineVerdict("NO VERDICT", f"NO VERDICT: interrupted after {len(outcomes)} checks", 1, outcomes)
    if gpu_state == "broken":  # no check said so (a selection without the driver checks): still not ready
        return MachineVerdict("NOT READY", f"NOT READY: {gpu_reason}", 1, outcomes)
    if not outcomes:
        return MachineVerdict("NO VERDICT", "NO VERDICT: no readiness check ran", 1, outcomes)
    if gpu_state == "absent":
        what = "no NVIDIA device" if pci_read else "no NVIDIA driver found (the PCI bus could not be read)"
        return MachineVerdict("CPU-only", f"CPU-only: {what}, GPU checks skipped "
                                          f"({_checks(len(passed))} without a GPU passed{selection})", 0, outcomes)
    warned = [o.check for o in passed if o.warned]
    parts = [f"{_checks(len(passed))} passed"]
    if warned:
        parts.append(f"{len(warned)} with warnings ({', '.join(warned)})")
    if gaps:
        by_reason: dict[str, list[str]] = {}
        for o in gaps:
            by_reason.setdefault(o.message, []).append(o.check)
        reasons = "; ".join(", ".join(checks) + ": " + reason for reason, checks in by_reason.items())
        parts.append(f"{len(gaps)} not run ({reasons})")
    return MachineVerdict("READY", f"READY: {', '.join(parts)}{selection}", 0, outcomes)
