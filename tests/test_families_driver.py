"""The H200 families run as planned (benchmarks/vram/families.py): its jobs, in the order a run cut
short still covers most, with LoRA targets every family really has, 24 boundary cases on both
sides of plan --train's verdict, and commands that name real modules."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from harness.memory.fit.budget import default_headroom, fits
from harness.memory.fit.estimate import estimate
from harness.memory.fit.lora import resolve_lora_targets
from harness.memory.fit.shape import model_shape
from harness.memory.measured.train_matrix import FAMILY_TARGET_SETS, TrainCase

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def driver():
    spec = importlib.util.spec_from_file_location("families_driver", ROOT / "benchmarks" / "vram" / "families.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def jobs(driver):
    return driver.all_jobs()


def test_snapshots_first_then_the_problem_families(jobs):
    assert [j["kind"] for j in jobs[:2]] == ["snapshot-train", "snapshot-generate"]
    train = [j for j in jobs if j["kind"] == "train" and j["case"]["role"] == "matrix"]
    first_other = next(i for i, j in enumerate(train) if j["arch"] not in ("gemma-2-2b", "gemma-3-1b"))
    assert all(j["arch"] in ("gemma-2-2b", "gemma-3-1b") for j in train[:first_other]) and first_other == 16
    assert len({j["name"] for j in jobs}) == len(jobs)


def test_every_case_targets_modules_its_family_has(jobs):
    for j in jobs:
        if j["kind"] not in ("train", "snapshot-train"):
            continue
        case = TrainCase(**j["case"])
        targets = resolve_lora_targets(model_shape(case.arch), FAMILY_TARGET_SETS[case.targets])
        assert not targets.unmatched and targets.modules > 0, j["name"]


def test_boundary_cases_straddle_the_6gib_verdict(driver, jobs):
    boundary = [TrainCase(**j["case"]) for j in jobs if j["kind"] == "train" and j["case"]["role"] == "boundary"]
    assert len(boundary) >= 20
    for arch in driver.FAMILIES:
        mine = [c for c in boundary if c.arch == arch]
        verdicts = [fits(estimate(model_shape(c.arch), c.query()).planned_bytes, c.budget_bytes,
                         driver.ASSUMED_CONTEXT, default_headroom("train")) for c in mine]
        assert len(mine) == 6 and sum(verdicts) == 3, arch


def test_commands_name_modules_that_exist(driver, jobs, tmp_path):
    seen = set()
    for j in jobs:
        cmd = driver.command(j, tmp_path / j["arch"], tmp_path / "out.json", "cuda:0")
        assert cmd[0] == sys.executable
        target = cmd[2] if cmd[1] == "-m" else cmd[1]
        seen.add(target)
    assert seen == {"harness.memory.measured.train_matrix", "harness.memory.measured.snapshot_case",
                    str(ROOT / "benchmarks" / "vram" / "families.py")}
    for module in ("harness.memory.measured.train_matrix", "harness.memory.measured.snapshot_case"):
        assert importlib.util.find_spec(module) is not None
    assert set(driver.FIT_EXCLUDED) <= set(driver.FAMILIES) | set(driver.SETS["mistral-moe"])


# ---------------------------------------------------------------------------------------------
# The second run (--set mistral-moe)


@pytest.fixture(scope="module")
def second(driver):
    return driver.all_jobs(job_set="mistral-moe")


def test_mistral_moe_set_runs_the_moe_first_then_mistral_training_and_boundary_cases(driver, second):
    assert [j["kind"] for j in second[:2]] == ["infer", "offload"] and second[0]["arch"] == "qwen3-30b-a3b"
    assert second[0]["claim"] >= 60 * 2**30  # 57 GiB of bf16 weights on the GPU
    train = [j for j in second if j["kind"] == "train"]
    assert second[2:2 + len(train)] == train  # the training cases before Mistral's inference
    matrix = [TrainCase(**j["case"]) for j in train if j["case"]["role"] == "matrix"]
    assert {(c.targets, c.lora_r, c.grad_checkpointing) for c in matrix} == {
        (t, r, g) for t in ("all", "attn") for r in (8, 64) for g in (True, False)}
    assert [j["kind"] for j in second[-2:]] == ["infer", "infer"]
    assert set(driver.SETS["mistral-moe"]) <= set(driver.FIT_EXCLUDED)
    assert len({j["name"] for j in second}) == len(second)


def test_mistral_moe_set_boundary_cases_straddle_the_6gib_verdict(driver, second):
    mine = [TrainCase(**j["case"]) for j in second if j["kind"] == "train" and j["case"]["role"] == "boundary"]
    verdicts = [fits(estimate(model_shape(c.arch), c.query()).planned_bytes, c.budget_bytes,
                     driver.ASSUMED_CONTEXT, default_headroom("train")) for c in mine]
    assert len(mine) >= 10 and {c.arch for c in mine} == {"mistral-7b-v0.3"}
    # half predicted to fit when the set was drawn (5 of 11); the estimate has moved since (4 of 11
    # after the recomputed layer's held logits and late backward): both sides must still be there
    assert 0 < sum(verdicts) < len(mine)


def test_mistral_moe_set_commands(driver, second, tmp_path):
    from harness.models import reference_config_path

    for j in second:
        where = reference_config_path(j["arch"]) if j["arch"] in driver.BUILT_ON_DEVICE else tmp_path / j["arch"]
        cmd = driver.command(j, where, tmp_path / "out.json", "cuda:0")
        if j["kind"] == "offload":
            assert cmd[1:4] == ["-m", "harness.memory.measured.moe_case", "--offload"] and cmd[4] == "qwen3-30b-a3b"
            assert importlib.util.find_spec("harness.memory.measured.moe_case") is not None
        elif j["kind"] == "infer" and j["arch"] in driver.BUILT_ON_DEVICE:
            assert cmd[cmd.index("--model-dir") + 1].endswith("qwen3-30b-a3b.json")  # built, not loaded


def test_the_fresh_set_checks_new_settings_on_both_sides_of_the_verdict(driver):
    """--set fresh: >= 20 boundary cases never run before, about half predicted to fit, over the
    five new families, and Mistral's checkpointed batch-2 steps at new settings, Mistral first."""
    jobs = driver.all_jobs(job_set="fresh")
    assert [j["kind"] for j in jobs[:2]] == ["snapshot-train", "snapshot-train"]
    cases = [TrainCase(**j["case"]) for j in jobs]
    seen = driver.committed_settings()
    assert all((c.arch, c.targets, c.lora_r, c.grad_checkpointing, c.batch, c.seq_len, c.optimizer) not in seen
               for c in cases)
    boundary = [c for c in cases if c.role == "boundary"]
    verdicts = [fits(estimate(model_shape(c.arch), c.query()).planned_bytes, c.budget_bytes,
                     driver.ASSUMED_CONTEXT, default_headroom("train")) for c in boundary]
    assert len(boundary) >= 20 and abs(sum(verdicts) - len(boundary) / 2) <= 2
    assert {c.arch for c in boundary} == set(driver.SETS["fresh"])
    b2 = [c for c in cases if c.role == "matrix"]
    assert len(b2) >= 3 and all(c.arch == "mistral-7b-v0.3" and c.batch == 2 and c.grad_checkpointing for c in b2)
    assert cases[2].arch == "mistral-7b-v0.3" and len({j["name"] for j in jobs}) == len(jobs)


