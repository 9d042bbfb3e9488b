"""How long `plan --train` takes (wall and CPU): before (every setting traced, no trace cache), after
(three lengths traced, the rest made from them: replay_limits.synthesized_trace; a fresh trace cache)
and again at another budget (the traces from the cache: trace_cache); and whether the limits at the
recipe's budget are the same. Each run in a fresh process.

    .venv/bin/python benchmarks/vram/plan_train_time.py [--recipe quickstart|7b|...] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPES = {
    # docs/quickstart.md's QLoRA recipe
    "quickstart": ["--config", "qwen2.5-1.5b", "--budget", "6GiB", "--train", "--precision", "nf4-dq,bf16",
                   "--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--lora-r", "16", "--optimizer", "paged_adamw_8bit"],
    # docs/vram.md's 7B figure: Mistral-7B attention-only r8
    "7b": ["--config", "mistral-7b-v0.3", "--budget", "6GiB", "--train", "--precision", "nf4-dq,fp4-dq",
           "--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--lora-r", "8"],
}
RUN = ("import sys, harness.memory.replay_limits as R; R.ANCHORS = int(sys.argv[1]); "
       "from harness.__main__ import main; sys.exit(main(sys.argv[2:]))")


def timed(args: list[str], anchors: int, cache: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", RUN, str(anchors), "plan", *args, "--json"], capture_output=True,
                       text=True, cwd=REPO, env={**os.environ, "HARNESS_CACHE_DIR": cache})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    plans = json.loads(r.stdout)["plans"] if r.stdout.strip().startswith("{") else []
    traced = sum(1 for line in r.stderr.splitlines() if line.endswith("step 1/3"))
    return {"wall_s": round(wall, 1), "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "exit": r.returncode, "traced": traced, "made": r.stderr.count("traced lengths"),
            "cached": r.stderr.count("from the trace cache"),
            "limits": {p["precision"]: [p["max_seq_len"], p["max_batch"], p["limits_from"]] for p in plans}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="quickstart", help=f"comma list of: {', '.join(RECIPES)}")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = {}
    for name in args.recipe.split(","):
        with tempfile.TemporaryDirectory() as cold, tempfile.TemporaryDirectory() as cache:
            before = timed(RECIPES[name], 10**6, cold)  # never enough anchors: every setting traced
            after = timed(RECIPES[name], 3, cache)
            budget = RECIPES[name].index("--budget") + 1
            other = RECIPES[name][:budget] + ["5GiB"] + RECIPES[name][budget + 1:]
            again = timed(other, 3, cache)  # another card: the traces it shares come from the cache
        out[name] = {"before": before, "after": after, "another_budget": again,
                     "same_limits": before["limits"] == after["limits"]}
        for label, r in (("before", before), ("after", after), ("after, 5GiB, warm cache", again)):
            print(f"{name} {label}: {r['wall_s']} s wall, {r['cpu_s']} s CPU, {r['traced']} traced, {r['made']} made "
                  f"from traces, {r['cached']} from the cache; limits {r['limits']}")
        print(f"{name}: same limits: {out[name]['same_limits']}")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
