"""Reading families runs back (benchmarks/vram/families.py's output; the committed runs are packed
under the repository's measurements/vram/families/, whose reader passes their directories in):
per family, the estimator's error on inference and on training (checkpointing on and off apart),
`plan --train`'s verdicts against real OOM under the emulated 6 GiB card, and the memory picture
of the snapshot cases, predicted beside measured, part by part.

Everything is recomputed from the committed rows with the estimator as it is now, so a change to
the estimator shows up here without a GPU.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .train_matrix import agreement, false_fits

# never used to fit a coefficient (benchmarks/vram/families.py FIT_EXCLUDED); phi-4-mini's training
# error without checkpointing led to one structural correction read from torch's SDPA code (the fused
# qkv is not kept alive when K/V are repeated, train_transient.saved_activations), so that figure is not blind
HELD_OUT = ("qwen3-1.7b", "phi-4-mini", "mistral-7b-v0.3", "qwen3-30b-a3b")
OFFLOAD_CPU_BYTES = 100 * 2**30  # the CPU max_memory harness.memory.measured.moe_case planned with
# measured snapshot category -> the predicted picture parts it is compared with
TRAIN_GROUPS = {"weights": ("weights", "quantization state"), "LoRA weights": ("LoRA weights",),
                "optimizer states": ("optimizer states", "optimizer step temporaries"),
                "logits/loss": ("logits/loss",),
                "activations and gradients": ("activations kept for backward", "gradients")}
TRAIN_MEASURED = {"weights": ("weights",), "LoRA weights": ("lora_weights",), "optimizer states": ("optimizer",),
                  "logits/loss": ("logits_loss",), "activations and gradients": ("activations", "backward", "other")}
GEN_GROUPS = {"weights": ("weights", "quantization state"), "KV cache": ("KV cache",),
              "activations": ("activations", "attention scores"), "logits/loss": ("logits/loss",)}
GEN_MEASURED = {"weights": ("weights",), "KV cache": ("kv_cache",), "activations": ("activations", "other", "backward"),
                "logits/loss": ("logits_loss",)}


def row_files(directory: Path | Sequence[Path]) -> list[Path]:
    """A run's row files: DIR/rows/*.json, or DIR/<run>/rows/*.json when the packed output
    (families-out/...) was unpacked as it is; for several runs, theirs in order."""
    if not isinstance(directory, (str, Path)):
        return [p for d in directory for p in row_files(Path(d))]
    directory = Path(directory)
    dirs = [directory / "rows"] + sorted(directory.glob("*/rows"))
    return sorted(p for d in dirs if d.is_dir() for p in d.glob("*.json"))


def load_rows(directory: Path | Sequence[Path]) -> dict[str, list[dict]]:
    """{"train": [...], "infer": [...], "snapshot": [...], "offload": [...], "failed": [...]} from
    the run's row files, each row stamped with the transformers version it ran under (the
    attention it picked)."""
    out: dict[str, list[dict]] = {"train": [], "infer": [], "snapshot": [], "offload": [], "failed": []}
    for path in row_files(directory):
        data = json.loads(path.read_text())
        version = run_transformers(path, data)
        if version:
            data = dict(data, transformers=version)
            if data.get("rows"):
                data["rows"] = [dict(r, transformers=version) for r in data["rows"]]
        if data.get("kind") == "infer":
            rows = data.get("rows")
            if data.get("error"):
                out["failed"].append(data)
            if rows is None:  # the worker was killed: the rows it had written as it went
                rows = [r for f in sorted(path.with_suffix(".d").glob("rows-*.json"))
                        for r in json.loads(f.read_text()).get("rows", [])]
            out["infer"] += [r for r in rows if not r.get("error") and r.get("peak_bytes")]
        elif data.get("kind") == "offload" and not data.get("error") and data.get("plan"):
            out["offload"].append(data)
        elif data.get("snapshot"):
            out["snapshot"].append(data)
            bare = {k: v for k, v in data.items() if k != "snapshot"}
            out["train" if data.get("mode") == "train" else "infer"].append(bare)
        elif data.get("error") or data.get("kind"):
            out["failed"].append(data)
        else:
            out["train"].append(data)
    return out


def run_transformers(path: Path, data: dict) -> str | None:
    """The transformers version of a row file: its own environment, else the run's environment.json."""
    env = data.get("environment") or {}
    if env.get("transformers"):
        return str(env["transformers"])
    for candidate in (path.parent.parent / "environment.json", path.parent.parent.parent / "environment.json"):
        if candidate.is_file():
            return json.loads(candidate.read_text()).get("transformers")
    return None


@dataclass
class ErrorStats:
    n: int
    median: float
    worst: float
    worst_under: float  # the most negative error (prediction below the measurement), 0 if none

    @classmethod
    def of(cls, errors: list[float]) -> "ErrorStats | None":
        if not errors:
            return None
        return cls(len(errors), statistics.median(abs(e) for e in errors), max(abs(e) for e in errors),
                   min(0.0, min(errors)))

    def as_dict(self) -> dict:
        return {"n": self.n, "median": self.median, "worst": self.worst, "worst_under": self.worst_under}


