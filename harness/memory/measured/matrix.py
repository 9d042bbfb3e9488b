"""The GPU matrix: predicted against measured peak VRAM, and fit/OOM under an emulated budget.

    python -m harness.memory.measured.matrix --archs qwen2.5-0.5b,llama-3.2-1b --out DIR [--budget 6GiB]

Each architecture runs in its own worker process (in parallel on one GPU: torch's allocator
statistics are per process). A worker saves random bf16 weights of the reference architecture
once, then loads them ONCE per precision with from_pretrained(device_map={"": 0}) and runs every
mode and batch on that model, then the LoRA / QLoRA training cases. Every case runs first under
the emulated budget (allocator capped at budget - CUDA context); if it OOMs there, it runs again
uncapped to measure its peak. After every row the worker rewrites DIR/rows-<arch>.json atomically
(temp file + os.replace), so an interrupted run keeps its data, and a rerun skips rows it has.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ... import atomic
from ...units import comma_list, parse_bytes
from .matrix_train import TRAIN_PRECISIONS, run_train

INFER_PRECISIONS = ("bf16", "nf4-dq", "nf4", "fp4", "int8", "fp32")
PREFILL_LENS = (512, 2048, 8192)
GENERATE = (512, 64)
BATCHES = (1, 4)


def log(msg: str) -> None:
    print(f"[vram {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_json_atomic(path: Path, data: Any) -> None:
    atomic.write_json(path, data)


def case_id(row: dict) -> str:
    keys = ("arch", "precision", "mode", "seq_len", "batch", "new_tokens", "lora_r", "grad_checkpointing")
    return "|".join(str(row.get(k)) for k in keys)


def inference_cases(arch: str, precision: str) -> list[dict]:
    cases = [dict(arch=arch, precision=precision, mode="weights", seq_len=0, batch=1)]
    for batch in BATCHES:
        for seq in PREFILL_LENS:
            cases.append(dict(arch=arch, precision=precision, mode="prefill", seq_len=seq, batch=batch))
        for seq, new in generate_settings():
            cases.append(dict(arch=arch, precision=precision, mode="generate", seq_len=seq, batch=batch,
                              new_tokens=new))
    return cases


def generate_settings() -> tuple[tuple[int, int], ...]:
    """GENERATE as (prompt, new tokens) pairs: one pair or a tuple of them."""
    return tuple(GENERATE) if isinstance(GENERATE[0], (tuple, list)) else (tuple(GENERATE),)


def predict(row: dict) -> int | None:
    from ..fit.estimate import Query, estimate
    from ..fit.shape import model_shape

    try:
        shape = model_shape(row["arch"])
        mode = row["mode"]
        q = Query(row["precision"], mode, seq_len=max(1, row["seq_len"]), batch=row["batch"],
                  new_tokens=row.get("new_tokens") or 0, lora_r=row.get("lora_r") or 16,
                  grad_checkpointing=bool(row.get("grad_checkpointing", True)))
        return estimate(shape, q).peak_bytes
    except Exception as exc:  # the measurement matters more than the prediction here
        log(f"predict failed for {case_id(row)}: {exc}")
        return None


class Worker:
    def __init__(self, arch: str, out: Path, budget: int, deadline: float, model_root: Path,
                 precisions: tuple[str, ...], train: bool, device: str = "cuda:0"):
        import torch

        self.torch = torch
        self.arch, self.out, self.budget, self.deadline = arch, out, budget, deadline
        self.model_root, self.precisions, self.train = model_root, precisions, train
        self.device = device
        self.cuda = device.startswith("cuda")
        self.path = out / f"rows-{arch}.json"
        self.rows: list[dict] = json.loads(self.path.read_text())["rows"] if self.path.exists() else []
        self.done = {case_id(r) for r in self.rows}
        from ..tracking.measure import cuda_context_bytes

        self.context = cuda_context_bytes(self.device) if self.cuda else None
        self.total = torch.cuda.get_device_properties(0).total_memory if self.cuda else 0
        self.env = self._environment()

    def _environment(self) -> dict:
        import peft
        import transformers

        try:
            import bitsandbytes as bnb
            bnb_version = bnb.__version__
        except Exception as exc:  # noqa: BLE001
            bnb_version = f"unavailable: {exc}"
        t = self.torch
        return {"gpu": t.cuda.get_device_name(0) if self.cuda else "cpu", "total_bytes": self.total, "context_bytes": self.context,
                "torch": t.__version__, "cuda": t.version.cuda, "transformers": transformers.__version__,
                "peft": peft.__version__, "bitsandbytes": bnb_version, "python": sys.version.split()[0],
                "budget_bytes": self.budget}

    def save(self) -> None:
        write_json_atomic(self.path, {"environment": self.env, "rows": self.rows})

    def out_of_time(self) -> bool:
        return time.time() > self.deadline

    # -- running one thing under the cap, then uncapped if it OOMs --------------------------------

    def todo(self, cases: list[dict]) -> list[dict]:
        """The cases this worker's rows file does not hold yet."""
        return [c for c in cases if case_id(c) not in self.done]

    def cap(self, capped: bool) -> None:
        t = self.torch
        gc.collect()
        if not self.cuda:
            return
        # cuBLAS keeps a workspace per handle (32 MiB on sm90; the backward thread has its own)
        # in the allocator; drop them so each case measures what it creates, as a fresh process.
        if hasattr(t._C, "_cuda_clearCublasWorkspaces"):
            t._C._cuda_clearCublasWorkspaces()
        t.cuda.empty_cache()
        fraction = (self.budget - (self.context or 0)) / self.total if capped else 1.0
        t.cuda.set_per_process_memory_fraction(fraction, 0)

    def measured(self, fn: Callable[[], Any], capped: bool) -> tuple[dict, Any]:
        from ..tracking.measure import MemoryTracker

        self.cap(capped)
        result, oom = None, False
        tracker = MemoryTracker(self.device)
        try:
            with tracker:
                result = fn()
        except Exception as exc:  # transformers may wrap the OOM of a load in another error
            if not (isinstance(exc, self.torch.OutOfMemoryError) or "out of memory" in str(exc).lower()):
                raise
            oom = True
            del exc
        m = tracker.result
        info = {"peak_bytes": m.peak_bytes, "reserved_peak_bytes": m.reserved_peak_bytes,
                "start_bytes": m.start_bytes, "end_bytes": m.end_bytes, "nvml_peak_bytes": m.nvml_peak_bytes,
                "nvml_scope": m.nvml_scope, "nvml_rate_hz": m.nvml_rate_hz,
                "host_rss_peak_bytes": m.host_rss_peak_bytes, "seconds": round(m.seconds, 3), "oom": oom}
        return info, result

    def record(self, case: dict, fn: Callable[[], Any], fits_under_budget: bool | None = None) -> Any:
        """Run a case (capped first unless we already know it cannot fit), append its row."""
        row = dict(case)
        result = None
        if fits_under_budget is False:  # e.g. the model itself did not load under the budget
            row["oom_under_budget"] = True
        else:
            info, result = self.measured(fn, capped=True)
            row["oom_under_budget"] = info["oom"]
            if not info["oom"]:
                row.update(info)
        if row["oom_under_budget"]:
            info, result = self.measured(fn, capped=False)
            if info["oom"]:
                row["error"] = "OOM even uncapped"
            row.update(info)
        row.pop("oom", None)
        row["predicted_bytes"] = predict(row)
        self.cap(False)
        self.rows.append(row)
        self.done.add(case_id(row))
        self.save()
        pk, pr = row.get("peak_bytes"), row.get("predicted_bytes")
        err = f"{(pr - pk) / pk:+.1%}" if pk and pr else "-"
        log(f"{self.arch} {row['precision']} {row['mode']} s={row['seq_len']} b={row['batch']} "
            f"r={row.get('lora_r')} gc={row.get('grad_checkpointing')}: peak {pk} pred {pr} ({err}) "
            f"oom@budget={row['oom_under_budget']}")
        return result

    # -- the model ----------------------------------------------------------------------------------

    def model_dir(self) -> Path:
        from ...models import save_random_model

        if self.arch.startswith("tiny-"):  # CPU smoke runs
            from ...models import tiny_model_dir

            return tiny_model_dir(self.arch[5:])
        path = self.model_root / self.arch
        if not (path / "config.json").exists():
            log(f"{self.arch}: saving random bf16 weights to {path}")
            save_random_model(self.arch, path, dtype="bf16", device=self.device)
            gc.collect()
            self.torch.cuda.empty_cache()
        return path

    def load(self, precision: str, capped: bool):
        from ...models import load_model

        path = self.model_dir()  # outside the measurement: saving the random checkpoint uses the GPU
        return self.measured(lambda: load_model(path, precision, self.device), capped)

    def load_case(self, precision: str) -> tuple[Any, bool]:
        """Load once; the weights row. Returns (model, loaded_under_budget)."""
        case = dict(arch=self.arch, precision=precision, mode="weights", seq_len=0, batch=1)
        row = dict(case)
        info, model = self.load(precision, capped=True)
        loaded_capped = not info["oom"]
        if not loaded_capped:
            model = None
            gc.collect()
            info, model = self.load(precision, capped=False)
        row.update(info)
        row.pop("oom", None)
        row["oom_under_budget"] = not loaded_capped
        row["resident_bytes"] = int(self.torch.cuda.memory_allocated(0)) if self.cuda else None
        row["predicted_bytes"] = predict(row)
        if case_id(row) not in self.done:
            self.rows.append(row)
            self.done.add(case_id(row))
            self.save()
            log(f"{self.arch} {precision} weights: peak {row['peak_bytes']} resident {row['resident_bytes']} "
                f"pred {row['predicted_bytes']} oom@budget={row['oom_under_budget']}")
        return model, loaded_capped

    def unload(self, model) -> None:
        del model
        gc.collect()
        self.torch.cuda.empty_cache()

    # -- the cases ----------------------------------------------------------------------------------

    def ids(self, model, batch: int, seq: int):
        g = self.torch.Generator(device=self.device).manual_seed(seq * 10 + batch)
        return self.torch.randint(3, model.config.vocab_size - 1, (batch, seq), device=self.device,
                                  generator=g)

    def prefill(self, model, batch: int, seq: int):
        t = self.torch
        ids = self.ids(model, batch, seq)
        mask = t.ones_like(ids)

        def fn():
            with t.no_grad():
                out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
                logits = out.logits[:, -1].to(copy=True, dtype=t.float32)
            del out
            return int(logits.shape[-1])
        return fn

    def generate(self, model, batch: int, seq: int, new: int):
        t = self.torch
        ids = self.ids(model, batch, seq)
        mask = t.ones_like(ids)

        def fn():
            with t.no_grad():
                out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                                     min_new_tokens=new, do_sample=False, pad_token_id=0)
            n = out.shape[1] - seq
            del out
            if n != new:
                raise RuntimeError(f"generated {n} tokens, asked for {new}")
            return n
        return fn

    def run(self) -> None:
        # The precisions the training cases use first, then training, then the rest: a run cut
        # short by its deadline still has every kind of case for some architectures.
        first = [p for p in self.precisions if p in TRAIN_PRECISIONS]
        rest = [p for p in self.precisions if p not in TRAIN_PRECISIONS]
        for precision in first:
            self.run_inference(precision)
        if self.train:
            for precision in TRAIN_PRECISIONS:
                run_train(self, precision)
        for precision in rest:
            self.run_inference(precision)

    def run_inference(self, precision: str) -> None:
        cases = self.todo(inference_cases(self.arch, precision))
        if not cases or self.out_of_time():
            return
        model, loaded = self.load_case(precision)
        for case in cases:
            if case["mode"] == "weights":
                continue
            if self.out_of_time():
                break
            if case["mode"] == "prefill":
                fn = self.prefill(model, case["batch"], case["seq_len"])
            else:
                fn = self.generate(model, case["batch"], case["seq_len"], case["new_tokens"])
            self.record(case, fn, fits_under_budget=None if loaded else False)
        self.unload(model)

