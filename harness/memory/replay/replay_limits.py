"""plan --train's limits, replayed: the longest context and the largest batch whose traced step
runs under torch's default caching allocator on the card (harness.memory.replay.step_trace), found by
tracing a handful of settings around the reserve rule's answer (docs/vram.md, "plan --train,
replayed").

A trace takes seconds on one core whatever the sequence length (the meta device computes nothing),
so few are spent: three lengths around the reserve rule's answer, traced side by side where cores
are spare (side_by_side), from which every other length at batch 1 is made (trace_synthesis);
the search (limit_bracket) starts from them. Its answer n fits replayed and n + 1 does not;
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
from functools import partial

from ...errors import UnsupportedError, one_line
from .limit_bracket import MAX_TRACES, ReplayPoint, largest_fitting
from ...env import usable_cores
from .side_by_side import can_fork, side_by_side
from .step_verdict import REPLAY_MARGIN
from .trace_synthesis import ANCHORS, synthesized_trace


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
                 transformers: str | None = None, processes: int | None = None):
        """transformers: the version whose attention choice the trace follows (default: the installed one);
        processes: how many traces may run side by side (default: the usable cores, at most ANCHORS)."""
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
        self.processes = min(processes or usable_cores(), ANCHORS) if can_fork() else 1
        self._side: set[tuple[int, int]] = set()  # the settings prepare_lengths traced in forked copies

    def points(self) -> list[ReplayPoint]:
        return list(self._points.values())

    def point(self, seq_len: int, batch: int) -> ReplayPoint:
        key = (seq_len, batch)
        if key not in self._points:
            self._points[key] = self._trace(seq_len, batch)
        return self._points[key]

    def _open_cache(self) -> None:
        from . import trace_cache

        if self._recipe_key is None:
            self._recipe_key = trace_cache.recipe_key(self.config, self.recipe, self.attention)
            self._cached = set(trace_cache.settings(self._recipe_key))

    def _trace(self, seq_len: int, batch: int) -> ReplayPoint:
        from . import trace_cache

        t0 = time.perf_counter()
        self._open_cache()
        how, trace = "", None
        if (seq_len, batch) in self._traces:  # an anchor: traced side by side, or read for a made length
            trace = self._traces[(seq_len, batch)]
            how = "traced side by side" if (seq_len, batch) in self._side else "from the trace cache"
        elif (seq_len, batch) in self._cached:
            trace, how = trace_cache.load(self._recipe_key, seq_len, batch), "from the trace cache"
        if trace is None:
            trace, how = self._made(seq_len, batch), f"made from {ANCHORS} traced lengths"
            self.synthesized += trace is not None
        if trace is None:
            trace, how = self._traced(seq_len, batch, lambda msg: self._say(f"{seq_len} x {batch}: {msg}")), ""
            self._cached.add((seq_len, batch))
        if not how.startswith("made"):
            self._traces[(seq_len, batch)] = trace
        point = self._replayed(trace, seq_len, batch, t0)
        self._say_point(point, how)
        return point

    def _traced(self, seq_len: int, batch: int, say) -> object:
        """The step at that setting traced now (and stored in the trace cache)."""
        from . import trace_cache
        from .step_trace import trace_training_step

        query = replace(self.recipe, seq_len=seq_len, batch=batch)
        failed = trace_cache.load_failure(self._recipe_key, seq_len, batch)
        if failed:
            if say:
                say("not traced again: it failed before with the same config, recipe and versions (trace cache)")
            raise UnsupportedError(failed)
        try:
            with _quiet():
                trace = trace_training_step(self.config, query, self.attention, progress=say)
        except ImportError as exc:
            raise UnsupportedError(f"the replay needs transformers and peft: {exc}") from None
        except UnsupportedError:
            raise
        except Exception as exc:  # noqa: BLE001 - a model the meta-device run cannot step: said, not raised
            reason = f"the step could not be traced: {type(exc).__name__}: {one_line(str(exc))[:300]}"
            if not isinstance(exc, (MemoryError, OSError)):  # those are this machine at this time: not kept
                trace_cache.save_failure(self._recipe_key, seq_len, batch, reason)
            raise UnsupportedError(reason) from None
        trace_cache.save(self._recipe_key, seq_len, batch, trace)
        return trace

    def _replayed(self, trace, seq_len: int, batch: int, t0: float) -> ReplayPoint:
        from .step_verdict import replay_verdict

        v = replay_verdict(trace, self.budget_bytes, self.context_bytes, self.margin)
        seconds = round(time.perf_counter() - t0, 1)
        return ReplayPoint(seq_len, batch, v.fits, v.need_bytes, v.traced_peak_bytes, seconds)

    def _say_point(self, point: ReplayPoint, how: str) -> None:
        self._say(f"{point.seq_len} x {point.batch}: {'fits' if point.fits else 'does not fit'} (traced need "
                  f"{point.need_bytes / 2**30:.2f} GiB, {how + ', ' if how else ''}{point.seconds:.0f} s)")

    def prepare_lengths(self, center: int, batch: int, lo: int, hi: int) -> None:
        """Trace side by side (side_by_side.py) the lengths at `batch` that every other length of
        the search is then made from (ANCHORS, synthesized_trace): `center`, the search's first
        setting, here, and the others, 3% either side, in forked copies, which only trace them (a
        setting is replayed when the search asks for it). Nothing where one core is all there is,
        or where fewer than two lengths are missing (the trace cache's count)."""
        self._open_cache()
        known = {s for s, b in set(self._traces) | self._cached if b == batch}
        missing = ANCHORS - len(known)
        if self.processes < 2 or missing < 2:
            return
        step, window = max(1, center // 32), self.window
        around = (center + k * step for k in (0, 1, -1, 2, -2, 3, -3, 4, -4))
        lengths = [s for s in around if lo <= s <= hi and s not in known
                   and (window is None or (s >= window) == (center >= window))][:missing]
        if len(lengths) < missing:
            return
        here, others = lengths[0], lengths[1:]
        self._say(f"tracing {', '.join(map(str, lengths))} x {batch} side by side ({self.processes} processes)")
        t0 = time.perf_counter()
        try:
            _, traces = side_by_side(lambda: self.point(here, batch),
                                     [partial(self._traced, s, batch, None) for s in others])
        except OSError as exc:  # no fork (memory, process limit): the search traces them one by one
            self._say(f"could not trace side by side ({exc}); one after another")
            return
        for s, trace in zip(others, traces):
            if isinstance(trace, BaseException):  # the search traces it again if it asks, and says why then
                self._say(f"{s} x {batch}: not traced side by side ({one_line(str(trace))[:200]})")
                continue
            self._traces[(s, batch)] = trace
            self._side.add((s, batch))
        self._say(f"{', '.join(map(str, lengths))} x {batch} traced ({time.perf_counter() - t0:.0f} s)")

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
        replayer.prepare_lengths(min(max(s0, lo_seq), hi_seq), 1, lo_seq, hi_seq)
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
