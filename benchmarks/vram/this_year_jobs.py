"""Draw the job set that measures this year's families on a GPU, before the run, as data.

    .venv/bin/python benchmarks/vram/this_year_jobs.py [--out measurements/vram/this-year-jobs.json]
    .venv/bin/python benchmarks/vram/this_year_jobs.py --tiny DIR --out DIR/jobs.json   # CPU dry run
    .venv/bin/python benchmarks/vram/this_year_jobs.py --next --out measurements/vram/next-hold-jobs.json

The jobs (run by `benchmarks/vram/families.py --jobs FILE`, one fresh process each):
- inference, bf16 and nf4-dq, per family with a checkpoint: weights, prefill 2048, generate 512+64
  and 2048+128 (batch 1); the three largest (Gemma-4-E4B, Granite-4.0-H-Tiny, gpt-oss-20b) in bf16,
  built with random weights on the GPU (no checkpoint: the disk and the hold are too small);
- the QLoRA step (nf4-dq, attention and all-linear targets, checkpointing on and off) at 512 and
  2048 tokens for every family with a checkpoint;
- Qwen3.5-2B's step and generation again with flash-linear-attention's fused kernels on the path
  (carried apart, so the other jobs run the reference PyTorch path);
- boundary cases under an emulated 6 GiB card: per trainable family, cases whose planned peak
  (with the training reserve) lies within +-20% of the card, half on each side, each with the
  verdict the estimate gives it now, with and without the unverified family's margin: the OOM
  under the cap is the truth.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import atomic  # noqa: E402
from harness.memory.measured.train_matrix import TrainCase  # noqa: E402

JOB_SET = "this-year"
TRAINED = ("gemma-3-1b", "gemma-3-4b", "gemma-4-e2b", "qwen3.5-2b", "qwen3.5-4b", "lfm2-1.2b")
BUILT_ON_DEVICE = ("gemma-4-e4b", "granite-4.0-h-tiny", "gpt-oss-20b")
BOUNDARY = ("gemma-3-1b", "gemma-3-4b", "qwen3.5-2b", "qwen3.5-4b", "lfm2-1.2b")
PER_FAMILY = 5
FUSED = "qwen3.5-2b"
FUSED_PATH = "/tmp/site-fla"  # where the GPU script installs flash-linear-attention
SHAPES = {"prefill_lens": [2048], "batches": [1], "generate": [[512, 64], [2048, 128]]}
LENGTHS = (512, 2048)
BUDGET = 6 * 2**30
ASSUMED_CONTEXT = 640 * 2**20  # the H200 process's CUDA context, measured by the earlier runs
SEED = 4747


def matrix_cases(arch: str) -> list[TrainCase]:
    return [TrainCase(arch, "nf4-dq", targets, 16, gc_on, 1, seq, "adamw_torch")
            for seq in LENGTHS for gc_on in (True, False) for targets in ("attn", "all")]


def verdicts(case: TrainCase) -> dict:
    """What plan's rule says of `case` on the card now: with the unverified margin and without it."""
    from harness.memory.fit.budget import default_headroom, fit_verdict
    from harness.memory.fit.estimate import estimate
    from harness.memory.family.families import UNVERIFIED_MARGIN
    from harness.memory.fit.shape import model_shape

    est = estimate(model_shape(case.arch), case.query())
    head = default_headroom("train")
    return {"predicted_bytes": est.peak_bytes, "planned_bytes": est.planned_bytes,
            "verdict_unverified": fit_verdict(est.planned_bytes, BUDGET, ASSUMED_CONTEXT, head,
                                              UNVERIFIED_MARGIN["train"]),
            "verdict_verified": fit_verdict(est.planned_bytes, BUDGET, ASSUMED_CONTEXT, head),
            "ratio": round(est.planned_bytes * (1 + head) / (BUDGET - ASSUMED_CONTEXT), 4)}


def boundary_cases(rng: random.Random, arch: str, per_family: int) -> list[tuple[TrainCase, dict]]:
    below, above, tries, seen = [], [], 0, set()
    while len(below) + len(above) < per_family and tries < 600:
        tries += 1
        c = TrainCase(arch, "nf4-dq", rng.choice(("all", "attn")), rng.choice((8, 16, 64)),
                      rng.choice((True, False)), rng.choice((1, 2)),
                      rng.choice((128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)),
                      rng.choice(("adamw_torch", "adamw_8bit")), budget_bytes=BUDGET, role="boundary")
        if c in seen:
            continue
        seen.add(c)
        try:
            v = verdicts(c)
        except Exception:  # noqa: BLE001 - a case the estimator refuses is not a boundary case
            continue
        side = below if v["ratio"] <= 1.0 else above
        if 0.8 <= v["ratio"] <= 1.2 and len(side) < (per_family + 1) // 2:
            side.append((c, v))
    return below + above


def train_job(case: TrainCase, **extra) -> dict:
    from benchmarks.vram.families import train_job as driver_job

    return dict(driver_job(case), **extra)


# GiB a built-on-device inference job may take: its bf16 weights (gpt-oss-20b 39, Gemma-4-E4B 15,
# Granite-4.0-H-Tiny 13) and a 2048-token prefill, with room
BUILT_CLAIM_GIB = {"gpt-oss-20b": 48, "gemma-4-e4b": 24, "granite-4.0-h-tiny": 24}
BUILT_TIMEOUT_S = 300  # a random fill of 21B parameters, then four cases of an eager MoE


