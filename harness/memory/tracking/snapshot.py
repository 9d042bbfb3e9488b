"""Where the memory of one step went, from torch's own allocator history.

    with SnapshotRecorder("cuda:0") as rec:      # torch.cuda.memory._record_memory_history
        ... load, wrap, train or generate ...
    summary = summarise(rec.snapshot, logits_ranges(model_type), window="optimizer_steps")

`summarise` replays the allocator's trace (alloc / free events with the Python stack of each
allocation) and names every allocation by what made it (CATEGORIES), then reports the live bytes
per category at the moment the step's allocated total peaked, and the same totals at evenly spaced
points of the step's timeline. The summary is a small JSON object (no raw pickle, no stacks), so
CPU tests can recompute a predicted-against-measured comparison from committed files.

How an allocation is named (first rule that matches; frames are innermost first):
- no Python frames, or torch/autograd frames: the backward pass (gradients and their
  temporaries: CUDA backward runs on autograd's device thread, which has no Python stack);
- torch/optim or bitsandbytes/optim: optimizer states (and the step's temporaries);
- a get_peft_model frame: LoRA weights; prepare_model_for_kbit_training / from_pretrained /
  transformers' core_model_loading (its loader threads): weights (quantization state included:
  bitsandbytes allocates packed weights and absmax together);
- transformers' loss_utils, or an innermost modeling frame on the CausalLM forward's own lines
  (lm_head, the fp32 upcast, final-logit soft-capping), or generation/utils.py: logits / loss;
- transformers' cache_utils.py: the KV cache;
- anything else under the model's forward (checkpoint recomputation included): activations.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Iterable

CATEGORIES = ("weights", "lora_weights", "optimizer", "activations", "logits_loss", "kv_cache", "backward", "other")
FREE_ACTIONS = ("free_requested", "free_completed")
TIMELINE_POINTS = 80


@dataclass(frozen=True)
class LineRange:
    """Lines `first`..`last` of a file whose name ends with `file_suffix` (a forward method)."""

    file_suffix: str
    first: int
    last: int

    def holds(self, frame: dict) -> bool:
        return str(frame.get("filename", "")).endswith(self.file_suffix) and self.first <= int(frame.get("line", 0)) <= self.last


def logits_ranges(model_type: str) -> list[LineRange]:
    """The source lines of the CausalLM forward of a transformers family (imports transformers)."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    cls = getattr(transformers, name, None) if name else None
    if cls is None:
        return []
    fn = inspect.unwrap(cls.forward)
    lines, first = inspect.getsourcelines(fn)
    path = inspect.getsourcefile(fn) or ""
    return [LineRange("/".join(path.split("/")[-3:]), first, first + len(lines) - 1)]


def _has(frames: list[dict], needle: str, key: str = "filename") -> bool:
    return any(needle in str(f.get(key, "")) for f in frames)


def category(frames: list[dict], ranges: Iterable[LineRange] = ()) -> str:
    """What made an allocation, from its Python stack (innermost frame first)."""
    if not frames:
        return "backward"
    names = {str(f.get("name", "")) for f in frames}
    if _has(frames, "torch/optim/") or _has(frames, "bitsandbytes/optim"):
        return "optimizer"
    if "get_peft_model" in names:
        return "lora_weights"
    # transformers 5 materialises unquantized checkpoints in a thread pool (core_model_loading.py):
    # those allocations carry no from_pretrained frame
    if names & {"prepare_model_for_kbit_training", "from_pretrained", "load_model"} or _has(frames, "core_model_loading.py"):
        return "weights"
    inner = next((f for f in frames if "modeling_" in str(f.get("filename", ""))), None)
    if _has(frames, "loss_utils.py") or (inner is not None and any(r.holds(inner) for r in ranges)):
        return "logits_loss"
    if _has(frames, "cache_utils.py"):
        return "kv_cache"
    if _has(frames, "torch/autograd/") and not _has(frames, "checkpoint.py"):
        return "backward"
    if _has(frames, "generation/utils.py") and not _has(frames, "modeling_"):
        return "logits_loss"
    if _has(frames, "modeling_") or _has(frames, "peft/") or _has(frames, "torch/nn/") or _has(frames, "checkpoint.py"):
        return "activations"
    return "other"


def _trace(snapshot: dict, device: int) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    return list(traces[device]) if device < len(traces) else []


