"""Out of memory: on the GPU (torch's allocator message, old and new formats) and on the host
(the kernel's OOM killer while a checkpoint loads).

torch >= 2.1 says: "Tried to allocate 546.00 MiB. GPU 0 has a total capacity of 15.77 GiB of
which 514.19 MiB is free. Process 562167 has 15.25 GiB memory in use. Of the allocated memory
13.73 GiB is allocated by PyTorch, and 736.86 MiB is reserved by PyTorch but unallocated."
(some releases spell "capacty"); torch < 2.1: "Tried to allocate 85.00 MiB (GPU 0; 4.00 GiB total
capacity; 3.04 GiB already allocated; 9.21 MiB free; 15.31 MiB cached|reserved in total by PyTorch)".
"""

from __future__ import annotations

import re

from . import planners
from .model import Cause, Context, Finding
from .text import SIZE, Log, gib, size_bytes
from .kinds import declare

declare("cuda_oom", "CUDA out of memory",
        "lower the batch size or sequence length, use gradient checkpointing (training) or a lower precision;"
        " PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when memory is fragmented")
declare("host_oom", "host out of memory",
        "give the process more host RAM or swap; load with torch_dtype=bfloat16 and device_map='auto'; raise "
        "the container/WSL memory limit")


_NEW = re.compile(
    rf"Tried to allocate {SIZE}\.\s*GPU (\d+) has a total capac\w*y of {SIZE} of which {SIZE} is free\.", re.I)
_OLD = re.compile(rf"Tried to allocate {SIZE}\s*\(GPU (\d+); {SIZE} total capacity; {SIZE} already allocated; "
                  rf"{SIZE} free;(?: {SIZE} reserved in total by PyTorch| {SIZE} cached)", re.I)
_TORCH_ALLOC = re.compile(rf"Of the allocated memory {SIZE} is allocated by PyTorch", re.I)
_UNALLOCATED = re.compile(rf"and {SIZE} is reserved by PyTorch but unallocated", re.I)
_PROCESS = re.compile(rf"Process (\d+) has {SIZE} memory in use", re.I)
_THIS_PROCESS = re.compile(rf"this process has {SIZE} memory in use", re.I)
# the error itself, not a sentence about it ("to avoid CUDA out of memory, ...")
CUDA_OOM = (r"(?:Error|error|ERROR)\W{1,3}(?:CUDA )?out of memory|CUDA out of memory\. Tried to allocate|"
            r"OutOfMemoryError:[ \t]+\S|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation")
GRAPH_CAPTURE = r"captur\w* (?:the )?cuda ?graph|cuda ?graph\w* captur|capture_model|graph capturing|cudagraph"
HOST_KILL = (r"(?:^|\]|\s)Killed\s*$|Out of memory: Killed process|oom-kill|invoked oom-killer|exit(?:ed)? "
             r"(?:with )?(?:code|status)[ :]*137|exitcode\s*:\s*-9|signal 9|SIGKILL|DefaultCPUAllocator: can't "
             r"allocate memory|std::bad_alloc|^MemoryError")


def _oom_figures(log: Log) -> dict:
    figures: dict = {}
    m = log.search(_NEW)
    if m:
        figures.update(tried=size_bytes(m[1], m[2]), gpu_index=int(m[3]), total=size_bytes(m[4], m[5]),
                       free=size_bytes(m[6], m[7]))
        a = log.search(_TORCH_ALLOC)
        u = log.search(_UNALLOCATED)
        if a:
            figures["allocated_by_pytorch"] = size_bytes(a[1], a[2])
        if u:
            figures["reserved_unallocated"] = size_bytes(u[1], u[2])
        procs = [(int(p[1]), size_bytes(p[2], p[3])) for p in re.finditer(_PROCESS, log.text)]
        if procs:
            figures["processes_in_use"] = dict(procs)
        t = log.search(_THIS_PROCESS)
        if t:
            figures["this_process_in_use"] = size_bytes(t[1], t[2])
        return figures
    m = log.search(_OLD)
    if m:
        figures.update(tried=size_bytes(m[1], m[2]), gpu_index=int(m[3]), total=size_bytes(m[4], m[5]),
                       allocated_by_pytorch=size_bytes(m[6], m[7]), free=size_bytes(m[8], m[9]))
        if m[10]:
            figures["reserved_total"] = size_bytes(m[10], m[11])
            figures["reserved_unallocated"] = max(0, figures["reserved_total"] - figures["allocated_by_pytorch"])
        elif m[12]:  # torch <= 1.3 "cached": the allocator's cache beside the allocated memory
            figures["reserved_unallocated"] = size_bytes(m[12], m[13])
    return figures


