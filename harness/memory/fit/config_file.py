"""A model's config.json read: from a dict, a config file, a model directory, a GGUF file's metadata or a
reference name (harness/configs/), and errors that name the --config they came from.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from ...errors import UsageError
from ...models import CONFIG_DIR


def load_config(spec: str | Path | dict) -> tuple[dict, Path | None]:
    """(config dict, model directory or None) from a dict, a config.json, a directory or a
    reference name (harness/configs/<name>.json)."""
    if isinstance(spec, dict):
        return dict(spec), None
    if str(spec).lower().endswith(".gguf"):
        from .gguf import read_gguf

        return {k: v for k, v in read_gguf(spec).config.items() if v is not None}, None
    path = Path(spec).expanduser()
    directory = None
    if path.is_dir():
        directory = path
        path = path / "config.json"
        if not path.is_file():
            raise UsageError(f"{directory} has no config.json")
    elif not path.is_file():
        ref = CONFIG_DIR / f"{spec}.json"
        if not ref.is_file():
            from ...models import unknown_reference_hint

            raise UsageError(f"--config: {str(spec)!r} is neither a file, a model directory nor a "
                             f"reference name{unknown_reference_hint(str(spec))}")
        path = ref
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON config ({str(exc).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: a config.json must hold a JSON object")
    if "text_config" in config and "hidden_size" not in config:  # multimodal wrappers
        config = dict(config["text_config"], model_type=config["text_config"].get("model_type"))
    return config, directory


@contextmanager
def naming_config(spec: str | Path | dict):
    """An error in what a config holds ("config has no hidden_size") names the --config it came from."""
    try:
        yield
    except UsageError as exc:
        if isinstance(spec, dict) or str(spec) in str(exc):
            raise
        raise UsageError(f"--config {spec}: {exc}") from None
