"""VRAM budget emulation and the fit planner.

Emulation: a large card behaves like a small one when torch's caching allocator is capped with
torch.cuda.set_per_process_memory_fraction. A real N-GiB card loses the CUDA context (and the
driver's reservations) before torch gets anything, so the cap is (budget - context) / total.
Past the cap an allocation raises torch.OutOfMemoryError, as it would on the small card.

Planner: per precision, the longest context and the largest batch whose predicted peak, plus the
allocator's reserve (estimate.RESERVE_FRACTION), fits in the budget after the CUDA context, never
past the model's own context limit (max_position_embeddings, rope scaling honoured).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, field
from typing import Any

from ...errors import UsageError
from .estimate import DEFAULT_NEW_TOKENS, RESERVE_FRACTION, Query, estimate
from .lora import DEFAULT_LORA_TARGETS
from .shape import ModelShape
from .weights import PRECISIONS, weight_bytes
from ...units import format_bytes

# CUDA context + driver reservations of one process on a small consumer card with lazy module
# loading (docs/architecture.md: ~290-430 MB). Measured on the GPU the budget runs on when it can be.
DEFAULT_CONTEXT_BYTES = 400 * 1024**2
# Headroom on the predicted allocator peak for inference: the caching allocator rounds blocks and
# splits segments, so at the cap it needs a little more than the allocated peak. On the H200 matrix
# under an emulated 6 GiB, 3% gave no "fits" verdict for a case that OOMed, and 5% only added false
# alarms. Training keeps more (estimate.RESERVE_FRACTION["train"]): see default_headroom().
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

    from ..tracking.measure import cuda_context_bytes

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


def fit_verdict(planned_bytes: int, budget_bytes: int, context_bytes: int, headroom: float,
                uncertainty: float = 0.0) -> str:
    """"fits", "tight" (it fits as estimated, but not with the uncertainty of an unverified family:
    families.UNVERIFIED_MARGIN) or "does not fit". The one rule estimate --budget and plan share."""
    if fits(planned_bytes * (1 + uncertainty), budget_bytes, context_bytes, headroom):
        return "fits"
    if fits(planned_bytes, budget_bytes, context_bytes, headroom):
        return "tight"
    return "does not fit"


def tight_unverified_text(uncertainty: float, family: str) -> str:
    from ..family.families import UNVERIFIED_MARGIN

    why = ("the generic path's worst under-prediction on the measured families" if uncertainty in UNVERIFIED_MARGIN.values()
           else "the worst under-prediction measured for it on the H200")
    return (f"tight: unverified family ({family}: its estimate carries {uncertainty:.1%}, {why}, "
            "so it fits only inside that margin)").replace(".0%", "%")


def default_headroom(mode: str) -> float:
    """The allocator reserve a card needs beyond the peak in this mode (estimate.RESERVE_FRACTION)."""
    return RESERVE_FRACTION.get(mode, DEFAULT_HEADROOM)


def usable_for_peak(budget_bytes: int, context_bytes: int, headroom: float) -> int:
    """The largest allocator peak that fits: what is left after the context and the reserve."""
    return int((budget_bytes - context_bytes) / (1 + headroom))


def _size(n: float, other: float | None = None) -> str:
    """format_bytes, with as many GiB decimals as it takes to tell `n` from `other` apart."""
    if other is None or abs(n) < 2**30:
        return format_bytes(n).replace(".00 ", " ")
    for decimals in (2, 3, 4):
        a, b = round(n / 2**30, decimals), round(other / 2**30, decimals)
        if a != b or decimals == 4:
            return f"{a:.{decimals}f} GiB"
    return format_bytes(n)


def usable_text(budget_bytes: int, context_bytes: int, headroom: float, need: int | None = None) -> str:
    usable = usable_for_peak(budget_bytes, context_bytes, headroom)
    return (f"{_size(usable, need)} is usable after the {_size(context_bytes)} CUDA context and "
            f"{headroom:.1%} headroom".replace(".0%", "%"))


def fragmentation_note(est) -> str:
    """' (a 4.86 GiB peak + 457 MiB kept free for ...)' when the estimate keeps fragmentation room."""
    if not est.fragmentation_bytes:
        return ""
    names = {"attention_scores": "re-allocated fp32 attention scores", "logits": "re-allocated fp32 logits",
             "optimizer_states": "the optimizer's states", "upcast": "the embedding's freed bf16 copy"}
    holes = [names.get(k, k) for k, v in (est.breakdown.get("fragmentation") or {}).items() if v]
    what = ", ".join(holes[:-1]) + (" and " if len(holes) > 1 else "") + holes[-1] if holes else "large blocks"
    return (f" (a {_size(est.peak_bytes)} peak + {_size(est.fragmentation_bytes)} kept free for the holes "
            f"left by {what})")


def need_text(what: str, need: int, budget_bytes: int, context_bytes: int, headroom: float, note: str = "") -> str:
    """'2048 tokens need 5.52 GiB; 5.44 GiB is usable after the 400 MiB CUDA context and 3% headroom'
    (`note` follows the need)."""
    usable = usable_for_peak(budget_bytes, context_bytes, headroom)
    return f"{what} need {_size(need, usable)}{note}; {usable_text(budget_bytes, context_bytes, headroom, need)}"


# How near the line a training verdict is a coin flip: under the emulated 6 GiB card (the families
# runs and the two truth runs, 366 boundary cases) 29 of the training reserve's 35 misses lay within
# 3.6% of the line; the others 3.8-6.4% and 14.5% over it (all refusals that fitted; the last is
# llama-3.2-1b all-linear r64 768 x 2, whose peak the estimate puts 4% high); docs/vram.md, "Where a
# training step's reserve goes".
TRAIN_VERDICT_UNCERTAINTY = 0.035


def tight_note(need: int, budget_bytes: int, context_bytes: int, headroom: float, mode: str) -> str:
    """'; tight: 0.4% under the line, ...' for a training verdict within TRAIN_VERDICT_UNCERTAINTY of
    the usable bytes (the verdict stands: this says how much to trust it), else ''."""
    if mode != "train" or need <= 0:
        return ""
    margin = usable_for_peak(budget_bytes, context_bytes, headroom) / need - 1
    if abs(margin) > TRAIN_VERDICT_UNCERTAINTY:
        return ""
    side = "under" if margin >= 0 else "over"
    band = f"{TRAIN_VERDICT_UNCERTAINTY:.1%}".replace(".0%", "%")
    return (f"; tight: {abs(margin):.1%} {side} the line, within the {band} where the measured training "
            "runs went either way")


# Under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the caching allocator maps memory page by
# page and gives back the pages it no longer uses, so the holes above (estimate.REALLOCATED_HOLES)
# are returned rather than held: a training step needs its peak and this reserve. Chosen by the
# rule of the default allocator's reserve (benchmarks/vram/choose_reserve.py --allocator expandable)
# over 22 runs capped at 6 GiB with expandable segments (measurements/vram/families/run-06 and
# -7/): the 14 that fitted all lay within peak x 1.02 of the line, the 8 that ran out beyond it. Over
# the 166 such runs committed since (to run-13) the rule still chooses 2%: 164 agree.
EXPANDABLE_SEGMENTS = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
EXPANDABLE_TRAIN_RESERVE = 0.02


def fits_expandable(est, budget_bytes: int, context_bytes: int) -> bool:
    """Would this training step fit with expandable segments (its peak + EXPANDABLE_TRAIN_RESERVE)?"""
    return est.mode == "train" and fits(est.peak_bytes, budget_bytes, context_bytes, EXPANDABLE_TRAIN_RESERVE)


def expandable_note(est, budget_bytes: int, context_bytes: int) -> str:
    """'; with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True it fits: ...' for a training step the
    default allocator's holes stop and expandable segments would let run, else ''."""
    if fits(est.planned_bytes, budget_bytes, context_bytes, default_headroom(est.mode)) \
            or not fits_expandable(est, budget_bytes, context_bytes):
        return ""
    usable = usable_for_peak(budget_bytes, context_bytes, EXPANDABLE_TRAIN_RESERVE)
    return (f"; with {EXPANDABLE_SEGMENTS} it fits: that allocator gives the holes back, and the "
            f"{_size(est.peak_bytes, usable)} peak is within the {_size(usable, est.peak_bytes)} usable "
            f"after the context and a {EXPANDABLE_TRAIN_RESERVE:.0%} reserve")