def test_the_planlimit_set_runs_each_replayed_limit_and_one_percent_past_it(driver, monkeypatch):
    """--set planlimit (the nineteenth run): per recipe of plan-limit-cases.json, batch 1 at plan
    --train's replayed limit and at the first length ~1% of the step past it, Mistral's first; the
    recipes are the ones plan_limit_cases.py draws from its seed, none run at batch 1 before."""
    import json
    import random

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "vram"))
    import plan_limit_cases

    rows = json.loads(driver.PLAN_LIMIT_CASES.read_text())["cases"]
    cases = [TrainCase(**j["case"]) for j in driver.plan_limit_jobs()]
    planned = [r for r in rows if r["limit"]]
    assert len(cases) == 2 * len(planned) >= 20 and {c.arch for c in cases} == set(driver.SETS["planlimit"])
    assert all(c.batch == 1 and c.role == "boundary" and c.budget_bytes == driver.BUDGET for c in cases)
    for r in planned:
        assert r["closed"] and r["past"] > r["limit"]
        mine = sorted(c.seq_len for c in cases if (c.arch, c.targets, c.lora_r, c.optimizer)
                      == (r["arch"], r["targets"], r["lora_r"], r["optimizer"]))
        assert mine == [r["limit"], r["past"]]
    assert cases[0].arch == "mistral-7b-v0.3" and len({c.key for c in cases}) == len(cases)
    drawn = plan_limit_cases.recipes(random.Random(plan_limit_cases.PLANLIMIT_SEED), plan_limit_cases.committed())
    assert drawn == [{k: r[k] for k in drawn[0]} for r in rows]


def test_a_committed_job_set_is_data_the_driver_runs_again(driver):
    """--jobs: the driver takes a run's jobs.json (a committed run, measurements/vram/families/) as its
    job set, in order, with the run's own set (model builds follow it)."""
    import measurements

    job_set, jobs = driver.jobs_from("vram/families/run-10", "issue27")
    kept = json.loads(next(measurements.unpacked("vram/families/run-10").rglob("jobs.json")).read_text())
    assert job_set == "again" and jobs == kept and len(jobs) == len({j["name"] for j in jobs}) > 0


def test_the_claims_pool_is_the_cards_and_counts_checkpoints_being_built(driver):
    h200, h100 = 150_109_880_320, 85_017_493_504  # the two lent cards' total_memory
    assert driver.pool_bytes(h200) == pytest.approx(driver.GPU_POOL, rel=0.01)
    assert driver.pool_bytes(h100) < h100 - 8 * 2**30  # the H100 run of the H200's pool ran every job out
    assert driver.pool_bytes(None) == driver.GPU_POOL
    pool, gib = driver.pool_bytes(h100), 2**30
    assert driver.has_room(30 * gib, 0, 0, pool, running=False)  # alone on an idle card: always
    assert driver.has_room(200 * gib, 0, 0, pool, running=False)
    assert driver.has_room(20 * gib, 30 * gib, 0, pool, running=True)
    assert not driver.has_room(20 * gib, 30 * gib, 25 * gib, pool, running=True)  # a checkpoint is on the card
    assert not driver.has_room(50 * gib, 0, 25 * gib, pool, running=False)
