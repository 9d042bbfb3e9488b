"""Benchmark of check-dir on a 7B-sized directory: header-only time per shard, --deep peak RSS.

    python benchmarks/modeldir/bench_deep.py [--config qwen2.5-7b] [--small qwen2.5-0.5b] [--dir /tmp/x] [--keep]

Writes random bf16 directories (shapes from the published config, data written chunk by chunk
from one repeated random block: never more than a few MB in memory), runs
`python -m harness check-dir` on them in child processes, and measures wall time and the child's
peak RSS (getrusage). Figures go to reports/modeldir-bench.json. Not a test: it writes ~15 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.modeldir.consistency import expected_model  # noqa: E402
from harness.modeldir.paths import DirView  # noqa: E402
from harness.modeldir.safetensors_header import read_header  # noqa: E402
from harness.models import reference_config, tiny_model_dir  # noqa: E402

SHARD_BYTES = 5 * 10**9  # transformers v4's default shard size: several shards for a 7B model
BLOCK = 16 * 2**20


def write_random_dir(config_name: str, out: Path) -> dict:
    import torch

    config = reference_config(config_name)
    config["dtype"] = "bfloat16"
    config.pop("torch_dtype", None)
    expected = expected_model(config)
    names = [n for n in expected.shapes if not (expected.tied and n == expected.lm_head_key)]
    shards: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = 2 * _numel(expected.shapes[name])
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    out.mkdir(parents=True)
    block = (torch.randn(BLOCK // 2) * 0.02).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
    weight_map, total = {}, 0
    started = time.monotonic()
    for i, members in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name in members:
            nbytes = 2 * _numel(expected.shapes[name])
            header[name] = {"dtype": "BF16", "shape": list(expected.shapes[name]), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = fname
        blob = json.dumps(header).encode()
        blob += b" " * (-len(blob) % 8)
        with open(out / fname, "wb") as fh:
            fh.write(struct.pack("<Q", len(blob)) + blob)
            remaining = offset
            while remaining:
                n = min(remaining, len(block))
                fh.write(block[:n])
                remaining -= n
        total += offset
        print(f"[bench] wrote {fname}: {offset / 1e9:.2f} GB ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    tiny = tiny_model_dir("qwen2")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(tiny / name, out / name)
    return {"config": config_name, "shards": len(shards), "bytes": total,
            "params": total // 2, "write_s": round(time.monotonic() - started, 1)}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def header_times(directory: Path) -> list[float]:
    view = DirView.open(directory)
    times = []
    for shard in sorted(directory.glob("model-*.safetensors")):
        t = time.perf_counter()
        with view.open_binary(shard.name) as fh:
            read_header(fh, shard.stat().st_size)
        times.append(time.perf_counter() - t)
    return times


def run_check(directory: Path, deep: bool) -> dict:
    """check-dir in a child process: wall time, the child's peak RSS, its JSON verdict."""
    command = [sys.executable, "-m", "harness", "check-dir", str(directory), "--json"] + (["--deep"] if deep else [])
    with tempfile.TemporaryFile("w+") as stdout:
        t = time.monotonic()
        proc = subprocess.Popen(command, cwd=ROOT, stdout=stdout, env={**os.environ, "PYTHONPATH": str(ROOT)})
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (peak RSS), not all children's
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t
        stdout.seek(0)
        text = stdout.read()
    result = json.loads(text) if text.strip() else {}
    return {"deep": deep, "exit": proc.returncode, "ok": result.get("ok"), "wall_s": round(wall, 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "bytes_read": result.get("bytes_read"),
            "findings": [f["code"] for f in result.get("findings", [])]}


def drop_page_cache_hint(directory: Path) -> None:
    """Ask the kernel to forget the files' pages (so --deep really reads from disk)."""
    for f in directory.glob("*.safetensors"):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="qwen2.5-7b")
    parser.add_argument("--small", default="qwen2.5-0.5b", help="a smaller config, to show RSS stays flat")
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir on /tmp)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", default=str(ROOT / "reports" / "modeldir-bench.json"))
    args = parser.parse_args()

    base = Path(args.dir or tempfile.mkdtemp(prefix="modeldir-bench-"))
    figures = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]}, "runs": []}
    try:
        for name in [args.small, args.config]:
            d = base / name
            info = write_random_dir(name, d)
            times = header_times(d)
            info["header_s_per_shard"] = [round(x, 5) for x in times]
            info["header_only"] = run_check(d, deep=False)
            drop_page_cache_hint(d)
            info["deep"] = run_check(d, deep=True)
            info["deep"]["read_gb_per_s"] = round(info["bytes"] / 1e9 / max(info["deep"]["wall_s"], 1e-9), 2)
            figures["runs"].append(info)
            print(json.dumps(info), file=sys.stderr, flush=True)
            _write(Path(args.out), figures)
            if not args.keep:
                shutil.rmtree(d)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    return 0


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
