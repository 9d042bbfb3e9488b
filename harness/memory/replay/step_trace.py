"""A QLoRA training step's allocations, in order, without a GPU: the model built on the meta
device and run through the protocol of harness.memory.measured.train_matrix (load, prepare, peft, the
optimizer's steps) under a dispatch mode that records every storage made and freed. Replayed on
torch's caching allocator (harness.memory.replay.allocator_sim) it says whether the step fits a capped card
with that allocator's holes, which a reserve fraction can only guess (docs/vram.md, "The allocator
replayed").

Where CUDA allocates what the meta device does not, the trace stands in for it, each read off an
H200 allocator history (measurements/vram/families/run-14):
- transformers' caching_allocator_warmup: one block the size of the weights as loaded, freed at once;
  the weights are then carved out of its segment (the holes that decide most refusals);
- the checkpoint's tensors in sorted key order, each 4-bit one quantized on arrival (bitsandbytes'
  CUDA quantize_4bit: the bf16 weight, its fp32 absmax, the packed weight, the nested absmax);
- bitsandbytes' gemm_4bit: the dequantized weight as a temporary (the dequant + F.linear path every
  sm90 card takes past 4 tokens);
- SDPA as the CUDA kernels run it (flash without a mask, memory-efficient with one; the meta device
  would decompose it into the math path and keep the score matrix);
- dropout's mask as a bool (CUDA's fused kernel; the meta decomposition keeps a float one);
- cuBLAS's workspace of each thread at its first matmul (WORKSPACE_BYTES): the step's, and the
  autograd engine's at the first one of backward;
- SDPA's math path as torch runs it, where CUDA takes it (fp32 q/k/v with grouped-query heads).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

from ...errors import UnsupportedError
from ..fit.lora import optimizer_name
from .cuda_kernels import functional_as_cuda, sdpa_without_softcap
from .cuda_temps import gemm_4bit_temps, quantize_events, safe_softmax_temps

MiB = 1 << 20
# cuBLAS's workspace on sm90, one per thread's handle, made after the output of that thread's first
# matmul: the step's in forward, the autograd engine's at the first of backward (an H200 history's
# order); the checkpointed steps' traced peaks sat 64-66 MiB under the measured ones without them
WORKSPACE_BYTES = 32 * MiB
# The context probe (harness.memory.tracking.measure.cuda_context_bytes) leaves one small-pool segment cached
# before the model loads; the warmup counts it as memory already there.
PROBE_SEGMENT_BYTES = 2 * MiB
# checked against H200 histories: nf4-dq (fp4-dq allocates alike); a bf16 base is not traced yet
TRACED_PRECISIONS = ("nf4-dq", "fp4-dq")
LORA_DROPOUT = 0.05


@dataclass(frozen=True)
class StepTrace:
    """The events ("alloc", key, bytes) / ("free", key) / ("empty_cache",) of a load and its steps."""

    events: list[tuple]
    train_at: int  # index of the first event of the first step
    # an output was sized by the length rounded up (the memory-efficient attention's logsumexp, to
    # 32 tokens), so other lengths cannot be made from this one (replay_limits.synthesized_trace)
    rounded: bool = False

    @property
    def train_peak_bytes(self) -> int:
        """The peak of the live bytes over the steps (unrounded, as the tensors ask; the cuBLAS
        workspaces counted): the recorded peak, to the MiB, on each of the twelve H200 histories of
        the fourteenth to seventeenth families runs (docs/vram.md)."""
        sizes: dict = {}
        live = peak = 0
        for i, e in enumerate(self.events):
            if e[0] == "alloc":
                sizes[e[1]] = e[2]
                live += e[2]
                if i >= self.train_at and live > peak:
                    peak = live
            elif e[0] == "free":
                live -= sizes.pop(e[1])
        return peak


class _Recorder:
    """A TorchDispatchMode's state: every meta storage an op makes, and when it dies."""

    def __init__(self):
        self.events: list[tuple] = []
        self._next = 0
        self._live: dict[int, int] = {}  # storage id -> event key
        self._refs: dict[int, weakref.ref] = {}
        self._stood_for: set[int] = set()  # storages synthetic events stand for
        self._pinned: list = []  # ...kept alive, so no recorded storage takes their id
        self._workspaces: set[bool] | None = None  # threads (backward or not) with a cuBLAS workspace
        self.rounded = False  # StepTrace.rounded

    def workspaces_from_now(self) -> None:
        self._workspaces = set()

    def after_matmul(self, backward: bool) -> None:
        """The thread's cuBLAS workspace at its first matmul, held to the end as its handle holds it."""
        if self._workspaces is not None and backward not in self._workspaces:
            self._workspaces.add(backward)
            self.synthetic(WORKSPACE_BYTES)

    def synthetic(self, nbytes: int) -> int:
        self._next += 1
        self.events.append(("alloc", self._next, int(nbytes)))
        return self._next

    def free(self, key: int) -> None:
        self.events.append(("free", key))

    def stand_for(self, tensors) -> None:
        for t in tensors:
            storage = t.untyped_storage()
            self._stood_for.add(storage._cdata)
            self._pinned.append(storage)

    def adopt(self, tensor) -> None:
        storage = tensor.untyped_storage()
        sid = storage._cdata
        if sid in self._live or sid in self._stood_for:
            return
        key = self._live[sid] = self.synthetic(storage.nbytes())
        self._refs[sid] = weakref.ref(storage, lambda _, sid=sid: self._died(sid))

    def _died(self, sid: int) -> None:
        self._refs.pop(sid, None)
        key = self._live.pop(sid, None)
        if key is not None:
            self.free(key)


