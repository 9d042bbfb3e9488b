"""check-dir on N randomly mutated copies of a healthy model directory: no traceback, no hang.

    python benchmarks/modeldir/mutation_fuzz.py [-n 1000] [--seed 0] [--hang-seconds 120]
        [--out measurements/modeldir/fuzz.json]

Each copy of the tiny qwen2 directory gets 1-3 mutations drawn from MUTATIONS (bytes flipped,
files cut short or extended, JSON values replaced by NaN / huge / wrong types, keys dropped,
safetensors header bytes and length changed, files replaced by random bytes or deleted,
symlink loops and links out, stray files, hostile chat-template snippets, tokenizer merges
broken), then check_dir runs in this process (its readers in their bounded children). A
traceback is any exception out of check_dir or its report's JSON; a hang is a check that runs
past --hang-seconds. Writes the counts, the verdict mix and the first failures to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

WEIRD = [float("nan"), float("inf"), -1, 0, 2**70, "x", None, [], {}, [1, "a"], True, -1e-300, 1e308]
SNIPPETS = ["{% for i in range(100000) %}{{ i }}{% endfor %}", "{{ 'a' * 999999999 }}", "{{ ''.__class__ }}",
            "{% for m in messages %}{{ m.content }}", "{{ raise_exception('no') }}", "{{ messages[0]['x'] }}",
            "{% set ns = namespace(a=1) %}{{ ns.a }}", "{{ messages | tojson }}"]


class Hang(Exception):
    pass


def _files(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and not p.is_symlink())


def _json_files(d: Path) -> list[Path]:
    return [p for p in _files(d) if p.suffix == ".json"]


def flip_bytes(d: Path, rng: random.Random) -> str:
    p = rng.choice(_files(d))
    data = bytearray(p.read_bytes())
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    p.write_bytes(bytes(data))
    return f"flip {p.name}"


def truncate(d: Path, rng: random.Random) -> str:
    p = rng.choice(_files(d))
    size = p.stat().st_size
    with open(p, "r+b") as fh:
        fh.truncate(rng.randint(0, max(size - 1, 0)))
    return f"truncate {p.name}"


def extend(d: Path, rng: random.Random) -> str:
    p = rng.choice(_files(d))
    with open(p, "ab") as fh:
        fh.write(os.urandom(rng.randint(1, 4096)))
    return f"extend {p.name}"


def json_value(d: Path, rng: random.Random) -> str:
    p = rng.choice(_json_files(d) or _files(d))
    try:
        data = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError):
        return "json_value skipped"
    target = data
    while isinstance(target, dict) and target and rng.random() < 0.5:
        child = target[rng.choice(list(target))]
        if not isinstance(child, dict):
            break
        target = child
    if isinstance(target, dict) and target:
        target[rng.choice(list(target))] = rng.choice(WEIRD)
    p.write_text(json.dumps(data))
    return f"json_value {p.name}"


def json_drop(d: Path, rng: random.Random) -> str:
    p = rng.choice(_json_files(d) or _files(d))
    try:
        data = json.loads(p.read_text())
    except (ValueError, UnicodeDecodeError):
        return "json_drop skipped"
    if isinstance(data, dict) and data:
        data.pop(rng.choice(list(data)))
    p.write_text(json.dumps(data))
    return f"json_drop {p.name}"


def header_bytes(d: Path, rng: random.Random) -> str:
    p = d / "model.safetensors"
    if not p.exists():
        return "header skipped"
    data = bytearray(p.read_bytes())
    n = int.from_bytes(data[:8], "little")
    for _ in range(rng.randint(1, 4)):
        data[8 + rng.randrange(max(min(n, len(data) - 8), 1))] = rng.choice(b'{}[]",:0123456789NaI -e')
    p.write_bytes(bytes(data))
    return "header bytes"


def header_length(d: Path, rng: random.Random) -> str:
    p = d / "model.safetensors"
    if not p.exists():
        return "header skipped"
    data = bytearray(p.read_bytes())
    data[:8] = rng.choice([0, 1, 7, 2**63, 2**40, len(data), rng.randrange(2**20)]).to_bytes(8, "little")
    p.write_bytes(bytes(data))
    return "header length"


def random_file(d: Path, rng: random.Random) -> str:
    p = rng.choice(_files(d))
    p.write_bytes(os.urandom(rng.randint(0, 8192)))
    return f"random {p.name}"


def delete(d: Path, rng: random.Random) -> str:
    p = rng.choice(_files(d))
    p.unlink()
    return f"delete {p.name}"


def links(d: Path, rng: random.Random) -> str:
    p = rng.choice(_files(d))
    name = p.name
    p.unlink()
    kind = rng.choice(["loop", "dangling", "outside", "chain"])
    if kind == "loop":
        os.symlink(name, p)
    elif kind == "dangling":
        os.symlink("nowhere/" + name, p)
    elif kind == "outside":
        os.symlink("/etc/hostname", p)
    else:
        os.symlink(name + ".b", p)
        os.symlink(name, d / (name + ".b"))
    return f"link {kind} {name}"


def stray(d: Path, rng: random.Random) -> str:
    name = rng.choice(["handler.py", "README.md", "x.bin", "optimizer.pt", "a/b/c.pkl", "custom_generate/generate.py",
                       "preprocessor_config.json", "tokenizer.model", "chat_template.json"])
    p = d / name
    p.parent.mkdir(parents=True, exist_ok=True)
    body = rng.choice([os.urandom(rng.randint(0, 2048)), b"class X:\n  pass\n", b"cos\nsystem\n(S'true'\ntR.",
                       json.dumps({"auto_map": {"AutoProcessor": "a/b--c.D"}}).encode(),
                       json.dumps({"chat_template": rng.choice(SNIPPETS)}).encode()])
    p.write_bytes(body)
    return f"stray {name}"


def template(d: Path, rng: random.Random) -> str:
    (d / "chat_template.jinja").write_text("".join(rng.choice(SNIPPETS) for _ in range(rng.randint(1, 3))))
    return "template"


def merges(d: Path, rng: random.Random) -> str:
    p = d / "tokenizer.json"
    if not p.exists():
        return "merges skipped"
    tok = json.loads(p.read_text())
    model = tok.get("model") or {}
    if isinstance(model.get("merges"), list) and model["merges"]:
        model["merges"][rng.randrange(len(model["merges"]))] = rng.choice([["?", "?"], "a b c", 5, ["Ġ"]])
    p.write_text(json.dumps(tok))
    return "merges"


MUTATIONS = [flip_bytes, truncate, extend, json_value, json_drop, header_bytes, header_length, random_file, delete,
             links, stray, template, merges]


def _mutate(mutation, d: Path, rng: random.Random) -> str:
    """A mutation that cannot apply (no file left, a file no longer text) is skipped, not a failure."""
    try:
        return mutation(d, rng)
    except (IndexError, ValueError, OSError) as exc:
        return f"{mutation.__name__} skipped ({type(exc).__name__})"


def _write(out: Path, counts: dict, seed: int, slowest: dict | None, started: float, failures: list) -> dict:
    result = {**counts, "seed": seed, "slowest": slowest, "wall_s": round(time.monotonic() - started, 1),
              "load_average": os.getloadavg(), "failures": failures[:20]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    return result


def _alarm(signum, frame):
    raise Hang()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hang-seconds", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=ROOT / "measurements" / "modeldir" / "fuzz.json")
    args = parser.parse_args(argv)

    from harness.errors import UsageError
    from harness.models import tiny_model_dir
    from harness.modeldir import check_dir

    base = tiny_model_dir("qwen2")
    work = Path(tempfile.mkdtemp(prefix="checkdir-fuzz-"))
    signal.signal(signal.SIGALRM, _alarm)
    counts = {"dirs": 0, "refused": 0, "ok": 0, "usage_error": 0, "tracebacks": 0, "hangs": 0}
    failures, slowest, started, slowest_case = [], 0.0, time.monotonic(), None
    try:
        for i in range(args.n):
            rng = random.Random(args.seed * 1_000_003 + i)
            d = work / f"m{i}"
            shutil.copytree(base, d, ignore=shutil.ignore_patterns("harness-recipe.json"))
            applied = [_mutate(rng.choice(MUTATIONS), d, rng) for _ in range(rng.randint(1, 3))]
            counts["dirs"] += 1
            t0 = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, args.hang_seconds)
            try:
                report = check_dir(d)
                json.dumps(report.to_dict())
                counts["ok" if report.ok else "refused"] += 1
            except UsageError:
                counts["usage_error"] += 1
            except Hang:
                counts["hangs"] += 1
                failures.append({"i": i, "mutations": applied, "what": "hang"})
            except Exception:  # noqa: BLE001 - counted, kept for the report
                counts["tracebacks"] += 1
                failures.append({"i": i, "mutations": applied, "what": traceback.format_exc()[-1500:]})
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            took = time.monotonic() - t0
            if took > slowest:
                slowest, slowest_case = took, {"i": i, "mutations": applied, "seconds": round(took, 2)}
            shutil.rmtree(d, ignore_errors=True)
            if (i + 1) % 100 == 0:
                print(f"[fuzz] {i + 1}/{args.n} {counts}", file=sys.stderr, flush=True)
                _write(args.out, counts, args.seed, slowest_case, started, failures)  # a killed run keeps its figures
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = _write(args.out, counts, args.seed, slowest_case, started, failures)
    print(json.dumps({k: v for k, v in result.items() if k != "failures"}))
    return 0 if not (counts["tracebacks"] or counts["hangs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
