"""`python -m harness bench`: load an OpenAI-compatible endpoint, write results JSON (schema 1).

Exit 0 when every request succeeded, the prompts had the requested length and the token counts
agree; 1 otherwise (the results file is written either way, after every run; a run whose prompt
lengths missed the request marks the file invalid and ends the bench); 2 on bad usage; 130 on
Ctrl-C, after writing what finished.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..errors import CheckFailed, UsageError
from . import add_ramp_up, check_writable, ramp_up_seconds
from ..units import comma_list, int_list


def _int_list(text: str, what: str) -> list[int]:
    return list(int_list(text, what))


def failure_reason(data: dict) -> str:
    """': the server said: ...' for the most common failure class, with the server's max_model_len
    when the prompt and output do not fit in it ('' when no request carries a reason)."""
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for run in data["runs"]:
        for label, count in (run.get("errors") or {}).items():
            if (run.get("error_details") or {}).get(label):
                counts[label] = counts.get(label, 0) + count
                first.setdefault(label, run["error_details"][label])
    if not counts:
        return ""
    label = max(counts, key=counts.get)
    text = f": {label}: the server said: {first[label]}"
    limit = (data.get("environment") or {}).get("max_model_len")
    w = data.get("workload") or {}
    need = (w.get("input_len") or 0) + (w.get("output_len") or 0)
    if label.startswith("http_4") and isinstance(limit, int) and need > limit:
        text += (f" (the server's max_model_len is {limit}; --input-len {w.get('input_len')} + --output-len "
                 f"{w.get('output_len')} = {need})")
    return text


def parse_share(text: str, what: str) -> float:
    """'90%' or '0.9' -> 0.9, within (0, 1]."""
    value = str(text).strip()
    try:
        share = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a share such as 90%") from None
    if not 0 < share <= 1:
        raise UsageError(f"{what}: {text!r} must be above 0% and at most 100%")
    return share


def parse_workers(text: str) -> int | None:
    """--workers: "auto" (None) or a count >= 1."""
    if str(text).strip().lower() == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"--workers: {text!r} is not a number of processes or auto") from None
    if value < 1:
        raise UsageError(f"--workers: {text!r} needs at least 1")
    return value


def parse_slo(text: str | None):
    from ..serving.stats import SLO

    if not text:
        return None
    fields = {}
    for item in comma_list(text, "--slo"):
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in ("ttft_ms", "tpot_ms", "e2e_ms"):
            raise UsageError(f"--slo: unknown key {key!r} (use ttft_ms, tpot_ms, e2e_ms, e.g. ttft_ms=500,tpot_ms=50)")
        try:
            fields[key] = float(value)
        except ValueError:
            raise UsageError(f"--slo: {item!r} needs a number, e.g. ttft_ms=500") from None
        if not 0 < fields[key] < float("inf"):
            raise UsageError(f"--slo: {item!r} needs a positive number of milliseconds")
    return SLO(**fields)


def add_arguments(parser) -> None:
    parser.add_argument("--endpoint", required=True,
                        help="base URL of the server, with or without /v1, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--model", required=True, help="model name as the server knows it")
    parser.add_argument("--concurrency", default=None,
                        help="closed-loop concurrency levels, comma list (default 1); with --request-rate, the cap on requests in flight (default none)")
    parser.add_argument("--request-rate", default=None,
                        help="open loop: Poisson arrivals at this many requests/s; a comma list runs each rate; "
                             "'sweep' doubles the rate from --sweep-start until the server saturates (the first "
                             "--concurrency value caps requests in flight)")
    parser.add_argument("--sweep-start", type=float, default=1.0, help="with --request-rate sweep: the first rate (default 1/s)")
    parser.add_argument("--slo-target", default="90%",
                        help="the share of requests within --slo for a rate to meet it (default 90%%): the sweep "
                             "reports the highest such rate")
    parser.add_argument("--num-prompts", type=int, required=True, help="requests per run")
    parser.add_argument("--input-len", type=int, required=True, help="prompt tokens (exact with a tokenizer)")
    parser.add_argument("--output-len", type=int, required=True, help="output tokens (ignore_eos, min_tokens = max_tokens)")
    parser.add_argument("--prefix-len", type=int, default=None,
                        help="tokens of a prefix shared by every prompt (default 0; --dataset prefix: half of --input-len)")
    from ..serving.datasets import DATASETS, help_text

    parser.add_argument("--dataset", choices=tuple(DATASETS), default="fixed",
                        help="built-in workload (nothing downloaded): " + help_text())
    parser.add_argument("--random-range-ratio", type=float, default=None,
                        help="--dataset random: lengths uniform within len x (1 +- ratio) (vLLM's flag, default 0); "
                             "sharegpt-synthetic: the log-normal sigma (default 0.6)")
    parser.add_argument("--input-dist", choices=("fixed", "uniform", "normal"), default="fixed",
                        help="prompt lengths: all --input-len (default), or drawn around it (each still exact)")
    parser.add_argument("--output-dist", choices=("fixed", "uniform", "normal"), default="fixed",
                        help="output lengths: all --output-len (default), or drawn around it")
    parser.add_argument("--len-spread", type=float, default=0.25,
                        help="with a distribution: uniform within mean x (1 +- spread), normal with sd mean x spread "
                             "(clipped to 1..2 x mean); default 0.25")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer directory (default: --model when it is a local directory; else the "
                             "server's own tokenizer through POST /tokenize, else probe requests' usage)")
    parser.add_argument("--prompt-calibration", default="auto",
                        choices=("auto", "tokenizer", "server-tokenize", "server-vocab", "usage-probes"),
                        help="how prompts of --input-len tokens are built (default auto: the first that works "
                             "of tokenizer, server-tokenize (one-token words, else the server's own token ids: server-vocab), usage-probes)")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions")
    add_ramp_up(parser)
    parser.add_argument("--workers", default="auto",
                        help="client worker processes, each its own event loop and connections (default auto: "
                             "the cores nobody else is using, less one, at least 1)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request before it counts as timed out (default 120)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per level (compare wants at least 3)")
    parser.add_argument("--warmup", type=int, default=2, help="requests before each run, kept out of the figures (default 2)")
    parser.add_argument("--slo", default=None, help="goodput SLOs, e.g. ttft_ms=500,tpot_ms=50")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-requests", action="store_true", help="leave per-request raw events out of the JSON")
    parser.add_argument("--out", required=True, help="results JSON to write")
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-run progress lines")


def run(args) -> int:
    from ..serving.client import Target
    from ..serving.runner import BenchConfig, run_bench
    from ..serving.workload import Workload, tokenizer_dir_for
    from ..settings import parse_endpoint

    endpoint = parse_endpoint(args.endpoint)
    if not 0 < args.timeout < float("inf"):
        raise UsageError(f"--timeout: {args.timeout} must be a positive number of seconds")
    ramp_up = ramp_up_seconds(args)
    if args.repeats < 1:
        raise UsageError("--repeats must be at least 1")
    if args.warmup < 0:
        raise UsageError(f"--warmup: {args.warmup} must be 0 or more requests")
    from ..serving.sweep import parse_rates

    rates = parse_rates(args.request_rate, args.sweep_start)
    slo_target = parse_share(args.slo_target, "--slo-target")
    workers = parse_workers(args.workers)
    out = Path(args.out)
    check_writable(out, "--out", create_folders=True)  # before any request is sent
    workload = Workload(input_len=args.input_len, output_len=args.output_len, num_prompts=args.num_prompts,
                        api=args.api, seed=args.seed, **_dataset_fields(args))
    cfg = BenchConfig(
        target=Target(base_url=endpoint, model=args.model, api=args.api, timeout_s=args.timeout),
        workload=workload,
        concurrencies=_int_list(args.concurrency, "--concurrency") if args.concurrency else ([] if args.request_rate else [1]),
        rates=rates,
        slo_target=slo_target,
        ramp_up_s=ramp_up,
        repeats=args.repeats,
        warmup=args.warmup,
        slo=parse_slo(args.slo),
        tokenizer_dir=tokenizer_dir_for(args.model, args.tokenizer),
        out=out,
        keep_requests=not args.no_requests,
        quiet=args.quiet,
        prompt_calibration=args.prompt_calibration,
        workers=workers,
        report_dir=Path(os.environ.get("HARNESS_REPORT_DIR") or "reports"),
    )
    try:
        data = run_bench(cfg)
    except KeyboardInterrupt:
        where = f"partial results in {out}" if out.is_file() else "nothing was written (no run had started)"
        print(f"harness bench: interrupted; {where}", file=sys.stderr)
        return 130
    failed = sum(r["requests_failed"] for r in data["runs"])
    total = sum(r["requests_ok"] + r["requests_failed"] for r in data["runs"])
    disagree = [f for r in data["runs"] for f in r["token_accounting"]["findings"]]
    print(f"wrote {out}", file=sys.stderr)
    if data["runs"]:  # the summary vllm bench serve users read, -q or not
        from ..serving.summary import format_results

        print(format_results(data), flush=True)
    if not data.get("valid", True):
        raise CheckFailed(f"invalid run, marked so in {out}: {data['invalid_reasons'][0]}")
    died = [f for r in data["runs"] for f in r.get("worker_failures") or ()]
    if died:
        raise CheckFailed(f"a client worker died, the run is incomplete: {died[0]}; results in {out}")
    if failed:
        errors: dict[str, int] = {}
        for r in data["runs"]:
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
        detail = ", ".join(f"{k} x{v}" for k, v in sorted(errors.items()))
        raise CheckFailed(f"{failed} of {total} requests failed ({detail}){failure_reason(data)}; results in {out}")
    if disagree:
        raise CheckFailed(f"token counts disagree: {disagree[0]}; results in {out}")
    print(f"OK: {total} of {total} requests succeeded, prompts at the requested length, token counts agree; "
          f"results in {out}", flush=True)
    return 0


def _dataset_fields(args) -> dict:
    """The workload's length distributions and prefix: --dataset's preset, or --input-dist & co."""
    from ..serving.datasets import workload_fields

    if args.dataset == "fixed":
        if args.random_range_ratio is not None:
            raise UsageError("--random-range-ratio goes with --dataset random or sharegpt-synthetic")
        return {"prefix_len": args.prefix_len or 0, "input_dist": args.input_dist, "output_dist": args.output_dist,
                "len_spread": args.len_spread}
    if (args.input_dist, args.output_dist) != ("fixed", "fixed"):
        raise UsageError(f"--dataset {args.dataset} sets the length distributions: leave out --input-dist/--output-dist")
    return workload_fields(args.dataset, args.input_len, args.prefix_len, args.random_range_ratio)
