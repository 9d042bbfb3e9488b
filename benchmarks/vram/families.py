"""Issue 27 on a GPU: memory truth for the families people fine-tune now, in one short call.

    python benchmarks/vram/families.py --out DIR [--time-limit-s 300] [--smoke]

Every case runs in a fresh process (the training cases through harness.memory.train_matrix, the
snapshot cases through harness.memory.snapshot_case), several at once on the one GPU; each writes
its own row, DIR/rows/<n>-<name>.json, atomically, so a run cut short keeps every finished case.
The inference cases of a family and precision share one process (harness.memory.matrix's Worker:
one load, then prefill and generate cases measured one after the other, as the committed inference
matrix was). Most valuable first: the two snapshot cases (one QLoRA step and one generation of
Gemma-2), then the training matrix of the problem families (Gemma-2, Gemma-3) with the 6 GiB
boundary cases interleaved, then the other families, then inference. The driver starts no case
once less than CASE_MIN_S is left and kills what still runs at the deadline; DIR/DONE is written
last, with the counts.

Held out of any fit (never used to choose a coefficient): qwen3-1.7b and phi-4-mini (FIT_EXCLUDED).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import atomic  # noqa: E402
from harness.memory.train_matrix import TrainCase  # noqa: E402

FAMILIES = ("gemma-2-2b", "gemma-3-1b", "qwen3-1.7b", "phi-4-mini")
FIT_EXCLUDED = ("qwen3-1.7b", "phi-4-mini")
BUDGET = 6 * 2**30
ASSUMED_CONTEXT = 640 * 2**20
CASE_TIMEOUT_S = 150
CASE_MIN_S = 35  # a fresh process needs ~15-25 s to import, load and step
GPU_POOL = 125 * 2**30
INFER = {"prefill_lens": (1024, 4096), "batches": (1, 2), "generate": (1024, 64)}
T0 = time.time()


def log(msg: str) -> None:
    print(f"[families {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def py_env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="2",
               TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(ROOT)) if p)
    return env


def attn_targets(arch: str) -> str:
    return "attn-fused" if arch.startswith("phi") else "attn"


# ---------------------------------------------------------------------------------------------
# The jobs


def snapshot_jobs(arch: str = "gemma-2-2b") -> list[dict]:
    train = TrainCase(arch, "nf4-dq", "all", 8, True, 1, 1024, "adamw_torch", role="snapshot", steps=2)
    gen = {"arch": arch, "precision": "nf4-dq", "batch": 1, "seq_len": 1024, "new_tokens": 32}
    return [{"kind": "snapshot-train", "arch": arch, "name": f"snapshot-train-{arch}", "case": asdict(train),
             "claim": claim_bytes(train)},
            {"kind": "snapshot-generate", "arch": arch, "name": f"snapshot-generate-{arch}", "case": gen,
             "claim": 12 * 2**30}]


def matrix_cases(arch: str) -> list[TrainCase]:
    """nf4-dq QLoRA: {all-linear, attention} x r {8, 64} x checkpointing {on, off}, the length and
    batch rotated through (512, 1), (1024, 1), (2048, 1), (1024, 2) so each family spans them."""
    shapes = ((512, 1), (1024, 1), (2048, 1), (1024, 2))
    out, i = [], 0
    for gc_on in (True, False):
        for targets in ("all", attn_targets(arch)):
            for r in (8, 64):
                seq, batch = shapes[i % len(shapes)]
                i += 1
                out.append(TrainCase(arch, "nf4-dq", targets, r, gc_on, batch, seq, "adamw_torch"))
    return out


def boundary_cases(rng: random.Random, per_family: int) -> list[TrainCase]:
    """Per family, cases whose `plan --train` verdict (planned x (1 + reserve) against 6 GiB -
    context) lies within +-25% of the cap, half on each side: the real OOM under the cap is the
    truth."""
    from harness.memory.estimate import RESERVE_FRACTION, estimate
    from harness.memory.shape import model_shape

    out: list[TrainCase] = []
    for arch in FAMILIES:
        shape = model_shape(arch)
        below, above, tries = [], [], 0
        while len(below) + len(above) < per_family and tries < 1500:
            tries += 1
            c = TrainCase(arch, "nf4-dq", rng.choice(("all", attn_targets(arch))), rng.choice((8, 16, 64)),
                          rng.choice((True, False)), rng.choice((1, 2)),
                          rng.choice((256, 512, 768, 1024, 1536, 2048, 3072)),
                          rng.choice(("adamw_torch", "adamw_8bit")), budget_bytes=BUDGET, role="boundary")
            try:
                est = estimate(shape, c.query())
            except Exception:  # noqa: BLE001 - a case the estimator refuses is not a boundary case
                continue
            ratio = est.planned_bytes * (1 + RESERVE_FRACTION["train"]) / (BUDGET - ASSUMED_CONTEXT)
            side = below if ratio <= 1.0 else above
            if c in below + above or not 0.75 <= ratio <= 1.25 or len(side) >= per_family // 2:
                continue
            side.append(c)
        out += below + above
    rng.shuffle(out)
    return out


_SHAPES: dict = {}


def claim_bytes(case: TrainCase) -> int:
    """What a case may take of the GPU while others run: its cap, or 1.5 x its prediction (the
    estimator is unchecked on these families) + 1 GiB, at least 4 GiB."""
    if case.budget_bytes:
        return case.budget_bytes + 2**30
    from harness.memory.estimate import estimate
    from harness.memory.shape import model_shape

    try:
        shape = _SHAPES.setdefault(case.arch, model_shape(case.arch))
        return max(4 * 2**30, int(1.5 * estimate(shape, case.query()).peak_bytes) + 2**30)
    except Exception:  # noqa: BLE001
        return 24 * 2**30


def train_job(case: TrainCase) -> dict:
    claim = claim_bytes(case)
    return {"kind": "train", "arch": case.arch, "case": asdict(case), "claim": claim,
            "name": f"{case.role}-{case.arch}-{case.targets}-r{case.lora_r}-gc{int(case.grad_checkpointing)}"
                    f"-b{case.batch}-s{case.seq_len}-{case.optimizer}"}


def infer_job(arch: str, precision: str) -> dict:
    return {"kind": "infer", "arch": arch, "precision": precision, "name": f"infer-{arch}-{precision}",
            "claim": 12 * 2**30}


def all_jobs(smoke: bool = False) -> list[dict]:
    if smoke:
        tiny = TrainCase("qwen2.5-0.5b", "bf16", "attn", 8, True, 1, 32, "adamw_torch", steps=1)
        return [train_job(tiny)]
    rng = random.Random(27)
    boundary = [train_job(c) for c in boundary_cases(rng, 6)]
    first = snapshot_jobs()
    problem = [train_job(c) for a in ("gemma-2-2b", "gemma-3-1b") for c in matrix_cases(a)]
    others = [train_job(c) for a in ("qwen3-1.7b", "phi-4-mini") for c in matrix_cases(a)]
    infer = [infer_job(a, p) for a in FAMILIES for p in ("nf4-dq", "bf16")]
    jobs = first + infer[:2]
    # boundary cases spread through the training cases: a run cut short still has most of them
    train = problem + others
    step = max(1, len(train) // max(1, len(boundary)))
    for i, b in enumerate(boundary):
        train.insert(i * (step + 1), b)
    return jobs + train[:12] + infer[2:] + train[12:]


def command(job: dict, model_dir: Path, out: Path, device: str) -> list[str]:
    if job["kind"] == "train":
        return [sys.executable, "-m", "harness.memory.train_matrix", "--case", json.dumps(job["case"]),
                "--model-dir", str(model_dir), "--out", str(out), "--device", device]
    if job["kind"].startswith("snapshot"):
        flag = "--train" if job["kind"] == "snapshot-train" else "--generate"
        return [sys.executable, "-m", "harness.memory.snapshot_case", flag, json.dumps(job["case"]),
                "--model-dir", str(model_dir), "--out", str(out), "--device", device]
    return [sys.executable, str(Path(__file__).resolve()), "--infer-worker", job["arch"], "--precision",
            job["precision"], "--model-dir", str(model_dir), "--out", str(out), "--device", device]


# ---------------------------------------------------------------------------------------------
# Inference worker (one process per family and precision)


def infer_worker(arch: str, precision: str, model_dir: Path, out: Path, device: str, deadline: float) -> None:
    from harness.memory import matrix

    matrix.PREFILL_LENS, matrix.BATCHES = INFER["prefill_lens"], INFER["batches"]
    matrix.GENERATE = INFER["generate"]
    work = out.parent / (out.stem + ".d")
    work.mkdir(parents=True, exist_ok=True)
    import torch

    total = torch.cuda.get_device_properties(0).total_memory if device.startswith("cuda") else 0
    w = matrix.Worker(arch, work, total or BUDGET, deadline, model_dir.parent, (precision,), False, device=device)
    w.model_dir = lambda: model_dir  # the driver saved it
    try:
        w.run()
    finally:
        w.save()
        atomic.write_json(out, {"kind": "infer", "arch": arch, "precision": precision, "environment": w.env,
                                "rows": w.rows})


# ---------------------------------------------------------------------------------------------
# Scheduling


def save_models(archs, root: Path, device: str, deadline: float, log_dir: Path | None = None) -> dict[str, Path]:
    procs = {}
    root.mkdir(parents=True, exist_ok=True)
    for arch in archs:
        path = root / arch
        if (path / "config.json").exists():
            continue
        code = ("from harness.models import save_random_model; "
                f"save_random_model({arch!r}, {str(path)!r}, dtype='bf16', device={device!r})")
        log_path = root.parent / f"save-{arch}.log" if log_dir is None else log_dir / f"save-{arch}.log"
        procs[arch] = subprocess.Popen([sys.executable, "-c", code], env=py_env(), stdout=subprocess.DEVNULL,
                                       stderr=open(log_path, "w"))
    failed = set()
    for arch, proc in procs.items():
        try:
            proc.wait(timeout=max(5, deadline - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode != 0:  # a save cut short leaves a config.json beside partial weights
            failed.add(arch)
        log(f"saved {arch}: exit {proc.returncode}")
    return {a: root / a for a in archs if a not in failed and (root / a / "config.json").exists()}


def run_jobs(jobs: list[dict], model_dirs: dict, out_dir: Path, device: str, deadline: float, slots: int) -> dict:
    rows_dir = out_dir / "rows"
    logs = out_dir / "logs"
    rows_dir.mkdir(parents=True, exist_ok=True)
    logs.mkdir(exist_ok=True)
    pending = [j for j in jobs if j["arch"] in model_dirs]
    running: dict[int, tuple] = {}
    used, n, counts = 0, 0, {"done": 0, "timeout": 0, "no_row": 0, "skipped": len(jobs) - len(pending)}

    def finish(pid: int, kill: bool) -> None:
        nonlocal used
        proc, job, out, started = running.pop(pid)
        used -= job["claim"]
        if kill:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if out.exists() and not kill:
            counts["done"] += 1
            row = json.loads(out.read_text())
            log(f"done {out.name} in {time.time() - started:.0f}s: peak {row.get('peak_bytes')} "
                f"pred {row.get('predicted_bytes')} oom={row.get('oom')} {row.get('error', '')}")
        else:
            counts["timeout" if kill else "no_row"] += 1
            atomic.write_json(out, dict(job, error="killed at the deadline" if kill else
                                        f"exit {proc.returncode} without a row", wall_s=round(time.time() - started, 1)))
            log(f"{'killed' if kill else 'failed'} {out.name}")

    while pending or running:
        now = time.time()
        for pid in list(running):
            proc, job, out, started = running[pid]
            if proc.poll() is not None:
                finish(pid, False)
            elif now - started > CASE_TIMEOUT_S or now > deadline:
                finish(pid, True)
        if deadline - now < CASE_MIN_S:
            counts["skipped"] += len(pending)
            pending = []
        started_one = False
        while pending and len(running) < slots and (not running or used + pending[0]["claim"] <= GPU_POOL):
            job = pending.pop(0)
            n += 1
            out = rows_dir / f"{n:03d}-{job['name']}.json"
            env = py_env()
            env["FAMILIES_DEADLINE"] = str(deadline)
            proc = subprocess.Popen(command(job, model_dirs[job["arch"]], out, device), env=env,
                                    start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=open(logs / f"{n:03d}-{job['name']}.log", "w"))
            running[proc.pid] = (proc, job, out, time.time())
            used += job["claim"]
            started_one = True
        if not started_one:
            time.sleep(0.5)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--time-limit-s", type=float, default=300)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--model-root", default="/tmp/families-models")
    ap.add_argument("--slots", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="CPU: one tiny training case through the scheduler")
    ap.add_argument("--list", action="store_true", help="print the jobs in order and exit")
    ap.add_argument("--infer-worker", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.infer_worker:
        deadline = float(os.environ.get("FAMILIES_DEADLINE", time.time() + 120))
        infer_worker(args.infer_worker, args.precision, Path(args.model_dir), Path(args.out), args.device, deadline - 10)
        return 0
    jobs = all_jobs(args.smoke)
    if args.list:
        for j in jobs:
            print(j["name"])
        return 0
    deadline = T0 + args.time_limit_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / "jobs.json", jobs)
    from harness.memory.train_matrix import environment

    env_info = dict(environment(args.device), fit_excluded=list(FIT_EXCLUDED), budget_bytes=BUDGET)
    atomic.write_json(out / "environment.json", env_info)
    log(f"{len(jobs)} jobs; environment {env_info}")
    if args.smoke:
        from harness.models import tiny_model_dir

        model_dirs = {"qwen2.5-0.5b": tiny_model_dir("qwen2")}
    else:
        (out / "logs").mkdir(exist_ok=True)
        model_dirs = save_models(FAMILIES, Path(args.model_root), args.device, T0 + 90, out / "logs")
    counts = run_jobs(jobs, model_dirs, out, args.device, deadline, args.slots)
    log(f"finished: {counts}")
    atomic.write_json(out / "DONE", dict(counts, seconds=round(time.time() - T0, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
