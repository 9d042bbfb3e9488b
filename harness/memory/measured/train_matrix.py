"""One LoRA/QLoRA training case the way users run it, in a fresh process, measured.

    python -m harness.memory.measured.train_matrix --case '{"arch": ..., ...}' --model-dir DIR --out ROW.json

The protocol (issue 13): from_pretrained at the precision -> prepare_model_for_kbit_training(
use_gradient_checkpointing=...) for a quantized base, or gradient_checkpointing_enable() +
enable_input_require_grads() for a bf16 base -> get_peft_model(LoRA r, alpha 2r, dropout 0.05, the
targets) -> model.train() -> the optimizer's steps on random token ids (labels = input ids). The
allocator peak is measured over the steps only (loading is its own figure). With `budget_bytes` the
allocator is capped first at budget - this process's CUDA context, as on a card of that size, and
the row says whether it ran out of memory (and in which phase) instead of measuring a peak.

One process per case because state left by an earlier case (a wrapped or unwrapped model, the
checkpointing flag, cuBLAS workspaces, the allocator's segments) changes the next case's peak.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ... import atomic
from .matrix_readback import load_matrix
from .matrix_train import optimizer_steps

TARGET_SETS = {"attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "all": ("all-linear",)}
# Sets only some families have, kept out of TARGET_SETS (the seeded case draws iterate it):
# phi-3's attention is qkv_proj + o_proj.
FAMILY_TARGET_SETS = {**TARGET_SETS, "attn-fused": ("qkv_proj", "o_proj")}
STEPS = 3


@dataclass(frozen=True)
class TrainCase:
    arch: str
    precision: str  # bf16 or a bitsandbytes precision (nf4-dq, ...)
    targets: str  # a key of FAMILY_TARGET_SETS
    lora_r: int
    grad_checkpointing: bool
    batch: int
    seq_len: int
    optimizer: str  # harness.memory.fit.lora.OPTIMIZERS
    budget_bytes: int | None = None  # cap the allocator like a card of this size
    role: str = "matrix"  # matrix | boundary
    steps: int = STEPS

    @property
    def key(self) -> str:
        return "|".join(str(v) for v in asdict(self).values())

    def query(self):
        from ..fit.estimate import Query

        return Query(self.precision, "train", seq_len=self.seq_len, batch=self.batch, lora_r=self.lora_r,
                     lora_targets=FAMILY_TARGET_SETS[self.targets], grad_checkpointing=self.grad_checkpointing,
                     optimizer=self.optimizer)


def predicted_bytes(case: TrainCase, calibration: dict | None = None) -> int:
    from ..fit.estimate import estimate
    from ..fit.shape import model_shape

    return estimate(model_shape(case.arch), case.query(), calibration).peak_bytes


def make_optimizer(name: str, params):
    """The optimizer HF Trainer builds for `optim=name` (lr 2e-4, its default weight decay 0)."""
    from ..fit.lora import optimizer_name

    name = optimizer_name(name)
    if name == "adamw_torch":
        import torch

        return torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0)
    import bitsandbytes as bnb

    cls = {"adamw_8bit": bnb.optim.AdamW8bit, "paged_adamw_32bit": bnb.optim.PagedAdamW32bit,
           "paged_adamw_8bit": bnb.optim.PagedAdamW8bit}[name]
    return cls(params, lr=2e-4, weight_decay=0.0)


def _optimizer_state_bytes(opt, device: str) -> tuple[int, int]:
    """(bytes in torch's allocator, bytes elsewhere: bitsandbytes' paged buffers) of the states on
    `device` (torch keeps AdamW's step counters as CPU scalars: not device memory)."""
    import torch

    kind = torch.device(device).type
    alloc = paged = 0
    seen: set[int] = set()
    for state in opt.state.values():
        for value in state.values():
            if not isinstance(value, torch.Tensor) or value.numel() <= 1 or value.data_ptr() in seen:
                continue
            seen.add(value.data_ptr())
            size = value.numel() * value.element_size()
            if getattr(value, "is_paged", False):  # bitsandbytes: a CPU-typed view of managed memory
                paged += size
            elif value.device.type == kind:
                alloc += size
    return alloc, paged


def allocator_state(device: str) -> dict[str, int]:
    """The caching allocator's counters now: what tensors hold (allocated), what it holds from the
    driver (reserved), and the free pieces of split blocks (inactive split: the holes), each with
    its peak since the process started."""
    import torch

    stats = torch.cuda.memory_stats(torch.device(device))
    out = {}
    for name in ("allocated_bytes", "reserved_bytes", "inactive_split_bytes"):
        for pool in ("all", "large_pool", "small_pool"):
            for when in ("current", "peak"):
                out[f"{name}.{pool}.{when}"] = int(stats.get(f"{name}.{pool}.{when}", 0))
    out["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
    return out


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


@dataclass
class Run:
    """What one process measured (None where not reached)."""

    phase: str = "start"
    oom: bool = False
    oom_phase: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


def run_case(case: TrainCase, model_dir: str | Path, device: str = "cuda:0") -> dict:
    """Run `case` in this process and return its row (the process should be fresh)."""
    import torch

    from ...models import load_model
    from ..tracking.measure import MemoryTracker, cuda_context_bytes

    cuda = device.startswith("cuda")
    run = Run()
    row: dict[str, Any] = asdict(case)
    row.update(mode="train", lora_targets=list(FAMILY_TARGET_SETS[case.targets]),
               alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""))
    t0 = time.perf_counter()
    if cuda:
        context = cuda_context_bytes(device)
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
        row.update(context_bytes=context, total_bytes=int(total))
        if case.budget_bytes:
            cap = case.budget_bytes - (context or 0)
            torch.cuda.set_per_process_memory_fraction(cap / total, torch.device(device))
            row["allocator_cap_bytes"] = int(cap)
    model = opt = None
    try:
        run.phase = "load"
        model = load_model(model_dir, case.precision, device)
        if cuda:
            row["loaded_bytes"] = int(torch.cuda.memory_allocated(torch.device(device)))
        run.phase = "prepare"
        model = _with_lora(model, case, row)
        opt = make_optimizer(case.optimizer, [p for p in model.parameters() if p.requires_grad])
        g = torch.Generator(device="cpu").manual_seed(case.seq_len * 10 + case.batch)
        vocab = model.config.vocab_size if hasattr(model.config, "vocab_size") else model.get_input_embeddings().num_embeddings
        ids = torch.randint(3, vocab - 1, (case.batch, case.seq_len), generator=g).to(device)
        run.phase = "train"
        tracker = MemoryTracker(device, interval_s=0.02)  # a dozen cases share the CPUs
        losses: list[float] = []
        try:
            with tracker:
                losses = optimizer_steps(model, opt, ids, case.steps)
        finally:
            m = tracker.result
            row.update(peak_bytes=m.peak_bytes, reserved_peak_bytes=m.reserved_peak_bytes,
                       start_bytes=m.start_bytes, end_bytes=m.end_bytes, nvml_peak_bytes=m.nvml_peak_bytes,
                       nvml_scope=m.nvml_scope, host_rss_peak_bytes=m.host_rss_peak_bytes,
                       train_seconds=round(m.seconds, 3))
        alloc, paged = _optimizer_state_bytes(opt, device)
        row.update(losses=losses, optimizer_state_bytes_measured=alloc, paged_optimizer_state_bytes_measured=paged)
        if cuda:
            row["allocator_at_end"] = allocator_state(device)
        run.phase = "done"
    except Exception as exc:  # noqa: BLE001 - OOM is a result; anything else is recorded, not hidden
        if _is_oom(exc):
            run.oom, run.oom_phase = True, run.phase
            if cuda:  # the cap, not a GPU shared with other cases, must be what ran out
                row["device_free_at_oom_bytes"] = int(torch.cuda.mem_get_info(torch.device(device))[0])
                # while `exc` still holds the failed step's frames: what was live and what was held
                row["allocator_at_oom"] = allocator_state(device)
                row["oom_message"] = " ".join(str(exc).split())[:400]
        else:
            row["error"] = f"{run.phase}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]
        del exc
    finally:
        del model, opt
        gc.collect()
    row.update(oom=run.oom, oom_phase=run.oom_phase, seconds=round(time.perf_counter() - t0, 3))
    if run.oom:  # a peak measured up to the OOM is not the case's peak
        row["peak_bytes"] = None
    row.update(_prediction(case))
    return row


def _with_lora(model, case: TrainCase, row: dict):
    """The model as users train it: prepared for k-bit training (quantized) or checkpointing,
    LoRA-wrapped by peft; what peft wrapped goes into `row`."""
    if case.precision not in ("bf16", "fp16", "fp32"):
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=case.grad_checkpointing)
    elif case.grad_checkpointing:
        model.gradient_checkpointing_enable()
        model.enable_input_require_grads()
    model.config.use_cache = False
    from peft import LoraConfig, get_peft_model

    targets = FAMILY_TARGET_SETS[case.targets]
    cfg = LoraConfig(r=case.lora_r, lora_alpha=2 * case.lora_r, lora_dropout=0.05,
                     target_modules=targets[0] if targets == ("all-linear",) else list(targets),
                     task_type="CAUSAL_LM")
    model = get_peft_model(model, cfg)
    model.train()
    trainable, _ = model.get_nb_trainable_parameters()
    lora = [name for name, mod in model.named_modules() if len(getattr(mod, "lora_A", {}) or {}) > 0]
    row.update(lora_params_measured=int(trainable), lora_modules_measured=len(lora),
               lora_wrapped=sorted({name.rsplit(".", 1)[-1] for name in lora}))
    return model


