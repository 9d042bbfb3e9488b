"""Offload planning: when a model does not fit the card, where accelerate puts it and what it costs.

`plan_offload` builds the model on the meta device (no weights, no GPU), asks transformers/accelerate
for the placement `from_pretrained(device_map="auto", max_memory=...)` would choose for a budget
(the GPU gets the budget after the CUDA context, the headroom and the runtime memory of the context
asked for; the CPU gets the host RAM), and sums the bytes per device.

Decode time per token (docs/architecture.md, Memory: offload): offloaded layers still run on the GPU; accelerate's hooks
copy their weights host -> device on every forward, from ordinary (pageable) host memory, and drop
them afterwards. So every generated token re-sends every offloaded byte:

    t_token = gpu_bytes / device_bw + cpu_bytes / h2d_bw + disk_bytes / disk_bw + layers x t_layer

device_bw, h2d_bw: from a `suites/hw --hw-level full` results JSON (its d2d_bandwidth and
h2d_bandwidth checks; the pageable figure when the check measured it) or the defaults below, which
describe a 6-8 GiB consumer card on PCIe 4.0. t_layer is the per-layer cost of an eager decode step
(Python and kernel launches), which bounds small-batch decode on any GPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ...errors import UsageError
from ...units import format_bytes

OFFLOAD_PRECISIONS = ("fp32", "fp16", "bf16")
# Defaults for a 6-8 GiB consumer card (RTX 3060/4060 class) when no hw results are given:
DEFAULT_H2D_GBPS = 8.0  # pageable host -> device copies over PCIe 4.0 (x8 on many such cards)
DEFAULT_DEVICE_GBPS = 300.0  # GDDR6 read bandwidth of that class (RTX 3060 360 GB/s, 4060 272 GB/s)
DEFAULT_DISK_GBPS = 2.0  # an NVMe SSD read; weights offloaded to disk are read back every token
# An eager transformers decode step costs Python and kernel launches per decoder layer whatever the
# GPU: measured on the H200 host (transformers 5.17), qwen2.5-7b all on the GPU decodes at 54.8
# ms/token, of which 3.5 ms read the weights: 1.8 ms per layer (measurements/vram/truth/).
DEFAULT_LAYER_MS = 1.8
# Host memory of the process itself (Python, torch, transformers, the CUDA runtime's host side),
# before any offloaded weight: measured RSS of a loaded all-GPU 7B process on the H200 machine.
HOST_BASELINE_BYTES = 2 * 1024**3


@dataclass
class Bandwidths:
    h2d_gbps: float = DEFAULT_H2D_GBPS
    h2d_source: str = "default (pageable PCIe 4.0 copy of a consumer card)"
    device_gbps: float = DEFAULT_DEVICE_GBPS
    device_source: str = "default (GDDR6 of a 6-8 GiB card)"
    disk_gbps: float = DEFAULT_DISK_GBPS
    layer_ms: float = DEFAULT_LAYER_MS


def _check_figures(test: dict) -> list[dict]:
    rec = test.get("record") or {}
    details = rec.get("details") or {}
    return details.get("per_gpu") and [g.get("details", {}) for g in details["per_gpu"]] or [details]


def offload_h2d(fig: dict) -> tuple[float, str]:
    """The host-to-device rate offloaded weights are copied at, from an h2d_bandwidth figure:
    transformers 5 keeps CPU-offloaded weights as views of the memory-mapped checkpoint, so the
    copy from a mapped file (mmap_gbps) when measured, else from ordinary pageable memory, else
    (an older results file) the pinned figure, which flatters the prediction. Best of all the
    copy that imitates the hooks: tensor by tensor from a mapped file (offload_gbps)."""
    if fig.get("offload_gbps"):
        return float(fig["offload_gbps"]), "h2d tensor by tensor from a memory-mapped file"
    if fig.get("mmap_gbps"):
        return float(fig["mmap_gbps"]), "h2d from a memory-mapped file"
    if fig.get("pageable_gbps"):
        return float(fig["pageable_gbps"]), "pageable h2d (memory-mapped not measured)"
    return float(fig["gbps"]), "pinned h2d (pageable not measured)"


def bandwidths_from_results(path: str | Path) -> Bandwidths:
    """Bandwidths from a results JSON of `pytest suites/hw --hw-level full` (first GPU)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"--hw-results: {path} is not a readable results JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not isinstance(data.get("tests"), list):
        raise UsageError(f"--hw-results: {path} is not a harness results JSON (no tests list)")
    bw = Bandwidths()
    found = False
    for test in data["tests"]:
        check = (test.get("record") or {}).get("check")
        figs = _check_figures(test)
        fig = figs[0] if figs else {}
        if check == "h2d_bandwidth" and fig.get("gbps"):
            found = True
            gbps, what = offload_h2d(fig)
            bw.h2d_gbps, bw.h2d_source = gbps, f"{path.name}: {what}"
        elif check == "d2d_bandwidth" and fig.get("gbps"):
            bw.device_gbps, bw.device_source = float(fig["gbps"]), f"{path.name}: d2d_bandwidth"
    if not found:
        raise UsageError(f"--hw-results: {path} has no h2d_bandwidth figure (run pytest suites/hw --hw-level full)")
    return bw


