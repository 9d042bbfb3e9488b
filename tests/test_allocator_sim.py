"""harness.memory.replay.allocator_sim against segment layouts worked out by hand from
c10/cuda/CUDACachingAllocator.cpp's rules (default settings, one stream) and the address placement in
its `_va_take`, and against numbers measured with torch 2.11 on an H200."""

from __future__ import annotations

import random
import time

import pytest

from harness.memory.replay.allocator_sim import CachingAllocator, allocation_size, round_size
from harness.memory.replay.allocator_replay import Replay, live_bytes_peak, replay, smallest_cap

KiB = 1 << 10
MiB = 1 << 20


def run(ops, cap=None):
    """An allocator after the ops: ("alloc", key, nbytes) | ("free", key)."""
    a = CachingAllocator(cap)
    for op in ops:
        if op[0] == "alloc":
            assert a.malloc(op[1], op[2]), op
        else:
            a.free(op[1])
        a.check()
    return a


def test_round_size_and_segment_size():
    assert [round_size(n) for n in (1, 511, 512, 513, 1024, MiB + 1)] == [512, 512, 512, 1024, 1024, MiB + 512]
    assert allocation_size(512) == allocation_size(MiB) == 2 * MiB  # small pool: kSmallBuffer
    assert allocation_size(MiB + 512) == allocation_size(10 * MiB - 512) == 20 * MiB  # kLargeBuffer
    assert allocation_size(10 * MiB) == 10 * MiB  # from kMinLargeAlloc: rounded up to 2 MiB
    assert allocation_size(10 * MiB + 512) == 12 * MiB


def test_small_pool_packs_into_one_2mib_segment():
    a = run([("alloc", "a", 100), ("alloc", "b", 512), ("alloc", "c", 513), ("alloc", "d", 1000)])
    assert a.layout() == [(2 * MiB, True, [(512, "a"), (512, "b"), (1024, "c"), (1024, "d"), (2 * MiB - 3072, None)])]
    assert (a.allocated, a.reserved) == (3072, 2 * MiB)


def test_small_pool_splits_a_512_byte_remainder():
    a = run([("alloc", "a", MiB), ("alloc", "b", MiB - 512), ("alloc", "c", 1)])
    assert a.layout() == [(2 * MiB, True, [(MiB, "a"), (MiB - 512, "b"), (512, "c")])]
    # a full small segment: the next small request needs a second one
    a.malloc("d", 1)
    assert [s[0] for s in a.layout()] == [2 * MiB, 2 * MiB]
    assert a.allocated == 2 * MiB + 512


def test_large_request_gets_20mib_segment_and_remainder_is_reused():
    a = run([("alloc", "a", 5 * MiB)])
    assert a.layout() == [(20 * MiB, False, [(5 * MiB, "a"), (15 * MiB, None)])]
    a.malloc("b", 12 * MiB)
    assert a.layout() == [(20 * MiB, False, [(5 * MiB, "a"), (12 * MiB, "b"), (3 * MiB, None)])]
    assert (a.allocated, a.reserved, a.reserved_peak) == (17 * MiB, 20 * MiB, 20 * MiB)


def test_large_pool_keeps_a_remainder_of_at_most_1mib_unsplit():
    # 15 MiB free after a; b = 14 MiB leaves exactly 1 MiB: not split (the rule is remaining > 1 MiB),
    # so b holds 15 MiB, which counts as allocated, and c needs a second segment.
    a = run([("alloc", "a", 5 * MiB), ("alloc", "b", 14 * MiB)])
    assert a.layout() == [(20 * MiB, False, [(5 * MiB, "a"), (15 * MiB, "b")])]
    assert a.allocated == 20 * MiB
    a.malloc("c", MiB + 512)
    assert a.reserved == 40 * MiB
    # 512 bytes less for b leaves 1 MiB + 512: split, and c fits the remainder exactly
    a = run([("alloc", "a", 5 * MiB), ("alloc", "b", 14 * MiB - 512)])
    assert a.layout() == [(20 * MiB, False, [(5 * MiB, "a"), (14 * MiB - 512, "b"), (MiB + 512, None)])]
    a.malloc("c", MiB + 512)
    assert a.layout() == [(20 * MiB, False, [(5 * MiB, "a"), (14 * MiB - 512, "b"), (MiB + 512, "c")])]
    assert (a.allocated, a.reserved) == (20 * MiB, 20 * MiB)