@dataclass(frozen=True)
class ContextLimit:
    tokens: int | None  # None: the config states no limit
    source: str  # how it was derived, for the why-text


def context_limit(config: dict) -> ContextLimit:
    """The longest sequence the model takes: max_position_embeddings, scaled by its rope scaling
    where that extends it (linear, dynamic, yarn), as vLLM derives max_model_len. llama3 and
    longrope configs already state the extended length."""
    base = config.get("max_position_embeddings")
    if not isinstance(base, int) or isinstance(base, bool) or base < 1:
        return ContextLimit(None, "no max_position_embeddings in the config")
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    if isinstance(rope, dict):
        kind = str(rope.get("rope_type") or rope.get("type") or "default")
        factor = rope.get("factor")
        if kind not in ("default", "llama3", "longrope", "su") and isinstance(factor, (int, float)) and factor > 1:
            original = rope.get("original_max_position_embeddings") if kind == "yarn" else None
            start = original if isinstance(original, int) and original > 0 else base
            return ContextLimit(int(start * factor), f"max_position_embeddings with {kind} rope scaling x{factor:g}")
    return ContextLimit(base, "max_position_embeddings")


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
    limited_by: str | None = None  # "model" (its context limit), "memory", or None (does not fit)
    context_limit: int | None = None  # the model's own limit, when the config states one
    headroom: float | None = None
    # training: the same two limits with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the peak +
    # EXPANDABLE_TRAIN_RESERVE, budget.fits_expandable), None where not even that fits or not training
    max_seq_len_expandable: int | None = None
    max_batch_expandable: int | None = None
    # training: "replay" where the limits were found by replaying torch's caching allocator on traced
    # steps (harness.memory.replay.replay_limits; `replay` holds the traced settings), else "reserve rule"
    # (`replay` then says why not, when a replay was asked for)
    limits_from: str = "reserve rule"
    replay: dict | None = None
    # an unverified family's limits keep its uncertainty (families.UNVERIFIED_MARGIN) free: `verdict`
    # "tight" where something fits only inside it; max_seq_len_nominal is the limit without it
    verdict: str = "fits"
    uncertainty: float = 0.0
    max_seq_len_nominal: int | None = None

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


