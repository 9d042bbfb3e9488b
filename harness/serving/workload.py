"""Fixed-length workloads: prompts of an exact token count, built with the model's own tokenizer.

Every prompt is distinct (random words) so that prefix caching only helps where the workload asks
for it (`prefix_len`: a prefix shared by all prompts). Counts include the special tokens the server
adds when it tokenizes a completion prompt (e.g. a BOS), because that is what usage reports.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, asdict
from pathlib import Path

from ..errors import UsageError
from .client import RequestSpec

_WORD = re.compile(r"^ [A-Za-z]{2,}$")


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    num_prompts: int
    prefix_len: int = 0
    api: str = "completions"
    seed: int = 0
    input_dist: str = "fixed"  # DISTRIBUTIONS: each prompt's length drawn around input_len
    output_dist: str = "fixed"
    len_spread: float = 0.25  # uniform: mean x (1 +- spread); normal: sd = mean x spread, within 2 sd
    dataset: str = "fixed"  # the bench --dataset preset (datasets.py) these fields came from

    def __post_init__(self):
        if self.input_len < 1 or self.output_len < 1 or self.num_prompts < 1:
            raise UsageError("--input-len, --output-len and --num-prompts must be at least 1")
        if self.prefix_len < 0:
            raise UsageError(f"--prefix-len {self.prefix_len} must be 0 or more")
        if not self.prefix_len < self.input_len:
            raise UsageError(f"--prefix-len {self.prefix_len} must be below --input-len {self.input_len}")
        if self.api not in ("completions", "chat"):
            raise UsageError(f"--api: {self.api!r} is not completions or chat")
        for what, dist in (("--input-dist", self.input_dist), ("--output-dist", self.output_dist)):
            if dist not in DISTRIBUTIONS:
                raise UsageError(f"{what}: {dist!r} is not one of {', '.join(DISTRIBUTIONS)}")
        if not 0 <= self.len_spread < 1:
            raise UsageError(f"--len-spread {self.len_spread:g} must be at least 0 and below 1")
        if self.varied and self.prefix_len and self.prefix_len >= min(n for n, _ in self.lengths()):
            raise UsageError(f"--prefix-len {self.prefix_len} must be below the shortest drawn prompt "
                             f"({min(n for n, _ in self.lengths())} tokens)")

    @property
    def varied(self) -> bool:
        return (self.input_dist, self.output_dist) != ("fixed", "fixed")

    def lengths(self) -> list[tuple[int, int]]:
        """(prompt tokens, output tokens) of each request, drawn with the workload's seed."""
        rng = random.Random(self.seed * 7919 + 17)
        floor = self.prefix_len + 4 if self.dataset == "sharegpt-synthetic" else 1  # room beside its system prefix
        return [(max(floor, _draw(rng, self.input_dist, self.input_len, self.len_spread)),
                 _draw(rng, self.output_dist, self.output_len, self.len_spread)) for _ in range(self.num_prompts)]

    def to_json(self) -> dict:
        data = asdict(self)
        if not self.varied:  # files of fixed-length workloads keep the fields (and fingerprint) they had
            for key in ("input_dist", "output_dist", "len_spread"):
                data.pop(key)
        if self.dataset == "fixed":  # and the fingerprint of files written before --dataset
            data.pop("dataset")
        data.update(ignore_eos=True, min_tokens=self.output_len, max_tokens=self.output_len)
        return data


DISTRIBUTIONS = ("fixed", "uniform", "normal", "lognormal")


def _draw(rng: random.Random, dist: str, mean: int, spread: float) -> int:
    if dist == "uniform":
        return rng.randint(max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread))))
    if dist == "normal":  # within two standard deviations, and 1 .. 2 x mean
        low, high = max(1, round(mean * (1 - 2 * spread))), min(2 * mean, round(mean * (1 + 2 * spread)))
        return min(high, max(low, round(rng.gauss(mean, mean * spread))))
    if dist == "lognormal":  # long-tailed as chat logs are: median below the mean, within 1 .. 4 x mean
        return min(4 * mean, max(1, round(mean * math.exp(rng.gauss(-spread * spread / 2, spread)))))
    return mean


