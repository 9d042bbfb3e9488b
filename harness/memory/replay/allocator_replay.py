"""A trace of allocations and frees replayed through the caching allocator's model (allocator_sim): one
replay and whether it ran out, the smallest cap it fits under, and the events of a recorded allocator
history.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from .allocator_sim import CachingAllocator, round_size


@dataclass(frozen=True)
class Replay:
    oom: bool
    oom_event: int | None  # index in the events of the alloc that ran out of memory
    allocated_peak: int  # torch.cuda.max_memory_allocated
    reserved_peak: int  # torch.cuda.max_memory_reserved
    retries: int  # num_alloc_retries
    reserved_at_oom: int | None  # reserved bytes when the OOM was raised (after the cache release)


Event = tuple  # ("alloc", key, nbytes), ("free", key) or ("empty_cache",)


def replay(events: Iterable[Event], cap_bytes: int | None = None, *, check_every: int = 0) -> Replay:
    """Run the events through a fresh allocator, stopping at the first OOM (torch raises there).

    check_every > 0 checks reserved >= allocated after every event and all the bookkeeping
    (CachingAllocator.check) every check_every events and at the end: slow, for tests.
    """
    sim = CachingAllocator(cap_bytes)
    malloc, free = sim.malloc, sim.free
    i = -1
    for i, event in enumerate(events):
        op = event[0]
        if op == "alloc":
            try:
                ok = malloc(event[1], event[2])
            except ValueError as e:
                raise ValueError(f"event {i}: {e}") from None
            if not ok:
                return Replay(True, i, sim.allocated_peak, sim.reserved_peak, sim.retries, sim.reserved)
        elif op == "free":
            try:
                free(event[1])
            except KeyError:
                raise ValueError(f"event {i}: free of key {event[1]!r}, which is not allocated") from None
        elif op == "empty_cache":  # torch.cuda.empty_cache(): every whole free segment goes back
            sim.empty_cache()
        else:
            raise ValueError(f"event {i}: unknown operation {op!r} (want 'alloc', 'free' or 'empty_cache')")
        if check_every:
            if sim.reserved < sim.allocated:
                raise RuntimeError(f"event {i}: reserved {sim.reserved} < allocated {sim.allocated}")
            if i % check_every == 0:
                sim.check()
    if check_every:
        sim.check()
    return Replay(False, None, sim.allocated_peak, sim.reserved_peak, sim.retries, None)


def live_bytes_peak(events: Iterable[Event]) -> int:
    """The peak of the live requests, each rounded to 512 bytes: a floor under any feasible cap."""
    live: dict[Hashable, int] = {}
    total = peak = 0
    for event in events:
        if event[0] == "alloc":
            n = round_size(event[2]) if event[2] > 0 else 0
            live[event[1]] = n
            total += n
            if total > peak:
                peak = total
        elif event[0] == "free":
            total -= live.pop(event[1], 0)
    return peak


def smallest_cap(events: Iterable[Event], granularity: int = 2 << 20) -> int:
    """The smallest cap, a multiple of granularity, under which the events replay without OOM.

    Binary search between the peak of the live (rounded) requests, which no smaller cap can hold,
    and the uncapped reserved peak, which always suffices. The result fits and one granularity less
    runs out; that no smaller cap fits assumes a larger cap never runs out where a smaller one does
    not, which holds in practice but is not guaranteed (a cache release changes the later layout).
    """
    if granularity <= 0:
        raise ValueError(f"granularity must be > 0, got {granularity}")
    events = events if isinstance(events, Sequence) else list(events)
    uncapped = replay(events)
    lo = -(-live_bytes_peak(events) // granularity)  # in units of granularity; lo - 1 cannot fit
    hi = -(-uncapped.reserved_peak // granularity)  # fits
    while lo < hi:
        mid = (lo + hi) // 2
        if replay(events, mid * granularity).oom:
            lo = mid + 1
        else:
            hi = mid
    return hi * granularity


def events_from_history(history: Iterable[Sequence]) -> list[Event]:
    """Replayable events from a recorded allocator history (snapshot_case --trace-out rows
    [action, address, size, where]): each allocation named by its row's index in the history, frees
    matched by address, each run of segment frees as one empty_cache (torch.cuda.empty_cache, or the
    release before a retry, which the replay makes itself); segment allocations and frees of blocks
    made before the recording began are dropped."""
    live: dict[int, int] = {}
    out: list[Event] = []
    for i, row in enumerate(history):
        action, address = row[0], row[1]
        if action == "alloc":
            live[address] = i
            out.append(("alloc", i, row[2]))
        elif action == "free" and address in live:
            out.append(("free", live.pop(address)))
        elif action == "segment_free" and (not out or out[-1] != ("empty_cache",)):
            out.append(("empty_cache",))
    return out
