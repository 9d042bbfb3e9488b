"""`vllm bench serve` at several concurrencies from one process, one level per stdin line, so the
vLLM import (~20 s on the H200 machine) is paid once, not per level. Run by gpu_serving.py under
the vLLM interpreter; each stdin line is the CLI arguments of one `vllm bench serve` run (the
same ones `python3 -m vllm.entrypoints.cli.main bench serve` takes); each run answers one stdout
line, {"ok": true} or {"error": "..."}, after its --save-result file is written.

    python3 benchmarks/vllm_plan/vllm_bench_levels.py < levels.txt
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys


def main() -> int:
    # vLLM logs to stdout from its import on: the answers get a descriptor of their own
    answer = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for line in sys.stdin:
        if not line.strip():
            continue
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        try:
            args = parser.parse_args(shlex.split(line))
            with contextlib.redirect_stdout(sys.stderr):  # the bench's own report must not mix with the answers
                bench_main(args)
            reply = {"ok": True}
        except SystemExit as exc:  # argparse's errors
            reply = {"error": f"bad arguments (exit {exc.code})"}
        except Exception as exc:  # one failed level must not stop the others
            reply = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        answer.write(json.dumps(reply) + "\n")
        answer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