def _prediction(case: TrainCase) -> dict:
    """What the estimator predicts for `case`, or why it could not."""
    from ..fit.lora import resolve_lora_targets
    from ..fit.shape import model_shape

    try:
        t = resolve_lora_targets(model_shape(case.arch), FAMILY_TARGET_SETS[case.targets])
        return dict(predicted_bytes=predicted_bytes(case), lora_modules_predicted=t.modules,
                    lora_unmatched_targets=list(t.unmatched))
    except Exception as exc:  # noqa: BLE001 - the measurement matters more than the prediction
        return {"predict_error": str(exc)[:200]}


def environment(device: str = "cuda:0") -> dict:
    import peft
    import torch
    import transformers

    try:
        import bitsandbytes as bnb

        bnb_version = bnb.__version__
    except Exception as exc:  # noqa: BLE001
        bnb_version = f"unavailable: {exc}"
    cuda = device.startswith("cuda") and torch.cuda.is_available()
    return {"gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
            "total_bytes": torch.cuda.get_device_properties(0).total_memory if cuda else 0,
            "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
            "peft": peft.__version__, "bitsandbytes": bnb_version, "python": sys.version.split()[0]}


# ---------------------------------------------------------------------------------------------
# Reading rows back

# Never in the fit of calibration.CALIBRATION's training keys (benchmarks/vram/fit_calibration.py --train
# --holdout ...): phi-3's fused qkv_proj/gate_up_proj, and a larger qwen2.
HOLDOUT_ARCHS = ("phi-3-mini-4k", "qwen2.5-3b")