UNSTATED_LIMIT = 131072  # searched up to when a config states no context limit
TRAIN_MIN_SEQ = 16  # the shortest training context the search tries


def plan(shape: ModelShape, budget_bytes: int, train: bool = False, precisions=PRECISIONS,
         context_bytes: int = DEFAULT_CONTEXT_BYTES, headroom: float | None = None,
         max_seq_len: int | None = None, reference_seq_len: int = 2048, new_tokens: int = DEFAULT_NEW_TOKENS,
         max_batch: int = 256, lora_r: int = 16, grad_checkpointing: bool = True,
         lora_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS, optimizer: str = "adamw_torch",
         limit_source: str = "max_position_embeddings") -> list[PrecisionPlan]:
    """Per precision, the longest context (batch 1) and the largest batch (at reference_seq_len)
    whose predicted peak fits. `max_seq_len` is the model's own limit (context_limit()); the plan
    never goes past it and says when it, not memory, is what stops the context."""
    mode = "train" if train else "generate"
    headroom = default_headroom(mode) if headroom is None else headroom
    usable = budget_bytes - context_bytes
    if usable <= 0:
        raise UsageError(f"budget {format_bytes(budget_bytes)} leaves nothing after the CUDA context "
                         f"({format_bytes(context_bytes)})")
    limit = max_seq_len or UNSTATED_LIMIT
    need = lambda what, n: need_text(what, n, budget_bytes, context_bytes, headroom)  # noqa: E731
    ref = min(reference_seq_len, limit)
    from ..family.families import verification

    checked = verification(shape.family, mode, shape.source, shape.traits)
    uncertainty = checked["uncertainty"]
    plans = []
    for p in precisions:
        def est(seq: int, batch: int):
            if train:
                q = Query(p, "train", seq_len=seq, batch=batch, lora_r=lora_r, lora_targets=tuple(lora_targets),
                          grad_checkpointing=grad_checkpointing, optimizer=optimizer)
            else:  # context = prompt + generated tokens
                prompt = max(1, seq - new_tokens)
                q = Query(p, "generate", seq_len=prompt, batch=batch, new_tokens=seq - prompt)
            return estimate(shape, q)

        est = functools.lru_cache(maxsize=None)(est)  # the searches below ask again for the same steps

        def peak(seq: int, batch: int) -> int:  # the planned bytes: peak + fragmentation allowance
            return est(seq, batch).planned_bytes

        def kept_free(seq: int) -> str:
            return fragmentation_note(est(seq, 1))

        w = weight_bytes(shape, p)
        verdict = lambda s, b: fit_verdict(peak(s, b), budget_bytes, context_bytes, headroom, uncertainty)  # noqa: E731
        ok_seq = lambda s: verdict(s, 1) == "fits"  # noqa: E731
        ok_batch = lambda b: verdict(ref, b) == "fits"  # noqa: E731
        lo_seq = min(new_tokens + 1 if not train else TRAIN_MIN_SEQ, limit)
        best_seq = _largest(ok_seq, lo_seq, limit)
        best_batch = _largest(ok_batch, 1, max_batch)
        nominal = _largest(lambda s: verdict(s, 1) != "does not fit", lo_seq, limit) if uncertainty else best_seq
        common = dict(context_limit=max_seq_len, headroom=headroom, uncertainty=uncertainty, max_seq_len_nominal=nominal)
        if train:
            with_expandable = lambda s, b: fits(est(s, b).peak_bytes, budget_bytes, context_bytes,  # noqa: E731
                                                EXPANDABLE_TRAIN_RESERVE)
            common.update(max_seq_len_expandable=_largest(lambda s: with_expandable(s, 1), lo_seq, limit),
                          max_batch_expandable=_largest(lambda b: with_expandable(ref, b), 1, max_batch))
        if best_seq is None:
            tight = nominal is not None
            weights_fit = fits(w, budget_bytes, context_bytes, headroom)
            reason = _refusal(need, w, weights_fit, tight and tight_unverified_text(uncertainty, shape.family),
                              lo_seq, peak(lo_seq, 1) if weights_fit else 0)
            plans.append(PrecisionPlan(p, mode, False, w, None, None, ref, None, reason,
                                       verdict="tight" if tight else "does not fit", **common))
            continue
        at_max = peak(best_seq, 1)
        if best_seq >= limit:
            limited_by = "model"
            reason = (f"the model's limit, not memory, stops it ({limit_source}): " if max_seq_len else
                      f"fits up to the {limit}-token limit checked (the config states no max_position_embeddings): ")
            reason += need(f"{limit} tokens", at_max)
        else:
            limited_by = "memory"
            reason = need_text(f"{best_seq + 1} tokens", peak(best_seq + 1, 1), budget_bytes, context_bytes, headroom,
                               kept_free(best_seq + 1))
            if uncertainty and nominal and nominal > best_seq:
                reason += (f"; with the {uncertainty:.1%} an unverified family's estimate carries kept free"
                           f" (up to {nominal} tokens it fits only inside that margin: tight)").replace(".0%", "%")
        reason += f"; batch 1 at {ref} tokens does not fit" if best_batch is None else ""
        plans.append(PrecisionPlan(p, mode, True, w, best_seq, best_batch, ref, at_max, reason,
                                   limited_by=limited_by, **common))
    return plans


def _refusal(need, weights: int, weights_fit: bool, tight_text, lo_seq: int, lo_peak: int) -> str:
    """Why no context fits: the weights alone, an unverified family's margin (tight), or the shortest step."""
    if not weights_fit:
        return need("weights alone", weights)
    step = need(f"{lo_seq} tokens at batch 1", lo_peak)
    return f"{tight_text}: {step}" if tight_text else f"the weights fit ({_size(weights)}) but {step}"
