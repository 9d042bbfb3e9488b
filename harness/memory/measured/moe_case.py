"""Issue 27's MoE cases (Qwen3-30B-A3B) without a checkpoint on disk: random weights built where they
will live, then measured.

    python -m harness.memory.measured.moe_case --offload ARCH --budget-bytes N --out ROW.json [--device cuda:0]

A 30B checkpoint (61 GB of bf16) would fill most of a 64 GiB disk and take minutes to initialise on
a CPU, so the model is built on the meta device and each tensor is materialised on the device the
placement gives it (the GPU, or host RAM for offloaded layers) and filled there with a normal(0,
0.02) draw, drawn on the GPU when there is one and copied (cheap), 1 for norm weights, 0 for biases:
finite activations at any depth, like from_config's own init, without its CPU cost. The rotary
embedding's inv_freq is a non-persistent buffer (not materialised by to_empty): the rotary modules
are built again on their device.

`offload_case` checks `plan --offload` (harness.memory.fit.offload.plan_offload) against a real
offloaded run: the placement the plan computes (what from_pretrained(device_map="auto",
max_memory=...) would choose) is dispatched by accelerate's dispatch_model, which is also what
transformers' from_pretrained calls for a device map with "cpu" entries
(transformers.integrations.accelerate.accelerate_dispatch): CPU-placed layers keep their weights in
host RAM and an AlignDevicesHook copies them to the GPU for every forward. The allocator is capped
at the budget minus this process's CUDA context, as on a card of that size; the row holds the
plan's figures (with the bandwidths measured on this machine, and with the defaults of a consumer
card) beside the measured GPU peak and the decode time per token.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

from ... import atomic

STD = 0.02


def _device_of(name: str, device_map: dict[str, Any] | None, default: str) -> str:
    if not device_map:
        return default
    owner = next((p for p in sorted(device_map, key=len, reverse=True)
                  if p == "" or name == p or name.startswith(p + ".")), None)
    where = device_map.get(owner, default) if owner is not None else default
    if where in ("cpu", "disk"):
        return "cpu"
    return f"cuda:{where}" if isinstance(where, int) else str(where)


def _fill(t, name: str, scratch: str | None) -> None:
    """Fill `t` in place: ones for norm weights, zeros for biases, else normal(0, STD)."""
    import torch

    leaf = name.rsplit(".", 1)[-1]
    if t.dim() == 1 and "norm" in name and leaf == "weight":
        t.fill_(1.0)
    elif leaf == "bias":
        t.zero_()
    elif scratch and t.device.type == "cpu":  # draw on the GPU, copy down: CPU RNG is slow at 30B
        tmp = torch.empty(t.shape, dtype=t.dtype, device=scratch).normal_(0.0, STD)
        t.copy_(tmp)
        del tmp
    else:
        t.normal_(0.0, STD)


def build_random(spec: Any, device: str = "cuda:0", device_map: dict[str, Any] | None = None,
                 dtype: str = "bf16", seed: int = 0):
    """The model of `spec` (a reference name, config path or dict) with random weights, each tensor
    on `device` or where `device_map` places its module ("cpu" for offloaded ones)."""
    import torch
    from torch import nn
    from transformers import AutoModelForCausalLM

    from ...models import as_config, torch_dtype

    config = as_config(spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype(dtype))
    torch.manual_seed(seed)
    scratch = device if device.startswith("cuda") else None
    if scratch:
        torch.cuda.manual_seed(seed)
    with torch.no_grad():
        for name, p in list(model.named_parameters()):
            target = _device_of(name, device_map, device)
            new = torch.empty(p.shape, dtype=p.dtype, device=target)
            _fill(new, name, scratch)
            mod_name, _, leaf = name.rpartition(".")
            model.get_submodule(mod_name)._parameters[leaf] = nn.Parameter(new, requires_grad=False)
        for name, mod in list(model.named_modules()):
            if type(mod).__name__.endswith("RotaryEmbedding"):
                with torch.device(_device_of(name, device_map, device)):  # its __init__'s device kwarg varies
                    fresh = type(mod)(config=model.config)
                parent, _, leaf = name.rpartition(".")
                setattr(model.get_submodule(parent), leaf, fresh)
        for name, b in list(model.named_buffers()):
            if b.is_meta:
                mod_name, _, leaf = name.rpartition(".")
                owner = model.get_submodule(mod_name)
                owner._buffers[leaf] = torch.zeros(b.shape, dtype=b.dtype, device=_device_of(name, device_map, device))
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    if scratch:
        torch.cuda.empty_cache()
    return model.eval()


def measure_bandwidths(device: str, size: int = 512 * 2**20, repeats: int = 3):
    """This machine's pageable host -> device copy rate (what the hooks do with a host-RAM tensor)
    and its device read rate (a device copy reads and writes: 2 x bytes over the time), in a
    harness.memory.fit.offload.Bandwidths."""
    import torch

    from ..fit.offload import Bandwidths

    if not device.startswith("cuda"):
        return Bandwidths(h2d_source="default (no GPU)")
    host = torch.ones(size, dtype=torch.uint8)
    sync = lambda: torch.cuda.synchronize(device)  # noqa: E731
    h2d = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        dev = host.to(device)
        sync()
        h2d.append(size / (time.perf_counter() - t0) / 1e9)
        del dev
    src = torch.empty(size, dtype=torch.uint8, device=device)
    d2d = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        dst = src.clone()
        sync()
        d2d.append(2 * size / (time.perf_counter() - t0) / 1e9)
        del dst
    del src, host
    torch.cuda.empty_cache()
    return Bandwidths(h2d_gbps=round(max(h2d), 2), h2d_source="measured here: pageable host RAM -> device",
                      device_gbps=round(max(d2d), 1), device_source="measured here: device copy (read + write)")


def _plan_figures(plan) -> dict:
    keep = ("budget_bytes", "context_bytes", "headroom", "seq_len", "runtime_bytes", "gpu_max_memory_bytes",
            "bytes_on_gpu", "bytes_on_cpu", "bytes_on_disk", "layers_on", "host_ram_bytes", "h2d_gbps",
            "device_gbps", "predicted_decode_ms", "predicted_tokens_per_s", "offloaded", "reason")
    return {k: getattr(plan, k) for k in keep}


def largest_layer_bytes(model) -> int:
    from ..fit.offload import _decoder_layers

    return max((sum(p.numel() * p.element_size() for p in layer.parameters()) for layer in _decoder_layers(model)),
               default=0)


def offload_case(arch: str, budget_bytes: int, device: str = "cuda:0", prompt_len: int = 32,
                 new_tokens: int = 6, cpu_memory_bytes: int = 100 * 2**30) -> dict:
    """Plan `arch` at bf16 for a card of `budget_bytes`, then run that placement under the cap."""
    from ..tracking.measure import _rss_bytes, cuda_context_bytes
    from ..fit.offload import measure_decode, plan_offload, record_failure

    cuda = device.startswith("cuda")
    row: dict[str, Any] = {"kind": "offload", "arch": arch, "precision": "bf16", "budget_bytes": budget_bytes,
                           "prompt_len": prompt_len, "new_tokens": new_tokens, "oom": False}
    t0 = time.perf_counter()
    bw = measure_bandwidths(device)
    row["bandwidths"] = {"h2d_gbps": bw.h2d_gbps, "device_gbps": bw.device_gbps, "layer_ms": bw.layer_ms}
    context = cuda_context_bytes(device) if cuda else None
    plan = plan_offload(arch, budget_bytes, "bf16", context_bytes=context, seq_len=prompt_len + new_tokens,
                        new_tokens=new_tokens, cpu_memory_bytes=cpu_memory_bytes, bandwidths=bw)
    default = plan_offload(arch, budget_bytes, "bf16", seq_len=prompt_len + new_tokens, new_tokens=new_tokens,
                           cpu_memory_bytes=cpu_memory_bytes)
    row.update(plan=_plan_figures(plan), plan_default_bandwidths=_plan_figures(default), context_bytes=context,
               plan_s=round(time.perf_counter() - t0, 1))
    device_map = {k: (v if isinstance(v, (int, str)) else str(v)) for k, v in plan.device_map.items()}
    if not cuda:  # CPU smoke: every module on the CPU, no hooks that offload
        device_map = {k: "cpu" for k in device_map}
    model = build_random(arch, device, device_map)
    row.update(build_s=round(time.perf_counter() - t0 - row["plan_s"], 1), largest_layer_bytes=largest_layer_bytes(model),
               rss_after_build_bytes=_rss_bytes())
    try:
        _dispatch_and_decode(model, device_map, device, budget_bytes, context, row, prompt_len, new_tokens,
                             measure_decode)
    except Exception as exc:  # noqa: BLE001 - an OOM is the finding; anything else is recorded
        record_failure(row, exc)
        del exc
    finally:
        del model
        gc.collect()
    row.update(seconds=round(time.perf_counter() - t0, 1), rss_end_bytes=_rss_bytes())
    return row


def _dispatch_and_decode(model, device_map, device, budget_bytes, context, row, prompt_len, new_tokens, measure_decode):
    import torch
    from accelerate import dispatch_model

    cuda = device.startswith("cuda")
    if cuda:
        dev = torch.device(device)
        total = torch.cuda.get_device_properties(dev).total_memory
        cap = budget_bytes - (context or 0)
        torch.cuda.set_per_process_memory_fraction(cap / total, dev)
        row["allocator_cap_bytes"] = int(cap)
    main = device if not cuda else 0
    # as transformers' accelerate_dispatch does: the KV cache object is not moved by the hooks
    skip = getattr(model, "_skip_keys_device_placement", None)
    model = dispatch_model(model, device_map=device_map, main_device=main, **({"skip_keys": skip} if skip else {}))
    if cuda:
        row["resident_bytes"] = int(torch.cuda.memory_allocated(dev))
        torch.cuda.reset_peak_memory_stats(dev)
    row.update(measure_decode(model, device, prompt_len=prompt_len, new_tokens=new_tokens))
    if cuda:
        row["decode_peak_bytes"] = int(torch.cuda.max_memory_allocated(dev))
        row["decode_reserved_peak_bytes"] = int(torch.cuda.max_memory_reserved(dev))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.memory.measured.moe_case", description=__doc__.splitlines()[0])
    ap.add_argument("--offload", required=True, help="architecture (reference name or config path)")
    ap.add_argument("--budget-bytes", type=int, default=6 * 2**30)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=6)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args(argv)
    row = offload_case(args.offload, args.budget_bytes, args.device, args.prompt_len, args.new_tokens)
    atomic.write_json(Path(args.out), row)
    print(json.dumps({k: row.get(k) for k in ("decode_ms_per_token", "decode_peak_bytes", "oom", "error")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