def load_truth(runs: dict[str, Path]) -> tuple[list[dict], dict]:
    """The rows of fresh-process training runs ({run name: train_rows.json}, in order), each row
    tagged with its run. The committed H200 runs (the repository's measurements/vram/truth/: run1,
    the fit's rows; validation, drawn after the estimator was fixed) are passed in by its reader."""
    rows: list[dict] = []
    env: dict = {}
    for run, path in runs.items():
        got, run_env = load_matrix([path])
        env = env or run_env
        rows += [dict(r, run=run) for r in got]
    return rows, env


def agreement(boundary: list[dict]) -> float:
    """The share of boundary rows whose verdict matched what ran (nan without rows)."""
    return sum(r["planner_fits"] == r["actually_fits"] for r in boundary) / len(boundary) if boundary else float("nan")


def false_fits(boundary: list[dict]) -> list[dict]:
    """The boundary rows predicted to fit that ran out of memory."""
    return [r for r in boundary if r["planner_fits"] and not r["actually_fits"]]


@dataclass
class TrainingSummary:
    rows: list[dict]  # matrix rows with "predicted" and "error" added
    boundary: list[dict]  # boundary rows with "planner_fits" and "actually_fits"
    # boundary rows run with expandable segments, "planner_fits" their verdict (budget.fits_expandable)
    boundary_expandable: list[dict] = field(default_factory=list)

    def errors(self, archs=None, targets=None, gc: bool | None = None) -> list[float]:
        return [abs(r["error"]) for r in self.rows
                if (archs is None or r["arch"] in archs) and (targets is None or r["targets"] == targets)
                and (gc is None or r["grad_checkpointing"] is gc)]

    def boundary_of(self, run: str | None = None) -> list[dict]:
        return [r for r in self.boundary if run is None or r.get("run") == run]

    def agreement_of(self, run: str | None = None) -> float:
        return agreement(self.boundary_of(run))

    def false_fits_of(self, run: str | None = None) -> list[dict]:
        return false_fits(self.boundary_of(run))

    @property
    def agreement(self) -> float:
        return self.agreement_of()

    @property
    def false_fits(self) -> list[dict]:
        return self.false_fits_of()


