"""Numbers in config.json / generation_config.json that load garbage.

json.loads (what transformers uses) accepts NaN, Infinity and -Infinity, and transformers' config
classes keep them: `rms_norm_eps: NaN` makes every logit NaN, `rope_theta: Infinity` every
position the same. Every non-finite number anywhere in these files is an error. Ranges the
installed transformers does not validate itself are checked from RANGES, a table of ours (it can
drift from the models, so it holds only bounds every architecture shares); what transformers
does validate is its own `config.rejected` (harness.modeldir.check._expected).
"""

from __future__ import annotations

import math

from .findings import Collector

# key (anywhere in the file, nested configs included) -> (lowest allowed, highest allowed, open low end)
RANGES: dict[str, tuple[float, float, bool]] = {
    "rms_norm_eps": (0.0, 1.0, True),
    "layer_norm_eps": (0.0, 1.0, True),
    "layer_norm_epsilon": (0.0, 1.0, True),
    "norm_eps": (0.0, 1.0, True),
    "rope_theta": (0.0, math.inf, True),
    "initializer_range": (0.0, math.inf, False),
    "attention_dropout": (0.0, 1.0, False),
    "hidden_dropout": (0.0, 1.0, False),
    "partial_rotary_factor": (0.0, 1.0, True),
    "temperature": (0.0, math.inf, False),
    "top_p": (0.0, 1.0, False),
}
FILES = ("config.json", "generation_config.json")


def check_values(rel: str, data, out: Collector) -> None:
    for key, value in _numbers(data, ""):
        if not math.isfinite(value):
            out.add("config.non_finite", rel,
                    f"{key} is {value!r}: json.loads and transformers accept it, and the model computes garbage "
                    "(NaN logits, or every position alike); copy the value from the base model's config")
            continue
        bound = RANGES.get(key.rsplit(".", 1)[-1])
        if bound is None:
            continue
        low, high, open_low = bound
        if value < low or (open_low and value == low) or value > high:
            side = ">" if open_low else ">="
            out.add("config.out_of_range", rel,
                    f"{key} is {value!r}, outside {side} {low:g} and <= {high:g}: the loaders accept it and the model "
                    "computes garbage; copy the value from the base model's config")


def _numbers(data, prefix: str):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _numbers(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(data, list):
        for i, value in enumerate(data[:4096]):
            yield from _numbers(value, f"{prefix}[{i}]")
    elif isinstance(data, float) or (isinstance(data, int) and not isinstance(data, bool)):
        yield prefix, float(data) if isinstance(data, float) or abs(data) < 2**1023 else math.inf