def _phase(log: Log) -> str:
    if log.has(r"backward|optimizer|\.step\(|Trainer|trainer\.train|train\.py|--train|fine-?tun|lora|accelerate launch"):
        return "training"
    if log.has(r"from_pretrained|Loading checkpoint shards|load_state_dict|\.to\(|\.cuda\(\)|Loading weights"):
        return "loading"
    if log.has(r"generate|inference|forward|infer"):
        return "inference"
    return "unknown"


def _fragmented(f: dict) -> bool:
    """PyTorch's own hint: reserved-but-unallocated memory is large. Large here: it could hold the
    failed request, or it is over a quarter of what PyTorch allocated."""
    unalloc = f.get("reserved_unallocated", 0)
    return unalloc >= f.get("tried", 1) or unalloc > 0.25 * max(f.get("allocated_by_pytorch", 0), 1)


def _others(f: dict) -> int:
    """Memory other processes hold on the card, when the message lists them."""
    procs = f.get("processes_in_use") or {}
    mine = f.get("this_process_in_use")
    if mine is None or not procs:
        return 0
    return sum(b for b in procs.values()) - mine if len(procs) > 1 else 0


def _oom_causes(log: Log, f: dict, phase: str, evidence: str) -> tuple[list[Cause], list[str]]:
    causes, fixes = [], []
    tried, free, unalloc = f.get("tried"), f.get("free"), f.get("reserved_unallocated", 0)
    # when even a defragmented cache could not hold the request, its size is the first cause
    too_big = tried is not None and free is not None and tried > free + unalloc
    if tried is not None and free is not None and _fragmented(f) and not too_big:
        causes.append(Cause(
            f"fragmentation: {gib(unalloc)} is reserved by PyTorch but unallocated (in pieces too small for the "
            f"{gib(tried)} request)", evidence))
        fixes.append("set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before the process starts (it lets "
                     "the allocator grow segments instead of leaving unusable holes)")
    if too_big:
        share = (free + unalloc) / tried
        causes.append(Cause(
            f"the {phase if phase != 'unknown' else 'step'} needs more memory than the card has left: "
            f"{gib(tried)} requested, {gib(free)} free" + (f" + {gib(unalloc)} cached" if unalloc else ""), evidence))
        fixes.append(f"make the step smaller: the failed request alone would fit at {share:.0%} of the current "
                     f"batch x sequence (if it scales with them), so halve the batch (raise gradient accumulation "
                     f"to keep the effective batch) or shorten the sequence"
                     + (", turn on gradient checkpointing, or load the base in 4-bit (QLoRA)" if phase == "training"
                        else ", or load the weights at a lower precision (bf16, int8, nf4)"))
        if _fragmented(f):
            causes.append(Cause(f"also fragmentation: {gib(unalloc)} is reserved by PyTorch but unallocated",
                                evidence))
            fixes.append("also set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to cut the fragmentation")
    elif tried is not None and free is not None and free >= tried and not _fragmented(f):
        causes.append(Cause(f"the card reports {gib(free)} free yet a {gib(tried)} request failed: a memory cap "
                            f"(set_per_process_memory_fraction, MIG, WSL's shared memory) or another process "
                            f"allocating at the same moment", evidence))
        fixes.append("check for a per-process memory fraction or a second process on the card (nvidia-smi)")
    others = _others(f)
    if others > 0.1 * f.get("total", 1):
        causes.append(Cause(f"other processes hold {gib(others)} on this card", evidence))
        fixes.append("stop the other processes on the card (nvidia-smi shows them) or use another GPU")
    if not causes:
        causes.append(Cause(f"the {phase if phase != 'unknown' else 'job'} needs more GPU memory than the card has",
                            evidence))
        fixes.append("lower the batch size or sequence length, use gradient checkpointing (training), or a lower "
                     "precision (bf16 -> int8/nf4); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True helps when "
                     "memory is fragmented")
    return causes, fixes


