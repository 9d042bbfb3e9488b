"""The reader of this tree: what was measured, as data (manifest.json says, for each entry, what
produced it and what reads it).

An entry is either packed (one raw run as `<name>.tar.gz`, its summary `<name>.json` and its notes
`<name>.md` beside it) or a set of plain files (`files`, each with its sha256). A packed run is read
unpacked: `unpacked(name)` extracts it once into the repository's .cache/ (git-ignored) and returns
that directory, laid out as the run wrote it. The harness library never reads this tree; the tests,
suites, benchmarks and scripts pass what they read from here to it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
CACHE = HERE.parent / ".cache" / "measurements"


def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def entries(kind: str | None = None) -> list[dict]:
    return [e for e in manifest()["entries"] if kind is None or e["kind"] == kind]


def entry(name: str) -> dict:
    for e in manifest()["entries"]:
        if e["name"] == name:
            return e
    raise KeyError(f"no measurement {name!r} in {MANIFEST}")


def path(name: str) -> Path:
    """The archive of a packed entry, or the folder of a set of plain files."""
    e = entry(name)
    return HERE / (e["archive"] if "archive" in e else e["folder"])


def file(name: str, relative: str) -> Path:
    """One plain file of an entry (KeyError when the manifest does not list it)."""
    e = entry(name)
    if relative not in e.get("files", {}):
        raise KeyError(f"{name}: {relative} is not one of its files")
    return HERE / e["folder"] / relative


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def unpacked(name: str) -> Path:
    """A packed entry's run directory (extracted once per archive content, safe under xdist)."""
    archive = path(name)
    digest = sha256(archive)[:12]
    target = CACHE / f"{name.replace('/', '--')}-{digest}"
    if target.is_dir():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=CACHE, prefix=".unpacking-"))
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another process unpacked it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def run_dir(spec: str | Path) -> Path:
    """A families run given as a directory, or as an entry of this tree: its name (vram/families/run-18),
    its archive, or either with measurements/ in front."""
    p = Path(spec)
    if p.is_dir():
        return p
    name = str(spec).removesuffix(".tar.gz")
    if Path(name).is_absolute() and Path(name).is_relative_to(HERE):
        name = str(Path(name).relative_to(HERE))
    return unpacked(name.removeprefix("measurements/"))


def families_runs() -> list[Path]:
    """The families runs the committed verdict figures are read over (runs 1-13, in order)."""
    return [unpacked(e["name"]) for e in entries("families-run") if e.get("families_truth")]


def pack(directory: Path, archive: Path, exclude: tuple[str, ...] = ("README.md",)) -> None:
    """A run directory as one reproducible tar.gz (sorted, no owners, no times)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in sorted(directory.rglob("*")):
            rel = p.relative_to(directory)
            if str(rel) in exclude or not p.is_file():
                continue
            info = tarfile.TarInfo(rel.as_posix())
            info.size, info.mtime, info.mode = p.stat().st_size, 0, 0o644
            with p.open("rb") as f:
                tar.addfile(info, f)
    with archive.open("wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(buf.getvalue())


def summarise(name: str) -> dict:
    """What a packed run holds, recomputed from its raw files: files, rows per kind, the training
    steps that ran out and those that fitted, the environment it ran under."""
    if entry(name)["kind"] == "matrix-run":
        return _summarise_matrix(name)
    from harness.memory.measured import families_truth as T

    directory = unpacked(name)
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    rows = T.load_rows(directory)
    env_files = sorted(directory.rglob("environment.json"))
    env = json.loads(env_files[0].read_text()) if env_files else {}
    train = rows["train"]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "rows": {kind: len(v) for kind, v in rows.items()},
            "train_ran_out": sum(1 for r in train if r.get("oom")),
            "train_fitted": sum(1 for r in train if r.get("oom") is False),
            "environment": {k: env.get(k) for k in ("gpu", "torch", "cuda", "transformers", "peft",
                                                    "bitsandbytes", "job_set")}}


def _summarise_matrix(name: str) -> dict:
    """A packed VRAM matrix run (rows-<arch>.json files): files, rows per mode, architectures, environment."""
    from harness.memory.measured.matrix_readback import load_matrix

    files = sorted(p for p in unpacked(name).rglob("*") if p.is_file())
    rows, env = load_matrix(matrix_rows(name))
    modes: dict[str, int] = {}
    for r in rows:
        modes[r["mode"]] = modes.get(r["mode"], 0) + 1
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files), "rows": modes,
            "archs": sorted({r["arch"] for r in rows}),
            "environment": {k: env.get(k) for k in ("gpu", "torch", "cuda", "transformers", "peft", "bitsandbytes")}}


def folder(name: str) -> Path:
    """The folder of an entry of plain files."""
    return HERE / entry(name)["folder"]


def matrix_rows(name: str = "vram/matrix") -> list[Path]:
    """The rows-*.json files of a committed VRAM matrix (vram/matrix, vram/holdout; vram/run1 is packed)."""
    where = unpacked(name) if "archive" in entry(name) else folder(name)
    return sorted(where.glob("rows-*.json"))


def truth_runs() -> dict[str, Path]:
    """The fresh-process training runs, in order: the matrix and first boundary cases (the fit's
    rows), then the validation run drawn after the estimator was fixed."""
    truth = folder("vram/truth")
    return {"run1": truth / "train_rows.json", "validation": truth / "validation" / "train_rows.json"}
