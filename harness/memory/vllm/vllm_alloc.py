"""What "Model loading took" counts beyond the parameters: PyTorch's caching allocator under the
`max_split_size_mb:20` that vLLM sets while it loads the model.

vLLM 0.26's `Worker.load_model` (vllm/v1/worker/gpu_worker.py) wraps the model runner's
`load_model` in `_scoped_allocator_max_split(max_split_size_mb=20)` (vLLM PR #41268), and the
figure it logs is the allocator's allocated bytes after the load (`DeviceMemoryProfiler` ->
`CudaPlatform.get_current_memory_usage` = `torch.cuda.max_memory_allocated` after a peak reset).
With max_split_size set, the allocator (c10/cuda/CUDACachingAllocator.cpp) never splits a block of
20 MiB or more: a tensor of that size holds its whole segment (the request rounded up to 2 MiB),
or a cached free block up to 20 MiB larger (max_non_split_rounding_size), and the slack counts as
allocated. The free blocks come from the rotary cos/sin cache, built in float32 on the GPU in the
first decoder layer (vllm/model_executor/layers/rotary_embedding/base.py) and freed.

The replay follows the order in which vLLM's decoder creates its tensors on the GPU (embedding,
then per layer the fused qkv, o, the rotary cache once, the fused gate_up and down, then an untied
lm_head); tensors below 1 MiB (norms, biases, scales of small layers) come from the small pool,
whose 512-byte rounding is left out. On the H200's random qwen2.5-1.5b: 3.0164 GiB allocated for
2.9066 GiB of tensors (bf16, logged 3.02) and 1.1193 for 1.0954 (W4A16, logged 1.12).
"""

from __future__ import annotations

from .vllm_model import ModelFacts

MiB = 1 << 20
SMALL_SIZE = 1 * MiB  # kSmallSize: requests up to this come from the small pool
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: below this a new segment is kLargeBuffer (20 MiB)
LARGE_BUFFER = 20 * MiB
ROUND_LARGE = 2 * MiB  # kRoundLarge
MAX_SPLIT = 20 * MiB  # vLLM's scoped max_split_size_mb while loading
NON_SPLIT_ROUNDING = 20 * MiB  # max_non_split_rounding_size's default (kLargeBuffer)


