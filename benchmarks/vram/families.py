"""Issue 27 on a GPU: memory truth for the families people fine-tune now, in one short call.

    python benchmarks/vram/families.py --out DIR [--time-limit-s 300] [--smoke]

Every case runs in a fresh process (the training cases through harness.memory.measured.train_matrix, the
snapshot cases through harness.memory.measured.snapshot_case), several at once on the one GPU; each writes
its own row, DIR/rows/<n>-<name>.json, atomically, so a run cut short keeps every finished case.
The inference cases of a family and precision share one process (harness.memory.measured.matrix's Worker:
one load, then prefill and generate cases measured one after the other, as the committed inference
matrix was). Most valuable first: the two snapshot cases (one QLoRA step and one generation of
Gemma-2), then the training matrix of the problem families (Gemma-2, Gemma-3) with the 6 GiB
boundary cases interleaved, then the other families, then inference. The driver starts no case
once less than CASE_MIN_S is left and kills what still runs at the deadline; DIR/DONE is written
last, with the counts.

Held out of any fit (never used to choose a coefficient): qwen3-1.7b and phi-4-mini, and the second
run's mistral-7b-v0.3 and qwen3-30b-a3b (FIT_EXCLUDED).

`--set` (default: $FAMILIES_SET, else "issue27") picks the job set: "issue27", the first run above;
"mistral-moe", the second (measurements/vram/families/run-02): Mistral-7B v0.3's QLoRA training
matrix with >= 12 plan --train 6 GiB boundary cases interleaved, Qwen3-30B-A3B's bf16 inference on
the whole GPU (prefill and generate, built on the GPU by harness.memory.measured.moe_case: no 61 GB
checkpoint) and its `plan --offload` placement run for real under a 6 GiB cap (weights of the
offloaded layers in host RAM), then Mistral's inference at bf16 and nf4-dq. The MoE cases start
while Mistral's random checkpoint is still being saved. "fresh", the third
(measurements/vram/families/run-03): out-of-sample checks of the recomputed-layer model
(harness/memory/fit/recompute.py): two Mistral-7B steps with the allocator's history (the largest
blocks at the peak), its checkpointed batch-2 QLoRA steps at new lengths and ranks, and 30 plan --train boundary cases under the 6 GiB card (6 per family: Mistral-7B, Gemma-2,
Gemma-3, Qwen3, Phi-4-mini; half predicted to fit, within 12% of the verdict), none at a setting a
committed row ran. "reserve", the fourth (measurements/vram/families/run-04): 36 fresh boundary
cases for the training reserve of estimate.REALLOCATED_HOLES (reserve_jobs); "reserve2", the fifth
(run-05): 36 more, drawn after the reserve was chosen again over all 186 committed
cases; "diagnose5", the sixth (run-06): the fifth run's four predicted fits that ran
out, again capped (the allocator's counters at the OOM), capped with expandable segments, and
uncapped, with phi-4-mini's all-linear ranks (diagnose_jobs); "reserve3", the seventh
(run-07): 36 fresh boundary cases for the reserve with the upcast's hole, then each
refusal again with expandable segments; "expandable", the eighth (run-08): 36 fresh
boundary cases of the verdict with expandable segments, run with them (expandable_jobs); "under",
the ninth (run-09): the steps whose peak the estimate puts 2-3% low, recorded with
the allocator's history (under_jobs); "again", the tenth (run-10): 36 more fresh
boundary cases of each verdict, nothing changed (again_jobs); "under2", the eleventh
(run-11): the ninth run's steps and the expandable verdict's one false fit, recorded
again with every allocation live at the peak grouped by the stack that made it (snapshot.peak_groups);
"again2", the twelfth (run-12): 36 fresh boundary cases of each verdict after the
recomputed layer's peak gained what those snapshots showed (again_jobs); "again3", the thirteenth
(run-13): 36 more of each, nothing changed (again_jobs); "planlimit", the nineteenth
(run-19): plan --train's replayed context limits and ~1% past them, two recipes per
family (plan_limit_jobs, drawn by plan_limit_cases.py). `--list` prints the jobs with each case's prediction and verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import atomic  # noqa: E402
from harness.memory.fit.budget import EXPANDABLE_SEGMENTS  # noqa: E402
from harness.memory.measured.train_matrix import TrainCase  # noqa: E402

# The job sets are data (measurements/vram/jobs/families-sets.json): each --set's architectures and,
# for the sets drawn from a seed, the seeds; the drawing below stays code.
JOB_SETS = json.loads((ROOT / "measurements" / "vram" / "jobs" / "families-sets.json").read_text())
FAMILIES = tuple(JOB_SETS["families"])
FIT_EXCLUDED = tuple(JOB_SETS["fit_excluded"])
BOUNDARY_FAMILIES = tuple(JOB_SETS["boundary_families"])  # the six of the boundary sets
SETS = {name: tuple(s["archs"]) for name, s in JOB_SETS["sets"].items()}
BUILT_ON_DEVICE = tuple(JOB_SETS["built_on_device"])  # no checkpoint: harness.memory.measured.moe_case builds it where it runs
MOE_CLAIM = 72 * 2**30  # 57 GiB of bf16 weights + a 4096 x 2 prefill, with room
OFFLOAD_TIMEOUT_S = 280  # 57 GB built in host RAM, then every token copies it host -> device
BUDGET = 6 * 2**30
ASSUMED_CONTEXT = 640 * 2**20
CASE_TIMEOUT_S = 150
CASE_MIN_S = 35  # a fresh process needs ~15-25 s to import, load and step
GPU_POOL = 125 * 2**30  # where the card is unknown (CPU dry runs): the H200's pool
POOL_SHARE = 0.89  # of the card the running jobs' claims may fill (125 of the H200's 139.8 GiB): the
# rest is the CUDA contexts. An H100 run with the H200's 125 GiB ran every job out of memory (run-21)
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


def matrix_cases(arch: str, shapes=((512, 1), (1024, 1), (2048, 1), (1024, 2))) -> list[TrainCase]:
    """nf4-dq QLoRA: {all-linear, attention} x r {8, 64} x checkpointing {on, off}, the length and
    batch rotated through `shapes` (seq, batch) so each family spans them."""
    out, i = [], 0
    for gc_on in (True, False):
        for targets in ("all", attn_targets(arch)):
            for r in (8, 64):
                seq, batch = shapes[i % len(shapes)]
                i += 1
                out.append(TrainCase(arch, "nf4-dq", targets, r, gc_on, batch, seq, "adamw_torch"))
    return out


def boundary_cases(rng: random.Random, per_family: int, families=FAMILIES) -> list[TrainCase]:
    """Per family, cases whose `plan --train` verdict (planned x (1 + reserve) against 6 GiB -
    context) lies within +-25% of the cap, half on each side: the real OOM under the cap is the
    truth."""
    from harness.memory.fit.estimate import RESERVE_FRACTION, estimate
    from harness.memory.fit.shape import model_shape

    out: list[TrainCase] = []
    for arch in families:
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
    from harness.memory.fit.estimate import estimate
    from harness.memory.fit.shape import model_shape

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


def expandable_job(case: TrainCase, suffix: str = "-expandable") -> dict:
    """`case` run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (its name + `suffix`)."""
    job = train_job(case)
    return dict(job, env=EXPANDABLE, name=job["name"] + suffix)


def snapshot_train_job(case: TrainCase, suffix: str = "") -> dict:
    """`case` run with the allocator's history recorded (harness.memory.measured.snapshot_case)."""
    return {"kind": "snapshot-train", "arch": case.arch, "case": asdict(case), "claim": claim_bytes(case),
            "name": f"snapshot-train-{case.arch}-{case.targets}-r{case.lora_r}-b{case.batch}-s{case.seq_len}{suffix}"}


