"""Whether a traced training step runs on a card: torch's caching allocator replayed under the cap, with a
margin for what the trace does not see.
"""

from __future__ import annotations

from dataclasses import dataclass

from .step_trace import StepTrace


# The margin the replay keeps under the cap for what the trace does not see (the autograd engine's
# in-place gradient accumulation, which the meta device under a dispatch mode does out of place;
# the driver's address choices): the step must replay under cap / (1 + margin); the smallest on
# benchmarks/vram/replay_verdicts.py's grid with no predicted fit that ran out over the 284 committed
# families boundary cases (docs/vram.md, "The allocator replayed")
REPLAY_MARGIN = 0.005


@dataclass(frozen=True)
class ReplayVerdict:
    fits: bool
    need_bytes: int  # a bisection's smallest cap (2 MiB steps): for reading; fits replays at the cap
    cap_bytes: int  # what the allocator may hold: the budget less the CUDA context
    margin: float
    traced_peak_bytes: int

    def as_dict(self) -> dict:
        return {"fits": self.fits, "need_bytes": self.need_bytes, "cap_bytes": self.cap_bytes,
                "margin": self.margin, "traced_peak_bytes": self.traced_peak_bytes}


def fits_under(events, line_bytes: int, margin: float) -> bool:
    """Do the events replay without OOM under line_bytes / (1 + margin)? Replayed at that cap, not
    read off the smallest cap: whether a step fits is not monotone in the cap (a release before a
    retry changes the later layout), and a bisection's need can call a fitting step a refusal."""
    from .allocator_replay import replay

    return not replay(events, int(line_bytes / (1 + margin))).oom


def replay_verdict(trace: StepTrace, budget_bytes: int, context_bytes: int, margin: float = REPLAY_MARGIN) -> ReplayVerdict:
    """Does the traced step run on a card of budget_bytes, torch's default allocator replayed?"""
    from .allocator_replay import smallest_cap

    cap = budget_bytes - context_bytes
    need = smallest_cap(trace.events)
    return ReplayVerdict(fits_under(trace.events, cap, margin), need, cap, margin, trace.train_peak_bytes)
