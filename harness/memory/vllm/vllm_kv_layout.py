"""vLLM's KV cache layout, reproduced in plain Python (no vLLM import): per-layer specs, the
hybrid KV cache manager's grouping and page-size unification, blocks, and the tokens and max
concurrency vLLM logs. Read from vLLM 0.31.0 / 0.32.0 (`vllm/v1/kv_cache_interface.py`,
`vllm/v1/core/kv_cache_utils.py`: get_kv_cache_groups, unify_kv_cache_spec_page_size,
_get_kv_cache_groups_uniform_page_size, get_kv_cache_config_from_groups,
get_max_concurrency_for_kv_cache_config; `platforms/interface.py: _align_hybrid_block_size`).
Which layers a model has is harness.memory.vllm.vllm_kv_families' job; this module only sizes them.
The tests hold it to vLLM's own functions, run in the vLLM venvs (harness/memory/vllm/vllm_kv_check.py).

Layer-outer KV layouts only (the CPU backend's LBHNC and MLA's LBNHC, the ones read here): vLLM's
packed block-outermost grouping (`_get_packed_kv_cache_groups`) is not reproduced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class LayerSpec:
    """One layer's KV cache spec, as vLLM's KVCacheSpec subclasses size it.

    kind: full (FullAttentionSpec), sliding (SlidingWindowSpec), chunked
    (ChunkedLocalAttentionSpec), mla (MLAAttentionSpec), mamba (MambaSpec: Mamba-1/2, GDN,
    short-conv states).
    """

    kind: str
    block_size: int
    bytes_per_token: int = 0  # attention: heads x (head_size + head_size_v) x dtype bytes
    state_bytes: int = 0  # mamba: the whole per-request state (all its shapes)
    window: int | None = None  # sliding window or attention chunk size
    page_padded: int | None = None
    extra_pages: int = 0  # mamba: prefill checkpoint blocks (Mamba-2 in 0.32, align mode)
    detail: str = ""  # for reading: heads x head size, or the state shapes

    @property
    def unpadded_page(self) -> int:
        return self.state_bytes if self.kind == "mamba" else self.block_size * self.bytes_per_token

    @property
    def page(self) -> int:
        return self.page_padded if self.page_padded is not None else self.unpadded_page

    def request_pages(self, s: "Scheduling") -> int:
        """Pages one request at max_model_len holds (vLLM: cdiv(max_memory_usage_bytes, page))."""
        L = s.max_model_len
        if self.kind in ("full", "mla"):
            return cdiv(L, self.block_size)
        if self.kind == "sliding":
            return cdiv(min(self.window - 1 + s.max_in_flight_tokens, L), self.block_size) + 1
        if self.kind == "chunked":
            return cdiv(min(self.window + s.max_in_flight_tokens, L), self.block_size)
        if self.kind == "mamba":
            return 2 + self.extra_pages if s.mamba_cache_mode == "align" else 1
        raise ValueError(self.kind)

    def same_type(self, other: "LayerSpec") -> bool:
        """vLLM's is_uniform_with_collection: one kind; sliding / chunked with one window size."""
        if self.kind != other.kind:
            return False
        if self.kind in ("sliding", "chunked"):
            return self.window == other.window
        if self.kind == "mamba":
            return self.page == other.page and self.extra_pages == other.extra_pages
        return True


@dataclass(frozen=True)
class Scheduling:
    """What the sizing reads from vLLM's resolved config."""

    max_model_len: int
    max_in_flight_tokens: int  # max_concurrent_batches x max_num_batched_tokens
    mamba_cache_mode: str = "none"  # "align" when prefix caching is on for a hybrid model


@dataclass
class Group:
    layers: list[str]
    spec: LayerSpec  # every layer of a group has this spec (vLLM merges them)
    uniform_type: bool = False  # one UniformTypeKVCacheSpecs over layers whose pages differ
    specs: list[LayerSpec] = field(default_factory=list)

    @property
    def page(self) -> int:
        return sum(s.page for s in self.specs) if self.uniform_type else self.spec.page

    def request_pages(self, s: Scheduling) -> int:
        if self.uniform_type:
            return max(x.request_pages(s) for x in self.specs)
        return self.spec.request_pages(s)

    def block_bytes(self) -> int:
        """This group's share of one block in a layer-outer layout: every layer's page."""
        return sum(s.page for s in self.specs) if self.uniform_type else self.spec.page * len(self.layers)


@dataclass
class KvLayout:
    groups: list[Group]
    bytes_per_block: int
    padding_layers: int = 0


class LayoutRefused(Exception):
    """vLLM cannot lay these specs out (its NotImplementedError / ValueError), with its reason."""


