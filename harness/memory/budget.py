"""VRAM budget emulation and the fit planner.

Emulation: a large card behaves like a small one when torch's caching allocator is capped with
torch.cuda.set_per_process_memory_fraction. A real N-GiB card loses the CUDA context (and the
driver's reservations) before torch gets anything, so the cap is (budget - context) / total.
Past the cap an allocation raises torch.OutOfMemoryError, as it would on the small card.

Planner: per precision, the longest context and the largest batch whose predicted peak, plus a
headroom for allocator fragmentation, fits in the budget after the CUDA context.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import UsageError
from .estimate import PRECISIONS, ModelShape, Query, estimate, weight_bytes
from ..units import format_bytes

# CUDA context + driver reservations of one process on a small consumer card with lazy module
# loading (facts.md: ~290-430 MB). Measured on the GPU the budget runs on when it can be.
DEFAULT_CONTEXT_BYTES = 400 * 1024**2
# Headroom on the predicted allocator peak: the caching allocator rounds blocks and splits
# segments, so at the cap it needs a little more than the allocated peak. On the H200 matrix under
# an emulated 6 GiB, 3% gave no "fits" verdict for a case that OOMed, and 5% only added false alarms.
DEFAULT_HEADROOM = 0.03


@dataclass
class BudgetState:
    budget_bytes: int
    context_bytes: int
    total_bytes: int
    fraction: float
    device: str

    @property
    def allocator_cap_bytes(self) -> int:
        return int(self.fraction * self.total_bytes)


def usable_bytes(budget_bytes: int, context_bytes: int = DEFAULT_CONTEXT_BYTES) -> int:
    return budget_bytes - context_bytes


def apply_budget(budget_bytes: int, device: str = "cuda:0", context_bytes: int | None = None) -> BudgetState:
    """Cap torch's allocator on `device` so that allocator + context fit in `budget_bytes`."""
    import torch

    from .measure import cuda_context_bytes

    if not device.startswith("cuda") or not torch.cuda.is_available():
        raise UsageError(f"a VRAM budget needs a CUDA device (device is {device})")
    dev = torch.device(device)
    total = torch.cuda.get_device_properties(dev).total_memory
    if context_bytes is None:
        context_bytes = cuda_context_bytes(device)
        if context_bytes is None:
            context_bytes = DEFAULT_CONTEXT_BYTES
    if budget_bytes >= total:
        raise UsageError(f"budget {format_bytes(budget_bytes)} is not below the card's "
                         f"{format_bytes(total)}: nothing to emulate")
    cap = budget_bytes - context_bytes
    if cap <= 0:
        raise UsageError(f"budget {format_bytes(budget_bytes)} is smaller than the CUDA context "
                         f"({format_bytes(context_bytes)})")
    fraction = cap / total
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(fraction, dev)
    return BudgetState(budget_bytes, int(context_bytes), int(total), fraction, device)


def release_budget(state: BudgetState | None) -> None:
    """Lift the cap (fraction 1.0) and drop cached blocks."""
    if state is None:
        return
    import torch

    dev = torch.device(state.device)
    torch.cuda.set_per_process_memory_fraction(1.0, dev)
    torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------
# Planner


def fits(peak_bytes: int, budget_bytes: int, context_bytes: int = DEFAULT_CONTEXT_BYTES,
         headroom: float = DEFAULT_HEADROOM) -> bool:
    return peak_bytes * (1 + headroom) <= budget_bytes - context_bytes


@dataclass
class PrecisionPlan:
    precision: str
    mode: str
    fits: bool
    weights_bytes: int
    max_seq_len: int | None  # at batch 1
    max_batch: int | None  # at the reference sequence length
    reference_seq_len: int
    peak_at_max_bytes: int | None
    reason: str
    limits: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def _largest(ok, lo: int, hi: int) -> int | None:
    """Largest n in [lo, hi] with ok(n), assuming ok is monotone (True then False)."""
    if not ok(lo):
        return None
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def plan(shape: ModelShape, budget_bytes: int, train: bool = False, precisions=PRECISIONS,
         context_bytes: int = DEFAULT_CONTEXT_BYTES, headroom: float = DEFAULT_HEADROOM,
         max_seq_len: int | None = None, reference_seq_len: int = 2048, new_tokens: int = 128,
         max_batch: int = 256, lora_r: int = 16, grad_checkpointing: bool = True) -> list[PrecisionPlan]:
    usable = budget_bytes - context_bytes
    if usable <= 0:
        raise UsageError(f"budget {format_bytes(budget_bytes)} leaves nothing after the CUDA context "
                         f"({format_bytes(context_bytes)})")
    limit = max_seq_len or 131072
    mode = "train" if train else "generate"
    plans = []
    for p in precisions:
        def peak(seq: int, batch: int) -> int:
            if train:
                q = Query(p, "train", seq_len=seq, batch=batch, lora_r=lora_r,
                          grad_checkpointing=grad_checkpointing)
            else:  # context = prompt + generated tokens
                prompt = max(1, seq - new_tokens)
                q = Query(p, "generate", seq_len=prompt, batch=batch, new_tokens=seq - prompt)
            return estimate(shape, q).peak_bytes

        w = weight_bytes(shape, p)
        ok_seq = lambda s: fits(peak(s, 1), budget_bytes, context_bytes, headroom)  # noqa: E731
        ok_batch = lambda b: fits(peak(reference_seq_len, b), budget_bytes, context_bytes, headroom)  # noqa: E731
        lo_seq = new_tokens + 1 if not train else 16
        best_seq = _largest(ok_seq, lo_seq, limit)
        best_batch = _largest(ok_batch, 1, max_batch)
        need = int(w * (1 + headroom))
        if best_seq is None:
            if need > usable:
                reason = (f"weights alone need {format_bytes(w)} (+{headroom:.0%} headroom) and "
                          f"{format_bytes(usable)} is usable after the CUDA context")
            else:
                reason = (f"weights fit ({format_bytes(w)}) but even {lo_seq} tokens at batch 1 "
                          f"peak at {format_bytes(peak(lo_seq, 1))} (> {format_bytes(usable)} usable "
                          f"with {headroom:.0%} headroom)")
            plans.append(PrecisionPlan(p, mode, False, w, None, None, reference_seq_len, None, reason))
            continue
        at_max = peak(best_seq, 1)
        if best_seq >= limit:
            reason = f"fits up to the {limit}-token limit checked"
        else:
            reason = (f"{best_seq + 1} tokens would peak at {format_bytes(peak(best_seq + 1, 1))}, "
                      f"over {format_bytes(usable)} usable with {headroom:.0%} headroom")
        if best_batch is None:
            reason += f"; batch 1 at {reference_seq_len} tokens does not fit"
        plans.append(PrecisionPlan(p, mode, True, w, best_seq, best_batch, reference_seq_len, at_max,
                                   reason))
    return plans