def recognise_cuda_oom(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(CUDA_OOM)
    if not m:
        return []
    evidence = log.line_of(m)
    f = _oom_figures(log)
    if f.get("tried"):
        evidence = log.evidence(r"Tried to allocate") or evidence
    phase = _phase(log)
    startup = _vllm_startup_oom(log, evidence, f) if log.from_vllm() else None
    causes, fixes = _oom_causes(log, f, phase, evidence)
    f.update(_settings_from_log(log))
    gpu = planners.gpu_for(ctx, f.get("total"))
    computed = planners.safe(planners.transformers_plan, ctx, gpu, phase == "training", f.get("seq_len"))
    scaled = _batch_from_log(f)
    if scaled is not None:
        computed = dict(computed or {}, **scaled)
        fixes.insert(0, f"with batch {f['batch']} in the log, batch {scaled['batch_for_failed_request']} is the largest "
                        f"at which the failed request fits (assuming it grows with the batch)")
    elif not computed:
        fixes.append("for a computed batch, add the batch size and sequence length the run used to the text "
                     "(per_device_train_batch_size=..., max_seq_length=...) or pass --config MODEL --gpu-memory CARD")
    what = (f"CUDA ran out of memory{' during ' + phase if phase != 'unknown' else ''}"
            + (f": {gib(f['tried'])} requested with {gib(f['free'])} free of {gib(f['total'])}" if f.get("tried") else ""))
    fix = "; ".join(fixes) + "." + planners.plan_text(computed if computed and "error" not in computed else None)
    plain = Finding("cuda_oom", what, causes, fix, score=70, position=m.end(),
                    figures_from_log={k: v for k, v in f.items()}, computed=computed)
    return [startup, plain] if startup else [plain]


_BATCH = r"(?:per_device_train_batch_size|micro_batch_size|train_batch_size|batch_size|BATCH_SIZE)['\"]?\s*[:=]?\s*(\d+)\b"
_SEQ = (r"(?:cutoff_len|max_seq_length|max_seq_len|model_max_length|max_length|seq_len)['\"]?\s*[:=]?\s*"
        r"(\d{2,6})\b")


def _settings_from_log(log: Log) -> dict:
    """The batch and sequence length the command or config in the log states, if it does."""
    out = {}
    b, q = log.search(_BATCH), log.search(_SEQ)
    if b and int(b.group(1)) > 0:
        out["batch"] = int(b.group(1))
    if q and int(q.group(1)) >= 16:
        out["seq_len"] = int(q.group(1))
    return out


def _batch_from_log(f: dict) -> dict | None:
    tried, free, unalloc, batch = f.get("tried"), f.get("free"), f.get("reserved_unallocated", 0), f.get("batch")
    if not (tried and batch and free is not None) or tried <= free + unalloc:
        return None
    fitting = int(batch * (free + unalloc) / tried)
    if fitting >= batch:
        return None
    return {"batch_for_failed_request": max(fitting, 1) if fitting else 0,
            "batch_source": "the log: its batch x (free + cached) / the failed request, assuming the request grows "
                            "with the batch (a lower bound on the cut: the next allocations need room too)"}


PROFILING = (r"profile_run|_dummy_run|dummy_sampler_run|determine_available_memory|determine_num_available_blocks|"
             r"_initialize_kv_caches|initialize_kv_cache|memory profiling|profiling run")
_ALSO = ("it is also a CUDA out-of-memory error (kind cuda_oom), but that kind's fix (a smaller batch or sequence) "
         "does not apply: vLLM sizes its own batch from the flags below")


def _vllm_startup_oom(log: Log, evidence: str, f: dict) -> Finding | None:
    """A CUDA OOM inside vLLM's start-up (profile run or CUDA graph capture): vLLM's flags are the fix."""
    graph, profile = log.search(GRAPH_CAPTURE), log.search(PROFILING)
    if not (graph or profile):
        return None
    util = re.search(r"gpu[_-]memory[_-]utilization[= ]+([\d.]+)", log.text)
    lower = None
    if util:
        lower = round(max(0.05, float(util.group(1)) - 0.05), 2)
    if graph and (not profile or graph.end() > profile.end()):
        cause = Cause("vLLM ran out of memory while capturing CUDA graphs: they are allocated after the KV cache took "
                      "its share, from what the utilization left; " + _ALSO, log.line_of(graph))
        fix = ("start with --enforce-eager (no CUDA graphs), or lower --gpu-memory-utilization"
               + (f" from {util.group(1)} to {lower} (0.05 less leaves room for the graphs)" if lower else
                  " by 0.05-0.1 to leave room for the graphs (the log does not show the utilization it ran with: "
                  "add the vLLM command line to the text for a computed figure)")
               + ", or capture fewer sizes (lower --max-num-seqs)")
        what = "vLLM's start-up ran out of GPU memory during CUDA graph capture"
    else:
        cause = Cause("vLLM ran out of memory in its profile run (one forward pass of --max-num-batched-tokens "
                      "tokens, before the KV cache is sized): the weights left too little room for the activations; "
                      + _ALSO, log.line_of(profile))
        tokens = re.search(r"max_num_batched_tokens[=: ]+(\d+)", log.text)
        if tokens and int(tokens.group(1)) >= 1024:
            half = int(tokens.group(1)) // 2
            computed = {"max_num_batched_tokens": half, "source": f"the log's max_num_batched_tokens "
                        f"{tokens.group(1)} halved: the profile run's activations scale with it"}
            first = (f"start with --max-num-batched-tokens {half} (half the log's {tokens.group(1)}: the profile "
                     f"run's activations scale with it)")
        else:
            computed = None
            first = ("lower --max-num-batched-tokens (the profile run's size; the log does not show the value it ran "
                     "with: add vLLM's config line, max_num_batched_tokens=..., to the text and half of it is "
                     "computed)")
        fix = (first + "; also lower --max-num-seqs, or --max-model-len when chunked prefill is off, or serve a "
               "quantized model; raising --gpu-memory-utilization does not help a profile-run OOM")
        what = "vLLM's start-up ran out of GPU memory in its profile run"
        return Finding("vllm_startup", what, [cause], fix + ".", score=85, position=len(log.text),
                       figures_from_log=f, computed=computed)
    return Finding("vllm_startup", what, [cause], fix + ".", score=85, position=len(log.text), figures_from_log=f,
                   computed={"gpu_memory_utilization": lower, "source": "the log's utilization less 0.05"}
                   if lower and graph else None)


def recognise_host_oom(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(HOST_KILL, re.IGNORECASE | re.MULTILINE)
    if not m:
        return []
    evidence = log.line_of(m)
    loading = log.has(r"Loading checkpoint shards|from_pretrained|load_state_dict|Loading weights|safetensors|"
                      r"torch\.load")
    dmesg = log.evidence(r"Out of memory: Killed process.*|invoked oom-killer.*")
    causes = [Cause("the kernel's OOM killer ended the process: host RAM (plus swap) ran out"
                    + (" while the checkpoint was loading" if loading else ""), dmesg or evidence)]
    if loading:
        causes.append(Cause("loading materialises the weights in host RAM first: in float32 unless a dtype is given "
                            "(twice the bf16 size), and .bin (pickle) shards are read whole",
                            log.evidence(r"Loading checkpoint shards.*") or evidence))
    if log.has(r"docker|container|kubernetes|cgroup|WSL"):
        causes.append(Cause("the container's (or WSL's) memory limit is below the machine's RAM",
                            log.evidence(r"docker|container|kubernetes|cgroup|WSL") or evidence))
    fix = ("give the process more host RAM (or swap): load with torch_dtype=torch.bfloat16 and device_map=\"auto\" "
           "(low_cpu_mem_usage: one shard at a time, straight to the GPU), prefer safetensors shards over .bin, "
           "close other programs, and raise the container/WSL/VM memory limit if there is one.")
    computed = planners.safe(planners.host_load_bytes, ctx)
    if computed and "error" not in computed:
        fix += (f" For {computed['model']}: about {gib(computed['bf16_bytes'])} of RAM loading in bf16, "
                f"{gib(computed['fp32_bytes'])} in float32 (the default without torch_dtype).")
    score = 75 if (dmesg or loading) else 55
    return [Finding("host_oom", "the process was killed for lack of host memory"
                    + (" while loading the model" if loading else ""), causes, fix, score=score, position=m.end(),
                    computed=computed)]
