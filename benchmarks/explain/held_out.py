"""How `explain` does on real messages it was not written against.

tests/data/explain/held_out.json holds error texts users posted in public issue threads, split
off by URL hash (sha256(url) % 3 == 0) before any recogniser was written, and never used to tune
one; held_out_2.json was collected after the recognisers were written and changed none. For each: is it recognised, is the kind the thread's, and does the fix name what the thread
established (one of the case's `fix_must` words; cases whose thread established no fix count as
n/a). held_out_3.json (issue 44) holds threads of the kinds added then and vLLM start-up OOMs,
collected after those recognisers and the library catalog were committed. Also runs the training
set for comparison.

    python3 benchmarks/explain/held_out.py [--out measurements/explain/held_out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_json  # noqa: E402
from harness.explain import explain  # noqa: E402

DATA = ROOT / "tests" / "data" / "explain"


def score(case: dict) -> dict:
    result = explain(case["text"])
    must = case.get("fix_must") or []
    fix_match = None
    if result.recognised and must:
        fix_match = any(word.lower() in result.fix.lower() for word in must)
    return {"id": case["id"], "url": case["url"], "kind": case["kind"], "recognised": result.recognised,
            "got_kind": result.kind, "right_kind": result.recognised and result.kind == case["kind"],
            "fix_established": bool(must), "fix_match": fix_match, "fix": result.fix}


def summary(rows: list[dict]) -> dict:
    recognised = [r for r in rows if r["recognised"]]
    with_fix = [r for r in recognised if r["fix_established"]]
    return {
        "total": len(rows),
        "recognised": len(recognised),
        "right_kind": sum(r["right_kind"] for r in recognised),
        "recognised_with_established_fix": len(with_fix),
        "fix_matches": sum(bool(r["fix_match"]) for r in with_fix),
        "unrecognised": [r["url"] for r in rows if not r["recognised"]],
        "wrong_kind": [f"{r['url']} (thread: {r['kind']}, explain: {r['got_kind']})" for r in recognised
                       if not r["right_kind"]],
        "fix_mismatch": [r["url"] for r in with_fix if not r["fix_match"]],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "measurements" / "explain" / "held_out.json"))
    args = parser.parse_args(argv)
    out = {}
    for name in ("held_out", "held_out_2", "held_out_3", "real_messages"):
        if not (DATA / f"{name}.json").is_file():
            continue
        cases = json.loads((DATA / f"{name}.json").read_text())["cases"]
        rows = [score(c) for c in cases]
        out[name] = {"summary": summary(rows), "cases": rows}
    write_json(args.out, out, indent=1)
    for name, block in out.items():
        s = block["summary"]
        print(f"{name}: recognised {s['recognised']}/{s['total']}, right kind {s['right_kind']}/{s['recognised']}, "
              f"fix matches the thread's {s['fix_matches']}/{s['recognised_with_established_fix']} "
              f"(recognised cases whose thread established a fix)")
        for label in ("unrecognised", "wrong_kind", "fix_mismatch"):
            for item in s[label]:
                print(f"  {label}: {item}")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
