"""Two models on one small GPU: resident when they fit the budget, switched when they do not.

- ``emulate_budget(budget_bytes, device)``: caps torch's caching allocator so a large GPU behaves
  like a small card (an allocation past the cap raises torch.OutOfMemoryError).
- ``TwoModelManager``: measures each model's footprint, keeps both resident when they fit the
  budget (with headroom), otherwise switches (release, gc, empty_cache, load), timing every
  switch and recording its peak.
- ``load_order_experiment``: large-first against small-first, with the allocator's peak and the
  fragmentation (reserved minus allocated) after loading both and after one switch cycle.
- KV-cache handoff between two models on separate CUDA streams (``handoff_race``), run without
  synchronisation (a race: model B reads the shared prompt cache before model A's stream wrote
  it) and with it (``wait_stream``/event), each checked by a cache scan and against a reference.
- ``prefix_cache`` / ``continue_from_cache``: the same handoff on one device (CPU in CI).

torch is imported inside functions.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import UsageError

Loader = Callable[[], Any]


def _torch():
    import torch

    return torch


def _is_cuda(device: str) -> bool:
    return str(device).startswith("cuda")


def _sync(device: str) -> None:
    if _is_cuda(device):
        _torch().cuda.synchronize(device)


def _mem(device: str) -> dict[str, int]:
    torch = _torch()
    if not _is_cuda(device):
        return {"allocated": 0, "reserved": 0, "peak": 0}
    return {"allocated": torch.cuda.memory_allocated(device), "reserved": torch.cuda.memory_reserved(device),
            "peak": torch.cuda.max_memory_allocated(device)}


@contextlib.contextmanager
def emulate_budget(budget_bytes: int | None, device: str = "cuda:0"):
    """harness.memory.fit.budget's emulation (allocator cap = budget - CUDA context) for the duration;
    None or a CPU device: no cap."""
    from ..memory.fit.budget import apply_budget, release_budget

    if budget_bytes is None or not _is_cuda(device):
        yield None
        return
    state = apply_budget(budget_bytes, device)
    try:
        yield state
    finally:
        release_budget(state)


def usable_budget(budget_bytes: int, device: str) -> int:
    """What the allocator may use of a card of `budget_bytes` (the CUDA context comes first)."""
    from ..memory.fit.budget import DEFAULT_CONTEXT_BYTES
    from ..memory.tracking.measure import cuda_context_bytes

    if not _is_cuda(device):
        return budget_bytes
    context = cuda_context_bytes(device)
    return budget_bytes - (DEFAULT_CONTEXT_BYTES if context is None else context)


def _tensor_bytes(model) -> int:
    """Bytes of a model's parameters and buffers (the footprint on a CPU, where there is no allocator)."""
    seen, total = set(), 0
    for tensor in list(model.parameters()) + list(model.buffers()):
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            total += tensor.numel() * tensor.element_size()
    return total


@dataclass
class Footprint:
    name: str
    bytes: int  # allocated by the model once loaded
    peak_bytes: int  # allocator peak while loading
    load_s: float


@dataclass
class SwitchEvent:
    to: str
    released: list[str]
    release_s: float
    load_s: float
    latency_s: float  # release + load, synchronised
    peak_bytes: int  # allocator peak during the switch
    allocated_bytes: int  # after the switch
    reserved_bytes: int


