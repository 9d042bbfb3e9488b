"""The loop the verdict benchmarks share (replay_verdicts.py, plan_verdicts.py): boundary cases
worked through in spawned processes, each row written as it comes (atomic writes), and a rerun
resuming from the rows already there."""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections.abc import Callable
from pathlib import Path

from harness import atomic


def case_key(row: dict, run: str) -> str:
    """A boundary case's setting and run, one string."""
    return "|".join(str(row.get(k)) for k in ("arch", "targets", "lora_r", "grad_checkpointing", "batch", "seq_len",
                                              "optimizer")) + f"|{run}"


def replayed_limit_of(r: dict, axis: str):
    """(plan, shape, recipe, found): plan --train's reserve-rule plan and its `axis` limit replayed
    for a families row's recipe (arch, targets, lora_r, grad_checkpointing, optimizer, precision,
    budget_bytes, context_bytes, seq_len as --batch-seq-len; the attention as its transformers ran it)."""
    from harness.memory.fit import budget as B
    from harness.memory.fit.estimate import Query
    from harness.memory.family.families import at_transformers
    from harness.memory.replay.replay_limits import StepReplayer, limit_search
    from harness.memory.fit.shape import model_shape
    from harness.memory.fit.config_file import load_config
    from harness.memory.measured.train_matrix import FAMILY_TARGET_SETS

    config = load_config(r["arch"])[0]
    shape = at_transformers(model_shape(r["arch"]), r.get("transformers"))
    recipe = Query(r["precision"], "train", lora_r=r["lora_r"], lora_targets=FAMILY_TARGET_SETS[r["targets"]],
                   grad_checkpointing=r["grad_checkpointing"], optimizer=r["optimizer"])
    limit = B.context_limit(config)
    (plan,) = B.plan(shape, r["budget_bytes"], train=True, precisions=(r["precision"],),
                     context_bytes=r["context_bytes"], reference_seq_len=r["seq_len"], lora_r=recipe.lora_r,
                     lora_targets=recipe.lora_targets, grad_checkpointing=recipe.grad_checkpointing,
                     optimizer=recipe.optimizer, max_seq_len=limit.tokens)
    replayer = StepReplayer(config, shape, recipe, r["budget_bytes"], r["context_bytes"], transformers=r.get("transformers"))
    found = limit_search(plan, shape, replayer, axis, lo_seq=B.TRAIN_MIN_SEQ, hi_seq=limit.tokens or B.UNSTATED_LIMIT,
                         max_batch=256)
    return plan, shape, recipe, found


def rows_done(out: Path, field: str) -> dict[str, dict]:
    """The rows of a previous run that got `field` (not an error), by key."""
    rows = json.loads(out.read_text())["rows"] if out.is_file() else []
    return {r["key"]: r for r in rows if field in r}


def work_through(work: Callable[[tuple], dict], todo: list[tuple], done: dict[str, dict], out: Path, jobs: int,
                 describe: Callable[[dict], str], table: Callable[[list[dict]], list[str]], cases: int) -> None:
    """work(case) for each case of `todo`, `jobs` at once, each row written to `out` beside the
    `done` ones as it comes; then table(rows), written there too and printed."""
    print(f"{cases} cases, {len(done)} already in {out}, {len(todo)} to go", file=sys.stderr)
    rows = list(done.values())
    with multiprocessing.get_context("spawn").Pool(jobs) as pool:
        for i, row in enumerate(pool.imap_unordered(work, todo), 1):
            rows.append(row)
            atomic.write_json(out, {"rows": rows})
            print(f"[{i}/{len(todo)}] {row['key']}: {describe(row)}", file=sys.stderr, flush=True)
        pool.close()  # let the workers exit before the pool's exit terminates them
        pool.join()
    lines = table(rows)
    atomic.write_json(out, {"rows": rows, "table": lines})
    print("\n".join(lines))