def test_request_from_10mib_gets_its_own_segment_rounded_to_2mib():
    a = run([("alloc", "a", 11 * MiB + 1)])  # rounds to 11 MiB + 512 -> 12 MiB segment, 1 MiB - 512 left
    assert a.layout() == [(12 * MiB, False, [(12 * MiB, "a")])]
    assert a.allocated == 12 * MiB
    a = run([("alloc", "a", 10 * MiB - 512)])  # just under kMinLargeAlloc: a 20 MiB segment
    assert a.layout() == [(20 * MiB, False, [(10 * MiB - 512, "a"), (10 * MiB + 512, None)])]


def test_pools_do_not_share_blocks():
    a = run([("alloc", "s", 4 * KiB), ("free", "s"), ("alloc", "l", MiB + 1)])
    assert a.layout() == [
        (2 * MiB, True, [(2 * MiB, None)]),
        (20 * MiB, False, [(MiB + 512, "l"), (19 * MiB - 512, None)]),
    ]
    a = run([("alloc", "l", 2 * MiB), ("free", "l"), ("alloc", "s", MiB)])
    assert [(size, small) for size, small, _ in a.layout()] == [(20 * MiB, False), (2 * MiB, True)]


def test_free_merges_with_both_neighbours():
    a = run([("alloc", k, 5 * MiB) for k in "abc"])
    assert a.layout() == [(20 * MiB, False, [(5 * MiB, "a"), (5 * MiB, "b"), (5 * MiB, "c"), (5 * MiB, None)])]
    a.free("b")
    assert a.layout()[0][2] == [(5 * MiB, "a"), (5 * MiB, None), (5 * MiB, "c"), (5 * MiB, None)]
    a.free("a")  # merges with the free block after it
    assert a.layout()[0][2] == [(10 * MiB, None), (5 * MiB, "c"), (5 * MiB, None)]
    a.free("c")  # merges with both
    assert a.layout() == [(20 * MiB, False, [(20 * MiB, None)])]
    assert (a.allocated, a.reserved) == (0, 20 * MiB)
    a.check()


def test_best_fit_then_lowest_address():
    a = run([("alloc", "a", 6 * MiB), ("alloc", "b", 2 * MiB), ("alloc", "c", 4 * MiB), ("alloc", "d", 2 * MiB)])
    a.free("a")
    a.free("c")
    assert a.layout()[0][2] == [(6 * MiB, None), (2 * MiB, "b"), (4 * MiB, None), (2 * MiB, "d"), (6 * MiB, None)]
    a.malloc("e", 3 * MiB)  # best fit: the 4 MiB block; 1 MiB left is not split
    assert a.layout()[0][2] == [(6 * MiB, None), (2 * MiB, "b"), (4 * MiB, "e"), (2 * MiB, "d"), (6 * MiB, None)]
    a.malloc("f", 5 * MiB)  # two 6 MiB blocks: the lower address wins
    assert a.layout()[0][2] == [(6 * MiB, "f"), (2 * MiB, "b"), (4 * MiB, "e"), (2 * MiB, "d"), (6 * MiB, None)]
    assert a.reserved == 20 * MiB


def test_segment_addresses_follow_the_drivers_placement():
    # Address space is handed out top down in 32 MiB chunks, a segment going to the lowest unused
    # range that fits: x's chunk is [-32, 0) MiB from the top; s takes its tail at -12; y does not
    # fit the 10 MiB left there, so a new chunk [-64, -32) holds y at -64 and z in its tail at -48.
    a = run([("alloc", "x", 5 * MiB), ("alloc", "s", 1), ("alloc", "y", 16 * MiB), ("alloc", "z", 16 * MiB)])
    x = next(seg.address for seg in a.segments() if seg.blocks[0][1] == "x")
    assert [(seg.address - x, seg.size, seg.blocks[0][1]) for seg in a.segments()] == [
        (-32 * MiB, 16 * MiB, "y"), (-16 * MiB, 16 * MiB, "z"), (0, 20 * MiB, "x"), (20 * MiB, 2 * MiB, "s"),
    ]


def test_equal_free_blocks_go_lowest_address_first():
    # u's and w's segments each end in a free 15 MiB block; w's segment lies lower (a newer chunk),
    # so y goes there (a rising-address model would put it beside u).
    ops = [("alloc", "u", 5 * MiB), ("alloc", "v", 15 * MiB), ("alloc", "w", 5 * MiB), ("alloc", "x", 15 * MiB)]
    a = run([*ops, ("free", "v"), ("free", "x"), ("alloc", "y", 15 * MiB)])
    assert a.layout() == [
        (20 * MiB, False, [(5 * MiB, "w"), (15 * MiB, "y")]),
        (20 * MiB, False, [(5 * MiB, "u"), (15 * MiB, None)]),
    ]