class PromptTokenizer:
    """The tokenizer of a model directory, through `tokenizers` (no transformers import)."""

    def __init__(self, model_dir: str | Path):
        from tokenizers import Tokenizer

        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise UsageError(f"--tokenizer: {str(model_dir)!r} has no tokenizer.json")
        self.source = str(Path(model_dir).resolve())
        self._tok = Tokenizer.from_file(str(path))
        self._specials = len(self._tok.encode("", add_special_tokens=True).ids)
        self._words = self._word_ids()

    def count(self, text: str) -> int:
        """Tokens the server will see for `text` as a completion prompt (specials included)."""
        return len(self._tok.encode(text, add_special_tokens=True).ids)

    def count_output(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def _word_ids(self) -> list[int]:
        words = []
        for token, tid in self._tok.get_vocab(with_added_tokens=False).items():
            text = self._tok.decode([tid])
            if _WORD.match(text) and self._tok.encode(text, add_special_tokens=False).ids == [tid]:
                words.append(tid)
        if len(words) < 16:
            raise UsageError("tokenizer: too few whole-word tokens to build exact-length prompts")
        return sorted(words)

    def text_of_length(self, n: int, rng: random.Random, prefix_ids: list[int] | None = None) -> tuple[str, list[int]]:
        """A text that tokenizes to exactly `n` tokens (specials included); returns (text, ids)."""
        body = n - self._specials
        if body < 1:
            raise UsageError(f"cannot build a prompt of {n} tokens with this tokenizer")
        ids = list(prefix_ids or [])
        ids += [rng.choice(self._words) for _ in range(body - len(ids))]
        for _ in range(50):
            text = self._tok.decode(ids)
            got = self.count(text)
            if got == n:
                return text, ids
            if got > n:
                ids = ids[:-1]
            else:
                ids.append(rng.choice(self._words))
        raise UsageError(f"could not build a prompt of exactly {n} tokens")


def build_specs(workload: Workload, tokenizer: PromptTokenizer) -> list[RequestSpec]:
    rng = random.Random(workload.seed)
    prefix_ids: list[int] | None = None
    if workload.prefix_len:
        _, prefix_ids = tokenizer.text_of_length(workload.prefix_len + tokenizer._specials, rng)
    specs = []
    for _ in range(workload.num_prompts):
        text, _ = tokenizer.text_of_length(workload.input_len, rng, prefix_ids)
        specs.append(RequestSpec(prompt=text, input_tokens=workload.input_len, output_tokens=workload.output_len,
                                 requested_input_tokens=workload.input_len))
    return specs


def specs_without_tokenizer(workload: Workload) -> list[RequestSpec]:
    """Word prompts of unknown token length, for the stand-in's client-limit benchmark only: a real
    server's prompts are calibrated with its own tokenizer (prompts.py), never guessed like this."""
    rng = random.Random(workload.seed)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
    prefix = " ".join(rng.choice(words) for _ in range(workload.prefix_len))
    specs = []
    for _ in range(workload.num_prompts):
        tail = " ".join(rng.choice(words) for _ in range(workload.input_len - workload.prefix_len))
        specs.append(RequestSpec(prompt=(prefix + " " + tail).strip(), input_tokens=0, output_tokens=workload.output_len))
    return specs


def tokenizer_dir_for(model: str, tokenizer: str | None) -> Path | None:
    """--tokenizer DIR, else --model when it is a local directory with a tokenizer.json."""
    if tokenizer:
        path = Path(tokenizer).expanduser()
        if not path.is_dir():
            raise UsageError(f"--tokenizer: {tokenizer!r} is not a directory")
        return path
    path = Path(model).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return path
    return None