def _worker_main(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    precisions = comma_list(args.precisions, "--precisions")
    w = Worker(args.worker, out, parse_bytes(args.budget, "--budget"), args.deadline, Path(args.model_root),
               precisions, not args.no_train, device=args.device)
    log(f"{args.worker}: context {w.context} bytes, {len(w.done)} rows already done")
    try:
        w.run()
    finally:
        w.save()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.memory.measured.matrix", description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default="qwen2.5-0.5b,llama-3.2-1b,tinyllama-1.1b,qwen2.5-1.5b,smollm2-1.7b")
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", default="6GiB")
    ap.add_argument("--precisions", default=",".join(INFER_PRECISIONS))
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--time-limit-s", type=float, default=540.0, help="stop starting new cases after this")
    ap.add_argument("--model-root", default="/tmp/vram-models")
    ap.add_argument("--device", default="cuda:0", help="cuda:0, or cpu for a smoke run of the code paths")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return _worker_main(args)
    deadline = time.time() + args.time_limit_s
    procs = []
    for arch in comma_list(args.archs, "--archs"):
        cmd = [sys.executable, "-m", "harness.memory.measured.matrix", "--worker", arch, "--out", args.out,
               "--budget", args.budget, "--precisions", args.precisions, "--deadline", str(deadline),
               "--model-root", args.model_root, "--device", args.device] + (["--no-train"] if args.no_train else [])
        procs.append((arch, subprocess.Popen(cmd)))
    rc = 0
    for arch, proc in procs:
        code = proc.wait()
        log(f"worker {arch} exited {code}")
        rc = rc or code
    return rc


if __name__ == "__main__":
    sys.exit(main())