def test_segments_that_touch_do_not_merge():
    # s's 2 MiB segment sits right after x's 20 MiB one: freeing both leaves two whole free segments.
    a = run([("alloc", "x", 5 * MiB), ("alloc", "s", 1), ("free", "x"), ("free", "s")])
    segs = a.segments()
    assert segs[0].address + segs[0].size == segs[1].address
    assert a.layout() == [(20 * MiB, False, [(20 * MiB, None)]), (2 * MiB, True, [(2 * MiB, None)])]
    a.empty_cache()
    assert a.layout() == [] and a.reserved == 0


RELEASE_TRACE = [("alloc", "a", 15 * MiB), ("free", "a"), ("alloc", "b", 30 * MiB)]


def test_cap_forces_release_of_cached_segments():
    # a: 16 MiB segment, cached once freed; b needs 30 MiB: 16 + 30 > 40, the cache release frees the
    # 16 MiB segment, the retry fits.
    assert replay(RELEASE_TRACE) == Replay(False, None, 30 * MiB, 46 * MiB, 0, None)
    assert replay(RELEASE_TRACE, 40 * MiB) == Replay(False, None, 30 * MiB, 30 * MiB, 1, None)
    a = run(RELEASE_TRACE, 40 * MiB)
    assert a.layout() == [(30 * MiB, False, [(30 * MiB, "b")])]


def test_release_frees_both_pools_but_not_split_segments():
    ops = [("alloc", "s", 100), ("alloc", "x", 5 * MiB), ("alloc", "y", 5 * MiB), ("alloc", "z", 12 * MiB)]
    ops += [("free", "s"), ("free", "x"), ("free", "z")]
    a = run(ops, 36 * MiB)  # 2 + 20 + 12 = 34 MiB reserved, 5 MiB allocated (y)
    assert a.reserved == 34 * MiB
    assert a.malloc("w", 13 * MiB)  # 34 + 14 > 36: release frees s's and z's segments, keeps y's
    assert a.retries == 1
    # w reuses z's freed address range, below y's segment
    assert a.layout() == [
        (14 * MiB, False, [(14 * MiB, "w")]),
        (20 * MiB, False, [(5 * MiB, None), (5 * MiB, "y"), (10 * MiB, None)]),
    ]


FRAGMENTED_TRACE = [("alloc", "a", 5 * MiB), ("alloc", "b", 5 * MiB), ("free", "a"), ("alloc", "c", 25 * MiB)]


def test_live_block_pins_its_segment_and_the_cap_runs_out():
    # a and b share a 20 MiB segment; with b live the release frees nothing; c's 26 MiB segment
    # does not fit 40 MiB beside it, though only 5 MiB is allocated.
    assert replay(FRAGMENTED_TRACE, 40 * MiB) == Replay(True, 3, 10 * MiB, 20 * MiB, 1, 20 * MiB)
    assert replay(FRAGMENTED_TRACE, 46 * MiB) == Replay(False, None, 31 * MiB, 46 * MiB, 0, None)
    a = CachingAllocator(40 * MiB)
    for op in FRAGMENTED_TRACE[:3]:
        a.malloc(*op[1:]) if op[0] == "alloc" else a.free(op[1])
    assert not a.malloc("c", 25 * MiB)
    assert a.layout() == [(20 * MiB, False, [(5 * MiB, None), (5 * MiB, "b"), (10 * MiB, None)])]
    assert (a.allocated, a.reserved, a.retries) == (5 * MiB, 20 * MiB, 1)


def test_cap_is_inclusive():
    assert not replay([("alloc", "a", 20 * MiB)], 20 * MiB).oom
    assert replay([("alloc", "a", 20 * MiB)], 20 * MiB - 1).oom


def test_smallest_cap_of_the_hand_traces():
    assert smallest_cap(RELEASE_TRACE) == 30 * MiB
    assert smallest_cap(FRAGMENTED_TRACE) == 46 * MiB
    assert smallest_cap(FRAGMENTED_TRACE, granularity=4 * MiB) == 48 * MiB
    assert smallest_cap([]) == 0


def test_zero_byte_alloc_takes_no_block():
    a = run([("alloc", "z", 0), ("alloc", "a", 1)])
    assert a.layout() == [(2 * MiB, True, [(512, "a"), (2 * MiB - 512, None)])]
    a.free("z")
    assert replay([("alloc", "z", 0), ("free", "z")]) == Replay(False, None, 0, 0, 0, None)


