"""Built-in dataset workloads for `bench --dataset` (nothing is downloaded): each a preset of the
workload's length distributions and shared prefix, under the name vLLM's `bench serve` uses where
one fits (`random` with `--random-range-ratio`, as vllm/benchmarks/datasets; `prefix` for its
prefix-sharing sets; `sharegpt-synthetic` in place of ShareGPT, which would need a download).
Every prompt is still exact at its own length (prompts.build_specs)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True)
class Dataset:
    name: str
    input_dist: str
    output_dist: str
    what: str


DATASETS: dict[str, Dataset] = {d.name: d for d in (
    Dataset("fixed", "fixed", "fixed", "every prompt --input-len tokens, every output --output-len (the default)"),
    Dataset("random", "uniform", "uniform",
            "vLLM's random set: prompt and output lengths uniform within --random-range-ratio of --input-len and "
            "--output-len (vLLM's [len x (1 - r), len x (1 + r)]), --prefix-len tokens shared (vLLM's --random-prefix-len)"),
    Dataset("prefix", "fixed", "fixed",
            "prefix sharing: every prompt starts with the same --prefix-len tokens (default: half of --input-len)"),
    Dataset("sharegpt-synthetic", "lognormal", "lognormal",
            "ShareGPT-like chat requests built here: long-tailed (log-normal, sigma --random-range-ratio, default "
            "0.6) prompt and output lengths around --input-len and --output-len, a shared system prefix of "
            "--prefix-len tokens (default an eighth of --input-len); single-turn"),
)}


def help_text() -> str:
    return "; ".join(f"{d.name}: {d.what}" for d in DATASETS.values()).replace("%", "%%")


def workload_fields(name: str, input_len: int, prefix_len: int | None, range_ratio: float | None) -> dict:
    """The Workload fields (input_dist, output_dist, len_spread, prefix_len) of a dataset."""
    if name not in DATASETS:
        raise UsageError(f"--dataset: {name!r} is not one of {', '.join(DATASETS)}")
    d = DATASETS[name]
    if range_ratio is not None and not 0 <= range_ratio < 1:
        raise UsageError(f"--random-range-ratio {range_ratio:g} must be at least 0 and below 1")
    if range_ratio is not None and name in ("fixed", "prefix"):
        raise UsageError(f"--random-range-ratio does not apply to --dataset {name}")
    spread = range_ratio if range_ratio is not None else {"random": 0.0, "sharegpt-synthetic": 0.6}.get(name, 0.25)
    if prefix_len is None:
        prefix_len = {"prefix": input_len // 2, "sharegpt-synthetic": input_len // 8}.get(name, 0)
    dists = (d.input_dist, d.output_dist) if spread > 0 else ("fixed", "fixed")
    return {"input_dist": dists[0], "output_dist": dists[1], "len_spread": spread, "prefix_len": prefix_len,
            "dataset": name}
