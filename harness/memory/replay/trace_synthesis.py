"""Traced steps made from other lengths' traces (plan --train's speed): at one batch, a step's
allocations are the same ops at every sequence length, each of a size at most quadratic in it, so
three traced lengths give every other length's trace exactly.
"""

from __future__ import annotations

# A step's allocations at one batch are the same ops at every sequence length (the meta device has
# no data-dependent branch past the first few tokens), each of a size quadratic in the length at
# most (scores and masks seq x seq, activations seq, weights and states constant): from three traced
# lengths every other length's trace follows exactly (Lagrange interpolation in integers). Checked on
# the quick start's recipe (qwen2.5-1.5b nf4-dq, r 16 on q,k,v,o, paged 8-bit AdamW): traces at 500,
# 1000 and 1500 tokens give the 2000-token trace's 32,679 allocations byte for byte.
ANCHORS = 3


def synthesized_trace(traced: list[tuple[int, object]], seq_len: int, window: int | None):
    """The StepTrace at seq_len made from ANCHORS traces of other lengths at the same batch, or None
    where they cannot make it: too few, events that differ in kind or order, a size that is not an
    integer there, a sliding window between the lengths (a mask appears past it), or a trace with a
    size rounded in the length (StepTrace.rounded: not a polynomial, so three lengths do not fix it)."""
    from .step_trace import StepTrace

    if len(traced) < ANCHORS or any(t.rounded for _, t in traced):
        return None
    anchors = sorted(traced, key=lambda st: abs(st[0] - seq_len))[:ANCHORS]
    xs = [x for x, _ in anchors]
    if window is not None and len({x >= window for x in xs + [seq_len]}) > 1:
        return None
    traces = [t for _, t in anchors]
    first = traces[0]
    if any(len(t.events) != len(first.events) or t.train_at != first.train_at for t in traces[1:]):
        return None
    # Lagrange weights at seq_len over a common denominator
    den = 1
    for i, xi in enumerate(xs):
        for j, xj in enumerate(xs):
            if i != j:
                den *= xi - xj
    nums = []
    for i, xi in enumerate(xs):
        num, d = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num *= seq_len - xj
                d *= xi - xj
        nums.append(num * (den // d))
    events = []
    for evs in zip(*(t.events for t in traces)):
        e0 = evs[0]
        if any(e[:2] != e0[:2] for e in evs[1:]):
            return None
        if e0[0] != "alloc":
            events.append(e0)
            continue
        total = sum(n * e[2] for n, e in zip(nums, evs))
        if total % den or total // den < 0:
            return None
        events.append(("alloc", e0[1], total // den))
    return StepTrace(events, first.train_at)
