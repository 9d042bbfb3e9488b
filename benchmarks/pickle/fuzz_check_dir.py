"""Fuzz `check-dir --json --allow-pickle` with mutated real checkpoints (issue 23).

Seeds are real small files users have: a torch.save zip (bf16 + fp32), a legacy torch.save, a
protocol-2 pickle, a .npy, a .npz and a safetensors file. Each case applies 1-4 mutations (bit
flips, truncation, insertion of random bytes, a chunk duplicated) and runs the command line
(harness.__main__.main, in this process, stdout and stderr captured) on a directory holding the
mutated file as pytorch_model.bin or under its own name. A case fails when stdout is not exactly
one JSON document, the exit code is not 0/1, anything escapes as an exception (a traceback), or it
runs past --limit seconds (a hang: SIGALRM interrupts it).

    python benchmarks/pickle/fuzz_check_dir.py [--cases 1000] [--seed 0] [--limit 120]
Writes reports/pickle-fuzz-check-dir.json and .md (atomically).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


class _Hang(Exception):
    pass


def seeds() -> dict[str, bytes]:
    import numpy as np
    import torch
    from safetensors.torch import save

    def saved(obj, **kw) -> bytes:
        buffer = io.BytesIO()
        torch.save(obj, buffer, **kw)
        return buffer.getvalue()

    state = {"w": torch.ones(8, 4), "b": torch.zeros(4, dtype=torch.bfloat16)}
    npy = io.BytesIO()
    np.save(npy, np.arange(16, dtype=np.float32))
    npz = io.BytesIO()
    np.savez(npz, a=np.zeros(4), b=np.ones(3))
    import pickle

    return {"pytorch_model.bin": saved(state), "legacy.bin": saved(state, _use_new_zipfile_serialization=False),
            "model.pkl": pickle.dumps({"lr": 0.1, "steps": [1, 2, 3]}, protocol=2),
            "arrays.npy": npy.getvalue(), "arrays.npz": npz.getvalue(),
            "model.safetensors": save({"w": torch.ones(4, 4)})}


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    raw = bytearray(data)
    done = []
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(max(1, len(raw)))
        kind = rng.choice(["flip", "flip", "truncate", "insert", "duplicate"])
        if kind == "flip" and raw:
            raw[at] ^= 1 << rng.randrange(8)
        elif kind == "truncate":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = os.urandom(rng.randint(1, 64))
        else:
            chunk = raw[at:at + rng.randint(1, 256)]
            raw[at:at] = chunk
        done.append(f"{kind}@{at}")
    return bytes(raw), done


def run_case(directory: Path, limit: float) -> dict:
    from harness.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(_Hang()))
    signal.setitimer(signal.ITIMER_REAL, limit)
    started = time.monotonic()
    problem = None
    code = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(["check-dir", "--json", "--allow-pickle", str(directory)])
    except _Hang:
        problem = "hang"
    except BaseException as exc:  # noqa: BLE001 - what the fuzzer is looking for
        problem = f"traceback: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.monotonic() - started
    if problem is None:
        try:
            payload = json.loads(out.getvalue())
            if not isinstance(payload, dict) or "ok" not in payload:
                problem = "JSON without ok"
        except ValueError:
            problem = f"stdout is not one JSON document: {out.getvalue()[:120]!r}"
        if problem is None and code not in (0, 1):
            problem = f"exit code {code}"
        if problem is None and "Traceback" in err.getvalue():
            problem = "traceback on stderr"
    return {"problem": problem, "seconds": round(seconds, 3), "exit": code}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fuzz check-dir --json with mutated checkpoints")
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=float, default=120.0, help="seconds a case may take before it is a hang")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "pickle-fuzz-check-dir")
    args = parser.parse_args(argv)
    import torch

    from harness.atomic import write_text

    rng = random.Random(args.seed)
    bases = seeds()
    failures, times, codes = [], [], {0: 0, 1: 0}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fuzz-check-dir-") as tmp:
        for index in range(args.cases):
            name = rng.choice(sorted(bases))
            data, how = mutate(bases[name], rng)
            directory = Path(tmp) / str(index)
            directory.mkdir()
            (directory / "config.json").write_text('{"model_type": "llama"}')
            target = "pytorch_model.bin" if rng.random() < 0.5 else name
            (directory / target).write_bytes(data)
            result = run_case(directory, args.limit)
            times.append(result["seconds"])
            if result["exit"] in codes:
                codes[result["exit"]] += 1
            if result["problem"]:
                failures.append({"case": index, "seed_file": name, "as": target, "mutations": how, **result})
            if (index + 1) % 50 == 0:
                print(f"{index + 1}/{args.cases} cases, {len(failures)} failing, "
                      f"{time.monotonic() - started:.0f} s", file=sys.stderr)
            for child in directory.iterdir():
                child.unlink()
            directory.rmdir()
    hangs = sum(f["problem"] == "hang" for f in failures)
    tracebacks = sum(str(f["problem"]).startswith("traceback") for f in failures)
    result = {"cases": args.cases, "seed": args.seed, "limit_s": args.limit, "failures": len(failures),
              "tracebacks": tracebacks, "hangs": hangs, "not_json": len(failures) - hangs - tracebacks,
              "exit_codes": codes, "max_case_s": max(times), "mean_case_s": round(sum(times) / len(times), 3),
              "total_s": round(time.monotonic() - started, 1), "first_failures": failures[:20],
              "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, "
                         f"torch {torch.__version__}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text(args.out.with_suffix(".json"), json.dumps(result, indent=1))
    write_text(args.out.with_suffix(".md"),
               f"# check-dir --json on {args.cases} mutated checkpoints\n\n"
               f"tracebacks {tracebacks}, hangs {hangs} (limit {args.limit:g} s), other failures "
               f"{result['not_json']}; exit codes {codes}; slowest case {result['max_case_s']} s, mean "
               f"{result['mean_case_s']} s. {result['machine']}\n")
    print(json.dumps({k: v for k, v in result.items() if k != "first_failures"}, indent=1))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
