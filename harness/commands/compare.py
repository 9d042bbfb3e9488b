"""`python -m harness compare BASELINE.json CANDIDATE.json`: exit 1 on a regression beyond noise.

Exit 0: nothing regressed; 1: a table naming what regressed; 2: the two cannot be compared
(different config fingerprints, too few repeated runs, a file marked invalid, the same file twice,
a file that is not valid bench results), said in one line.
"""

from __future__ import annotations

import sys

from ..errors import CheckFailed, UsageError
from ..units import comma_list


def add_arguments(parser) -> None:
    parser.add_argument("baseline", help="bench results JSON of the baseline")
    parser.add_argument("candidate", help="bench results JSON of the candidate")
    parser.add_argument("--threshold", default=None,
                        help="per-metric thresholds, e.g. ttft_p50=10%%,output_throughput=5%% "
                             "(defaults: latencies 20%%, ttft_p99 50%%, throughputs 10%%)")
    parser.add_argument("--allow-diff", default="",
                        help="fingerprint fields allowed to differ, e.g. server_version for an upgrade rehearsal "
                             "(fields: model, flags, workload, hardware, server_version, api)")
    parser.add_argument("--min-repeats", type=int, default=3, help="runs per level required on each side (default 3)")
    parser.add_argument("--policy", choices=("harness", "vllm-ci"), default="harness",
                        help="harness (default): 95%% interval over runs past the threshold, after what the client "
                             "measured of its own delays; vllm-ci: vLLM CI's rule, median of runs, latency > 1.20x "
                             "or throughput < 0.80x")
    parser.add_argument("--json", dest="json_out", default=None, help="also write the comparison as JSON here")


def run(args) -> int:
    from ..serving import compare as cmp
    from ..serving import results
    from ..serving.results import FINGERPRINT_FIELDS, write_atomic

    allow = comma_list(args.allow_diff, "--allow-diff", choices=FINGERPRINT_FIELDS, allow_empty=True)
    if args.min_repeats < 1:
        raise UsageError("--min-repeats must be at least 1")
    if args.threshold and args.policy == "vllm-ci":
        raise UsageError("--threshold does not apply to --policy vllm-ci (its thresholds are fixed: 1.20x, 0.80x)")
    thresholds = cmp.parse_thresholds(args.threshold)
    twice = results.same_results([args.baseline, args.candidate])
    if twice:
        raise UsageError(f"{twice[0]} and {twice[1]} are the same results: compare a baseline with a new run")
    baseline, candidate = results.load(args.baseline), results.load(args.candidate)
    result = cmp.compare(baseline, candidate, thresholds=thresholds, allow=allow, min_repeats=args.min_repeats,
                         policy=args.policy)
    print(cmp.format_table(result))
    if args.json_out:
        write_atomic(args.json_out, result.to_json() | {"baseline": args.baseline, "candidate": args.candidate})
    if result.regressed:
        names = sorted({f"{c.metric} ({c.level}) {100 * c.change:+.0f}%" for c in result.changes if c.verdict == "regressed"})
        names += [b for b in result.behaviours if b.startswith("REGRESSION")]
        raise CheckFailed("regression: " + "; ".join(names))
    print("no regression beyond noise", file=sys.stderr)
    return 0
