"""What stops a training run from fitting a card, and which single change helps most, with the
figure for each (`plan --train`).

Each change is estimated the same way as the run itself (estimate.estimate), except the chunked
loss, which the estimator does not run: it keeps the logits/loss share of CHUNK_TOKENS tokens
instead of the whole batch's (what Liger's fused linear cross-entropy or a chunked lm_head + loss
loop materialise), everything else unchanged.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from .budget import EXPANDABLE_SEGMENTS, EXPANDABLE_TRAIN_RESERVE, fits, usable_for_peak
from .estimate import Query, estimate
from .picture import parts

CHUNK_TOKENS = 1024
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
FUSED_ATTENTION_TARGETS = ("qkv_proj", "o_proj")
SMALL_RANK = 8
MIN_SEQ = 16


@dataclass
class Change:
    change: str
    planned_bytes: int
    saves_bytes: int
    fits: bool
    detail: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TrainAdvice:
    seq_len: int
    batch: int
    planned_bytes: int
    usable_bytes: int
    fits: bool
    stopped_by: list[dict] = field(default_factory=list)  # the largest parts at the peak
    changes: list[Change] = field(default_factory=list)  # most helpful first
    best: str | None = None  # the change that helps most and fits alone, if one does

    def as_dict(self) -> dict:
        return asdict(self)


def _planned(shape, q: Query) -> int:
    return estimate(shape, q).planned_bytes


def _attention_targets(shape) -> tuple[str, ...]:
    kinds = {g.kind for g in shape.linears}
    return FUSED_ATTENTION_TARGETS if "qkv_proj" in kinds else ATTENTION_TARGETS


def _longest_fitting(shape, q: Query, ok) -> int | None:
    lo, hi = MIN_SEQ, q.seq_len - 1
    if hi < lo or not ok(_planned(shape, replace(q, seq_len=lo))):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(_planned(shape, replace(q, seq_len=mid))):
            lo = mid
        else:
            hi = mid
    return hi if ok(_planned(shape, replace(q, seq_len=hi))) else lo


def candidate_changes(shape, q: Query, ok, headroom: float, replayed_longest: int | None = None) -> list[Change]:
    """Every single change that applies to this run, with its planned bytes (what the default
    allocator's `headroom` multiplies). replayed_longest: the longest context at this batch that
    fits replayed on the allocator (plan's replayed limit), taken over the estimate's."""
    est = estimate(shape, q)
    base = est.planned_bytes
    out: list[Change] = []

    def add(name: str, planned: int, detail: str = "", fit: bool | None = None) -> None:
        out.append(Change(name, planned, base - planned, ok(planned) if fit is None else fit, detail))

    if replayed_longest is None:
        seq, how = _longest_fitting(shape, q, ok), ""
    else:
        seq, how = min(replayed_longest, q.seq_len - 1), (", replayed on torch's caching allocator (the figure "
                                                          "is the reserve rule's, which the replay overrules)")
    if seq is not None and seq >= MIN_SEQ:
        add(f"shorter context: {seq} tokens", _planned(shape, replace(q, seq_len=seq)),
            f"the longest that fits at batch {q.batch}{how}", True)
    elif q.seq_len > MIN_SEQ:
        add(f"shorter context: {MIN_SEQ} tokens", _planned(shape, replace(q, seq_len=MIN_SEQ)),
            f"even the shortest context does not fit{how}", False)
    attention = _attention_targets(shape)
    if tuple(q.lora_targets) != attention:
        add(f"fewer LoRA targets: {','.join(attention)}", _planned(shape, replace(q, lora_targets=attention)))
    loss = est.breakdown.get("loss_logits", 0)
    tokens = q.batch * q.seq_len
    if loss and tokens > CHUNK_TOKENS:
        kept = int(loss * CHUNK_TOKENS / tokens)
        add(f"chunked loss ({CHUNK_TOKENS}-token chunks)", base - loss + kept,
            f"logits/loss {loss / 2**30:.2f} GiB -> {kept / 2**30:.2f} GiB (e.g. Liger's fused linear cross-entropy)")
    if q.batch > 1:
        add(f"smaller batch: {q.batch // 2}", _planned(shape, replace(q, batch=q.batch // 2)))
    if not q.grad_checkpointing:
        add("gradient checkpointing on", _planned(shape, replace(q, grad_checkpointing=True)))
    if q.lora_r > SMALL_RANK:
        add(f"LoRA rank {SMALL_RANK}", _planned(shape, replace(q, lora_r=SMALL_RANK)))
    if est.fragmentation_bytes:  # the same run, its peak + EXPANDABLE_TRAIN_RESERVE in the same units
        add(EXPANDABLE_SEGMENTS, int(est.peak_bytes * (1 + EXPANDABLE_TRAIN_RESERVE) / (1 + headroom)),
            f"the allocator gives its holes back: the peak + {EXPANDABLE_TRAIN_RESERVE:.0%}, nothing else changes")
    out.sort(key=lambda c: (c.planned_bytes, c.change))
    return out


def train_advice(shape, q: Query, budget_bytes: int, context_bytes: int, headroom: float,
                 replayed_longest: int | None = None, uncertainty: float = 0.0) -> TrainAdvice:
    """What the run `q` needs against the card, the parts that stop it, and the changes.
    replayed_longest: plan's replayed context limit at q.batch, which then decides whether q fits
    and how short its context must be (the other changes stay estimated)."""
    # an unverified family's uncertainty kept free, as plan's limits keep it (budget.fit_verdict)
    ok = lambda planned: fits(planned * (1 + uncertainty), budget_bytes, context_bytes, headroom)  # noqa: E731
    est = estimate(shape, q)
    peak_parts = [p for p in parts(est, shape, 0) if p.component not in ("allocator reserve", "CUDA context")]
    top = sorted(peak_parts, key=lambda p: -p.bytes)[:3]
    advice = TrainAdvice(q.seq_len, q.batch, est.planned_bytes, usable_for_peak(budget_bytes, context_bytes, headroom),
                         ok(est.planned_bytes) if replayed_longest is None else q.seq_len <= replayed_longest,
                         [{"component": p.component, "bytes": p.bytes, "share": round(p.bytes / max(est.peak_bytes, 1), 3)}
                          for p in top])
    if advice.fits:
        return advice
    advice.changes = candidate_changes(shape, q, ok, headroom, replayed_longest)
    fitting = [c for c in advice.changes if c.fits]
    # the change that keeps most of the run: a fitting change other than cutting the context, if any
    keep = [c for c in fitting if not c.change.startswith("shorter context")] or fitting
    advice.best = max(keep, key=lambda c: c.saves_bytes).change if keep else None
    return advice


def advice_lines(a: TrainAdvice) -> list[str]:
    gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    head = f"  at {a.seq_len} tokens x {a.batch}: needs {gib(a.planned_bytes)}, {gib(a.usable_bytes)} usable"
    if a.fits:
        return [head + " - fits"]
    lines = [head + "; stopped by " + ", ".join(f"{s['component']} {gib(s['bytes'])} ({s['share']:.0%})"
                                                 for s in a.stopped_by)]
    for c in a.changes:
        lines.append(f"    {'fits' if c.fits else 'no  '}  {c.change:42s} {gib(c.planned_bytes):>10s} "
                     f"(saves {gib(c.saves_bytes)}){'  ' + c.detail if c.detail else ''}")
    lines.append(f"    helps most: {a.best}" if a.best else "    no single change fits it: combine them, or a larger card")
    return lines
