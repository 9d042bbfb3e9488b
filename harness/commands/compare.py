"""`python -m harness compare BASELINE.json CANDIDATE.json`: each gated metric OK, REGRESSED or UNDECIDED.

The last line printed is the verdict. Exit 0: every gated metric OK; 1: a metric (or a behaviour:
new failures, token disagreement) regressed; 3: none regressed but at least one is UNDECIDED (its
interval straddles the threshold), the line says what more would decide it; `--undecided pass`
exits 0 for those and says so in the line. 2: the two cannot be compared (different config
fingerprints, too few repeated runs, a file marked invalid, the same file twice, a file that is not
valid bench results, nor a `vllm bench serve --save-result` file), said in one line.
"""

from __future__ import annotations

from ..errors import UsageError
from ..units import comma_list


def add_arguments(parser) -> None:
    from ..serving.gate_metrics import UNDECIDED_CHOICES, thresholds_help

    parser.add_argument("baseline", help="bench results JSON of the baseline, a vllm bench serve --save-result JSON, "
                                         "or several joined by commas (their runs pooled as repeats)")
    parser.add_argument("candidate", help="the candidate's, as the baseline's")
    parser.add_argument("--threshold", default=None, help=thresholds_help())
    parser.add_argument("--allow-diff", default="",
                        help="fingerprint fields allowed to differ, e.g. server_version for an upgrade rehearsal "
                             "(fields: model, flags, workload, hardware, server_version, api)")
    parser.add_argument("--min-repeats", type=int, default=3, help="runs per level required on each side (default 3)")
    parser.add_argument("--policy", choices=("harness", "vllm-ci"), default="harness",
                        help="harness (default): 95%% interval over runs; OK within the threshold, REGRESSED beyond "
                             "it after what the client measured of its own delays, UNDECIDED when it straddles; "
                             "vllm-ci: vLLM CI's rule, median of runs, latency > 1.20x or throughput < 0.80x")
    parser.add_argument("--undecided", choices=UNDECIDED_CHOICES, default="fail",
                        help="fail (default): exit 3 when a metric is UNDECIDED; pass: exit 0 for it (said in the "
                             "last line)")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the comparison as JSON here")


def run(args) -> int:
    from ..serving import compare as cmp
    from ..serving import gate_metrics as gm
    from ..serving import results
    from ..serving.results import FINGERPRINT_FIELDS, write_atomic

    allow = comma_list(args.allow_diff, "--allow-diff", choices=FINGERPRINT_FIELDS, allow_empty=True)
    if args.min_repeats < 1:
        raise UsageError("--min-repeats must be at least 1")
    if args.threshold and args.policy == "vllm-ci":
        raise UsageError("--threshold does not apply to --policy vllm-ci (its thresholds are fixed: 1.20x, 0.80x)")
    thresholds = gm.parse_thresholds(args.threshold)
    twice = results.same_results(results.side_paths(args.baseline) + results.side_paths(args.candidate))
    if twice:
        raise UsageError(f"{twice[0]} and {twice[1]} are the same results: compare a baseline with a new run")
    baseline, candidate = results.load_side(args.baseline), results.load_side(args.candidate)
    result = cmp.compare(baseline, candidate, thresholds=thresholds, allow=allow, min_repeats=args.min_repeats,
                         policy=args.policy)
    print(cmp.format_table(result))
    line = cmp.verdict_line(result, args.undecided)
    if args.json_out:
        write_atomic(args.json_out, result.to_json() | {"baseline": args.baseline, "candidate": args.candidate,
                                                        "verdict_line": line, "undecided": args.undecided})
    print(line, flush=True)
    return gm.exit_code(result.verdict, args.undecided)
