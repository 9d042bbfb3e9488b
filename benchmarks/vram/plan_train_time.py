"""How long `plan --train` takes, in wall seconds (what a user waits: read it on a quiet box) and
CPU seconds (user + sys of the whole process tree, the forked tracers included: the figure to read
on a shared box), with the load average beside each: the code at --before (a git revision, run
from an export of its harness/) against the working tree's, each with a cold trace cache (a fresh
HARNESS_CACHE_DIR: nothing traced before, as on a user's first plan); the working tree's again
pinned to one core (no lengths traced side by side: what the forks cost in CPU); then with the
cache warm, at the recipe's budget and at another one. Each run is a fresh process; its printed
plan (stdout) is compared byte for byte with the before run's.

    .venv/bin/python benchmarks/vram/plan_train_time.py [--recipe quickstart,7b] [--before REV]
        [--repeat N] [--out FILE.json] [--run-dir DIR]

--run-dir writes DIR/plan-train-time.json, environment.json and README.md, ready for
`python scripts/pack_measurement.py DIR vram/replay/NAME --kind replay-run --script "..." --date ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPES = {
    # docs/quickstart.md's QLoRA recipe ("QLoRA on a 6 GB card")
    "quickstart": ["--config", "qwen2.5-1.5b", "--budget", "6GiB", "--train", "--precision", "nf4-dq,bf16",
                   "--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--lora-r", "16", "--optimizer", "paged_adamw_8bit"],
    # docs/vram.md's 7B figure: Mistral-7B attention-only r8
    "7b": ["--config", "mistral-7b-v0.3", "--budget", "6GiB", "--train", "--precision", "nf4-dq,fp4-dq",
           "--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--lora-r", "8"],
}


def traced_count(stderr: str) -> int:
    """Settings traced: each traced here says its steps; those traced side by side are listed once."""
    beside = sum(len(m.split(",")) - 1 for m in re.findall(r"tracing ([\d, ]+) x \d+ side by side", stderr))
    return stderr.count("step 1/3") + beside


def timed(args: list[str], cache: str, cwd: Path, one_core: bool = False) -> dict:
    """One `python -m harness plan ARGS` in a fresh process: CPU (its own and its descendants'), wall,
    the 1-minute load average before and after, what it traced and made, its stdout. one_core: the
    process pinned to one CPU (it then traces one length after another)."""
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    pin = (lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})) if one_core else None
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "harness", "plan", *args], capture_output=True, text=True, cwd=cwd,
                       env={**os.environ, "HARNESS_CACHE_DIR": cache, "PYTHONPATH": str(cwd)}, preexec_fn=pin)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2),
            "wall_s": round(wall, 2), "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "exit": r.returncode, "traced": traced_count(r.stderr), "made": r.stderr.count("traced lengths"),
            "cached": r.stderr.count("from the trace cache"), "stdout": r.stdout,
            "verdict": (r.stdout.strip().splitlines() or [""])[-1]}


def exported(rev: str, into: Path) -> Path:
    """harness/ as it was at rev, under `into` (git archive)."""
    blob = subprocess.run(["git", "archive", rev, "harness"], cwd=REPO, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


def one_recipe(name: str, before_rev: str | None, repeat: int) -> dict:
    args = RECIPES[name]
    budget = args.index("--budget") + 1
    other = args[:budget] + ["5GiB"] + args[budget + 1:]
    out: dict = {"args": args, "runs": []}
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            run = {}
            if before_rev:
                run["before"] = timed(args, str(tmp / "cache-before"), exported(before_rev, tmp / "before"))
            run["after"] = timed(args, str(tmp / "cache"), REPO)
            run["after_one_core"] = timed(args, str(tmp / "cache-one-core"), REPO, one_core=True)
            run["after_warm"] = timed(args, str(tmp / "cache"), REPO)
            run["after_warm_5GiB"] = timed(other, str(tmp / "cache"), REPO)
            out["runs"].append(run)
    first = out["runs"][0]
    out["same_output"] = all(r["after"]["stdout"] == r["after_warm"]["stdout"] == r["after_one_core"]["stdout"] and
                             (not before_rev or r["before"]["stdout"] == r["after"]["stdout"]) for r in out["runs"])
    out["summary"] = {label: {"cpu_s": [r[label]["cpu_s"] for r in out["runs"]],
                              "wall_s": [r[label]["wall_s"] for r in out["runs"]],
                              "load_1min": [r[label]["load_1min"] for r in out["runs"]],
                              "traced": first[label]["traced"], "made": first[label]["made"],
                              "cached": first[label]["cached"]} for label in first}
    return out


def environment() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {"gpu": f"none (CPU box, {os.cpu_count()} cores: {platform.processor() or platform.machine()})",
            "cuda": None, "torch": v("torch"), "transformers": v("transformers"), "peft": v("peft"),
            "bitsandbytes": v("bitsandbytes"), "python": platform.python_version()}


def lines(out: dict) -> list[str]:
    text = []
    for name, r in out["recipes"].items():
        for label, s in r["summary"].items():
            text.append(f"{name} {label}: CPU {s['cpu_s']} s, wall {s['wall_s']} s, load (1 min, before/after) "
                        f"{s['load_1min']}; {s['traced']} traced, {s['made']} made, {s['cached']} from the cache")
        text.append(f"{name}: plan output the same before and after, cold and warm: {r['same_output']}; "
                    f"{r['runs'][0]['after']['verdict']}")
    return text


def write_run_dir(run_dir: Path, out: dict, argv: list[str]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan-train-time.json").write_text(json.dumps(out, indent=1))
    (run_dir / "environment.json").write_text(json.dumps(environment(), indent=1))
    (run_dir / "README.md").write_text(
        "# plan --train's time, cold and warm\n\n"
        f"`benchmarks/vram/plan_train_time.py {' '.join(argv)}` on {environment()['gpu']} (load average "
        "beside each run: wall seconds are what a user waits only where the box was quiet; CPU seconds are "
        "user + sys of the whole process tree, forked tracers included).\n\n"
        + "\n".join(f"- {line}" for line in lines(out)) + "\n")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="quickstart,7b", help=f"comma list of: {', '.join(RECIPES)}")
    ap.add_argument("--before", default=None, help="a git revision to time against (its harness/)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each (the box is shared: CPU s is the figure)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--run-dir", type=Path, default=None, help="a run folder for scripts/pack_measurement.py")
    args = ap.parse_args(argv)
    out = {"nproc": os.cpu_count(), "recipes": {}}
    for name in args.recipe.split(","):
        out["recipes"][name] = one_recipe(name, args.before, args.repeat)
    print("\n".join(lines(out)))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    if args.run_dir:
        write_run_dir(args.run_dir, out, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