class LargePool:
    """The large pool of PyTorch's CUDA caching allocator (no expandable segments), one stream."""

    def __init__(self, max_split: int = MAX_SPLIT):
        self.max_split = max_split
        self.segments: list[list[list]] = []  # blocks: [size, in_use, handle]
        self.allocated = 0
        self._next = 0

    def _cached_block(self, size: int) -> tuple[int, int] | None:
        fits = [(b[0], si, bi) for si, seg in enumerate(self.segments)
                for bi, b in enumerate(seg) if not b[1] and b[0] >= size]
        if not fits:
            return None
        block, si, bi = min(fits)
        # get_free_block: no oversized block for a small request, nor one too large for a large one
        if size < self.max_split <= block or (size >= self.max_split and block >= size + NON_SPLIT_ROUNDING):
            return None
        return si, bi

    def alloc(self, nbytes: int) -> int:
        size = 512 * -(-nbytes // 512)
        found = self._cached_block(size)
        if found is None:
            segment = LARGE_BUFFER if size < MIN_LARGE_ALLOC else ROUND_LARGE * -(-size // ROUND_LARGE)
            self.segments.append([[segment, False, None]])
            found = (len(self.segments) - 1, 0)
        seg = self.segments[found[0]]
        block = seg[found[1]]
        remaining = block[0] - size
        if size < self.max_split and remaining > SMALL_SIZE:  # should_split, large pool
            seg.insert(found[1] + 1, [remaining, False, None])
            block[0] = size
        block[1], block[2] = True, self._next
        self._next += 1
        self.allocated += block[0]
        return block[2]

    def free(self, handle: int) -> None:
        for seg in self.segments:
            for i, b in enumerate(seg):
                if b[1] and b[2] == handle:
                    b[1], b[2] = False, None
                    self.allocated -= b[0]
                    if i + 1 < len(seg) and not seg[i + 1][1]:
                        b[0] += seg.pop(i + 1)[0]
                    if i > 0 and not seg[i - 1][1]:
                        seg[i - 1][0] += seg.pop(i)[0]
                    return


_FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


def _layer_linears(facts: ModelFacts) -> tuple[list[tuple[int, int]], int]:
    """(in, out) of one decoder layer's linears as vLLM fuses them (QKVParallelLinear,
    MergedColumnParallelLinear), in creation order (attention, then the MLP), and how many come
    before the rotary embedding (the attention's: up to o_proj)."""
    fused: dict[str, list[int]] = {}
    for kind, i, o, count in facts.linears:
        if count != facts.layers:
            continue
        key = _FUSED.get(kind, kind)
        fused.setdefault(key, [i, 0])[1] += o
    keys = list(fused)
    before_rope = keys.index("o_proj") + 1 if "o_proj" in keys else min(2, len(keys))
    return [(i, o) for i, o in fused.values()], before_rope


def _linear_tensors(i: int, o: int, quant: str, act_bytes: int, group: int, bits: int) -> list[int]:
    """The device tensors vLLM creates for one linear (create_weights of its quant method)."""
    n = i * o
    groups = max(1, i // group) if group else 1
    if quant == "none":
        return [n * act_bytes]
    if quant == "fp8":
        return [n]
    if bits == 8:
        return [n, o * 4 * groups]
    tensors = [n // 2, groups * o * 2]
    if quant in ("awq", "gptq"):
        tensors.append(groups * o // 2)
    if quant == "gptq":
        tensors.append(i * 4)
    return tensors


def load_slack_bytes(facts: ModelFacts, quant: str, act_bytes: int) -> int:
    """Allocated minus requested bytes of the large tensors vLLM creates while loading a dense
    decoder under max_split_size 20 MiB (see the module docstring)."""
    pool, requested = LargePool(), 0

    def param(nbytes: int) -> None:
        nonlocal requested
        if nbytes > SMALL_SIZE:
            requested += 512 * -(-nbytes // 512)
            pool.alloc(nbytes)

    linears, before_rope = _layer_linears(facts)
    param(facts.padded_vocab * facts.hidden * act_bytes)
    for layer in range(facts.layers):
        for n, (i, o) in enumerate(linears):
            if layer == 0 and n == before_rope:
                _rotary_cache(pool, facts, act_bytes, param)
            for t in _linear_tensors(i, o, quant, act_bytes, facts.group_size, facts.weight_bits):
                param(t)
    if not facts.tied:
        param(facts.padded_vocab * facts.hidden * act_bytes)
    return max(0, pool.allocated - requested)


def _rotary_cache(pool: LargePool, facts: ModelFacts, act_bytes: int, param) -> None:
    """RotaryEmbeddingBase._compute_cos_sin_cache on the GPU: t, freqs, cos, sin, their cat in
    float32, freed once the cache is cast to the model's dtype."""
    rows, half = facts.max_position, facts.rotary_dim // 2
    if rows * half * 4 <= SMALL_SIZE:
        return
    temps = [pool.alloc(rows * 4)] if rows * 4 > SMALL_SIZE else []
    temps += [pool.alloc(rows * half * 4) for _ in range(3)]
    cat = pool.alloc(rows * half * 8)
    for t in temps:
        pool.free(t)
    param(rows * half * 2 * act_bytes)
    pool.free(cat)


def cublas_workspace_bytes(compute_capability: tuple[int, int]) -> int:
    """torch's default cuBLAS workspace (CUBLAS_WORKSPACE_CONFIG unset, aten CublasHandlePool.cpp):
    4096 KiB x 8 on sm90 and newer, 4096 KiB x 2 + 16 KiB x 8 before; it comes from the caching
    allocator, so vLLM's torch peak counts it."""
    return 32 * MiB if tuple(compute_capability) >= (9, 0) else 8 * MiB + 128 * 1024
