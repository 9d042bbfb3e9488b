"""`python -m harness drift BASE_DIR QUANT_DIR`: did quantizing change what the model says?

KL statistics of the next-token distributions against the base (llama.cpp's: mean, median, p90,
p99, max), top-1 agreement, perplexity of both on a held-out text, greedy answers to a fixed
prompt set side by side, and the verdict. Exit 0 within the gate, 1 past it, 2 on bad usage.
"""

from __future__ import annotations

from pathlib import Path

from . import print_verdict


def add_arguments(parser) -> None:
    from ..quant.drift import REAL_MODEL_GATE

    parser.add_argument("base_dir", metavar="BASE_DIR", help="the model before quantizing (a model directory)")
    parser.add_argument("quant_dir", metavar="QUANT_DIR", help="the quantized model directory")
    parser.add_argument("--text", metavar="FILE",
                        help="UTF-8 text to measure on (default: the held-out paragraphs shipped with the harness)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per evaluated row (default 256)")
    parser.add_argument("--max-mean-kl", type=float, default=REAL_MODEL_GATE.max_mean_kl,
                        help=f"gate: mean KL in nats/token (default {REAL_MODEL_GATE.max_mean_kl})")
    parser.add_argument("--max-p99-kl", type=float, default=REAL_MODEL_GATE.max_p99_kl,
                        help=f"gate: 99th percentile KL (default {REAL_MODEL_GATE.max_p99_kl})")
    parser.add_argument("--min-top1", type=float, default=REAL_MODEL_GATE.min_top1,
                        help=f"gate: top-1 agreement, 0..1 (default {REAL_MODEL_GATE.min_top1})")
    parser.add_argument("--python", metavar="PY",
                        help="compute logits with this interpreter's transformers (e.g. .venvs/llmcompressor/bin/python, "
                             "the venv that wrote the checkpoint)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    parser.add_argument("--json", action="store_true", help="print the statistics, answers and verdict as JSON")


def _model_dir(value: str, flag: str) -> Path:
    from ..errors import UsageError

    path = Path(value).expanduser()
    if not path.is_dir():
        raise UsageError(f"{flag} {value!r} is not a directory")
    if not (path / "config.json").is_file():
        raise UsageError(f"{flag} {value!r} has no config.json")
    return path


def _gate(args):
    from ..errors import UsageError
    from ..quant.drift import Gate

    for flag, value in (("--max-mean-kl", args.max_mean_kl), ("--max-p99-kl", args.max_p99_kl)):
        if not value > 0:
            raise UsageError(f"{flag} must be > 0 (got {value})")
    if not 0 <= args.min_top1 <= 1:
        raise UsageError(f"--min-top1 must be between 0 and 1 (got {args.min_top1})")
    if args.seq_len < 8:
        raise UsageError(f"--seq-len must be >= 8 (got {args.seq_len})")
    return Gate(max_mean_kl=args.max_mean_kl, max_p99_kl=args.max_p99_kl, min_top1=args.min_top1)


def run(args) -> int:
    from ..errors import HarnessError, UsageError
    from ..quant.drift_inputs import check_inputs
    from ..quant.evaluate import compare_models
    from ..quant.tokens import read_text_file

    gate = _gate(args)
    base, quant = _model_dir(args.base_dir, "BASE_DIR"), _model_dir(args.quant_dir, "QUANT_DIR")
    check_inputs(base, quant)  # the same directory twice, weights cut short, two vocabularies
    if not ((base / "tokenizer.json").is_file() or (base / "tokenizer.model").is_file()):
        raise UsageError(f"BASE_DIR {args.base_dir!r} has no tokenizer: the drift is measured on text")
    text = read_text_file(args.text) if args.text else None
    try:
        result = compare_models(base, quant, text=text, text_name=args.text, seq_len=args.seq_len, gate=gate,
                                device=args.device, python=args.python)
    except ValueError as exc:  # text shorter than one row, logits of different vocabularies
        raise UsageError(str(exc)) from None
    except (OSError, RuntimeError, ImportError, _safetensors_error()) as exc:
        hint = (" (`python -m harness check-dir DIR` checks each directory)" if args.python else
                " (a checkpoint this transformers cannot load: try --python of the venv that wrote it, "
                "or `python -m harness check-dir DIR`)")
        raise HarnessError(f"could not run the models: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}{hint}") from None
    return print_verdict(result, args.json, _print_text)


def _safetensors_error() -> type[Exception]:
    """safetensors' own error (a file it cannot read), not an OSError: one line like the others."""
    try:
        from safetensors import SafetensorError
    except ImportError:
        return OSError
    return SafetensorError


def _print_text(result) -> None:
    d = result.drift
    print(f"base      {result.base_dir}\nquantized {result.quantized_dir}")
    print(f"text      {result.text}: {result.rows} rows x {result.seq_len} tokens, {d.tokens} positions")
    print(f"KL (nats/token)  mean {d.mean_kl:.5f} +/- {d.mean_kl_stderr:.5f}  median {d.median_kl:.5f}  "
          f"p90 {d.p90_kl:.5f}  p99 {d.p99_kl:.5f}  max {d.max_kl:.4f}")
    print(f"top-1 agreement  {d.top1_agreement:.1%}")
    print(f"perplexity       base {d.ppl_reference:.3f}  quantized {d.ppl_quantized:.3f}  (ratio {d.ppl_ratio:.4f})")
    print("greedy answers:")
    for a in result.answers:
        mark = "same" if a.same else "DIFF"
        print(f"  [{mark}] {a.prompt}\n         base:      {a.base!r}\n         quantized: {a.quantized!r}")
    print(("OK" if d.ok else "DRIFTED") + ": " + d.verdict())
