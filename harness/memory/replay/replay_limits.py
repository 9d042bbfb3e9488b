"""plan --train's limits, replayed: the longest context and the largest batch whose traced step
runs under torch's default caching allocator on the card (harness.memory.replay.step_trace), found by
tracing a handful of settings around the reserve rule's answer (docs/vram.md, "plan --train,
replayed").

A trace takes 5-10 s on one core whatever the sequence length (the meta device computes nothing),
so the search spends few of them: it starts at the reserve rule's answer, steers by the traced
need (a step's need grows almost linearly with tokens and batch), and closes in by bisection
where that guess does not shrink the bracket. Its answer n fits replayed and n + 1 does not;
fitting is not quite monotone (a release before a retry changes the later layout), so a setting
below n may still not fit, which the measured agreement counts (benchmarks/vram/plan_verdicts.py).
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace

from ...errors import UnsupportedError, one_line
from .step_verdict import REPLAY_MARGIN

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


@dataclass
class ReplayedLimit:
    """A limit (the context at batch 1, or the batch at the reference length) found by replay."""

    axis: str  # "seq_len" or "batch"
    value: int | None  # the largest that fits replayed; None: not even the smallest does
    reserve_rule: int | None  # what the reserve rule answered
    closed: bool  # value + 1 was traced and refused (or value is the search's upper end)
    points: list[ReplayPoint] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


class StepReplayer:
    """Traces one training recipe at any (sequence length, batch) and replays the allocator on it
    under budget - context, less REPLAY_MARGIN; every setting traced once (nf4-dq and fp4-dq
    allocate alike, so one replayer serves both)."""

    def __init__(self, config: dict, shape, recipe, budget_bytes: int, context_bytes: int,
                 margin: float = REPLAY_MARGIN, progress: Callable[[str], None] | None = None,
                 transformers: str | None = None):
        """transformers: the version whose attention choice the trace follows (default: the installed one)."""
        from ..family.families import at_transformers, installed_transformers

        self.config, self.recipe, self.margin = config, recipe, margin
        self.budget_bytes, self.context_bytes = budget_bytes, context_bytes
        self.cap_bytes = budget_bytes - context_bytes
        version = transformers or installed_transformers()
        self.attention = getattr(at_transformers(shape, version).traits, "attention", None) or "sdpa"
        self._say = progress or (lambda _msg: None)
        self._points: dict[tuple[int, int], ReplayPoint] = {}
        # traced steps by (seq_len, batch); once ANCHORS of one batch share their event structure,
        # the others at that batch are made from them (synthesized_trace) instead of traced
        self._traces: dict[tuple[int, int], object] = {}
        self.window = getattr(shape, "sliding_window", None)
        self.synthesized = 0
        self._recipe_key: str | None = None  # trace_cache's folder of this recipe, read at the first point
        self._cached: set[tuple[int, int]] = set()

    def points(self) -> list[ReplayPoint]:
        return list(self._points.values())

    def point(self, seq_len: int, batch: int) -> ReplayPoint:
        key = (seq_len, batch)
        if key not in self._points:
            self._points[key] = self._trace(seq_len, batch)
        return self._points[key]

    def _trace(self, seq_len: int, batch: int) -> ReplayPoint:
        from . import trace_cache
        from .step_trace import trace_training_step
        from .step_verdict import replay_verdict

        t0 = time.perf_counter()
        query = replace(self.recipe, seq_len=seq_len, batch=batch)
        say = lambda msg: self._say(f"{seq_len} x {batch}: {msg}")  # noqa: E731
        if self._recipe_key is None:
            self._recipe_key = trace_cache.recipe_key(self.config, self.recipe, self.attention)
            self._cached = set(trace_cache.settings(self._recipe_key))
        how, trace = "", None
        if (seq_len, batch) in self._cached:
            trace, how = trace_cache.load(self._recipe_key, seq_len, batch), "from the trace cache"
        if trace is None:
            trace, how = self._made(seq_len, batch), f"made from {ANCHORS} traced lengths"
            self.synthesized += trace is not None
        if trace is None:
            try:
                with _quiet():
                    trace = trace_training_step(self.config, query, self.attention, progress=say)
            except ImportError as exc:
                raise UnsupportedError(f"the replay needs transformers and peft: {exc}") from None
            except UnsupportedError:
                raise
            except Exception as exc:  # noqa: BLE001 - a model the meta-device run cannot step: said, not raised
                raise UnsupportedError(f"the step could not be traced: {type(exc).__name__}: "
                                       f"{one_line(str(exc))[:300]}") from None
            trace_cache.save(self._recipe_key, seq_len, batch, trace)
            self._cached.add((seq_len, batch))
            how = ""
        if not how.startswith("made"):
            self._traces[(seq_len, batch)] = trace
        v = replay_verdict(trace, self.budget_bytes, self.context_bytes, self.margin)
        point = ReplayPoint(seq_len, batch, v.fits, v.need_bytes, v.traced_peak_bytes, round(time.perf_counter() - t0, 1))
        self._say(f"{seq_len} x {batch}: {'fits' if v.fits else 'does not fit'} (traced need "
                  f"{point.need_bytes / 2**30:.2f} GiB, {how + ', ' if how else ''}{point.seconds:.0f} s)")
        return point

    def _made(self, seq_len: int, batch: int):
        """The setting made from the ANCHORS nearest traced lengths at its batch (this run's or the
        cache's), or None."""
        from . import trace_cache

        lengths = {s for s, b in set(self._traces) | self._cached if b == batch and s != seq_len}
        nearest = sorted(lengths, key=lambda s: (abs(s - seq_len), s))[:ANCHORS]
        if len(nearest) < ANCHORS:
            return None
        anchors = []
        for s in nearest:
            t = self._traces.get((s, batch)) or trace_cache.load(self._recipe_key, s, batch)
            if t is None:
                return None
            self._traces[(s, batch)] = t
            anchors.append((s, t))
        return synthesized_trace(anchors, seq_len, self.window)


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


@contextmanager
def _quiet():
    """The libraries' warnings while they are imported and traced (deprecations, a CPU kernel
    bitsandbytes could not fetch) are about the meta-device run, not the user's training."""
    log = logging.getLogger("bitsandbytes")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def replay_unavailable() -> str | None:
    """Which of the tracer's libraries this machine lacks, or None when it has them all."""
    from .step_trace import import_bitsandbytes

    for module in ("transformers", "bitsandbytes", "peft"):
        try:
            with _quiet():
                import_bitsandbytes() if module == "bitsandbytes" else __import__(module)
        except Exception as exc:  # noqa: BLE001 - any import failure means no trace
            return f"the replay needs {module}: {type(exc).__name__}: {exc}"
    return None


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


def replayed_limit(replayer: StepReplayer, axis: str, reserve_rule: int | None, lo: int, hi: int,
                   other: int, slope_bytes: float) -> ReplayedLimit:
    """The largest sequence length at batch `other` (axis "seq_len"), or batch at sequence length
    `other` (axis "batch"), in [lo, hi] that fits replayed, starting from the reserve rule's answer."""
    if axis == "seq_len":
        probe, axis_of = (lambda n: replayer.point(n, other)), (lambda p: p.seq_len)
    else:
        probe, axis_of = (lambda n: replayer.point(other, n)), (lambda p: p.batch)
    target = int(replayer.cap_bytes / (1 + replayer.margin))
    value, closed = largest_fitting(probe, axis_of, target, reserve_rule or lo, lo, hi, slope_bytes)
    on_axis = [p for p in replayer.points() if (p.batch if axis == "seq_len" else p.seq_len) == other]
    return ReplayedLimit(axis, value, reserve_rule, closed, sorted(on_axis, key=axis_of))


def limit_search(plan, shape, replayer: StepReplayer, axis: str, *, lo_seq: int, hi_seq: int,
                 max_batch: int) -> ReplayedLimit:
    """One of plan's two limits replayed: the context at batch 1 (axis "seq_len", in [lo_seq, hi_seq])
    or the batch at plan.reference_seq_len (axis "batch", in [1, max_batch]), each started at the
    reserve rule's answer and steered by the estimate's bytes per token or per sequence."""
    from ..fit.estimate import estimate

    recipe = replace(replayer.recipe, precision=plan.precision)

    def planned(seq: int, batch: int) -> int:
        return estimate(shape, replace(recipe, seq_len=seq, batch=batch)).planned_bytes

    if axis == "seq_len":
        s0 = plan.max_seq_len or lo_seq
        return replayed_limit(replayer, axis, plan.max_seq_len, lo_seq, hi_seq, 1,
                              (planned(s0 + 64, 1) - planned(s0, 1)) / 64)
    ref = plan.reference_seq_len
    return replayed_limit(replayer, axis, plan.max_batch, 1, max_batch, ref, planned(ref, 2) - planned(ref, 1))


def cap_text(cap_bytes: int, margin: float) -> str:
    """'the 5.32 GiB replayed (the 5.35 GiB the card leaves, less 0.5%)': the line a replayed verdict
    is drawn at, in the words plan --train and estimate --replay both print."""
    from ..fit.budget import _size

    return f"the {_size(int(cap_bytes / (1 + margin)))} replayed (the {_size(cap_bytes)} the card leaves, less {margin:.1%})"


def point_text(fits: bool, need_bytes: int, cap_bytes: int, margin: float) -> str:
    """One traced setting's verdict in plan --train's words."""
    from ..fit.budget import _size

    return (f"{'fits' if fits else 'does not fit'}, replayed on torch's caching allocator: traced need "
            f"{_size(need_bytes)}, {'under' if fits else 'over'} {cap_text(cap_bytes, margin)}")


def replay_plan(plan, shape, replayer: StepReplayer, *, lo_seq: int, hi_seq: int, max_batch: int,
                limit_source: str | None):
    """`plan` (a budget.PrecisionPlan of a traced precision) with its context and batch limits
    replayed: limits_from "replay", the traced settings under `replay`, the reason said anew."""
    from ..fit.budget import _size
    from ..fit.estimate import estimate

    seq, batch = (limit_search(plan, shape, replayer, axis, lo_seq=lo_seq, hi_seq=hi_seq, max_batch=max_batch)
                  for axis in ("seq_len", "batch"))
    ref = plan.reference_seq_len
    line = cap_text(replayer.cap_bytes, replayer.margin)
    if seq.value is None:
        first = seq.points[0]
        reason = (f"the weights fit ({_size(plan.weights_bytes)}) but {first.seq_len} tokens at batch 1 do not, "
                  f"replayed on torch's caching allocator: traced need {_size(first.need_bytes)}, over {line}")
    elif seq.value >= hi_seq:
        at = next(p for p in seq.points if p.seq_len == seq.value)
        stop = f"the model's limit, not memory, stops it ({limit_source})" if limit_source else \
            f"fits up to the {hi_seq}-token limit checked (the config states no max_position_embeddings)"
        reason = (f"{stop}: {hi_seq} tokens fit replayed on torch's caching allocator (traced need "
                  f"{_size(at.need_bytes)}, under {line})")
    else:
        over = next((p for p in seq.points if p.seq_len > seq.value and not p.fits), None)
        reason = ((f"{over.seq_len} tokens do not fit, replayed on torch's caching allocator: traced need "
                   f"{_size(over.need_bytes)}, over {line}") if over else
                  f"{seq.value} tokens fit, replayed on torch's caching allocator under {line}") + \
            f" (the reserve rule's answer: {seq.reserve_rule or 'none'})"
    if seq.value is not None and batch.value is None:
        reason += f"; batch 1 at {ref} tokens does not fit"
    unclosed = [r.axis for r in (seq, batch) if not r.closed]
    if unclosed:
        reason += (f"; the search for {' and '.join(unclosed)} stopped after {MAX_TRACES} traces: the largest "
                   "setting seen fitting")
    return replace(plan, fits=seq.value is not None, max_seq_len=seq.value,
                   max_batch=batch.value if seq.value is not None else None,
                   peak_at_max_bytes=estimate(shape, replace(replayer.recipe, precision=plan.precision,
                                                             seq_len=seq.value)).planned_bytes if seq.value else None,
                   reason=reason,
                   limited_by=None if seq.value is None else ("model" if seq.value >= hi_seq else "memory"),
                   verdict="fits" if seq.value is not None else "does not fit",
                   limits_from="replay", replay={"margin": replayer.margin, "cap_bytes": replayer.cap_bytes,
                                                 "seq_len": seq.as_dict(), "batch": batch.as_dict()})