def runs_expandable(row: dict) -> bool:
    """Did this row's process run with expandable segments (PYTORCH_CUDA_ALLOC_CONF)?"""
    return "expandable_segments:true" in (row.get("alloc_conf") or "").replace(" ", "").lower()


def evaluate_training(rows: list[dict], calibration: dict | None = None) -> TrainingSummary:
    """Each measured matrix row against the estimator; each boundary row's real OOM against the
    verdict `plan --train` gives (peak + training reserve + this process's context <= budget), or
    for a row run with expandable segments the verdict with them (budget.fits_expandable)."""
    from ..fit.budget import default_headroom, fits, fits_expandable
    from ..fit.estimate import estimate
    from ..family.families import at_transformers
    from ..fit.shape import model_shape
    from .matrix_readback import row_query

    shapes: dict[str, Any] = {}
    matrix, boundary, expandable = [], [], []
    for row in rows:
        if row.get("error"):
            continue
        version = row.get("transformers")  # the attention that version picked
        shape = shapes.setdefault((row["arch"], version), at_transformers(model_shape(row["arch"]), version))
        est = estimate(shape, row_query(row), calibration)
        pred = est.peak_bytes
        if row.get("role") == "boundary" and runs_expandable(row):
            expandable.append(dict(row, predicted=pred, planned=pred, actually_fits=not row["oom"],
                                   planner_fits=fits_expandable(est, row["budget_bytes"], row["context_bytes"])))
        elif row.get("role") == "boundary":
            boundary.append(dict(row, predicted=pred, planned=est.planned_bytes, actually_fits=not row["oom"],
                                 planner_fits=fits(est.planned_bytes, row["budget_bytes"], row["context_bytes"],
                                                   default_headroom("train"))))
        elif row.get("peak_bytes") and not row.get("oom"):
            matrix.append(dict(row, predicted=pred, error=(pred - row["peak_bytes"]) / row["peak_bytes"]))
    return TrainingSummary(matrix, boundary, expandable)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.memory.measured.train_matrix", description=__doc__.splitlines()[0])
    ap.add_argument("--case", required=True, help="the TrainCase as a JSON object")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", required=True, help="where the row goes (JSON, written atomically)")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args(argv)
    case = TrainCase(**json.loads(args.case))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    row = run_case(case, args.model_dir, args.device)
    atomic.write_json(Path(args.out), row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