@dataclass
class FamilySummary:
    inference: dict[str, ErrorStats | None] = field(default_factory=dict)  # arch -> stats
    train_gc: dict[str, ErrorStats | None] = field(default_factory=dict)
    train_nogc: dict[str, ErrorStats | None] = field(default_factory=dict)
    boundary: list[dict] = field(default_factory=list)
    boundary_expandable: list[dict] = field(default_factory=list)  # the verdict with expandable segments
    pictures: list[dict] = field(default_factory=list)
    offload: list[dict] = field(default_factory=list)  # offload_comparison per offloaded run
    failed: int = 0

    def boundary_of(self, arch: str) -> list[dict]:
        return [r for r in self.boundary if r["arch"] == arch]

    def agreement_of(self, arch: str) -> float:
        return agreement(self.boundary_of(arch))

    @property
    def agreement(self) -> float:
        return agreement(self.boundary)

    @property
    def false_fits(self) -> list[dict]:
        return false_fits(self.boundary)


def evaluate_families(directory: Path | Sequence[Path]) -> FamilySummary:
    from .matrix_readback import evaluate
    from .train_matrix import evaluate_training

    rows = load_rows(directory)
    out = FamilySummary(failed=len(rows["failed"]))
    infer = evaluate(rows["infer"]).rows if rows["infer"] else []
    for arch in sorted({r["arch"] for r in infer}):
        out.inference[arch] = ErrorStats.of([r["error"] for r in infer if r["arch"] == arch])
    train = evaluate_training([r for r in rows["train"] if not r.get("error")])
    for arch in sorted({r["arch"] for r in train.rows}):
        for gc, target in ((True, out.train_gc), (False, out.train_nogc)):
            target[arch] = ErrorStats.of([r["error"] for r in train.rows if r["arch"] == arch and r["grad_checkpointing"] is gc])
    out.boundary = train.boundary
    out.boundary_expandable = train.boundary_expandable
    out.pictures = [picture_comparison(r) for r in rows["snapshot"] if (r.get("snapshot") or {}).get("peak_by_category")]
    out.offload = [offload_comparison(r) for r in rows["offload"]]
    return out


def offload_comparison(row: dict) -> dict[str, Any]:
    """One real offloaded run (harness.memory.measured.moe_case) against `plan --offload` recomputed now
    with the bandwidths and CUDA context measured in that run: the GPU bytes the plan leaves
    there (the weights it keeps on the GPU + the runtime bytes of the context + the largest
    offloaded layer, which the hooks copy in for its forward), its decode time per token, and
    the budget promise (the plan said the placement runs within the card)."""
    from ..fit.offload import Bandwidths, plan_offload

    bw = row.get("bandwidths") or {}
    bands = Bandwidths(h2d_gbps=bw.get("h2d_gbps") or 8.0, device_gbps=bw.get("device_gbps") or 300.0,
                       layer_ms=bw.get("layer_ms") or 1.8, h2d_source="measured in the run")
    seq = row["prompt_len"] + row["new_tokens"]
    plan = plan_offload(row["arch"], row["budget_bytes"], row.get("precision", "bf16"),
                        context_bytes=row.get("context_bytes"), seq_len=seq, new_tokens=row["new_tokens"],
                        cpu_memory_bytes=OFFLOAD_CPU_BYTES, bandwidths=bands)
    layer = row.get("largest_layer_bytes", 0) if plan.offloaded else 0
    predicted_gpu = plan.bytes_on_gpu + plan.runtime_bytes + layer
    measured_gpu = row.get("decode_peak_bytes")
    ms, pred_ms = row.get("decode_ms_per_token"), plan.predicted_decode_ms
    return {"arch": row["arch"], "budget_bytes": row["budget_bytes"], "oom": bool(row.get("oom")),
            "layers_on": plan.layers_on, "run_layers_on": (row.get("plan") or {}).get("layers_on"),
            "bytes_on_gpu": plan.bytes_on_gpu, "bytes_on_cpu": plan.bytes_on_cpu,
            "predicted_gpu_peak": predicted_gpu, "measured_gpu_peak": measured_gpu,
            "gpu_error": (predicted_gpu - measured_gpu) / measured_gpu if measured_gpu else None,
            "within_budget": bool(measured_gpu) and measured_gpu + (row.get("context_bytes") or 0) <= row["budget_bytes"],
            "predicted_ms": pred_ms, "measured_ms": ms, "ms_error": (pred_ms - ms) / ms if ms else None,
            "predicted_ms_consumer_card": (row.get("plan_default_bandwidths") or {}).get("predicted_decode_ms"),
            "h2d_gbps": bands.h2d_gbps}