def infer_job(arch: str, precision: str) -> dict:
    return {"kind": "infer", "arch": arch, "precision": precision, "name": f"infer-{arch}-{precision}",
            "claim": infer_claim(arch, precision)}


def infer_claim(arch: str, precision: str) -> int:
    """12 GiB for the small families; else 1.3 x the largest predicted case + 1 GiB."""
    if arch in BUILT_ON_DEVICE:
        return MOE_CLAIM
    from harness.memory.fit.estimate import Query, estimate
    from harness.memory.fit.shape import model_shape

    try:
        shape = _SHAPES.setdefault(arch, model_shape(arch))
        seq, new = INFER["generate"]
        peak = max(estimate(shape, Query(precision, "prefill", seq_len=max(INFER["prefill_lens"]),
                                         batch=max(INFER["batches"]))).peak_bytes,
                   estimate(shape, Query(precision, "generate", seq_len=seq, new_tokens=new,
                                         batch=max(INFER["batches"]))).peak_bytes)
    except Exception:  # noqa: BLE001
        return 24 * 2**30
    return max(12 * 2**30, int(1.3 * peak) + 2**30)


def offload_job(arch: str, budget: int = BUDGET) -> dict:
    return {"kind": "offload", "arch": arch, "budget_bytes": budget, "name": f"offload-{arch}-{budget >> 30}gib",
            "claim": budget + 2**30, "timeout_s": OFFLOAD_TIMEOUT_S}