def summarise(snapshot: dict, ranges: Iterable[LineRange] = (), window: str | None = None,
              device: int = 0, points: int = TIMELINE_POINTS) -> dict[str, Any]:
    """Live bytes per category at the allocated peak of the window (the events from the first
    allocation whose stack holds a frame named `window` on; the whole trace without one), and a
    timeline of `points` samples over that window."""
    ranges = list(ranges)
    events = _trace(snapshot, device)
    live: dict[int, tuple[int, str]] = {}
    totals = dict.fromkeys(CATEGORIES, 0)
    start = None
    if window is not None:
        start = next((i for i, e in enumerate(events) if e.get("action") == "alloc"
                      and any(f.get("name") == window for f in e.get("frames") or [])), None)
    start = 0 if start is None else start
    stride = max(1, (len(events) - start) // max(1, points))
    peak_total, peak_at, peak_cats = -1, None, dict(totals)
    timeline, allocs, unknown_frees = [], 0, 0
    for i, e in enumerate(events):
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            cat = category(e.get("frames") or [], ranges)
            live[addr] = (int(e.get("size", 0)), cat)
            totals[cat] += int(e.get("size", 0))
            allocs += 1
        elif action in FREE_ACTIONS:
            if addr in live:
                size, cat = live.pop(addr)
                totals[cat] -= size
            elif action == "free_requested":
                unknown_frees += 1
        if i < start:
            continue
        total = sum(totals.values())
        if total > peak_total:
            peak_total, peak_at, peak_cats = total, i, dict(totals)
        if (i - start) % stride == 0:
            timeline.append({"event": i, "total": total, **{c: v for c, v in totals.items() if v}})
    at_peak = _live_at(events, peak_at) if peak_at is not None else []
    return {"events": len(events), "allocations": allocs, "window_start": start, "peak_event": peak_at,
            "peak_bytes": max(peak_total, 0), "peak_by_category": {c: v for c, v in peak_cats.items() if v},
            "peak_blocks": peak_blocks(events, at_peak, ranges), "peak_groups": peak_groups(events, at_peak, ranges),
            "unmatched_frees": unknown_frees, "timeline": timeline,
            "first_event_is_alloc": bool(events) and events[0].get("action") == "alloc"}


PEAK_BLOCKS = 40


def _where(frames: list[dict]) -> str:
    """The innermost frame outside torch's own Python (where the model's code made it)."""
    for f in frames:
        name = str(f.get("filename", ""))
        if not (name.startswith("torch/") or "/torch/" in name):
            return f"{'/'.join(name.split('/')[-2:])}:{f.get('line')} {f.get('name')}"
    return ""


def _live_at(events: list[dict], at: int) -> list[int]:
    """The indices of the allocation events still live at event `at` (the trace replayed up to it)."""
    live: dict[int, int] = {}
    for i, e in enumerate(events[:at + 1]):
        if e.get("action") == "alloc":
            live[e.get("addr")] = i
        elif e.get("action") in FREE_ACTIONS:
            live.pop(e.get("addr"), None)
    return list(live.values())


def peak_blocks(events: list[dict], live: list[int], ranges: Iterable[LineRange] = (), n: int = PEAK_BLOCKS) -> list[dict]:
    """The `n` largest of the allocations `live` at the peak (_live_at): size, category and the
    code that made each - what a model of the peak must account for."""
    largest = sorted(live, key=lambda i: -int(events[i].get("size", 0)))[:n]
    return [{"size": int(events[i].get("size", 0)), "category": category(events[i].get("frames") or [], ranges),
             "where": _where(events[i].get("frames") or []), "event": i} for i in largest]


PEAK_GROUPS = 80


def _stack(frames: list[dict], depth: int = 8) -> str:
    """The innermost `depth` frames' function names, torch's included (a recompute shows as such)."""
    return " < ".join(str(f.get("name")) for f in frames[:depth])


def peak_groups(events: list[dict], live: list[int], ranges: Iterable[LineRange] = (), n: int = PEAK_GROUPS) -> list[dict]:
    """Every allocation `live` at the peak (_live_at) but the weights', grouped by category, size and
    the stack that made it (count and bytes): the whole of what the peak holds beyond the model,
    where peak_blocks names only the largest blocks."""
    groups: dict[tuple, dict] = {}
    for i in live:
        frames = events[i].get("frames") or []
        cat = category(frames, ranges)
        if cat == "weights":
            continue
        key = (cat, int(events[i].get("size", 0)), _where(frames), _stack(frames))
        g = groups.setdefault(key, dict(zip(("category", "size", "where", "stack"), key), count=0, first_event=i))
        g["count"] += 1
        g["first_event"] = min(g["first_event"], i)
    return sorted(groups.values(), key=lambda g: -g["size"] * g["count"])[:n]


class SnapshotRecorder:
    """Records the allocator's history over a block; `snapshot` holds torch's snapshot dict after
    it (None on CPU-only torch). `max_entries` bounds the ring buffer: a summary whose trace lost
    its beginning says so (first_event_is_alloc / unmatched_frees)."""

    def __init__(self, device: str = "cuda:0", max_entries: int = 1_500_000):
        self.device, self.max_entries = device, max_entries
        self.snapshot: dict | None = None
        self.error: str | None = None  # why no snapshot was taken (the measured block still counts)
        self._on = False

    def __enter__(self) -> "SnapshotRecorder":
        import torch

        if self.device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.init()  # the allocator must exist before its history is recorded
            try:
                torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                         max_entries=self.max_entries)
                self._on = True
            except Exception as err:  # noqa: BLE001 - measure the case anyway, without its history
                self.error = f"recording: {type(err).__name__}: {err}"[:300]
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        import torch

        if self._on:
            try:
                self.snapshot = torch.cuda.memory._snapshot()
            except Exception as err:  # noqa: BLE001 - the case's own figures must survive
                self.error = f"{type(err).__name__}: {err}"[:300]
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
        return False
