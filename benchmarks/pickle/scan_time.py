"""Time check-dir --allow-pickle on a 15 GB sharded pytorch_model-*.bin checkpoint of a 7B model.

The checkpoint is the real layout (torch.save zip shards of a qwen2.5-7b-shaped bf16 state dict,
transformers 4.x names, pytorch_model.bin.index.json) written sparsely: every tensor is backed by a
sparse file through torch.UntypedStorage.from_file and saved under torch.serialization.skip_data(),
so each shard has its full size on disk without 15 GB being written. check-dir reads the pickles
only; the figure written is wall time and the bytes it read.

    python benchmarks/pickle/scan_time.py [--model qwen2.5-7b] [--shards 4] [--keep DIR]
Writes reports/pickle-scan-time.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def build_checkpoint(out: Path, model: str, shards: int) -> dict:
    import torch
    from torch.serialization import skip_data

    from harness.models import random_model

    meta = random_model(model, device="meta", dtype=torch.bfloat16)
    shapes = {name: (tuple(t.shape), t.dtype) for name, t in meta.state_dict().items()}
    total = sum(torch.Size(s).numel() * torch.tensor([], dtype=d).element_size() for s, d in shapes.values())
    biggest = max(torch.Size(s).numel() * torch.tensor([], dtype=d).element_size() for s, d in shapes.values())
    out.mkdir(parents=True)
    backing = out / ".backing"
    with open(backing, "wb") as fh:
        fh.truncate(biggest)
    names = list(shapes)
    per = -(-len(names) // shards)
    weight_map = {}
    for index in range(shards):
        chunk = names[index * per:(index + 1) * per]
        shard = f"pytorch_model-{index + 1:05d}-of-{shards:05d}.bin"
        state = {}
        for name in chunk:
            shape, dtype = shapes[name]
            nbytes = torch.Size(shape).numel() * torch.tensor([], dtype=dtype).element_size()
            storage = torch.UntypedStorage.from_file(str(backing), True, nbytes)
            state[name] = torch.empty(0, dtype=dtype).set_(storage, 0, shape)
            weight_map[name] = shard
        with skip_data():
            torch.save(state, out / shard)
        del state
    backing.unlink()
    (out / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}))
    meta.config.save_pretrained(out)
    return {"tensors": len(names), "bytes": total,
            "files_bytes": sum(p.stat().st_size for p in out.glob("*.bin")),
            "on_disk_bytes": sum(p.stat().st_blocks * 512 for p in out.glob("*.bin"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="time check-dir --allow-pickle on a sparse 7B .bin checkpoint")
    parser.add_argument("--model", default="qwen2.5-7b")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="build here and keep it (default: a temp dir)")
    args = parser.parse_args(argv)
    import torch

    from harness.modeldir import check_dir

    tmp = None if args.keep else tempfile.mkdtemp(prefix="pickle-scan-")
    out = args.keep or Path(tmp) / "model"
    try:
        started = time.monotonic()
        built = build_checkpoint(out, args.model, args.shards)
        build_s = time.monotonic() - started
        print(f"built {built['files_bytes'] / 1e9:.1f} GB in {args.shards} shards "
              f"({built['on_disk_bytes'] / 1e6:.1f} MB on disk) in {build_s:.1f} s", file=sys.stderr)
        runs = []
        for _ in range(args.repeats):
            started = time.monotonic()
            report = check_dir(out, allow_pickle=True)
            runs.append(time.monotonic() - started)
        safety_errors = [f.code for f in report.findings if f.severity == "error" and f.code.startswith("safety.")]
        result = {
            "model": args.model, "shards": args.shards, **built, "build_s": round(build_s, 2),
            "check_dir_s": [round(r, 3) for r in runs], "check_dir_best_s": round(min(runs), 3),
            "bytes_read": report.bytes_read, "safety_errors": safety_errors,
            "pickle_files": sum(f.code == "safety.pickle_file" for f in report.findings),
            "machine": f"{platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, "
                       f"torch {torch.__version__}",
        }
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    dest = ROOT / "reports" / "pickle-scan-time"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.with_suffix(".json").write_text(json.dumps(result, indent=1))
    dest.with_suffix(".md").write_text(
        f"# check-dir --allow-pickle on a sparse {result['files_bytes'] / 1e9:.1f} GB {args.model} .bin checkpoint\n\n"
        f"{args.shards} shards, {result['tensors']} tensors: best {result['check_dir_best_s']} s of {result['check_dir_s']}, "
        f"{result['bytes_read'] / 1e6:.2f} MB read, safety errors {safety_errors}. {result['machine']}\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