def interleave(train: list[dict], boundary: list[dict]) -> list[dict]:
    """Boundary cases spread through the training cases: a run cut short still has most of them."""
    train = list(train)
    step = max(1, len(train) // max(1, len(boundary)))
    for i, b in enumerate(boundary):
        train.insert(i * (step + 1), b)
    return train


def mistral_moe_jobs() -> list[dict]:
    """The second run, most valuable first: the MoE's inference on the whole GPU and its offloaded
    run (long: started at once, beside the rest), Mistral's training matrix with its boundary
    cases, then Mistral's inference."""
    arch, moe = SETS["mistral-moe"]
    rng = random.Random(2727)
    boundary = [train_job(c) for c in boundary_cases(rng, 14, (arch,))]
    # a 7B without checkpointing keeps ~20 GiB per 1k tokens: shorter shapes keep claims within the pool
    train = interleave([train_job(c) for c in matrix_cases(arch, ((512, 1), (1024, 1), (1536, 1), (512, 2)))],
                       boundary)
    return ([infer_job(moe, "bf16"), offload_job(moe)] + train
            + [infer_job(arch, "nf4-dq"), infer_job(arch, "bf16")])


# The third run (--set fresh): out-of-sample checks of the recomputed-layer model
# (harness/memory/fit/recompute.py), derived while reading Mistral's rows. Settings no committed row
# ran: other lengths, ranks and batches than the first two runs' boundary and matrix draws.
FRESH_SEQS = (128, 192, 320, 384, 448, 640, 896, 1280, 1792)
FRESH_RANKS = (4, 8, 16, 32, 64)
FRESH_PER_FAMILY = 6
FRESH_RATIO = (0.88, 1.12)  # planned x (1 + reserve) / (6 GiB - context): close to the verdict
# Mistral-7B checkpointed QLoRA at batch 2, uncapped (the rows the model was read against were
# 512 x 2 and 256 x 2): (targets, r, seq)
FRESH_MISTRAL_B2 = (("attn", 16, 384), ("all", 32, 640), ("attn", 8, 896), ("all", 8, 1280), ("attn", 32, 1792))
# Mistral steps recorded with the allocator's history (the largest blocks live at the peak, by the
# code that made them): one where the recomputed layer peaks in the attention's backward (long
# sequence), one where it peaks in the MLP's (short, batch 2): (targets, r, batch, seq)
FRESH_SNAPSHOTS = (("attn", 8, 1, 2560), ("all", 16, 2, 448))


def setting(row: dict) -> tuple:
    """(arch, targets, r, checkpointing, batch, seq, optimizer) of a training row (or asdict(TrainCase))."""
    return tuple(row[k] for k in ("arch", "targets", "lora_r", "grad_checkpointing", "batch", "seq_len", "optimizer"))


def committed_settings(runs: int = 2, truth: bool = False) -> set[tuple]:
    """The settings of every training row of the first `runs` families runs (those before the set
    being drawn), and with `truth` of the truth runs too, so a set stays the same once its own rows
    are committed."""
    import measurements
    from harness.memory.measured import families_truth as T
    from harness.memory.measured.train_matrix import load_truth

    rows = [r for d in measurements.families_runs()[:runs] for r in T.load_rows(d)["train"]]
    return {setting(r) for r in rows + (load_truth(measurements.truth_runs())[0] if truth else [])}


def first_family_first(cases: list[TrainCase], families: tuple[str, ...]) -> list[TrainCase]:
    """The first family's cases (Mistral's: its checkpoint takes longest to save), then the rest
    interleaved by family."""
    return [c for c in cases if c.arch == families[0]] + interleaved_by_family(cases, families[1:])


def interleaved_by_family(cases: list[TrainCase], families: tuple[str, ...]) -> list[TrainCase]:
    """One case of each family in turn, then what the families with more cases have left."""
    per_arch = [[c for c in cases if c.arch == a] for a in families]
    return [c for group in zip(*per_arch) for c in group] + [c for g in per_arch for c in g[min(map(len, per_arch)):]]


def default_ratio(est) -> float:
    """plan --train's need against the 6 GiB card's cap: planned x (1 + the training reserve)."""
    from harness.memory.fit.estimate import RESERVE_FRACTION

    return est.planned_bytes * (1 + RESERVE_FRACTION["train"]) / (BUDGET - ASSUMED_CONTEXT)


def expandable_ratio(est) -> float:
    """The need with expandable segments against the cap: peak x (1 + budget.EXPANDABLE_TRAIN_RESERVE)."""
    from harness.memory.fit.budget import EXPANDABLE_TRAIN_RESERVE

    return est.peak_bytes * (1 + EXPANDABLE_TRAIN_RESERVE) / (BUDGET - ASSUMED_CONTEXT)


def fresh_boundary_cases(rng: random.Random, seen: set[tuple], per_family: int = FRESH_PER_FAMILY,
                         families: tuple[str, ...] = SETS["fresh"], ratio_of=default_ratio) -> list[TrainCase]:
    """Per family, `per_family` cases never run before whose verdict (`ratio_of` an estimate: need /
    cap) lies within FRESH_RATIO of the 6 GiB card's cap, half predicted to fit."""
    from harness.memory.fit.estimate import estimate
    from harness.memory.fit.shape import model_shape

    out: list[TrainCase] = []
    for arch in families:
        shape = model_shape(arch)
        below, above = [], []
        for _ in range(4000):
            if len(below) + len(above) >= per_family:
                break
            c = TrainCase(arch, "nf4-dq", rng.choice(("all", attn_targets(arch))), rng.choice(FRESH_RANKS),
                          rng.random() < 0.8, rng.choice((1, 2, 3)), rng.choice(FRESH_SEQS),
                          rng.choice(("adamw_torch", "adamw_8bit")), budget_bytes=BUDGET, role="boundary")
            key = setting(asdict(c))
            ratio = ratio_of(estimate(shape, c.query()))
            side = below if ratio <= 1.0 else above
            if key in seen or c in below + above or not FRESH_RATIO[0] <= ratio <= FRESH_RATIO[1] \
                    or len(side) >= per_family // 2:
                continue
            side.append(c)
        out += [c for pair in zip(below, above) for c in pair]  # a run cut short keeps both sides
    return out


def fresh_jobs() -> list[dict]:
    """Most valuable first: Mistral's checkpointed batch-2 steps and its boundary cases (they start
    once its checkpoint is saved; the small families' cases fill the slots meanwhile), then the
    other families' boundary cases, interleaved by family."""
    seen = committed_settings()
    rng = random.Random(2728)
    mistral = SETS["fresh"][0]
    b2 = [TrainCase(mistral, "nf4-dq", t, r, True, 2, seq, "adamw_torch") for t, r, seq in FRESH_MISTRAL_B2]
    b2 = [c for c in b2 if setting(asdict(c)) not in seen]
    boundary = fresh_boundary_cases(rng, seen)
    first = [c for c in boundary if c.arch == mistral]
    rest = interleaved_by_family(boundary, SETS["fresh"][1:])
    snaps = [TrainCase(mistral, "nf4-dq", t, r, True, b, seq, "adamw_torch", role="snapshot", steps=2)
             for t, r, b, seq in FRESH_SNAPSHOTS]
    return [snapshot_train_job(c) for c in snaps] + [train_job(c) for c in interleave(b2, first) + rest]


# (seed, runs committed before the set was drawn) of the reserve sets: the fourth run tested the
# reserve chosen on the 150 cases before it, the fifth the same rule's choice over all 186
RESERVE_SETS = {n: (s["seed"], s["runs_before"]) for n, s in JOB_SETS["sets"].items()
                if "seed" in s and "expandable_seed" not in s}


def reserve_jobs(job_set: str = "reserve") -> list[dict]:
    """The fourth and fifth runs (--set reserve, reserve2): fresh plan --train boundary cases for the
    training reserve with the re-allocated blocks' holes (estimate.REALLOCATED_HOLES), drawn after
    it was chosen on the runs before and the truth runs: six families (llama-3.2-3b first run at a
    boundary in the fourth), six cases each, half predicted to fit, none at a committed setting.
    Mistral's first (its checkpoint takes longest to save), the rest interleaved by family."""
    seed, runs = RESERVE_SETS[job_set]
    families = SETS[job_set]
    seen = committed_settings(runs, truth=True)
    boundary = first_family_first(fresh_boundary_cases(random.Random(seed), seen, FRESH_PER_FAMILY, families), families)
    jobs = [train_job(c) for c in boundary]
    if job_set != "reserve3":
        return jobs
    # then each refusal again with expandable segments (role "recheck": not a boundary case twice),
    # whether the fix `explain` names for fragmentation would have let it run
    refused = [replace(c, role="recheck") for c in boundary if "does not fit" in case_verdict(c)]
    return jobs + [expandable_job(c) for c in refused]


# (seed of the default verdict's cases, of the expandable verdict's, runs committed before the set
# was drawn) of the sets that test both verdicts
AGAIN_SETS = {n: (s["seed"], s["expandable_seed"], s["runs_before"]) for n, s in JOB_SETS["sets"].items()
              if "expandable_seed" in s}


def again_jobs(job_set: str = "again") -> list[dict]:
    """The tenth run (--set again): 36 more fresh boundary cases of each verdict, nothing changed
    since the seventh and eighth runs tested them: plan --train's (default allocator), then the
    verdict with expandable segments (run with them); none at a committed setting or each other's.
    The twelfth (again2): the same after the recomputed layer's peak gained the held logits and the
    late backward (estimate.held_logits_bytes, late_backward_bytes); the thirteenth (again3): 36 more
    of each, nothing changed since; the eighteenth (again4): 36 more of the default allocator's only,
    to test the allocator replay (harness.memory.replay.step_trace) on steps it was not corrected on."""
    default_seed, expandable_seed, runs = AGAIN_SETS[job_set]
    families = SETS[job_set]
    seen = committed_settings(runs, truth=True)
    default = fresh_boundary_cases(random.Random(default_seed), seen, FRESH_PER_FAMILY, families)
    if expandable_seed is None:
        return [train_job(c) for c in first_family_first(default, families)]
    seen |= {setting(asdict(c)) for c in default}
    expandable = fresh_boundary_cases(random.Random(expandable_seed), seen, FRESH_PER_FAMILY, families, expandable_ratio)
    return ([train_job(c) for c in first_family_first(default, families)]
            + [expandable_job(c) for c in first_family_first(expandable, families)])


PLAN_LIMIT_CASES = ROOT / "measurements" / "vram" / "plan-limit-cases.json"  # the planlimit job set


def plan_limit_jobs(path: Path = PLAN_LIMIT_CASES) -> list[dict]:
    """The nineteenth run (--set planlimit): per recipe of plan_limit_cases.py, the longest context
    plan --train answers replayed (must fit the 6 GiB card) and the one ~1% of the step past it;
    both boundary cases. Mistral's first, the rest interleaved by family."""
    rows = json.loads(path.read_text())["cases"]
    cases = [TrainCase(r["arch"], "nf4-dq", r["targets"], r["lora_r"], r["grad_checkpointing"], 1, seq, r["optimizer"],
                       budget_bytes=BUDGET, role="boundary")
             for r in rows if r.get("limit") for seq in (r["limit"], r["past"])]
    return [train_job(c) for c in first_family_first(cases, SETS["planlimit"])]


# The fifth run's predicted fits that ran out under the 6 GiB card (arch, targets, r, checkpointing,
# batch, seq, optimizer), and phi-4-mini's all-linear rank series at one shape around its two.
MISSES_5 = (("phi-4-mini", "all", 32, True, 1, 192, "adamw_8bit"), ("phi-4-mini", "all", 32, True, 2, 128, "adamw_8bit"),
            ("qwen3-1.7b", "all", 8, False, 3, 128, "adamw_8bit"), ("gemma-3-1b", "all", 16, False, 1, 384, "adamw_torch"))
PHI_RANKS = (8, 16, 64)
EXPANDABLE = dict([EXPANDABLE_SEGMENTS.split("=", 1)])  # the job's environment: budget's setting


def diagnose_jobs() -> list[dict]:
    """The sixth run (--set diagnose5): why the fifth run's four predicted fits ran out. Each again
    under the 6 GiB card with the allocator's counters recorded at the OOM (role "recheck": not a
    boundary case again), under the card with expandable segments (the fix `explain` names for
    fragmentation), and uncapped (its real peak and how much the allocator held beside it); then
    phi-4-mini's all-linear ranks at 192 x 1 uncapped, and one step of the first miss recorded with
    the allocator's history (where its peak memory went)."""
    out = []
    for arch, targets, r, gc_on, batch, seq, opt in MISSES_5:
        capped = TrainCase(arch, "nf4-dq", targets, r, gc_on, batch, seq, opt, budget_bytes=BUDGET, role="recheck")
        out += [train_job(capped), expandable_job(capped), train_job(TrainCase(arch, "nf4-dq", targets, r, gc_on, batch, seq, opt))]
    out += [train_job(TrainCase("phi-4-mini", "nf4-dq", "all", r, True, 1, 192, "adamw_8bit")) for r in PHI_RANKS]
    arch, targets, r, gc_on, batch, seq, opt = MISSES_5[0]
    snap = TrainCase(arch, "nf4-dq", targets, r, gc_on, batch, seq, opt, role="snapshot", steps=2)
    return out + [snapshot_train_job(snap)]


def expandable_jobs() -> list[dict]:
    """The eighth run (--set expandable): the verdict with expandable segments (budget.fits_expandable)
    on 36 fresh boundary cases, six per family, drawn within FRESH_RATIO of its line, half each side,
    none at a committed setting; each run capped at 6 GiB with PYTORCH_CUDA_ALLOC_CONF set."""
    families = SETS["expandable"]
    seen = committed_settings(7, truth=True)
    boundary = fresh_boundary_cases(random.Random(2732), seen, FRESH_PER_FAMILY, families, expandable_ratio)
    return [expandable_job(c, suffix="") for c in first_family_first(boundary, families)]


# Steps whose peak the estimate puts 2-3% low (the checkpointed Mistral-7B attention-only steps,
# phi-4-mini all-linear r64 at 128 tokens), recorded with the allocator's history, beside one Mistral
# step it puts right: (arch, targets, r, batch, seq, optimizer)
UNDER_SNAPSHOTS = (("mistral-7b-v0.3", "attn", 16, 2, 384, "adamw_torch"),
                   ("mistral-7b-v0.3", "attn", 64, 1, 192, "adamw_8bit"),
                   ("mistral-7b-v0.3", "all", 8, 1, 256, "adamw_torch"),
                   ("phi-4-mini", "all", 64, 1, 128, "adamw_8bit"))


# the expandable verdict's false fit (the eighth run), its peak under-predicted
UNDER2_SNAPSHOTS = UNDER_SNAPSHOTS + (("mistral-7b-v0.3", "all", 32, 1, 128, "adamw_8bit"),)


def under_jobs(snapshots: tuple = UNDER_SNAPSHOTS) -> list[dict]:
    """The ninth run (--set under) and the eleventh (under2): where the under-predicted peaks' bytes
    are (snapshot_case)."""
    return [snapshot_train_job(TrainCase(arch, "nf4-dq", targets, r, True, batch, seq, opt, role="snapshot", steps=2),
                               suffix=f"-{opt}") for arch, targets, r, batch, seq, opt in snapshots]


# Two committed refusals that ran out of memory where a replay of the caching allocator on the step's
# traced allocations (harness.memory.replay.allocator_sim) said they fit: (arch, targets, r, batch, seq, optimizer)
TRACE_CASES = (("phi-4-mini", "all", 32, 1, 128, "adamw_torch"), ("gemma-3-1b", "all", 64, 2, 320, "adamw_torch"))


# Mistral-7B's, where the replay disagreed with what ran both ways: one refusal that ran out and
# the replay let fit, one that fitted and the replay refused
TRACE2_CASES = (("mistral-7b-v0.3", "attn", 8, 2, 320, "adamw_torch"), ("mistral-7b-v0.3", "all", 8, 1, 256, "adamw_torch"))


# The replay's other misses at margin 0, each recorded uncapped: four steps without checkpointing and
# two Mistral-7B attention-only steps that ran out where the replay let them fit, and the two refusals
# it was furthest off that fitted: (arch, targets, r, batch, seq, optimizer, checkpointing)
TRACE3_CASES = (("qwen3-1.7b", "all", 8, 3, 128, "adamw_8bit", False),
                ("llama-3.2-3b", "all", 64, 1, 192, "adamw_8bit", False),
                ("gemma-3-1b", "all", 16, 1, 384, "adamw_torch", False),
                ("llama-3.2-3b", "attn", 4, 1, 320, "adamw_8bit", False),
                ("mistral-7b-v0.3", "attn", 4, 1, 640, "adamw_8bit", True),
                ("mistral-7b-v0.3", "attn", 32, 3, 192, "adamw_8bit", True),
                ("gemma-2-2b", "attn", 4, 2, 192, "adamw_8bit", True),
                ("phi-4-mini", "attn-fused", 4, 1, 384, "adamw_8bit", True))


# The two fitted refusals again, capped as they ran and uncapped: their uncapped histories of the
# sixteenth run, replayed under the cap, ran out (+0.7%, +7.1%) where the capped runs had fitted
TRACE4_CASES = TRACE3_CASES[-2:]


def trace_jobs(cases: tuple = TRACE_CASES, capped_too: bool = True) -> list[dict]:
    """The fourteenth run (--set trace): each case capped at 6 GiB as it ran, and uncapped, with the
    allocator's whole history written beside its row (snapshot_case --trace-out); the fifteenth
    (trace2) and sixteenth (trace3): uncapped only. A case's seventh field, if any, is checkpointing."""
    jobs = []
    for arch, targets, r, batch, seq, opt, *gc in cases:
        checkpointing = gc[0] if gc else True
        capped = TrainCase(arch, "nf4-dq", targets, r, checkpointing, batch, seq, opt, budget_bytes=BUDGET, role="trace")
        both = ((capped, "-capped"),) if capped_too else ()
        gc_suffix = "" if checkpointing else "-gc0"
        for case, suffix in both + ((replace(capped, budget_bytes=None), "-uncapped"),):
            jobs.append(dict(snapshot_train_job(case, suffix=f"{gc_suffix}-{opt}{suffix}"), trace=True))
    return jobs


def case_verdict(case: TrainCase) -> str:
    """The estimate and plan --train's verdict of a case, one line (for --list)."""
    from harness.memory.fit.budget import default_headroom, fits, fits_expandable
    from harness.memory.fit.estimate import estimate
    from harness.memory.fit.shape import model_shape

    est = estimate(model_shape(case.arch), case.query())
    line = f"predicted {est.peak_bytes / 2**30:.2f} GiB"
    if case.budget_bytes:
        ok = fits(est.planned_bytes, case.budget_bytes, ASSUMED_CONTEXT, default_headroom("train"))
        line += f", planned {est.planned_bytes / 2**30:.2f} GiB: {'fits' if ok else 'does not fit'} 6 GiB"
        if not ok:
            line += f" ({'fits' if fits_expandable(est, case.budget_bytes, ASSUMED_CONTEXT) else 'not even'} with expandable segments)"
    return line


def smoke_jobs(job_set: str) -> list[dict]:
    tiny = TrainCase("qwen2.5-0.5b", "bf16", "attn", 8, True, 1, 32, "adamw_torch", steps=1)
    if job_set != "mistral-moe":
        return [train_job(tiny)]
    return [train_job(tiny), dict(infer_job("tiny-moe", "bf16"), claim=2**30), dict(offload_job("tiny-moe"), claim=2**30)]


def all_jobs(smoke: bool = False, job_set: str = "issue27") -> list[dict]:
    if smoke:
        return smoke_jobs(job_set)
    if job_set == "mistral-moe":
        return mistral_moe_jobs()
    if job_set == "fresh":
        return fresh_jobs()
    if job_set in RESERVE_SETS:
        return reserve_jobs(job_set)
    if job_set == "diagnose5":
        return diagnose_jobs()
    if job_set == "expandable":
        return expandable_jobs()
    if job_set == "under":
        return under_jobs()
    if job_set == "under2":
        return under_jobs(UNDER2_SNAPSHOTS)
    if job_set == "trace":
        return trace_jobs()
    if job_set == "trace2":
        return trace_jobs(TRACE2_CASES, capped_too=False)
    if job_set == "trace3":
        return trace_jobs(TRACE3_CASES, capped_too=False)
    if job_set == "trace4":
        return trace_jobs(TRACE4_CASES)
    if job_set in AGAIN_SETS:
        return again_jobs(job_set)
    if job_set == "planlimit":
        return plan_limit_jobs()
    rng = random.Random(27)
    boundary = [train_job(c) for c in boundary_cases(rng, 6)]
    first = snapshot_jobs()
    problem = [train_job(c) for a in ("gemma-2-2b", "gemma-3-1b") for c in matrix_cases(a)]
    others = [train_job(c) for a in ("qwen3-1.7b", "phi-4-mini") for c in matrix_cases(a)]
    infer = [infer_job(a, p) for a in FAMILIES for p in ("nf4-dq", "bf16")]
    jobs = first + infer[:2]
    train = interleave(problem + others, boundary)
    return jobs + train[:12] + infer[2:] + train[12:]


def command(job: dict, model_dir: Path, out: Path, device: str) -> list[str]:
    if job["kind"] == "train":
        return [sys.executable, "-m", "harness.memory.measured.train_matrix", "--case", json.dumps(job["case"]),
                "--model-dir", str(model_dir), "--out", str(out), "--device", device]
    if job["kind"].startswith("snapshot"):
        flag = "--train" if job["kind"] == "snapshot-train" else "--generate"
        trace = ["--trace-out", str(out.with_suffix(".trace.json.gz"))] if job.get("trace") else []
        return [sys.executable, "-m", "harness.memory.measured.snapshot_case", flag, json.dumps(job["case"]),
                "--model-dir", str(model_dir), "--out", str(out), "--device", device, *trace]
    if job["kind"] == "offload":
        spec = job["arch"] if job["arch"] in BUILT_ON_DEVICE else str(model_dir)
        return [sys.executable, "-m", "harness.memory.measured.moe_case", "--offload", spec, "--budget-bytes",
                str(job["budget_bytes"]), "--out", str(out), "--device", device]
    shapes = ["--infer-shapes", json.dumps(job["shapes"])] if job.get("shapes") else []
    return [sys.executable, str(Path(__file__).resolve()), "--infer-worker", job["arch"], "--precision",
            job["precision"], "--model-dir", str(model_dir), "--out", str(out), "--device", device, *shapes]


# ---------------------------------------------------------------------------------------------
# Inference worker (one process per family and precision)


def infer_worker(arch: str, precision: str, model_dir: Path, out: Path, device: str, deadline: float,
                 shapes: dict | None = None) -> None:
    """`shapes` ({"prefill_lens", "batches", "generate"}, from the job) replaces INFER's."""
    from harness.memory.measured import matrix

    shapes = dict(INFER, **(shapes or {}))
    matrix.PREFILL_LENS, matrix.BATCHES = tuple(shapes["prefill_lens"]), tuple(shapes["batches"])
    matrix.GENERATE = shapes["generate"]
    work = out.parent / (out.stem + ".d")
    work.mkdir(parents=True, exist_ok=True)
    import torch

    total = torch.cuda.get_device_properties(0).total_memory if device.startswith("cuda") else 0
    w = matrix.Worker(arch, work, total or BUDGET, deadline, model_dir.parent, (precision,), False, device=device)
    w.model_dir = lambda: model_dir  # the driver saved it
    if model_dir.suffix == ".json":  # a config, no checkpoint (the MoE): built on the device, random
        from harness.memory.measured.moe_case import build_random

        w.load = lambda p, capped: w.measured(lambda: build_random(str(model_dir), device, dtype=p), capped)
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
        path = root / model_folder(arch)
        if (path / "config.json").exists():
            continue
        code = ("from harness.models import save_random_model; "
                f"save_random_model({arch!r}, {str(path)!r}, dtype='bf16', device={device!r})")
        log_path = root.parent / f"save-{model_folder(arch)}.log" if log_dir is None else log_dir / f"save-{model_folder(arch)}.log"
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
    return {a: root / model_folder(a) for a in archs
            if a not in failed and (root / model_folder(a) / "config.json").exists()}


def model_folder(arch: str) -> str:
    """The checkpoint's folder name: the reference name, or a config file's stem (CPU dry runs)."""
    return Path(arch).name.removesuffix(".json")


def pool_bytes(total_bytes: int | None) -> int:
    """What the running jobs' claims may add up to on a card of total_bytes."""
    return int(total_bytes * POOL_SHARE) if total_bytes else GPU_POOL


def has_room(claim: int, used: int, saving_bytes: int, pool: int, running: bool) -> bool:
    """Whether a job of `claim` may start beside the running jobs' `used` and the checkpoints being
    built on the card (`saving_bytes`): alone on an idle card it always may."""
    return (not running and not saving_bytes) or used + saving_bytes + claim <= pool


def run_jobs(jobs: list[dict], model_dirs: dict, out_dir: Path, device: str, deadline: float, slots: int,
             saving: set | None = None, pool: int = GPU_POOL) -> dict:
    """`saving`: architectures whose checkpoint a background thread is still writing (it adds them
    to model_dirs when done, then removes them from `saving`): their jobs wait, the others start,
    while the model being built on the card counts against `pool` (its bf16 inference claim)."""
    rows_dir = out_dir / "rows"
    logs = out_dir / "logs"
    rows_dir.mkdir(parents=True, exist_ok=True)
    logs.mkdir(exist_ok=True)
    saving = saving if saving is not None else set()
    pending = [j for j in jobs if j["arch"] in model_dirs or j["arch"] in saving]
    running: dict[int, tuple] = {}
    used, n, counts = 0, 0, {"done": 0, "timeout": 0, "no_row": 0, "skipped": len(jobs) - len(pending)}
    save_claims = {a: infer_claim(a, "bf16") for a in saving} if device.startswith("cuda") else {}

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
            elif now - started > job.get("timeout_s", CASE_TIMEOUT_S) or now > deadline:
                finish(pid, True)
        if deadline - now < CASE_MIN_S:
            counts["skipped"] += len(pending)
            pending = []
        started_one = False
        lost = [j for j in pending if j["arch"] not in model_dirs and j["arch"] not in saving]  # save failed
        counts["skipped"] += len(lost)
        pending = [j for j in pending if j not in lost]
        while len(running) < slots:
            ready = [j for j in pending if j["arch"] in model_dirs]
            saving_bytes = sum(save_claims.get(a, 0) for a in list(saving))
            if not ready or not has_room(ready[0]["claim"], used, saving_bytes, pool, bool(running)):
                break
            job = ready[0]
            pending.remove(job)
            n += 1
            out = rows_dir / f"{n:03d}-{job['name']}.json"
            env = dict(py_env(), **job.get("env", {}))
            if job.get("pythonpath"):  # e.g. the fused kernels, installed apart so other jobs run without them
                env["PYTHONPATH"] = os.pathsep.join((job["pythonpath"], env["PYTHONPATH"]))
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


TINY_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 512, "max_position_embeddings": 2048,
            "tie_word_embeddings": False, "norm_topk_prob": True}


