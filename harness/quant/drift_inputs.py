"""What `drift BASE_DIR QUANT_DIR` can refuse before any model runs (loading two models and
running the text through both takes minutes): the same directory twice, a weights file that is
cut short or damaged, and two vocabularies of different sizes (their logits cannot be compared)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError


def check_inputs(base: Path, quant: Path) -> None:
    """Raise UsageError (one line) for a pair of model directories drift cannot compare."""
    if base.resolve() == quant.resolve():
        raise UsageError(f"BASE_DIR and QUANT_DIR are the same directory ({base}): give the model before "
                         "quantizing and the quantized one")
    for flag, folder in (("BASE_DIR", base), ("QUANT_DIR", quant)):
        _check_weights(flag, folder)
    base_vocab, quant_vocab = vocab_size(base), vocab_size(quant)
    if base_vocab is not None and quant_vocab is not None and base_vocab != quant_vocab:
        raise UsageError(f"the two models have different vocabularies (BASE_DIR vocab_size {base_vocab}, QUANT_DIR "
                         f"{quant_vocab}): their next-token distributions cannot be compared; was QUANT_DIR made "
                         "from BASE_DIR?")


def vocab_size(folder: Path) -> int | None:
    """config.json's vocab_size (a multimodal wrapper's text_config's), the width of the logits."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{folder / 'config.json'}: not a readable JSON config ({str(exc).splitlines()[0]})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{folder / 'config.json'}: a config.json must hold a JSON object")
    size = config.get("vocab_size")
    if size is None and isinstance(config.get("text_config"), dict):
        size = config["text_config"].get("vocab_size")
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _check_weights(flag: str, folder: Path) -> None:
    """Every safetensors file whole: its header parses and the file is as long as the header says."""
    from ..modeldir.safetensors_header import HeaderProblem, read_header

    for path in sorted(folder.glob("*.safetensors")):
        try:
            with path.open("rb") as fh:
                read_header(fh, path.stat().st_size)
        except HeaderProblem as problem:
            message = problem.message
        except OSError as exc:
            message = f"cannot read it ({exc.strerror or type(exc).__name__})"
        else:
            continue
        raise UsageError(f"{flag} {path}: {message} (`python -m harness check-dir {folder}` checks the "
                         "whole directory)")
