"""Pack a raw run directory into measurements/ (one archive, its summary and notes beside it) and
record it in measurements/manifest.json, e.g. after scripts/gpu/families.sh:

    python scripts/pack_measurement.py families-out/ vram/families/run-20 \\
        --script "benchmarks/vram/families.py --set again5 (scripts/gpu/families.sh)" \\
        --date 2026-12-06 --read-by tests/test_measurements.py

The machine and versions come from the run's environment.json; the notes (.md) from its README.md.
After a driver rewrote an entry's plain files on purpose, record their new sha256 (and say why in the
commit): python scripts/pack_measurement.py --refresh vllm_plan/family_sweep [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import measurements as M  # noqa: E402


def refresh(names: list[str]) -> int:
    """The sha256 of each plain file of the named entries, as the files are now."""
    data = M.manifest()
    by_name = {e["name"]: e for e in data["entries"]}
    unknown = [n for n in names if n not in by_name or "files" not in by_name[n]]
    if unknown:
        print(f"error: no entry of plain files named {', '.join(unknown)}", file=sys.stderr)
        return 2
    for name in names:
        e = by_name[name]
        e["files"] = {f: M.sha256(M.HERE / e["folder"] / f) for f in e["files"]}
        print(f"{name}: {len(e['files'])} file(s) recorded")
    M.MANIFEST.write_text(json.dumps(data, indent=1) + "\n")
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--refresh"]:
        return refresh(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("name", help="the entry's name under measurements/, e.g. vram/families/run-20")
    ap.add_argument("--kind", default="families-run")
    ap.add_argument("--script", required=True, help="what produced it (command line)")
    ap.add_argument("--date", required=True)
    ap.add_argument("--read-by", action="append", default=[], help="a test, figure or benchmark that reads it")
    ap.add_argument("--families-truth", action="store_true", help="one of the runs the verdict figures read")
    args = ap.parse_args(argv)
    if not args.directory.is_dir():
        print(f"error: {args.directory} is not a directory", file=sys.stderr)
        return 2
    archive = M.HERE / f"{args.name}.tar.gz"
    archive.parent.mkdir(parents=True, exist_ok=True)
    M.pack(args.directory, archive)
    readme = args.directory / "README.md"
    if readme.is_file():
        archive.with_name(archive.name.replace(".tar.gz", ".md")).write_text(readme.read_text())
    env_files = sorted(args.directory.rglob("environment.json"))
    env = json.loads(env_files[0].read_text()) if env_files else {}
    entry = {"name": args.name, "kind": args.kind, "archive": f"{args.name}.tar.gz",
             "summary": f"{args.name}.json", "notes": f"{args.name}.md" if readme.is_file() else None,
             "sha256": M.sha256(archive),
             "produced_by": {"script": args.script, "machine": env.get("gpu"), "date": args.date,
                             "versions": {k: env[k] for k in ("torch", "cuda", "transformers", "peft",
                                                              "bitsandbytes", "python") if k in env}},
             "read_by": args.read_by}
    if args.families_truth:
        entry["families_truth"] = True
    data = M.manifest() if M.MANIFEST.is_file() else {"schema_version": 1, "entries": []}
    data["entries"] = [e for e in data["entries"] if e["name"] != args.name] + [entry]
    M.MANIFEST.write_text(json.dumps(data, indent=1) + "\n")
    summary = M.summarise(args.name)
    (M.HERE / entry["summary"]).write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    print(f"{archive.relative_to(ROOT)}: {summary['files']} files, rows {summary['rows']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