@dataclass
class OffloadPlan:
    precision: str
    budget_bytes: int
    context_bytes: int
    headroom: float
    seq_len: int  # the context (prompt + generated) the GPU keeps room for
    runtime_bytes: int  # KV cache + activations + logits of that context (the estimator)
    gpu_max_memory_bytes: int  # what max_memory gives the GPU for weights
    cpu_max_memory_bytes: int
    device_map: dict[str, Any]
    bytes_on_gpu: int
    bytes_on_cpu: int
    bytes_on_disk: int
    layers_on: dict[str, int]
    host_ram_bytes: int  # offloaded-to-CPU weights + the process itself
    h2d_gbps: float
    h2d_source: str
    device_gbps: float
    disk_gbps: float
    predicted_decode_ms: float
    predicted_tokens_per_s: float
    offloaded: bool
    reason: str
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def meta_model(spec: str | Path | dict, precision: str = "bf16"):
    """The architecture on the meta device (no memory), in the dtype it will be loaded in."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from ...models import torch_dtype
    from .config_file import load_config

    config, _ = load_config(spec)
    data = dict(config)
    model_type = data.pop("model_type", None)
    if not model_type:
        raise UsageError("config has no model_type: cannot build the model to place it")
    try:
        cfg = AutoConfig.for_model(model_type, **data)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype(precision))
    except Exception as exc:  # noqa: BLE001 - unknown or broken configs are the user's input
        raise UsageError(f"cannot build model_type {model_type!r} on the meta device: "
                         f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    return model


def infer_placement(model, max_memory: dict) -> dict[str, Any]:
    """The device_map from_pretrained(device_map="auto", max_memory=max_memory) computes."""
    import logging

    # planning for a GPU this machine may not have: accelerate warns "Device 0 is not available"
    quiet = logging.getLogger("accelerate.utils.modeling")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        try:  # transformers >= 5 computes it itself (balanced memory, then infer_auto_device_map)
            from transformers.integrations.accelerate import _get_device_map

            return dict(_get_device_map(model, "auto", dict(max_memory), None))
        except ImportError:
            from accelerate import infer_auto_device_map

            return dict(infer_auto_device_map(model, max_memory=dict(max_memory),
                                              no_split_module_classes=model._no_split_modules))
    finally:
        quiet.setLevel(level)


def _device_kind(device: Any) -> str:
    if device in ("cpu", "disk"):
        return device
    return "gpu"


def bytes_by_device(model, device_map: dict[str, Any]) -> dict[str, int]:
    """Parameter and persistent-buffer bytes per device kind (gpu, cpu, disk) under device_map."""
    out = {"gpu": 0, "cpu": 0, "disk": 0}
    prefixes = sorted(device_map, key=len, reverse=True)
    seen: set[int] = set()
    tensors = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers())
    for name, tensor in tensors:
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        owner = next((p for p in prefixes if p == "" or name == p or name.startswith(p + ".")), None)
        if owner is None:
            continue
        out[_device_kind(device_map[owner])] += tensor.numel() * tensor.element_size()
    return out


def layers_by_device(device_map: dict[str, Any], n_layers: int) -> dict[str, int]:
    counts = {"gpu": 0, "cpu": 0, "disk": 0}
    prefixes = sorted(device_map, key=len, reverse=True)
    for i in range(n_layers):
        name = f"model.layers.{i}"
        owner = next((p for p in prefixes if p == "" or name == p or name.startswith(p + ".")), None)
        if owner is not None:
            counts[_device_kind(device_map[owner])] += 1
    return counts


def predict_decode_ms(bytes_on: dict[str, int], n_layers: int, bw: Bandwidths) -> float:
    seconds = (bytes_on["gpu"] / (bw.device_gbps * 1e9) + bytes_on["cpu"] / (bw.h2d_gbps * 1e9)
               + bytes_on["disk"] / (min(bw.disk_gbps, bw.h2d_gbps) * 1e9))
    return seconds * 1e3 + n_layers * bw.layer_ms


def plan_offload(spec: str | Path | dict, budget_bytes: int, precision: str = "bf16",
                 context_bytes: int | None = None, headroom: float | None = None, seq_len: int = 2048,
                 new_tokens: int = 128, cpu_memory_bytes: int | None = None,
                 bandwidths: Bandwidths | None = None, model=None) -> OffloadPlan:
    """Placement and decode cost of `spec` at `precision` on a card of `budget_bytes`."""
    from .budget import DEFAULT_CONTEXT_BYTES, DEFAULT_HEADROOM
    from .estimate import Query, estimate
    from .shape import model_shape

    if precision not in OFFLOAD_PRECISIONS:
        raise UsageError(f"--offload plans {', '.join(OFFLOAD_PRECISIONS)} weights (bitsandbytes keeps "
                         f"offloaded {precision} layers in another format); got {precision!r}")
    context = DEFAULT_CONTEXT_BYTES if context_bytes is None else context_bytes
    headroom = DEFAULT_HEADROOM if headroom is None else headroom
    bw = bandwidths or Bandwidths()
    shape = model_shape(spec)
    prompt = max(1, seq_len - new_tokens)
    gen = estimate(shape, Query(precision, "generate", seq_len=prompt, new_tokens=seq_len - prompt))
    runtime = gen.peak_bytes - gen.breakdown["weights"]
    usable = int((budget_bytes - context) / (1 + headroom))
    gpu_max = usable - runtime
    notes = []
    if gpu_max <= 0:
        raise UsageError(f"a {format_bytes(budget_bytes)} card has no room for weights: {seq_len} tokens of "
                         f"KV cache and activations need {format_bytes(runtime)} of the "
                         f"{format_bytes(usable)} usable after the {format_bytes(context)} CUDA context and "
                         f"{headroom:.0%} headroom")
    if cpu_memory_bytes is None:
        try:
            import psutil

            cpu_memory_bytes = int(psutil.virtual_memory().available)
            notes.append(f"CPU max_memory: this machine's available RAM ({format_bytes(cpu_memory_bytes)})")
        except Exception:  # noqa: BLE001 - psutil missing: assume the weights fit in RAM
            cpu_memory_bytes = 1 << 50
    model = model if model is not None else meta_model(spec, precision)
    max_memory = {0: gpu_max, "cpu": cpu_memory_bytes}
    device_map = infer_placement(model, max_memory)
    on = bytes_by_device(model, device_map)
    layers = layers_by_device(device_map, shape.layers)
    largest_layer = max((sum(p.numel() * p.element_size() for p in layer.parameters())
                         for layer in _decoder_layers(model)), default=0)
    host = on["cpu"] + (largest_layer if on["disk"] else 0) + HOST_BASELINE_BYTES
    ms = predict_decode_ms(on, shape.layers, bw)
    offloaded = bool(on["cpu"] or on["disk"])
    total = sum(on.values())
    if not offloaded:
        reason = (f"all {format_bytes(total)} of weights fit on the GPU (room for {format_bytes(gpu_max)} "
                  f"after the {format_bytes(context)} CUDA context, {headroom:.0%} headroom and "
                  f"{format_bytes(runtime)} for {seq_len} tokens): no offload needed")
    else:
        where = f"{layers['cpu']} of {shape.layers} layers on the CPU" + (
            f", {layers['disk']} on disk" if layers["disk"] else "")
        reason = (f"{format_bytes(on['gpu'])} of {format_bytes(total)} fit on the GPU; {where}: every token "
                  f"copies {format_bytes(on['cpu'] + on['disk'])} host -> device at {bw.h2d_gbps:.1f} GB/s "
                  f"({bw.h2d_source})")
    return OffloadPlan(
        precision=precision, budget_bytes=budget_bytes, context_bytes=context, headroom=headroom,
        seq_len=seq_len, runtime_bytes=runtime, gpu_max_memory_bytes=gpu_max,
        cpu_max_memory_bytes=cpu_memory_bytes, device_map={k: v for k, v in device_map.items()},
        bytes_on_gpu=on["gpu"], bytes_on_cpu=on["cpu"], bytes_on_disk=on["disk"], layers_on=layers,
        host_ram_bytes=host, h2d_gbps=bw.h2d_gbps, h2d_source=bw.h2d_source, device_gbps=bw.device_gbps,
        disk_gbps=bw.disk_gbps, predicted_decode_ms=round(ms, 2), predicted_tokens_per_s=round(1e3 / ms, 3),
        offloaded=offloaded, reason=reason, notes=notes)


def _decoder_layers(model):
    for name, module in model.named_modules():
        parts = name.split(".")
        if len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit():
            yield module


# ---------------------------------------------------------------------------------------------
# On a GPU: load with a placement and time decode steps


def measure_decode(model, device: str = "cuda:0", prompt_len: int = 128, new_tokens: int = 16,
                   seed: int = 0) -> dict:
    """Greedy decode step by step with a KV cache; ms per token (median of the steps after the
    first two), and the prefill time. Works on offloaded (hooked) models: inputs go to `device`."""
    import statistics
    import time

    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(3, vocab - 1, (1, prompt_len), generator=g).to(device)
    sync = (lambda: torch.cuda.synchronize(device)) if str(device).startswith("cuda") else (lambda: None)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        out = model(input_ids=ids, use_cache=True)
        sync()
        prefill_ms = (time.perf_counter() - t0) * 1e3
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1).to(device)
        steps = []
        for _ in range(new_tokens):
            sync()
            t0 = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=past, use_cache=True)
            sync()
            steps.append((time.perf_counter() - t0) * 1e3)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1).to(device)
    steady = steps[2:] if len(steps) > 4 else steps
    ms = statistics.median(steady)
    return {"decode_ms_per_token": round(ms, 3), "tokens_per_s": round(1e3 / ms, 3), "prefill_ms": round(prefill_ms, 2),
            "step_ms": [round(s, 2) for s in steps], "prompt_len": prompt_len, "new_tokens": new_tokens}



def record_failure(row: dict, exc: BaseException) -> None:
    """A measured run that raised: an out-of-memory is the finding (row["oom"]), anything else is
    recorded as the row's one-line error."""
    import torch

    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        row["oom"] = True
    else:
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:400]

