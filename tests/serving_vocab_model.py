"""A tiny model whose tokenizer knows no English word as one token (issue 25's "few common English
words as single tokens"): a byte-level BPE trained on random Greek and Cyrillic text, so English
costs one token per byte. Built locally like harness/models.py's tiny models, cached by recipe."""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness.models import CHATML_TEMPLATE, SPECIAL_TOKENS, build_into, default_cache_dir

RECIPE = {"name": "foreign-vocab", "format": 1, "vocab_size": 400, "hidden_size": 256, "layers": 2,
          "heads": 4, "kv_heads": 2, "max_position_embeddings": 4096, "seed": 7}


def _corpus(seed: int, lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    letters = "αβγδεζηθικλμνξοπρστυφχψω" + "абвгдежзийклмнопрстуфхцчшщыэюя"
    return [" ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(rng.randint(4, 14)))
            for _ in range(lines)]


def _build(out_dir: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast, Qwen2Config

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.post_processor = processors.ByteLevel(trim_offsets=False)
    raw.train_from_iterator(_corpus(RECIPE["seed"]), trainer=trainers.BpeTrainer(
        vocab_size=RECIPE["vocab_size"], special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                        pad_token="<|pad|>", unk_token=None, additional_special_tokens=["<|im_start|>"],
                                        model_max_length=RECIPE["max_position_embeddings"])
    tokenizer.chat_template = CHATML_TEMPLATE
    ids = {t: raw.token_to_id(t) for t in SPECIAL_TOKENS}
    config = Qwen2Config(vocab_size=raw.get_vocab_size(), hidden_size=RECIPE["hidden_size"],
                         intermediate_size=2 * RECIPE["hidden_size"], num_hidden_layers=RECIPE["layers"],
                         num_attention_heads=RECIPE["heads"], num_key_value_heads=RECIPE["kv_heads"],
                         max_position_embeddings=RECIPE["max_position_embeddings"], tie_word_embeddings=True,
                         bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                         pad_token_id=ids["<|pad|>"], rms_norm_eps=1e-6)
    torch.manual_seed(RECIPE["seed"])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id, do_sample=False)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "harness-recipe.json").write_text(json.dumps(RECIPE, indent=2) + "\n")


def foreign_vocab_model_dir(cache_dir: Path | None = None) -> Path:
    import hashlib

    root = Path(cache_dir) if cache_dir else default_cache_dir() / "models"
    target = root / f"foreign-vocab-{hashlib.sha256(json.dumps(RECIPE, sort_keys=True).encode()).hexdigest()[:12]}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    return build_into(target, _build)
