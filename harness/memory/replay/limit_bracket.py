"""plan --train's search for a limit (replay_limits): the largest setting whose traced step fits
replayed, next to one more that does not, in few traces. A trace takes seconds whatever the
setting, so each next setting is guessed from the traced needs (a step's need grows almost
linearly with tokens and batch), and the bracket is halved where that guess does not shrink it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# A search that has not closed in after this many traces answers the largest setting it saw fit
# (about ten are needed from a bracket of thousands of tokens; the estimate usually starts within one).
MAX_TRACES = 14


@dataclass(frozen=True)
class ReplayPoint:
    """One traced setting, replayed under the card's cap less the margin."""

    seq_len: int
    batch: int
    fits: bool
    need_bytes: int  # a bisection's smallest cap (2 MiB steps): what steers the search
    traced_peak_bytes: int
    seconds: float


def largest_fitting(probe: Callable[[int], ReplayPoint], axis_of: Callable[[ReplayPoint], int],
                    target_bytes: int, start: int, lo: int, hi: int, slope_bytes: float,
                    max_traces: int = MAX_TRACES) -> tuple[int | None, bool]:
    """The largest n in [lo, hi] with probe(n).fits, next to an n + 1 that does not.

    Starts at `start`. Until a fitting and a refused setting bracket the answer, each next guess
    solves need(n) = target_bytes from the newest trace at `slope_bytes` per unit and steps past it
    by a pad that doubles while the guesses stay on one side. Inside the bracket it solves the same
    on the line through the bracket's two needs, and halves the bracket instead when the last guess
    did not. Returns (n, closed): closed is False when max_traces ran out first (n is then the
    largest setting seen fitting, or None)."""
    fit: ReplayPoint | None = None  # the bracket's fitting end
    fail: ReplayPoint | None = None  # its refused end, above the fitting one
    n, pad, width = min(max(start, lo), hi), 1, None
    for _ in range(max_traces):
        p = probe(n)
        if p.fits and (fit is None or n > axis_of(fit)):
            fit = p
            if fail is not None and axis_of(fail) <= n:  # refused below a fit: not monotone, look above
                fail = None
        elif not p.fits and (fail is None or n < axis_of(fail)) and (fit is None or n > axis_of(fit)):
            fail = p
        a, b = (axis_of(fit) if fit else None), (axis_of(fail) if fail else None)
        if a is not None and a >= hi:
            return hi, True
        if b is not None and b <= lo:
            return None, True
        if a is not None and b is not None:
            if b - a <= 1:
                return a, True
            db = fail.need_bytes - fit.need_bytes
            guess = a + int((target_bytes - fit.need_bytes) * (b - a) / db) if db > 0 else (a + b) // 2
            if width is not None and b - a > width // 2:  # the last guess did not halve it
                guess = (a + b) // 2
            n, width = min(max(guess, a + 1), b - 1), b - a
            continue
        step = int((target_bytes - p.need_bytes) / slope_bytes) if slope_bytes > 0 else 0
        if fit is not None:  # only fits so far: up to where the need meets the line, and past it
            n = min(a + max(step, 0) + pad, hi)
        else:  # only refusals: down
            n = max(b - max(-step, 0) - pad, lo)
        pad *= 2
    return (axis_of(fit) if fit else None), False