def test_bad_events_name_key_and_index():
    with pytest.raises(ValueError, match=r"event 1: free of key 'ghost'"):
        replay([("alloc", "a", 1), ("free", "ghost")])
    with pytest.raises(ValueError, match=r"event 1: .*'a'.* already allocated"):
        replay([("alloc", "a", 1), ("alloc", "a", 1)])
    with pytest.raises(ValueError, match="event 0: unknown operation"):
        replay([("malloc", "a", 1)])


def random_trace(n: int, seed: int) -> list[tuple]:
    """Mixed small, medium and large requests, at most 400 live, in random order of freeing."""
    rng = random.Random(seed)
    events: list[tuple] = []
    live: list[int] = []
    key = 0
    while len(events) < n:
        if live and (len(live) > 400 or rng.random() < 0.48):
            events.append(("free", live.pop(rng.randrange(len(live)))))
            continue
        r = rng.random()
        if r < 0.6:
            nbytes = int(2 ** rng.uniform(0, 20))  # small pool
        elif r < 0.9:
            nbytes = int(2 ** rng.uniform(20, 23.3))  # 1 to 10 MiB: 20 MiB segments
        elif r < 0.99:
            nbytes = int(2 ** rng.uniform(23.3, 27))  # own segments
        else:
            nbytes = 0
        events.append(("alloc", key, nbytes))
        live.append(key)
        key += 1
    return events


# random_trace(n, seed), cap -> (Replay, segments at the end), measured with torch 2.11.0+cu130 on an
# H200 in a fresh process: torch.empty(nbytes, dtype=torch.uint8, device="cuda") per alloc, del per
# free, under set_per_process_memory_fraction(cap / total_memory); torch.cuda.memory_stats() and
# memory_snapshot() (the snapshots matched the replay block for block, keys included).
MEASURED = [
    ((20000, 1), None, Replay(False, None, 2681488896, 3357540352, 0, None), 47),
    ((20000, 2), 2800000000, Replay(True, 12245, 2165198336, 2764046336, 5, 2690646016), 40),
    ((20000, 4), 3239999999, Replay(True, 16087, 2750675968, 3225419776, 4, 3196059648), 43),
    ((50000, 6), 3900000000, Replay(True, 31700, 3177706496, 3875536896, 4, 3768582144), 51),
]


@pytest.mark.parametrize(("trace", "cap", "measured", "segments"), MEASURED)
def test_replay_matches_torch_on_h200(trace, cap, measured, segments):
    events = random_trace(*trace)
    assert replay(events, cap) == measured
    a = CachingAllocator(cap)
    for op in events[: measured.oom_event]:
        a.malloc(*op[1:]) if op[0] == "alloc" else a.free(op[1])
    assert not measured.oom or not a.malloc(*events[measured.oom_event][1:])
    assert len(a.segments()) == segments


def test_smallest_cap_is_tight_on_a_random_trace():
    events = random_trace(3000, seed=1)
    g = 2 * MiB
    cap = smallest_cap(events, g)
    assert cap % g == 0
    assert live_bytes_peak(events) <= cap <= replay(events).reserved_peak + g
    fits, short = replay(events, cap, check_every=1), replay(events, cap - g, check_every=1)
    assert not fits.oom and fits.reserved_peak <= cap
    assert short.oom and short.retries >= 1 and short.reserved_at_oom <= cap - g


def test_200k_random_events_keep_the_invariants():
    events = random_trace(200_000, seed=7)
    t = time.perf_counter()
    free_run = replay(events)
    elapsed = time.perf_counter() - t
    print(f"replay of {len(events)} events: {elapsed:.3f} s")
    assert not free_run.oom and free_run.retries == 0
    assert free_run.reserved_peak >= free_run.allocated_peak >= live_bytes_peak(events)
    checked = replay(events, check_every=5000)  # reserved >= allocated after every event, tiling every 5000
    assert checked == free_run
    tight = free_run.reserved_peak * 9 // 10
    capped = replay(events, tight, check_every=5000)
    assert capped.retries >= 1
    assert capped.reserved_peak <= tight
    # Tiling and pool bookkeeping after the capped run's releases.
    a = CachingAllocator(tight)
    for i, op in enumerate(events[: capped.oom_event if capped.oom else None]):
        a.malloc(*op[1:]) if op[0] == "alloc" else a.free(op[1])
        if i % 20_000 == 0:
            a.check()
    a.check()
    for size, _, blocks in a.layout():
        assert sum(b for b, _ in blocks) == size