def model_dirs_for(job_set: str, smoke: bool, out: Path, model_root: Path, device: str,
                   jobs: list[dict] | None = None, save_limit_s: float = 90) -> tuple[dict, set]:
    """{arch: model dir or config path} ready now, and the archs a background thread still saves.
    A job set kept as data names its own architectures; a job with "build": "device" gets no
    checkpoint (built with random weights where it runs)."""
    if smoke:
        from harness.models import tiny_model_dir

        cfg = out / "tiny-moe.json"
        atomic.write_json(cfg, TINY_MOE)
        return {"qwen2.5-0.5b": tiny_model_dir("qwen2"), "tiny-moe": cfg}, set()
    from harness.models import reference_config_path

    def config_path(arch: str) -> Path:  # a reference name, or a config file's path (CPU dry runs)
        return Path(arch) if arch.endswith(".json") else reference_config_path(arch)

    (out / "logs").mkdir(exist_ok=True)
    if job_set in SETS:
        archs, on_device = SETS[job_set], set(BUILT_ON_DEVICE)
    else:
        archs = tuple(dict.fromkeys(j["arch"] for j in jobs or ()))
        on_device = {j["arch"] for j in jobs or () if j.get("build") == "device"}
    dirs = {a: config_path(a) for a in archs if a in on_device}
    to_save = [a for a in archs if a not in on_device]
    saving = set(to_save)

    def save() -> None:
        try:
            dirs.update(save_models(to_save, model_root, device, T0 + save_limit_s, out / "logs"))
        finally:
            saving.clear()

    threading.Thread(target=save, daemon=True).start()
    return dirs, saving