def group_layers(specs: dict[str, LayerSpec]) -> KvLayout:
    """vLLM's get_kv_cache_groups for a layer-outer layout."""
    if not specs:
        return KvLayout([], 0)
    values = list(specs.values())
    names = list(specs)
    if all(v == values[0] for v in values):
        groups = [Group(names, values[0], specs=values)]
    elif len({v.block_size for v in values}) == 1 and all(values[0].same_type(v) for v in values):
        groups = [Group(names, values[0], uniform_type=True, specs=values)]
    else:
        groups, padding = _uniform_page_groups(unify_page_size(specs))
        return KvLayout(groups, max(g.block_bytes() for g in groups), padding)
    return KvLayout(groups, max(g.block_bytes() for g in groups))


def unify_page_size(specs: dict[str, LayerSpec]) -> dict[str, LayerSpec]:
    """vLLM's unify_kv_cache_spec_page_size: smaller pages grow their block size by an integer
    ratio, or are padded (Mamba; non-MLA attention whose page does not divide the largest)."""
    pages = {s.page for s in specs.values()}
    if len(pages) <= 1:
        return dict(specs)
    largest = max(pages)
    out = {}
    for name, spec in specs.items():
        if spec.page == largest:
            out[name] = spec
        elif spec.kind == "mamba":
            out[name] = replace(spec, page_padded=largest)
        elif largest % spec.page == 0:
            out[name] = replace(spec, block_size=spec.block_size * (largest // spec.page))
        elif spec.kind != "mla":
            out[name] = replace(spec, page_padded=largest)
        else:
            raise LayoutRefused(f"layer {name}: page size is not divisible by the maximum page size and "
                                "cannot be padded (vLLM pads only non-MLA attention layers)")
    return out


def _uniform_page_groups(specs: dict[str, LayerSpec]) -> tuple[list[Group], int]:
    """vLLM's _get_kv_cache_groups_uniform_page_size: layers bucketed by spec, every group the
    size of the smallest bucket (or of the largest when no bucket is 1.5x the smallest), each
    bucket dealt round-robin into its groups; the last group of a bucket may be short (padding)."""
    buckets: dict[LayerSpec, list[str]] = {}
    for name, spec in specs.items():
        buckets.setdefault(spec, []).append(name)
    sizes = [len(v) for v in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups, padding = [], 0
    for spec, layers in buckets.items():
        n = cdiv(len(layers), group_size)
        padding += n * group_size - len(layers)
        for i in range(n):
            members = layers[i::n]
            groups.append(Group(members, spec, specs=[spec] * len(members)))
    return groups, padding


@dataclass
class KvSizing:
    num_blocks: int
    blocks_per_request: int
    max_concurrency: float
    kv_cache_tokens: int
    bytes_per_block: int
    fits_one_request: bool
    needed_bytes: int  # for one request at max_model_len, as vLLM's start check computes it
    layout: KvLayout


def size(layout: KvLayout, available_bytes: int, s: Scheduling) -> KvSizing:
    """get_kv_cache_config_from_groups + the capacity vLLM logs, and its start check: one request
    at max_model_len must fit in the available memory less the null block."""
    if not layout.groups:  # attention-free: vLLM keeps one (null) block
        return KvSizing(1, 0, math.inf, 0, 0, True, 0, layout)
    per_block = layout.bytes_per_block
    blocks = max(0, available_bytes // per_block)
    per_request = sum(g.request_pages(s) for g in layout.groups)
    concurrency = blocks / per_request
    needed = per_block * per_request
    fits = available_bytes > 0 and needed <= available_bytes - per_block
    return KvSizing(blocks, per_request, concurrency, int(concurrency * s.max_model_len), per_block, fits,
                    needed, layout)


def largest_max_model_len(layout: KvLayout, available_bytes: int, s: Scheduling) -> int:
    """The longest max_model_len one request fits at (vLLM's estimate_max_model_len, by bisection)."""
    lo, hi = 0, max(s.max_model_len, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(layout, available_bytes, replace(s, max_model_len=mid)).fits_one_request:
            lo = mid
        else:
            hi = mid - 1
    return lo


def align_hybrid_block_size(attn_bytes_per_token: int, mamba_state_bytes: int, block_size: int,
                            kernel_block: int) -> tuple[int, int | None]:
    """Platform._align_hybrid_block_size: the attention block grows (in kernel-aligned steps) until
    an attention page holds a Mamba state, then the Mamba page is padded to the attention page.
    Returns (block_size, mamba page padded to, or None when equal)."""
    if mamba_state_bytes == 0:
        return block_size, None
    step = max(kernel_block, block_size)
    attn_block = step * cdiv(mamba_state_bytes, step * attn_bytes_per_token)
    attn_block = kernel_block * cdiv(attn_block, kernel_block)
    block_size = max(block_size, attn_block)
    page = block_size * attn_bytes_per_token
    return block_size, (None if page == mamba_state_bytes else page)