def infer_job(arch: str, precision: str, **extra) -> dict:
    built = extra.get("build") == "device"
    job = {"kind": "infer", "arch": arch, "precision": precision, "name": f"infer-{arch}-{precision}",
           "claim": BUILT_CLAIM_GIB.get(arch, 16) * 2**30, "shapes": SHAPES}
    return dict(job, **({"timeout_s": BUILT_TIMEOUT_S} if built else {}), **extra)


def jobs(trained=TRAINED, built=BUILT_ON_DEVICE, boundary=BOUNDARY, fused=FUSED, per_family=PER_FAMILY) -> list[dict]:
    rng = random.Random(SEED)
    bounds = [train_job(c, verdict=v) for arch in boundary for c, v in boundary_cases(rng, arch, per_family)]
    rng.shuffle(bounds)
    infer = [infer_job(a, p) for a in trained for p in ("bf16", "nf4-dq")]
    infer += [infer_job(a, "bf16", build="device") for a in built]
    train = [train_job(c) for a in trained for c in matrix_cases(a)]
    fla = [dict(j, name=j["name"] + "-fla", pythonpath=FUSED_PATH, kernels="flash-linear-attention")
           for j in [train_job(c) for c in matrix_cases(fused)] + [infer_job(fused, "bf16")]] if fused else []
    # the big builds first (they take the longest), boundary cases spread through the rest
    rest = infer[:len(trained) * 2] + train + fla
    step = max(1, len(rest) // max(1, len(bounds)))
    for i, b in enumerate(bounds):
        rest.insert(i * (step + 1), b)
    return infer[len(trained) * 2:] + rest


# What the first hold (families run 20) did not reach, for the next: the fused-kernel jobs (queued
# last, killed at the deadline), then the QLoRA steps of the families built on the GPU there; here
# their bf16 checkpoints are saved on the device (Gemma-4-E4B 15 GiB, Granite 13 GiB). Not gpt-oss-20b:
# its bf16 checkpoint (39 GiB) does not fit the 64 GiB disk beside them, and the driver claims
# 117-154 GiB for its steps (families.train_job), more than a lent card's pool.
NEXT_TRAINED = ("gemma-4-e4b", "granite-4.0-h-tiny")


def next_jobs() -> list[dict]:
    """The next hold's jobs: the fused-kernel ones, then the two QLoRA matrices, families
    alternating so a run cut short keeps some of each."""
    fla = [j for j in jobs(trained=(), built=(), boundary=()) if j["name"].endswith("-fla")]
    per_family = [[train_job(c) for c in matrix_cases(a)] for a in NEXT_TRAINED]
    return fla + [j for pair in zip(*per_family) for j in pair]


# the reference names' tiny twins (harness.memory.vllm.vllm_tiny: the same layer kinds, shrunk)
TINY_TWIN = {"gemma-3-1b": "gemma3", "gemma-3-4b": "gemma3", "gemma-4-e2b": "gemma4-shared", "gemma-4-e4b": "gemma4",
             "qwen3.5-2b": "qwen3.5", "qwen3.5-4b": "qwen3.5", "lfm2-1.2b": "lfm2", "granite-4.0-h-tiny": "granite4h",
             "gpt-oss-20b": "gpt-oss"}


def tiny_configs(folder: Path) -> dict[str, str]:
    """Tiny twins of the families' reference configs for a CPU dry run of the same code paths;
    {reference name: config path}."""
    from harness.memory.vllm.vllm_tiny import tiny_family_config

    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in TRAINED + BUILT_ON_DEVICE:
        path = folder / f"tiny-{name}.json"
        ids = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}  # inside the tiny vocabulary
        atomic.write_json(path, tiny_family_config(TINY_TWIN[name], 2048, ids))
        out[name] = str(path)
    return out


def tiny_jobs(folder: Path) -> list[dict]:
    """The same kinds of job on shrunk configs, for `families.py --device cpu`: no cap, no fused path."""
    paths = tiny_configs(folder)
    out = []
    for j in jobs(boundary=(), fused=None):
        if j["kind"] == "train" and j["case"]["seq_len"] != LENGTHS[0]:
            continue
        arch = paths[j["arch"]]
        j = dict(j, arch=arch, claim=2**28)
        if j["kind"] == "train":
            j["case"] = asdict(replace(TrainCase(**j["case"]), arch=arch, seq_len=32, steps=1))
        else:
            j["shapes"] = {"prefill_lens": [32], "batches": [1], "generate": [[16, 4]]}
        out.append(j)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "measurements" / "vram" / "this-year-jobs.json"))
    ap.add_argument("--tiny", metavar="DIR", help="shrunk configs in DIR and jobs over them, for a CPU dry run")
    ap.add_argument("--next", action="store_true", help="the next hold's jobs (what run 20 did not reach)")
    args = ap.parse_args(argv)
    drawn = tiny_jobs(Path(args.tiny)) if args.tiny else next_jobs() if args.next else jobs()
    atomic.write_json(Path(args.out), {"job_set": JOB_SET, "jobs": drawn})
    kinds = Counter(j["case"]["role"] if "case" in j else j["kind"] for j in drawn)
    print(f"{len(drawn)} jobs {dict(kinds)} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
