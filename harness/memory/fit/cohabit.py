"""Two models on one card (`plan --config A --config B --budget 6GiB`): can both stay resident
through a conversation, or must they be switched, and what a switch costs.

Both resident means: both models' weights, both conversations' KV caches at the conversation's
length, and the activations of the larger of the two steps (one model runs at a time, so only
one step's transient is live) fit the card, with the allocator reserve and one CUDA context (one
process holds both). With `train`, the first model trains (its LoRA/QLoRA step at that length)
while the second stays loaded and keeps its conversation.

A conversation grows by `turn_tokens` prompt tokens + `new_tokens` generated per turn; the plan
gives the longest context both conversations can reach and so the number of turns. A switch
frees one model and loads the other: its checkpoint is read from disk (bf16 safetensors unless a
model directory says otherwise) at `disk_gbps` and copied to the GPU at `h2d_gbps`, or from the
page cache at `h2d_gbps` alone when it was read recently. Quantizing on load (bitsandbytes) adds
time not counted here. The evicted model's conversation cache is lost: its next turn prefills the
whole context again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .budget import fits, usable_for_peak
from .estimate import Query, estimate
from .weights import kv_cache_bytes

DEFAULT_TURN_TOKENS = 256
DEFAULT_DISK_GBPS = 2.0  # an NVMe SSD read (harness.memory.fit.offload's default)
DEFAULT_H2D_GBPS = 8.0  # pageable host -> device over PCIe 4.0 (harness.memory.fit.offload's default)


@dataclass
class ModelOnCard:
    name: str
    precision: str
    role: str  # "serve" | "train"
    weights_bytes: int
    kv_bytes_per_token: float
    step_bytes: int  # the transient of its step at the conversation length (beyond weights and cache)
    checkpoint_bytes: int  # what a load reads from disk
    alone_fits: bool  # does it fit the card by itself at the conversation length

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class TwoModelPlan:
    budget_bytes: int
    context_bytes: int
    headroom: float
    seq_len: int  # the conversation length asked about
    turn_tokens: int  # tokens a turn adds (prompt + generated)
    models: list[ModelOnCard]
    both_resident: bool
    need_bytes: int  # both resident at seq_len
    usable_bytes: int
    max_context_tokens: int | None  # the longest both conversations reach while both stay resident
    max_turns: int | None
    larger_step: str
    context_limit: int | None = None  # the shorter of the two models' own limits
    switch: dict = field(default_factory=dict)
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def _checkpoint_bytes(spec, shape) -> int:
    """Bytes a load reads: a GGUF file's size, a directory's safetensors files, else a bf16
    checkpoint of the model."""
    path = Path(str(spec))
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.stat().st_size
    if path.is_dir():
        files = list(path.glob("*.safetensors"))
        if files:
            return sum(f.stat().st_size for f in files)
    return shape.total_params * 2


def model_on_card(name: str, spec, shape, precision: str, seq: int, role: str, query_kw: dict,
                  budget: int, context: int, headroom: float) -> ModelOnCard:
    weights = estimate(shape, Query(precision, "weights")).peak_bytes
    per_token = kv_cache_bytes(shape, precision, 1, seq) / seq
    if role == "train":
        est = estimate(shape, Query(precision, "train", seq_len=seq, **query_kw))
        step, kv = est.planned_bytes - weights, 0.0
    else:
        est = estimate(shape, Query(precision, "generate", seq_len=seq, new_tokens=query_kw.get("new_tokens", 64)))
        step = est.planned_bytes - weights - int(per_token * seq)
        kv = per_token
    return ModelOnCard(name, precision, role, weights, kv, max(0, step), _checkpoint_bytes(spec, shape),
                       fits(est.planned_bytes, budget, context, headroom))


def _need(models: list[ModelOnCard], seq: int, steps: list[int] | None = None) -> int:
    steps = steps or [m.step_bytes for m in models]
    return int(sum(m.weights_bytes + m.kv_bytes_per_token * seq for m in models) + max(steps))


def plan_two(specs: list, shapes: list, names: list[str], precisions: list[str], budget: int, context: int,
             headroom: float, seq_len: int, new_tokens: int = 64, turn_tokens: int = DEFAULT_TURN_TOKENS,
             train: bool = False, train_kw: dict | None = None, limit: int | None = None,
             disk_gbps: float = DEFAULT_DISK_GBPS, h2d_gbps: float = DEFAULT_H2D_GBPS) -> TwoModelPlan:
    roles = ["train", "serve"] if train else ["serve", "serve"]
    kw = [dict(train_kw or {}), {"new_tokens": new_tokens}] if train else [{"new_tokens": new_tokens}] * 2
    models = [model_on_card(n, sp, sh, p, seq_len, r, k, budget, context, headroom)
              for n, sp, sh, p, r, k in zip(names, specs, shapes, precisions, roles, kw)]
    usable = usable_for_peak(budget, context, headroom)
    need = _need(models, seq_len)
    both = fits(need, budget, context, headroom)
    larger = max(models, key=lambda m: m.step_bytes)
    per_turn = turn_tokens + new_tokens
    best = _longest_resident(models, budget, context, headroom, limit or 131072) if not train else None
    plan = TwoModelPlan(budget, context, headroom, seq_len, per_turn, models, both, need, usable, best,
                        best // per_turn if best else None, f"{larger.name} ({larger.role})", limit)
    plan.switch = switch_cost(models, disk_gbps, h2d_gbps)
    plan.reason = _reason(plan)
    return plan


def _longest_resident(models: list[ModelOnCard], budget: int, context: int, headroom: float, limit: int) -> int | None:
    """Longest conversation both hold, the step transient taken at the plan's length (it grows
    more slowly than the caches; past the asked length this errs on the generous side only by the
    activation growth, which the fit at the asked length already includes)."""
    ok = lambda n: fits(_need(models, n), budget, context, headroom)  # noqa: E731
    if not ok(1):
        return None
    lo, hi = 1, limit
    if ok(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def switch_cost(models: list[ModelOnCard], disk_gbps: float, h2d_gbps: float) -> dict:
    """Seconds to bring each model (back) onto the GPU."""
    out = {"disk_gbps": disk_gbps, "h2d_gbps": h2d_gbps, "per_model": []}
    for m in models:
        cold = m.checkpoint_bytes / (disk_gbps * 1e9) + m.weights_bytes / (h2d_gbps * 1e9)
        warm = m.checkpoint_bytes / (h2d_gbps * 1e9)
        out["per_model"].append({"name": m.name, "checkpoint_bytes": m.checkpoint_bytes,
                                 "load_s_from_disk": round(cold, 2), "load_s_from_page_cache": round(warm, 2)})
    out["note"] = ("estimated from the checkpoint size at the stated bandwidths; bitsandbytes quantizing on load "
                   "adds time; the evicted model's KV cache is lost and its next turn prefills the whole context")
    return out


def _reason(p: TwoModelPlan) -> str:
    gib = lambda n: f"{n / 2**30:.2f} GiB"  # noqa: E731
    parts = " + ".join(f"{m.name} {m.precision} weights {gib(m.weights_bytes)}" for m in p.models)
    kv = " + ".join(f"{m.kv_bytes_per_token * p.seq_len / 2**20:.0f} MiB" for m in p.models if m.kv_bytes_per_token)
    head = (f"{parts}{' + KV caches ' + kv if kv else ''} at {p.seq_len} tokens + the larger step "
            f"({p.larger_step}) = {gib(p.need_bytes)}; {gib(p.usable_bytes)} usable")
    if p.both_resident:
        capped = p.context_limit is not None and p.max_context_tokens == p.context_limit
        turns = (f"; both conversations reach {p.max_context_tokens} tokens ({p.max_turns} turns of "
                 f"{p.turn_tokens} tokens) " + ("- the models' own context limit, not memory, ends them" if capped
                                                 else "before one must be switched out")) if p.max_context_tokens else ""
        return "both stay resident: " + head + turns
    alone = [m.name for m in p.models if m.alone_fits]
    if len(alone) < len(p.models):
        missing = [m.name for m in p.models if not m.alone_fits]
        return f"switching cannot help: {', '.join(missing)} does not fit even alone; " + head
    costs = ", ".join(f"{c['name']} {c['load_s_from_disk']:.1f} s from disk / {c['load_s_from_page_cache']:.1f} s "
                      f"from the page cache" for c in p.switch["per_model"])
    return f"must be switched: {head}; each fits alone; a switch loads {costs}"
