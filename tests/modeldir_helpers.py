"""Helpers shared by the tests/test_modeldir_* files: edit a model directory the way users break it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("harness-recipe.json"))
    return dst


def edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data, indent=2))


def edit_tensors(path: Path, edit) -> None:
    """Load a safetensors file, let `edit(dict)` change it in place, save it back."""
    tensors = load_file(str(path))
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def codes(report) -> set[str]:
    return {f.code for f in report.findings}
