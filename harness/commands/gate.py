"""`python -m harness gate`: baseline and candidate measured in interleaved blocks (A B, B A, ...)
inside one call, paired by block, blocks added until every metric is decided (or --max-blocks /
--budget-s is spent). Two endpoints already up (--baseline-endpoint, --candidate-endpoint), or two
vLLM interpreters the command starts (--baseline-python, --candidate-python, --model-dir): both
kept up when memory allows, otherwise one at a time, alternating starts (--servers; the table says
which and why).

The last line printed is the verdict. Exit 0: every gated metric OK; 1: one REGRESSED (or new
failed requests); 3: none regressed, some UNDECIDED (the line says about how many more blocks
would decide); `--undecided pass` exits 0 for those and says so; 2: bad usage.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

from ..errors import UsageError
from . import add_ramp_up, ramp_up_seconds


def add_arguments(parser) -> None:
    from ..serving.gate_metrics import UNDECIDED_CHOICES, thresholds_help

    where = parser.add_argument_group("the two servers (two endpoints, or two vLLM interpreters to start)")
    where.add_argument("--baseline-endpoint", default=None, help="base URL of the baseline server (with or without /v1)")
    where.add_argument("--candidate-endpoint", default=None, help="base URL of the candidate server")
    where.add_argument("--baseline-python", default=None, help="a vLLM venv's python to start the baseline from")
    where.add_argument("--candidate-python", default=None, help="a vLLM venv's python to start the candidate from")
    where.add_argument("--model-dir", default=None, help="with --*-python: the model directory both serve")
    where.add_argument("--server-flags", default="", help="with --*-python: vLLM flags for both, one string")
    where.add_argument("--candidate-flags", default=None, help="with --*-python: the candidate's flags, if they differ")
    where.add_argument("--servers", choices=("auto", "both", "alternate"), default="auto",
                       help="with --*-python: both up at once, or one at a time (alternating starts, A B | B A: "
                            "a start per side change); auto (default): both when the candidate fits in memory "
                            "beside the running baseline by vLLM's own start-up check, else alternate")
    parser.add_argument("--model", default=None, help="model name as the servers know it (default: --model-dir's name)")
    parser.add_argument("--candidate-model", default=None, help="the candidate's model name, if it differs")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: --model-dir or --model when local)")
    parser.add_argument("--concurrency", type=int, default=4, help="closed-loop concurrency of every run (default 4)")
    parser.add_argument("--num-prompts", type=int, default=16, help="requests per run, per side and block (default 16)")
    parser.add_argument("--input-len", type=int, default=64, help="prompt tokens (default 64)")
    parser.add_argument("--output-len", type=int, default=32, help="output tokens (default 32)")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions")
    add_ramp_up(parser)
    parser.add_argument("--warmup", type=int, default=2, help="requests before each run, outside its figures (default 2)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default 120)")
    parser.add_argument("--threshold", default=None, help=thresholds_help())
    parser.add_argument("--alpha", type=float, default=0.05,
                        help="error rate per metric the rule promises over all its looks (default 0.05)")
    parser.add_argument("--min-blocks", type=int, default=3, help="the earliest look (default 3)")
    parser.add_argument("--max-blocks", type=int, default=12, help="the most blocks a gate runs (default 12)")
    parser.add_argument("--budget-s", type=float, default=None, help="stop adding blocks once another would pass this")
    parser.add_argument("--undecided", choices=UNDECIDED_CHOICES, default="fail",
                        help="fail (default): exit 3 when a metric is UNDECIDED; pass: exit 0 (said in the last line)")
    parser.add_argument("--noise-model", default=None,
                        help="the noise model file read to plan the first look and written after the gate "
                             "(default: $HARNESS_REPORT_DIR or reports/, gate-noise.json); 'none' for neither")
    parser.add_argument("--out", default=None,
                        help="gate result JSON; each side's runs go beside it as OUT.baseline.json / OUT.candidate.json")
    parser.add_argument("-q", "--quiet", action="store_true", help="no per-block lines")


def _rule(args):
    from ..serving.sequential import Rule

    if not 0 < args.alpha < 1:
        raise UsageError(f"--alpha: {args.alpha} must be between 0 and 1")
    if args.min_blocks < 3:
        raise UsageError("--min-blocks must be at least 3 (an interval needs two degrees of freedom)")
    if args.max_blocks < args.min_blocks:
        raise UsageError(f"--max-blocks {args.max_blocks} is below --min-blocks {args.min_blocks}")
    if args.budget_s is not None and not 0 < args.budget_s < float("inf"):
        raise UsageError("--budget-s must be a positive number of seconds")
    return Rule(alpha=args.alpha, min_blocks=args.min_blocks, max_blocks=args.max_blocks)


@contextlib.contextmanager
def _servers(args):
    """(baseline URL, candidate URL, environment per side, Servers or None): the endpoints given,
    or two vLLMs the command starts (gate_servers.Servers: both up, or one at a time)."""
    from ..settings import parse_endpoint

    endpoints = args.baseline_endpoint or args.candidate_endpoint
    pythons = args.baseline_python or args.candidate_python
    if endpoints and pythons:
        raise UsageError("give two endpoints or two interpreters, not both")
    if endpoints:
        if not (args.baseline_endpoint and args.candidate_endpoint):
            raise UsageError("--baseline-endpoint and --candidate-endpoint go together")
        if not args.model:
            raise UsageError("--model is required with endpoints (the name the servers serve)")
        if args.servers != "auto":
            raise UsageError("--servers applies to servers the gate starts (--baseline-python/--candidate-python)")
        yield (parse_endpoint(args.baseline_endpoint, "--baseline-endpoint"),
               parse_endpoint(args.candidate_endpoint, "--candidate-endpoint"), {}, {}, None)
        return
    if not pythons:
        raise UsageError("say what to gate: --baseline-endpoint/--candidate-endpoint, or "
                         "--baseline-python/--candidate-python with --model-dir")
    if not (args.baseline_python and args.candidate_python and args.model_dir):
        raise UsageError("--baseline-python, --candidate-python and --model-dir go together")
    model_dir = Path(args.model_dir)
    if not (model_dir / "config.json").is_file():
        raise UsageError(f"--model-dir: {args.model_dir!r} is not a model directory (no config.json)")
    from ..serving.gate_servers import Servers, ServerSpec

    flags = shlex.split(args.server_flags)
    cand_flags = shlex.split(args.candidate_flags) if args.candidate_flags is not None else flags
    name = args.model or model_dir.name
    log_dir = Path(os.environ.get("HARNESS_REPORT_DIR") or "reports") / "gate-logs"
    servers = Servers({"baseline": ServerSpec(args.baseline_python, model_dir, flags, name, log_dir),
                       "candidate": ServerSpec(args.candidate_python, model_dir, cand_flags, name, log_dir)},
                      args.servers)
    try:
        servers.open()
        print(servers.describe(), file=sys.stderr, flush=True)
        (base_url, base_env), (cand_url, cand_env) = servers.running("baseline"), servers.running("candidate")
        yield base_url, cand_url, base_env, cand_env, servers
    finally:
        servers.close()


def run(args) -> int:
    from ..serving import gate as g
    from ..serving import gate_metrics as gm
    from ..serving.client import Target
    from ..serving.results import write_atomic
    from ..serving.workload import Workload, tokenizer_dir_for

    rule = _rule(args)
    thresholds = gm.parse_thresholds(args.threshold)
    for flag, value in (("--concurrency", args.concurrency), ("--num-prompts", args.num_prompts),
                        ("--input-len", args.input_len), ("--output-len", args.output_len)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1")
    if not 0 < args.timeout < float("inf"):
        raise UsageError("--timeout must be a positive number of seconds")
    ramp_up = ramp_up_seconds(args)
    workload = Workload(input_len=args.input_len, output_len=args.output_len, num_prompts=args.num_prompts,
                        api=args.api)
    noise_path = None if str(args.noise_model).lower() == "none" else Path(
        args.noise_model or Path(os.environ.get("HARNESS_REPORT_DIR") or "reports") / "gate-noise.json")
    out = Path(args.out) if args.out else None
    if out is not None and out.is_dir():
        raise UsageError(f"--out: {args.out!r} is a directory")
    with _servers(args) as (base_url, cand_url, base_env, cand_env, servers):
        model = args.model or Path(args.model_dir).name
        tokenizer = tokenizer_dir_for(args.model_dir or model, args.tokenizer)
        sides = [g.Side(name, Target(url, m, api=args.api, timeout_s=args.timeout), tokenizer, env)
                 for name, url, m, env in (("baseline", base_url, model, base_env),
                                           ("candidate", cand_url, args.candidate_model or model, cand_env))]
        cfg = g.GateConfig(sides[0], sides[1], workload, concurrency=args.concurrency, ramp_up_s=ramp_up, rule=rule,
                           thresholds=thresholds, budget_s=args.budget_s, warmup=args.warmup,
                           noise_model=noise_path, out=out, quiet=args.quiet,
                           bring_up=servers.up if servers is not None and servers.mode == "alternate" else None)
        result = g.run_gate(cfg)
        if servers is not None:
            result.servers_note, result.server_starts = servers.describe(), servers.starts
        base_url, cand_url = sides[0].target.base_url, sides[1].target.base_url
    print(g.format_table(result))
    if out is not None:
        write_atomic(out, result.to_json(args.undecided) | {"baseline": base_url, "candidate": cand_url})
    print(g.verdict_line(result, args.undecided), flush=True)
    return gm.exit_code(result.verdict, args.undecided)