_MEMO = []


def _memo():
    """The process's MetaMemo (harness.memory.replay.meta_memo), shared by its traces."""
    if not _MEMO:
        from .meta_memo import MetaMemo

        _MEMO.append(MetaMemo())
    return _MEMO[0]


@contextmanager
def _frozen_heap():
    """The objects alive before the trace left out of the garbage collector's passes: the collections
    after each step (which decide when a storage dies) then scan only the trace's own objects, not
    the libraries' half a million (0.2 s a pass). Garbage made before holds no storage this trace
    records; it is collected after, once unfrozen."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def import_bitsandbytes() -> None:
    """bitsandbytes imported as the tracer needs it. It wraps four of its CPU kernels in torch.compile
    at import, which imports torch's inductor (0.9 s of CPU); the trace runs meta kernels only, so
    in a process that has not imported it yet it is imported with torch.compile handing the function
    back (what bitsandbytes itself falls back to when compiling fails). peft imports it too: this
    goes first."""
    import sys

    import torch

    if "bitsandbytes" in sys.modules:
        return
    compile_ = torch.compile
    torch.compile = lambda fn=None, **_kw: fn if fn is not None else (lambda f: f)
    try:
        import bitsandbytes  # noqa: F401
    finally:
        torch.compile = compile_


def _dispatch_mode(rec: _Recorder):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    gemm_4bit = getattr(getattr(torch.ops, "bitsandbytes", None), "gemm_4bit", None)
    aten = torch.ops.aten
    memo = _memo()
    matmuls = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default}
    if gemm_4bit is not None:
        matmuls.add(gemm_4bit.default)
    efficient = aten._scaled_dot_product_efficient_attention.default  # its logsumexp: ceil(length / 32) * 32

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is torch.ops.aten._local_scalar_dense.default:
                # data-dependent branches on meta take the common case: no packed sequences, step 1
                return True if args[0].dtype == torch.bool else 1
            temps = gemm_4bit_temps(rec, *args, **kwargs) if gemm_4bit is not None and func is gemm_4bit.default else []
            out = memo.call(func, args, kwargs)
            made = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.device.type == "meta"]
            if func is torch.ops.aten.native_dropout.default:
                made.reverse()  # CUDA's fused dropout makes its bool mask first
            for t in made:
                rec.adopt(t)
            if func in matmuls:
                rec.after_matmul(torch._C._current_autograd_node() is not None)
            if func is torch.ops.aten._safe_softmax.default:
                temps = safe_softmax_temps(rec, args[0], args[1])
            if func is efficient:
                rec.rounded = True
            for key in temps:
                rec.free(key)
            return out

    return Mode()


def _meta_model(config: dict, attention: str, dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = {k: v for k, v in config.items() if k != "architectures"}
    model_type = config.pop("model_type", None)
    if not model_type:
        raise UnsupportedError("the config has no model_type: no modeling code to trace")
    try:
        hf = AutoConfig.for_model(model_type, **config)
    except (KeyError, ValueError) as exc:
        raise UnsupportedError(f"transformers has no model_type {model_type!r} to trace ({exc})") from None
    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(hf, dtype=dtype, attn_implementation=attention)
        except ValueError:
            if attention != "sdpa":
                raise
    # this transformers refuses SDPA for the family (Gemma-2's soft-capping) where the traced one
    # (5.17) ran it without the cap
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS["sdpa_without_softcap"] = sdpa_without_softcap
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype, attn_implementation="eager")
    model.config._attn_implementation = "sdpa_without_softcap"
    return model


def _load(model, rec: _Recorder, quant_type: str, context_probe: bool) -> None:
    """from_pretrained's allocations: the warmup, then each tensor of the checkpoint in key order."""
    import torch

    quantized = {f"{n}.weight" for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and n.rpartition(".")[2] != "lm_head"}
    warm = sum(int(p.numel() * (0.5 if n in quantized else p.element_size())) for n, p in model.named_parameters())
    if context_probe:
        rec.free(rec.synthetic(4))
        warm -= PROBE_SEGMENT_BYTES
    if warm >= 2:
        rec.free(rec.synthetic(warm // 2 * 2))
    for name in sorted(n for n, _ in model.named_parameters()):
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        if name in quantized:
            _quantize(model, module_name, rec, quant_type)
        else:
            rec.adopt(getattr(module, attr))
    for buffer in model.buffers():
        rec.adopt(buffer)
    model.is_loaded_in_4bit = model.is_quantized = True


def _quantize(model, name: str, rec: _Recorder, quant_type: str) -> None:
    import bitsandbytes as bnb
    from torch.utils._python_dispatch import _disable_current_modes

    linear = model.get_submodule(name)
    quantize_events(rec, linear.weight.numel(), linear.weight.element_size())
    # bitsandbytes caches its 8-bit map on the device of the first tensor it quantizes
    # (functional.name2qmap): a map made here would be a meta tensor that every later real
    # quantization in this process then fails to copy ("Cannot copy out of meta tensor")
    qmaps = dict(bnb.functional.name2qmap)
    bnb.functional.name2qmap.clear()
    try:
        with _disable_current_modes():  # the events above stand for what this makes
            new = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                                    compute_dtype=linear.weight.dtype, compress_statistics=True,
                                    quant_type=quant_type, device="meta")
            packed, state = bnb.functional.quantize_4bit(linear.weight.data, blocksize=64, compress_statistics=True,
                                                        quant_type=quant_type)
    finally:
        bnb.functional.name2qmap.clear()
        bnb.functional.name2qmap.update(qmaps)
    rec.stand_for((packed, state.absmax, state.code, state.offset, state.state2.absmax, state.state2.code))
    new.weight = bnb.nn.Params4bit(packed, requires_grad=False, quant_state=state, quant_type=quant_type,
                                   compress_statistics=True, bnb_quantized=True, module=new)
    if linear.bias is not None:
        new.bias = linear.bias
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent), attr, new)