@dataclass
class TwoModelManager:
    """Two (or more) named models within `budget_bytes` of one device."""

    loaders: dict[str, Loader]
    device: str = "cuda:0"
    budget_bytes: int | None = None
    headroom_bytes: int = 512 * 2**20  # activations, cuBLAS workspace, a KV cache
    footprints: dict[str, Footprint] = field(default_factory=dict)
    resident: dict[str, Any] = field(default_factory=dict)
    events: list[SwitchEvent] = field(default_factory=list)
    mode: str | None = None  # "resident" | "switch"

    def _load(self, name: str) -> tuple[Any, float]:
        if name not in self.loaders:
            raise UsageError(f"unknown model {name!r} (known: {', '.join(self.loaders)})")
        start = time.perf_counter()
        model = self.loaders[name]()
        _sync(self.device)
        return model, time.perf_counter() - start

    def _release(self, name: str) -> None:
        model = self.resident.pop(name, None)
        if model is not None:
            with contextlib.suppress(Exception):
                model.to("meta")  # drop parameter storage even if a caller still holds a reference
            del model
        gc.collect()
        if _is_cuda(self.device):
            _torch().cuda.empty_cache()

    def measure(self) -> dict[str, Footprint]:
        """Load each model alone and record its footprint; decides the mode."""
        torch = _torch()
        for name in list(self.resident):
            self._release(name)
        for name in self.loaders:
            if _is_cuda(self.device):
                torch.cuda.reset_peak_memory_stats(self.device)
            before = _mem(self.device)["allocated"]
            print(f"[harness] two models: measuring {name} ...", file=sys.stderr, flush=True)
            model, load_s = self._load(name)
            after = _mem(self.device)
            size = after["allocated"] - before if _is_cuda(self.device) else _tensor_bytes(model)
            self.footprints[name] = Footprint(name, size, max(after["peak"] - before, size), load_s)
            self.resident[name] = model
            self._release(name)
        need = sum(f.bytes for f in self.footprints.values()) + self.headroom_bytes
        fits = self.budget_bytes is None or need <= usable_budget(self.budget_bytes, self.device)
        self.mode = "resident" if fits else "switch"
        return self.footprints

    def get(self, name: str):
        """The model `name`, on the device; under "switch", the others are released first."""
        torch = _torch()
        if self.mode is None:
            self.measure()
        if name in self.resident:
            return self.resident[name]
        if _is_cuda(self.device):
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        released = []
        if self.mode == "switch":
            for other in list(self.resident):
                self._release(other)
                released.append(other)
        release_s = time.perf_counter() - start
        model, load_s = self._load(name)
        latency = time.perf_counter() - start
        mem = _mem(self.device)
        self.resident[name] = model
        self.events.append(SwitchEvent(name, released, release_s, load_s, latency, mem["peak"],
                                       mem["allocated"], mem["reserved"]))
        return model

    def close(self) -> None:
        for name in list(self.resident):
            self._release(name)


@dataclass
class OrderResult:
    order: str  # "large-first" | "small-first"
    peak_bytes: int
    allocated_bytes: int
    reserved_bytes: int
    fragmentation_bytes: int  # reserved - allocated, both loaded
    cycle_reserved_bytes: int  # after releasing the first model and loading it again
    cycle_fragmentation_bytes: int
    oom: str | None = None


def load_order_experiment(large: Loader, small: Loader, device: str = "cuda:0",
                          budget_bytes: int | None = None) -> list[OrderResult]:
    """Load both models in each order (fresh allocator each time) and record peak and
    fragmentation, then release the first one and load it again (one switch cycle)."""
    torch = _torch()
    if not _is_cuda(device):
        raise UsageError("the load-order experiment measures the CUDA caching allocator: it needs a GPU")
    results = []
    for order, first, second in (("large-first", large, small), ("small-first", small, large)):
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        models: list[Any] = []
        oom = None
        with emulate_budget(budget_bytes, device):
            try:
                models.append(first())
                models.append(second())
                _sync(device)
                both = _mem(device)
                models[0].to("meta")
                models.pop(0)
                gc.collect()  # no empty_cache: a switch that keeps the cache shows fragmentation
                models.append(first())
                _sync(device)
                cycle = _mem(device)
            except torch.OutOfMemoryError as exc:
                oom = str(exc).splitlines()[0]
                both = cycle = _mem(device)
        results.append(OrderResult(order, torch.cuda.max_memory_allocated(device), both["allocated"],
                                   both["reserved"], both["reserved"] - both["allocated"],
                                   cycle["reserved"], cycle["reserved"] - cycle["allocated"], oom))
        for model in models:
            model.to("meta")
        del models
        gc.collect()
        torch.cuda.empty_cache()
    return results


