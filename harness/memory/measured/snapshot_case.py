"""One measured case with torch's allocator history recorded, in a fresh process: a QLoRA/LoRA
training case (harness.memory.measured.train_matrix's protocol, unchanged) or one generation, and the
summary of where its memory went (harness.memory.tracking.snapshot).

    python -m harness.memory.measured.snapshot_case --train '{TrainCase}' --model-dir DIR --out ROW.json
    python -m harness.memory.measured.snapshot_case --train '{TrainCase}' ... --trace-out TRACE.json.gz
    python -m harness.memory.measured.snapshot_case --generate '{"arch": .., "precision": .., "batch": 1,
        "seq_len": 1024, "new_tokens": 32}' --model-dir DIR --out ROW.json

The row is the case's usual row plus `snapshot` (live bytes per category at the step's allocated
peak and a timeline over the step), small enough to commit. Recording the history slows the
step (every allocation gathers its Python stack); the peak it measures is the same.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ... import atomic
from ..tracking.snapshot import SnapshotRecorder, _trace, logits_ranges, summarise


def _model_type(model_dir: str | Path) -> str:
    return str(json.loads((Path(model_dir) / "config.json").read_text()).get("model_type", ""))


def train_with_snapshot(case_json: dict, model_dir: str, device: str, trace_out: Path | None = None) -> dict:
    from .train_matrix import TrainCase, run_case

    case = TrainCase(**case_json)
    with SnapshotRecorder(device) as rec:
        row = run_case(case, model_dir, device)
    row["snapshot"] = _summary(rec, model_dir, "optimizer_steps")
    if trace_out is not None and rec.snapshot is not None:
        events = allocation_trace(rec.snapshot)
        atomic.write_bytes(trace_out, gzip.compress(json.dumps(events).encode()))
        row["trace_events"] = len(events)
    return row


TRACE_ACTIONS = {"alloc": "alloc", "free_completed": "free", "segment_alloc": "segment_alloc",
                 "segment_free": "segment_free"}


def allocation_trace(snapshot: dict, device: int = 0) -> list[list]:
    """The device's allocator history as [action, address, size, where] rows (where: the innermost
    Python frame outside torch's own files), to replay (harness.memory.replay.allocator_sim) or to set
    beside a traced step (harness.memory.replay.step_trace)."""
    out = []
    for e in _trace(snapshot, device):
        action = TRACE_ACTIONS.get(e["action"])
        if action is None:
            continue
        frames = e.get("frames") or []
        where = next((f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']}:{f['name']}" for f in frames
                      if "/torch/" not in f["filename"]), frames[0]["filename"] if frames else "")
        out.append([action, e["addr"], e["size"], where])
    return out


def generate_case(spec: dict, model_dir: str, device: str) -> dict:
    """Load at the precision, then one greedy generate of `new_tokens` after `seq_len` random ids;
    allocator peak over the generate call (weights included, as the matrix measures)."""
    import torch

    from ...models import load_model
    from ..tracking.measure import MemoryTracker, cuda_context_bytes

    row: dict[str, Any] = dict(spec, mode="generate")
    row["context_bytes"] = cuda_context_bytes(device) if device.startswith("cuda") else None
    model = load_model(model_dir, spec["precision"], device)
    g = torch.Generator(device="cpu").manual_seed(spec["seq_len"] * 10 + spec["batch"])
    ids = torch.randint(3, model.config.vocab_size - 1, (spec["batch"], spec["seq_len"]), generator=g).to(device)
    tracker = MemoryTracker(device, interval_s=0.02)
    with tracker, torch.no_grad():
        out = run_generate(model, ids, spec["new_tokens"])
    row.update(peak_bytes=tracker.result.peak_bytes, reserved_peak_bytes=tracker.result.reserved_peak_bytes,
               start_bytes=tracker.result.start_bytes, generated=int(out.shape[1] - ids.shape[1]),
               seconds=round(tracker.result.seconds, 3))
    del model, out
    gc.collect()
    return row


def run_generate(model, ids, new_tokens: int):
    """The generate call the snapshot's window is named after (frame name `run_generate`)."""
    import torch

    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


def generate_with_snapshot(spec: dict, model_dir: str, device: str) -> dict:
    with SnapshotRecorder(device) as rec:
        row = generate_case(spec, model_dir, device)
    row["snapshot"] = _summary(rec, model_dir, "run_generate")
    return row


def _summary(rec: SnapshotRecorder, model_dir: str, window: str) -> dict | None:
    if rec.snapshot is None:
        return {"error": rec.error} if rec.error else None
    t0 = time.perf_counter()
    try:
        ranges = logits_ranges(_model_type(model_dir))
    except Exception:  # noqa: BLE001 - without the ranges logits count as activations, said below
        ranges = []
    try:
        summary = summarise(rec.snapshot, ranges, window=window)
    except Exception as exc:  # noqa: BLE001 - the row's measurement is kept without its picture
        return {"error": f"summarise: {type(exc).__name__}: {exc}"[:300]}
    summary["logits_ranges"] = [[r.file_suffix, r.first, r.last] for r in ranges]
    summary["summarise_seconds"] = round(time.perf_counter() - t0, 2)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.memory.measured.snapshot_case", description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--train", help="a TrainCase as a JSON object")
    what.add_argument("--generate", help='{"arch", "precision", "batch", "seq_len", "new_tokens"} as JSON')
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--trace-out", type=Path, help="--train: also write the allocator's history here (gzipped JSON)")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if args.train:
            row = train_with_snapshot(json.loads(args.train), args.model_dir, args.device, args.trace_out)
        else:
            row = generate_with_snapshot(json.loads(args.generate), args.model_dir, args.device)
    except Exception as exc:  # noqa: BLE001 - the row says what failed; the driver goes on
        row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500],
               "case": args.train or args.generate}
    atomic.write_json(Path(args.out), row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
