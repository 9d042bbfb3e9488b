"""PyTorch's CUDA caching allocator, modelled (allocator_replay.py runs a trace of allocations and
frees through it).

Follows `DeviceCachingAllocator` in c10/cuda/CUDACachingAllocator.cpp (torch 2.11) with the default
PYTORCH_CUDA_ALLOC_CONF (no expandable segments, no max_split_size, no roundup_power2_divisions, no
garbage_collection_threshold, large_segment_size 20 MiB), one device, one stream, no CUDA graphs or
memory pools. `cap_bytes` is the allocator's `allowed_memory_maximum`, which
`torch.cuda.set_per_process_memory_fraction(f)` sets to `int(f * total_memory)` (f == 1.0 sets no cap).

malloc: round the request up to 512 bytes; requests up to 1 MiB use the small pool, others the large
pool; best fit among the pool's free blocks, ordered by (size, address); otherwise a new segment
(cudaMalloc) of 2 MiB (small), 20 MiB (large, under 10 MiB) or the request rounded up to 2 MiB, which
fails when it would take the segments past the cap; then `release_cached_blocks` (cudaFree of every
segment that is one free block, both pools; counts num_alloc_retries) and one more try; else OOM.
The found block is split when what remains is at least 512 bytes (small pool) or more than 1 MiB
(large pool); an unsplit block counts whole in the allocated bytes. free merges the block with free
neighbours of its segment.

The addresses cudaMalloc returns are the driver's; they break ties between free blocks of one size,
so `_va_take` stands in an approximation of the placement seen on an H200 (CUDA 13.0 driver, fresh
process). Not modelled: the device's own memory limit (only the cap makes cudaMalloc fail), streams
and record_stream events, and the free-memory callbacks (the CUDA IPC collector, a no-op without
shared tensors).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable
from dataclasses import dataclass

MiB = 1 << 20
MIN_BLOCK_SIZE = 512  # kMinBlockSize
SMALL_SIZE = 1 * MiB  # kSmallSize: largest request of the small pool
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: small-pool segment
LARGE_BUFFER = 20 * MiB  # kLargeBuffer / large_segment_size(): segment for requests under 10 MiB
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc
ROUND_LARGE = 2 * MiB  # kRoundLarge

# A free block's sort key is (size << _SHIFT) | address: one int that orders like (size, ptr).
_SHIFT = 64
_ADDR_MASK = (1 << _SHIFT) - 1
_VA_TOP = 1 << 47
VA_CHUNK = 32 * MiB  # cudaMalloc reserves address space in chunks of this (see _va_take)


def round_size(nbytes: int) -> int:
    """The block size the allocator uses for a request of nbytes (> 0)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """The size of the segment cudaMalloc'd for a rounded request that no free block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass(frozen=True)
class Segment:
    address: int
    size: int
    small: bool
    blocks: tuple[tuple[int, Hashable | None], ...]  # (size, key of the allocation or None if free)


class CachingAllocator:
    """One device's caching allocator; allocations are named by hashable keys."""

    def __init__(self, cap_bytes: int | None = None):
        if cap_bytes is not None and cap_bytes < 0:
            raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
        self.cap = cap_bytes
        self.allocated = 0
        self.reserved = 0  # total_allocated_memory: sum of the live segments
        self.allocated_peak = 0
        self.reserved_peak = 0
        self.retries = 0
        self._live: dict[Hashable, tuple[int, int, bool] | None] = {}  # key -> (address, size, small)
        self._segments: dict[int, tuple[int, bool]] = {}  # address -> (size, small)
        self._free: dict[int, int] = {}  # free block: address -> size
        self._free_end: dict[int, int] = {}  # free block: end address -> address
        self._whole: set[int] = set()  # free blocks that are a whole segment
        self._small_keys: list[int] = []
        self._large_keys: list[int] = []
        self._va_low = _VA_TOP  # bottom of the address space handed out so far
        self._va_gaps: list[tuple[int, int]] = []  # (start, end) unused, in address order

    def malloc(self, key: Hashable, nbytes: int) -> bool:
        """Allocate nbytes for key; False when the allocator runs out of memory."""
        if key in self._live:
            raise ValueError(f"alloc of key {key!r}, which is already allocated")
        if nbytes <= 0:
            if nbytes < 0:
                raise ValueError(f"alloc of {nbytes} bytes for key {key!r}")
            self._live[key] = None  # torch allocates nothing for 0 bytes
            return True
        size = MIN_BLOCK_SIZE if nbytes < MIN_BLOCK_SIZE else -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
        small = size <= SMALL_SIZE
        keys = self._small_keys if small else self._large_keys
        i = bisect_left(keys, size << _SHIFT)
        if i < len(keys):
            k = keys.pop(i)
            address = k & _ADDR_MASK
            block = k >> _SHIFT
            del self._free[address]
            del self._free_end[address + block]
            self._whole.discard(address)
        else:
            block = allocation_size(size)
            address = self._alloc_segment(block, small)
            if address is None:
                self._release_cached_blocks()
                self.retries += 1
                address = self._alloc_segment(block, small)
                if address is None:
                    return False
        remaining = block - size
        if (remaining >= MIN_BLOCK_SIZE) if small else (remaining > SMALL_SIZE):
            rest = address + size
            self._free[rest] = remaining
            self._free_end[rest + remaining] = rest
            insort(keys, (remaining << _SHIFT) | rest)
            block = size
        self._live[key] = (address, block, small)
        self.allocated += block
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
        return True

    def free(self, key: Hashable) -> None:
        """Free key's allocation; KeyError if key is not allocated."""
        record = self._live.pop(key)
        if record is None:
            return
        address, size, small = record
        self.allocated -= size
        keys = self._small_keys if small else self._large_keys
        end = address + size
        # Segments can touch: a neighbour is only merged when this block is not at a segment's edge.
        if address not in self._segments:
            before = self._free_end.pop(address, None)
            if before is not None:
                n = address - before
                del self._free[before]
                del keys[bisect_left(keys, (n << _SHIFT) | before)]
                address = before
        if end not in self._segments:
            after = self._free.pop(end, None)
            if after is not None:
                del self._free_end[end + after]
                del keys[bisect_left(keys, (after << _SHIFT) | end)]
                end += after
        size = end - address
        self._free[address] = size
        self._free_end[end] = address
        insort(keys, (size << _SHIFT) | address)
        segment = self._segments.get(address)
        if segment is not None and segment[0] == size:
            self._whole.add(address)

    def _alloc_segment(self, size: int, small: bool) -> int | None:
        if self.cap is not None and self.reserved + size > self.cap:
            return None
        address = self._va_take(size)
        self._segments[address] = (size, small)
        self.reserved += size
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved
        return address

    def _release_cached_blocks(self) -> None:
        for address in self._whole:
            size, small = self._segments.pop(address)
            del self._free[address]
            del self._free_end[address + size]
            keys = self._small_keys if small else self._large_keys
            del keys[bisect_left(keys, (size << _SHIFT) | address)]
            self.reserved -= size
            self._va_return(address, size)
        self._whole.clear()

    def _va_take(self, size: int) -> int:
        """The address cudaMalloc returns for size bytes.

        Addresses only decide which of two free blocks of one size is taken (the lower), but that
        changes the later layout. The rule, read off torch 2.11 (CUDA 13.0) on an H200: the lowest
        unused range that fits, at its low end; else a new chunk (size rounded up to 32 MiB) below
        all the others, whose unused tail becomes a range; cudaFree makes the range unused again.
        The driver sometimes leaves more room, and the first segments go to a region the CUDA
        context set up, so addresses differ, but their order held where it mattered: the stats and
        every block of 33 fresh-process runs of random traces (capped and not) matched, where
        addresses rising from segment to segment matched the stats of 9 and the blocks of none.
        """
        gaps = self._va_gaps
        for i, (start, end) in enumerate(gaps):
            if end - start >= size:
                if end - start == size:
                    del gaps[i]
                else:
                    gaps[i] = (start + size, end)
                return start
        chunk = -(-size // VA_CHUNK) * VA_CHUNK
        self._va_low -= chunk
        if chunk > size:
            gaps.insert(0, (self._va_low + size, self._va_low + chunk))
        return self._va_low

    def _va_return(self, address: int, size: int) -> None:
        gaps = self._va_gaps
        start, end = address, address + size
        i = bisect_left(gaps, (start,))
        if i < len(gaps) and gaps[i][0] == end:
            end = gaps.pop(i)[1]
        if i > 0 and gaps[i - 1][1] == start:
            i -= 1
            start = gaps.pop(i)[0]
        gaps.insert(i, (start, end))

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release every segment that holds no allocation."""
        self._release_cached_blocks()

    def segments(self) -> list[Segment]:
        """The segments in address order, as torch.cuda.memory_snapshot() lists them."""
        at = {r[0]: k for k, r in self._live.items() if r is not None}
        sizes = {r[0]: r[1] for r in self._live.values() if r is not None}
        out = []
        for address in sorted(self._segments):
            size, small = self._segments[address]
            blocks = []
            a, end = address, address + size
            while a < end:
                if a in self._free:
                    n = self._free[a]
                    blocks.append((n, None))
                else:
                    n = sizes[a]
                    blocks.append((n, at[a]))
                a += n
            out.append(Segment(address, size, small, tuple(blocks)))
        return out

    def layout(self) -> list[tuple[int, bool, list[tuple[int, Hashable | None]]]]:
        """The segments as (size, small, [(block size, key or None), ...]) in address order."""
        return [(s.size, s.small, list(s.blocks)) for s in self.segments()]

    def check(self) -> None:
        """Raise RuntimeError unless the bookkeeping is consistent."""

        def fail(why: str) -> None:
            raise RuntimeError(f"allocator invariant broken: {why}")

        if self.reserved < self.allocated:
            fail(f"reserved {self.reserved} < allocated {self.allocated}")
        if self.cap is not None and self.reserved > self.cap:
            fail(f"reserved {self.reserved} > cap {self.cap}")
        if self.reserved != sum(s for s, _ in self._segments.values()):
            fail("reserved is not the sum of the segments")
        live = [r for r in self._live.values() if r is not None]
        if self.allocated != sum(r[1] for r in live):
            fail("allocated is not the sum of the allocated blocks")
        starts = {r[0]: r for r in live}
        if len(starts) != len(live) or starts.keys() & self._free.keys():
            fail("two blocks start at one address")
        seen_free = 0
        for address, (size, small) in self._segments.items():
            a, end, prev_free = address, address + size, False
            while a < end:
                if a in self._free:
                    if prev_free:
                        fail(f"adjacent free blocks at {a:#x}")
                    n, prev_free, seen_free = self._free[a], True, seen_free + 1
                    keys = self._small_keys if small else self._large_keys
                    i = bisect_left(keys, (n << _SHIFT) | a)
                    if i == len(keys) or keys[i] != (n << _SHIFT) | a:
                        fail(f"free block at {a:#x} missing from its pool")
                    if self._free_end.get(a + n) != a:
                        fail(f"free block at {a:#x} missing from the end index")
                    if (a in self._whole) != (n == size):
                        fail(f"whole-segment flag wrong at {a:#x}")
                elif a in starts:
                    n, prev_free = starts[a][1], False
                    if starts[a][2] != small:
                        fail(f"block at {a:#x} in the wrong pool")
                    if n < MIN_BLOCK_SIZE:
                        fail(f"block at {a:#x} smaller than {MIN_BLOCK_SIZE}")
                else:
                    fail(f"no block at {a:#x} inside the segment at {address:#x}")
                a += n
            if a != end:
                fail(f"blocks overrun the segment at {address:#x}")
        if seen_free != len(self._free) or len(self._free_end) != len(self._free):
            fail("free blocks outside the segments")
        if len(self._small_keys) + len(self._large_keys) != len(self._free):
            fail("pool lists and free blocks disagree")
        if any(a not in self._free for a in self._whole):
            fail("whole-segment set holds a block that is not free")
        if self._small_keys != sorted(self._small_keys) or self._large_keys != sorted(self._large_keys):
            fail("a pool list is out of order")