# ---------------------------------------------------------------------------------------------
# KV-cache handoff


def prefix_cache(model, input_ids):
    """Prefill `input_ids` and return the model's cache (a transformers DynamicCache)."""
    torch = _torch()
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=True).past_key_values


def cache_from_tensors(keys: list, values: list, config=None):
    """A DynamicCache holding (copies of) the given per-layer keys and values."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    for layer, (k, v) in enumerate(zip(keys, values)):
        cache.update(k.clone(), v.clone(), layer)
    return cache


def continue_from_cache(model, cache, next_ids):
    """Logits of `next_ids` given a prefilled cache (the cache grows by len(next_ids))."""
    torch = _torch()
    with torch.no_grad():
        return model(input_ids=next_ids, past_key_values=cache, use_cache=True).logits


@dataclass
class RaceResult:
    synchronised: str  # "none" | "wait_stream" | "event"
    cache_findings: list  # nonfinite_in_cache of model B's cache
    nonfinite_logits: int
    max_abs_diff: float  # against the reference (inf when non-finite)
    matches_reference: bool


def handoff_race(model_a, model_b, prefix_ids, next_ids, sync: str = "none", sleep_cycles: int = 1_000_000_000,
                 atol: float = 1e-2) -> RaceResult:
    """Model A prefills a shared prompt cache on its own stream; model B, on another stream,
    copies that cache and continues from it.

    The shared buffers start as NaN (memory not yet written: NaN makes a stale read visible).
    With sync="none", stream B does not wait: A's stream is held back by torch.cuda._sleep, so B
    reads the buffers before A writes them, deterministically. sync="wait_stream" or "event"
    orders B after A. The reference is the same handoff on one stream.
    """
    from .locate import nonfinite_in_cache

    torch = _torch()
    device = prefix_ids.device
    if device.type != "cuda":
        raise UsageError("handoff_race needs CUDA streams (run it on a GPU)")
    if sync not in ("none", "wait_stream", "event"):
        raise UsageError(f"sync must be none, wait_stream or event, not {sync!r}")
    with torch.no_grad():
        reference_cache = prefix_cache(model_a, prefix_ids)
        reference = continue_from_cache(model_b, cache_from_tensors(
            [layer.keys for layer in reference_cache.layers], [layer.values for layer in reference_cache.layers]),
            next_ids).float()
        shapes = [(layer.keys.shape, layer.values.shape, layer.keys.dtype) for layer in reference_cache.layers]
        del reference_cache
        shared_k = [torch.full(ks, float("nan"), dtype=dt, device=device) for ks, _, dt in shapes]
        shared_v = [torch.full(vs, float("nan"), dtype=dt, device=device) for _, vs, dt in shapes]
        torch.cuda.synchronize(device)

        stream_a, stream_b = torch.cuda.Stream(device), torch.cuda.Stream(device)
        written = torch.cuda.Event()
        with torch.cuda.stream(stream_a):
            torch.cuda._sleep(sleep_cycles)  # a long kernel ahead of A's work widens the window
            cache_a = prefix_cache(model_a, prefix_ids)
            for layer, entry in enumerate(cache_a.layers):
                shared_k[layer].copy_(entry.keys)
                shared_v[layer].copy_(entry.values)
            written.record(stream_a)
        with torch.cuda.stream(stream_b):
            if sync == "wait_stream":
                stream_b.wait_stream(stream_a)
            elif sync == "event":
                stream_b.wait_event(written)
            cache_b = cache_from_tensors(shared_k, shared_v)
            logits = continue_from_cache(model_b, cache_b, next_ids).float()
        torch.cuda.synchronize(device)
        findings = nonfinite_in_cache(cache_b)
        bad = int((~torch.isfinite(logits)).sum())
        diff = float((logits - reference).abs().max()) if bad == 0 else float("inf")
        return RaceResult(sync, findings, bad, diff, bad == 0 and diff <= atol)
