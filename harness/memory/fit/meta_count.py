"""An architecture's parameters and generation cache as transformers builds it on the meta device.

For a family the estimator has no layout rule for, transformers' own modeling code is the
answer: the CausalLM is built on the meta device (bf16, the dtype it runs in), its parameters
are counted by role, and one forward there reads its cache layer by layer (cache_layout.py).
Importing torch and transformers and building the model cost 4-6 CPU-s a process on the 2-core
box, so the count is kept on disk (harness/disk_cache.py) under the config's content, the
installed torch and transformers, and the source of the code that counts: a later `harness
estimate` or `plan` of the same config reads it instead. HARNESS_META_CACHE=0 turns that off.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from ...disk_cache import DiskCache
from ...errors import UsageError
from .cache_layout import CacheLayer, layout_from_meta

_CACHE = DiskCache("meta-counts", ("torch", "transformers"), switch="HARNESS_META_CACHE")
_COUNTING_CODE = (Path(__file__), Path(__file__).with_name("cache_layout.py"))


class ParamTally:
    """Parameters counted by role, from safetensors headers or a meta-device model alike."""

    def __init__(self) -> None:
        self.linears: dict[tuple[str, int, int, str], int] = {}
        self.emb = self.lm_head = self.norm = self.bias = self.norm_t = self.bias_t = 0
        self.extra_emb = self.experts = 0

    def linear(self, name: str, in_features: int, out_features: int) -> None:
        """`name`: the module's dotted name (model.layers.0.self_attn.q_proj)."""
        parts = name.split(".")
        key = (parts[-1], in_features, out_features, parts[-2] if len(parts) > 1 else "")
        self.linears[key] = self.linears.get(key, 0) + 1

    def other(self, numel: int, is_bias: bool) -> None:
        if is_bias:
            self.bias, self.bias_t = self.bias + numel, self.bias_t + 1
        else:  # norms and anything else that is not quantized
            self.norm, self.norm_t = self.norm + numel, self.norm_t + 1

    _SCALARS = ("emb", "lm_head", "norm", "bias", "norm_t", "bias_t", "extra_emb", "experts")

    def to_json(self) -> dict:
        return {"linears": [[*k, c] for k, c in sorted(self.linears.items())],
                **{name: getattr(self, name) for name in self._SCALARS}}

    @classmethod
    def from_json(cls, data: dict) -> ParamTally:
        tally = cls()
        tally.linears = {(str(kind), int(i), int(o), str(parent)): int(c) for kind, i, o, parent, c in data["linears"]}
        for name in cls._SCALARS:
            setattr(tally, name, int(data[name]))
        return tally


def count_on_meta(config: dict) -> tuple[ParamTally, tuple[CacheLayer, ...]]:
    """The config's parameters by role and its cache layout, from the disk when counted before.
    A config transformers refuses is a one-line UsageError (never stored)."""
    key = _CACHE.key(config, _COUNTING_CODE)
    stored = _CACHE.load(key)
    if stored is not None:
        try:
            return ParamTally.from_json(stored["tally"]), tuple(CacheLayer(**layer) for layer in stored["cache"])
        except (KeyError, TypeError, ValueError):
            pass  # another format: counted again and stored over it
    tally, layout = _count(config)
    _CACHE.save(key, {"tally": tally.to_json(), "cache": [asdict(layer) for layer in layout]})
    return tally, layout


def _count(config: dict) -> tuple[ParamTally, tuple[CacheLayer, ...]]:
    try:
        import torch
        from transformers.pytorch_utils import Conv1D
    except ImportError as exc:  # pragma: no cover - torch is a hard dependency
        raise UsageError(f"unknown architecture needs torch and transformers: {exc}") from None
    model = build_on_meta(config)
    tally = ParamTally()
    seen: set[int] = set()
    out_emb = model.get_output_embeddings()
    in_emb = model.get_input_embeddings()
    for name, module in model.named_modules():
        for pname, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            numel = param.numel()
            if isinstance(module, torch.nn.Embedding):
                tally.emb += numel
                if module is not in_emb:  # Gemma-4's per-layer input tables
                    tally.extra_emb += numel
            elif module is out_emb and pname == "weight":
                tally.lm_head += numel
            elif module is out_emb:
                tally.bias += numel
            elif isinstance(module, torch.nn.Linear) and pname == "weight":
                tally.linear(name, module.in_features, module.out_features)
            elif isinstance(module, Conv1D) and pname == "weight":  # GPT-2 style: weight is (in, out)
                tally.linear(name, param.shape[0], param.shape[1])
            else:
                # fused MoE experts: a 3-D nn.Parameter, not an nn.Linear (a Conv1d's weight is 3-D too)
                if param.dim() == 3 and not isinstance(module, torch.nn.modules.conv._ConvNd):
                    tally.experts += numel
                tally.other(numel, is_bias=pname == "bias")
    return tally, layout_from_meta(model, str(config.get("model_type")))


def build_on_meta(config: dict):
    """The CausalLM of a config dict on the meta device, bf16; a config transformers refuses is a
    one-line UsageError naming the reason."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedConfig

    # save_pretrained writes inf as {"__float__": "Infinity"} (Granite-4 hybrid's, Falcon-H1's
    # time_step_limit); transformers decodes it on load, and so do we
    data = PreTrainedConfig._decode_special_floats(dict(config))
    model_type = data.pop("model_type", None)
    try:
        cfg = AutoConfig.for_model(model_type, **data)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises is the refusal's reason
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
        first = " ".join(lines[:2])
        if first.startswith("Unrecognized model identifier"):  # followed by every model_type it knows
            first = f"transformers {_transformers_version()} does not know this model_type"
        raise UsageError(f"cannot build model_type {model_type!r} on the meta device: {first[:300]}") from None


def _transformers_version() -> str:
    from importlib.metadata import version

    return version("transformers")