class _GradsOnly:
    """A paged optimizer's footprint in torch's allocator: none (its states are managed memory)."""

    def __init__(self, params):
        self.params = list(params)

    def step(self) -> None:
        pass

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def _optimizer(name: str, params):
    import torch

    if name == "adamw_torch":
        return torch.optim.AdamW(params, lr=2e-4, weight_decay=0.0, foreach=True)  # CUDA's default path
    if name == "adamw_8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(params, lr=2e-4, weight_decay=0.0)
    return _GradsOnly(params)


def trace_training_step(config: dict, query, attention: str = "sdpa", steps: int = 3, context_probe: bool = True,
                        progress: Callable[[str], None] | None = None) -> StepTrace:
    """`query` (an estimate.Query in train mode) as harness.memory.measured.train_matrix runs it, traced.

    context_probe: the process first measured its CUDA context (as the harness's runs do)."""
    import torch

    if query.precision not in TRACED_PRECISIONS:
        raise UnsupportedError(f"the allocator replay traces {', '.join(TRACED_PRECISIONS)}, not {query.precision}")
    optimizer = optimizer_name(query.optimizer)
    quant_type = query.precision.partition("-")[0]
    try:
        import_bitsandbytes()
    except Exception as exc:  # noqa: BLE001 - any import failure means no 4-bit trace
        raise UnsupportedError(f"tracing {query.precision} needs bitsandbytes: {exc}") from None
    import peft  # noqa: F401 - imported before the heap is frozen

    say = progress or (lambda _msg: None)
    with _frozen_heap():
        return _traced(config, query, attention, steps, context_probe, say, optimizer, quant_type)


def _traced(config: dict, query, attention: str, steps: int, context_probe: bool, say, optimizer: str,
            quant_type: str) -> StepTrace:
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    model = _meta_model(config, attention, torch.bfloat16)
    rec = _Recorder()
    targets = tuple(query.lora_targets)
    with _dispatch_mode(rec), functional_as_cuda():
        say("loading on the meta device")
        _load(model, rec, quant_type, context_probe)
        gc.collect()
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=query.grad_checkpointing)
        rec.events.append(("empty_cache",))  # peft's auto_clear_cache after the fp32 upcast
        model.config.use_cache = False
        lora = LoraConfig(r=query.lora_r, lora_alpha=2 * query.lora_r, lora_dropout=LORA_DROPOUT,
                          target_modules=targets[0] if targets == ("all-linear",) else list(targets),
                          task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
        model.train()
        opt = _optimizer(optimizer, [p for p in model.parameters() if p.requires_grad])
        ids = torch.randint(3, 1000, (query.batch, query.seq_len), device="meta")
        train_at = len(rec.events)
        rec.workspaces_from_now()
        for step in range(steps):
            say(f"step {step + 1}/{steps}")
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del out
            gc.collect()
    return StepTrace(rec.events, train_at, rec.rounded)