def jobs_from(spec: str, default_set: str) -> tuple[str, list[dict]]:
    """(job set, jobs) of a job set kept as data: a jobs.json file, or a run (directory, archive or
    measurements/ name) whose jobs.json and environment.json (its job_set) are read."""
    path = Path(spec)
    if path.is_file():  # a list of jobs, or {"job_set": name, "jobs": [...]}
        data = json.loads(path.read_text())
        return (data["job_set"], data["jobs"]) if isinstance(data, dict) else (default_set, data)
    import measurements

    run = measurements.run_dir(spec)
    jobs_file = next(iter(sorted(run.rglob("jobs.json"))), None)
    if jobs_file is None:
        raise SystemExit(f"--jobs {spec}: no jobs.json in {run}")
    env_file = jobs_file.with_name("environment.json")
    job_set = (json.loads(env_file.read_text()).get("job_set") if env_file.is_file() else None) or default_set
    return job_set, json.loads(jobs_file.read_text())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--set", default=os.environ.get("FAMILIES_SET") or "issue27", choices=sorted(SETS),
                    help="the job set (default: $FAMILIES_SET, else issue27)")
    ap.add_argument("--time-limit-s", type=float, default=300)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--model-root", default="/tmp/families-models")
    ap.add_argument("--slots", type=int, default=10)
    ap.add_argument("--smoke", action="store_true", help="CPU: tiny cases of the set's kinds through the scheduler")
    ap.add_argument("--list", action="store_true", help="print the jobs in order and exit")
    ap.add_argument("--jobs", help="run a job set kept as data instead of drawing --set: a jobs.json, a run "
                    "directory, or a committed run (vram/families/run-10); its set is the run's job_set")
    ap.add_argument("--infer-worker", help=argparse.SUPPRESS)
    ap.add_argument("--precision", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--infer-shapes", help=argparse.SUPPRESS)
    ap.add_argument("--save-limit-s", type=float, default=90,
                    help="seconds the random checkpoints may take to save (default 90)")
    args = ap.parse_args(argv)
    if args.infer_worker:
        deadline = float(os.environ.get("FAMILIES_DEADLINE", time.time() + 120))
        shapes = json.loads(args.infer_shapes) if args.infer_shapes else None
        infer_worker(args.infer_worker, args.precision, Path(args.model_dir), Path(args.out), args.device,
                     deadline - 10, shapes)
        return 0
    if args.jobs:
        args.set, jobs = jobs_from(args.jobs, args.set)
    else:
        jobs = all_jobs(args.smoke, args.set)
    if args.list:
        for j in jobs:
            verdict = f"  {case_verdict(TrainCase(**j['case']))}" if j["kind"] in ("train", "snapshot-train") else ""
            print(f"{j['name']}  claim {j['claim'] / 2**30:.1f} GiB{verdict}")
        return 0
    deadline = T0 + args.time_limit_s
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / "jobs.json", jobs)
    from harness.memory.measured.train_matrix import environment

    env_info = dict(environment(args.device), fit_excluded=list(FIT_EXCLUDED), budget_bytes=BUDGET, job_set=args.set)
    atomic.write_json(out / "environment.json", env_info)
    log(f"{len(jobs)} jobs ({args.set}); environment {env_info}")
    model_dirs, saving = model_dirs_for(args.set, args.smoke, out, Path(args.model_root), args.device,
                                        jobs if args.jobs else None, args.save_limit_s)
    pool = pool_bytes(env_info.get("total_bytes"))
    log(f"claims pool {pool / 2**30:.1f} GiB of the card's {(env_info.get('total_bytes') or 0) / 2**30:.1f} GiB")
    counts = run_jobs(jobs, model_dirs, out, args.device, deadline, args.slots, saving, pool)
    log(f"finished: {counts}")
    atomic.write_json(out / "DONE", dict(counts, seconds=round(time.time() - T0, 1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