def picture_comparison(row: dict) -> dict[str, Any]:
    """One snapshot case: the predicted parts and the measured categories, grouped alike."""
    from ..fit.estimate import estimate
    from ..family.families import at_transformers
    from .matrix_readback import row_query
    from ..fit.picture import parts
    from ..fit.shape import model_shape

    shape = at_transformers(model_shape(row["arch"]), row.get("transformers"))
    q = row_query(dict(row, new_tokens=row.get("new_tokens") or 0))
    est = estimate(shape, q)
    predicted = {p.component: p.bytes for p in parts(est, shape, 0)}
    measured = row["snapshot"]["peak_by_category"]
    if row.get("mode") == "train":
        measured = logits_gradients_to_loss(measured, row["batch"] * row["seq_len"] * shape.vocab * 4)
    groups, mgroups = (TRAIN_GROUPS, TRAIN_MEASURED) if row.get("mode") == "train" else (GEN_GROUPS, GEN_MEASURED)
    comparison = []
    for name, keys in groups.items():
        comparison.append({"component": name, "predicted": sum(predicted.get(k, 0) for k in keys),
                           "measured": sum(measured.get(k, 0) for k in mgroups[name])})
    return {"arch": row["arch"], "mode": row.get("mode"), "precision": row["precision"], "seq_len": row["seq_len"],
            "batch": row["batch"], "predicted_peak": est.peak_bytes, "measured_peak": row.get("peak_bytes"),
            "snapshot_peak": row["snapshot"]["peak_bytes"], "components": comparison,
            "timeline": row["snapshot"].get("timeline", [])}


def logits_gradients_to_loss(measured: dict[str, int], logits_bytes: int) -> dict[str, int]:
    """The snapshot names by stack: backward allocations carry no Python frames, so the gradients
    of the fp32 logits (batch x seq x vocab x 4 bytes each, live at the loss's backward peak) land
    in "backward", while the estimate counts them with the loss (its logits/loss part is every
    logits-sized tensor of that phase). Move the whole logits gradients within the backward total
    there, so both sides mean the same by logits/loss; what remains is the other gradients."""
    back = measured.get("backward", 0)
    moved = (back // logits_bytes) * logits_bytes if logits_bytes > 0 else 0
    if not moved:
        return dict(measured)
    return dict(measured, backward=back - moved, logits_loss=measured.get("logits_loss", 0) + moved)


def placement_text(layers_on: dict | None) -> str:
    """{'gpu': 2, 'cpu': 46, 'disk': 0} -> '2 on GPU, 46 on CPU, 0 on disk' (a report line, not a repr)."""
    names = {"gpu": "GPU", "cpu": "CPU"}
    return ", ".join(f"{n} on {names.get(k, k)}" for k, n in (layers_on or {}).items()) or "not recorded"


def summary_lines(s: FamilySummary) -> list[str]:
    """The must-show figures, one line each (benchmarks/vram/families_report.py prints them)."""
    pct = lambda v: f"{100 * v:.1f}%"  # noqa: E731
    lines = []
    for title, table in (("inference", s.inference), ("training, checkpointing on", s.train_gc),
                         ("training, checkpointing off", s.train_nogc)):
        for arch, st in table.items():
            if st:
                held = " (held out)" if arch in HELD_OUT else ""
                lines.append(f"{title:28s} {arch:14s}{held:11s} n={st.n:3d} median {pct(st.median):>6s} "
                             f"worst {pct(st.worst):>6s} worst under {pct(st.worst_under):>7s}")
    if s.boundary:
        lines.append(f"plan --train vs real OOM under 6 GiB: {len(s.boundary)} cases, agreement {pct(s.agreement)}, "
                     f"{len(s.false_fits)} predicted fits that ran out")
        for arch in sorted({r["arch"] for r in s.boundary}):
            false = len(false_fits(s.boundary_of(arch)))
            lines.append(f"    {arch:16s} {len(s.boundary_of(arch)):3d} cases, agreement {pct(s.agreement_of(arch))}, "
                         f"{false} predicted fits that ran out")
    if s.boundary_expandable:
        b = s.boundary_expandable
        lines.append(f"the same with expandable segments: {len(b)} cases, agreement {pct(agreement(b))}, "
                     f"{len(false_fits(b))} predicted fits that ran out")
    for o in s.offload:
        gib = lambda v: f"{(v or 0) / 2**30:.2f} GiB"  # noqa: E731
        lines.append(f"plan --offload {o['arch']} under {gib(o['budget_bytes'])}: layers: {placement_text(o['layers_on'])}; "
                     f"{'ran out of memory' if o['oom'] else 'no OOM'}, "
                     f"GPU peak predicted {gib(o['predicted_gpu_peak'])} measured {gib(o['measured_gpu_peak'])}, "
                     f"{o['predicted_ms']:.0f} ms/token predicted (h2d {o['h2d_gbps']:.1f} GB/s) vs "
                     f"{o['measured_ms'] or float('nan'):.0f} measured")
    for p in s.pictures:
        lines.append(f"picture {p['arch']} {p['precision']} {p['mode']} {p['seq_len']}x{p['batch']}: predicted peak "
                     f"{p['predicted_peak'] / 2**30:.2f} GiB, measured {(p['measured_peak'] or 0) / 2**30:.2f} GiB")
        for c in p["components"]:
            lines.append(f"    {c['component']:28s} predicted {c['predicted'] / 2**30:6.2f} GiB  measured "
                         f"{c['measured'] / 2**30:6.2f} GiB")
    return lines