def run_placement(model_dir: str | Path, device_map: dict[str, Any] | str, budget_bytes: int | None = None,
                  device: str = "cuda:0", precision: str = "bf16", prompt_len: int = 128,
                  new_tokens: int = 16, offload_folder: str | Path | None = None) -> dict:
    """Load `model_dir` with `device_map` (under the emulated budget when given), decode, measure.
    Run it in a fresh process: the allocator cap and the peak statistics are per process."""
    import gc
    import tempfile
    import time

    import torch
    from transformers import AutoModelForCausalLM

    from ...models import torch_dtype
    from ..tracking.measure import _rss_bytes, cuda_context_bytes

    dev = torch.device(device)
    context = cuda_context_bytes(device)
    total = torch.cuda.get_device_properties(dev).total_memory
    row: dict[str, Any] = {"budget_bytes": budget_bytes, "context_bytes": context, "oom": False}
    if budget_bytes:
        torch.cuda.set_per_process_memory_fraction((budget_bytes - (context or 0)) / total, dev)
    rss0 = _rss_bytes()
    folder = offload_folder or tempfile.mkdtemp(prefix="offload-")
    torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    model = None
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype(precision), device_map=device_map,
                                                     offload_folder=str(folder))
        model.eval()
        row.update(load_s=round(time.perf_counter() - t0, 2), loaded_bytes=int(torch.cuda.memory_allocated(dev)),
                   load_peak_bytes=int(torch.cuda.max_memory_allocated(dev)), rss_after_load_bytes=_rss_bytes())
        hf_map = getattr(model, "hf_device_map", None) or {}
        row["device_map_used"] = {k: (v if isinstance(v, (int, str)) else str(v)) for k, v in hf_map.items()}
        torch.cuda.reset_peak_memory_stats(dev)
        row.update(measure_decode(model, device, prompt_len=prompt_len, new_tokens=new_tokens))
        row["decode_peak_bytes"] = int(torch.cuda.max_memory_allocated(dev))
    except Exception as exc:  # noqa: BLE001 - an OOM here is the finding, anything else is recorded
        record_failure(row, exc)
        del exc
    finally:
        row.update(rss_start_bytes=rss0, rss_end_bytes=_rss_bytes())
        del model
        gc.collect()
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()
    return row
