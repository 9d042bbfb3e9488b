"""Token ids the quantize step calibrates on and the drift is measured on.

Calibration and evaluation use different text (different seeds of the harness's deterministic
corpus), so the drift is not measured on the samples the quantizer fitted. A model directory
without a tokenizer (a reference architecture with random weights) gets seeded random ids.
"""

from __future__ import annotations

import random

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
