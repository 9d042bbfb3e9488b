"""vLLM start-up failures, by the messages vLLM raises (V0 and V1 wordings):

- "The model's max seq len (32768) is larger than the maximum number of tokens that can be stored
  in KV cache (7344)" (V0) / "To serve at least one request with the models's max seq len (N),
  (X GiB KV cache is needed, ... Based on the available memory, the estimated maximum model length
  is M" (V1): the KV cache the utilization leaves cannot hold one request.
- "No available memory for the cache blocks": weights + activation profile fill the share.
- "Free memory on device (19.77/22.05 GiB) on startup is less than desired GPU memory utilization
  (0.9, 19.84 GiB)" (V1, 0.9+): something else holds memory on the card.
- "The quantization method awq is not supported for the current GPU. Minimum capability: 75.
  Current capability: 70." and "Quantization scheme is not supported for the current GPU".
- "Bfloat16 is only supported on GPUs with compute capability of at least 8.0".
- trust_remote_code and missing tokenizer files.
"""

from __future__ import annotations

import re

from . import planners
from .model import Cause, Context, Finding
from .text import GiB, Log, gib
from .kinds import declare

declare("vllm_startup", "vLLM start-up",
        "read vLLM's message: lower --max-model-len, adjust --gpu-memory-utilization, or use a model/format "
        "this GPU and vLLM release support")


_KV_V0 = r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored in KV cache \((\d+)\)"
_KV_V1 = (r"max seq len \((\d+)\),?\s*\(?([\d.]+) GiB KV cache is needed, which is larger than the available KV "
          r"cache memory \(([\d.]+) GiB\)")
_KV_V1_EST = r"estimated maximum model length is (\d+)"
_NO_BLOCKS = r"No available memory for the cache blocks"
_FREE = (r"(?:Free|Available) memory on (?:device|node)(?: (\S+))? \(([\d.]+)/([\d.]+) GiB\) on startup is less "
         r"than (?:(?:the )?desired (?:GPU|CPU) memory utilization|the engine's budget[^(]*)\s*\(([\d.]+), ([\d.]+) GiB\)")
_QUANT = (r"quantization method ([\w-]+) is not supported for the current GPU\.?\s*Minimum capability:\s*(\d+)\.?\s*"
          r"Current capability:\s*(\d+)")
_SCHEME = r"Quantization scheme is not supported for\s*the current GPU\.?\s*Min capability:\s*(\d+)\.?\s*Current capability:\s*(\d+)"
_BF16 = r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0"
_REMOTE = (r"requires you to execute the configuration file in that repo|consider setting `?trust_remote_code=True|"
           r"set the option `?trust_remote_code=True|pass the argument `?trust_remote_code=True")
_TOKENIZER = (r"Can't load tokenizer for|Couldn't instantiate the backend tokenizer|tokenizer\.json.{0,40}not found|"
              r"does not appear to have a file named tokenizer|Tokenizer class \w+ does not exist|requires the "
              r"SentencePiece library")
_UTIL = r"gpu[_-]memory[_-]utilization[= ]+([\d.]+)"
_VERSION = r"vLLM (?:API server )?version v?(\d+\.\d+(?:\.\d+)?)|LLM engine \(v(\d+\.\d+(?:\.\d+)?)"
# Minimum compute capabilities vLLM later lowered (method, logged minimum) -> what changed
LOWERED = {("awq", 80): "vLLM lowered AWQ's minimum to 7.5 (Turing) in later releases: upgrade vLLM",
           ("fp8", 90): "newer vLLM releases run FP8 weights on compute capability 8.0+ through the FP8 Marlin "
                        "kernel (weight-only): upgrade vLLM",
           ("fp8", 89): "newer vLLM releases run FP8 weights on compute capability 8.0+ through the FP8 Marlin "
                        "kernel (weight-only): upgrade vLLM"}


def _setting(log: Log, pattern: str, cast=float):
    m = log.search(pattern)
    return cast(m.group(1)) if m else None


def _version(log: Log) -> str | None:
    m = log.search(_VERSION)
    return (m.group(1) or m.group(2)) if m else None


def start_margin(ceiling: int) -> int:
    """A --max-model-len under the logged ceiling that a second start still fits: 2 % less, rounded
    down to a multiple of 256 (16 for short contexts). Threads that settled on a figure did likewise
    (QwenLM/Qwen3#295: ceiling 7344, 7200 started; this gives 7168)."""
    step = 256 if ceiling >= 4096 else 16
    return max(step, int(ceiling * 0.98) // step * step) if ceiling > step else ceiling


def recognise_kv(log: Log, ctx: Context) -> list[Finding]:
    m0, m1 = log.search(_KV_V0), log.search(_KV_V1)
    m = m0 or m1
    if not m:
        return []
    asked = int(m.group(1))
    figures: dict = {"max_model_len": asked}
    if m0:
        largest = int(m0.group(2))
        figures["kv_cache_tokens"] = largest
    else:
        figures.update(kv_needed_bytes=int(float(m1.group(2)) * GiB), kv_available_bytes=int(float(m1.group(3)) * GiB))
        est = log.search(_KV_V1_EST)
        largest = int(est.group(1)) if est else int(asked * float(m1.group(3)) / float(m1.group(2)))
        figures["estimated_max_model_len"] = largest
    util = _setting(log, _UTIL)
    if util:
        figures["gpu_memory_utilization"] = util
    safe = start_margin(largest)
    computed = {"max_model_len": largest,
                "source": "the log: the KV cache holds that many tokens, so one request of that length fits",
                "max_model_len_to_start": safe,
                "margin": "2 % under the log's ceiling, rounded down to a multiple of 256 (16 under 4096 tokens): "
                          "the next start's profile run can leave slightly less KV cache than this one's"}
    gpu = planners.gpu_for(ctx)
    planned = planners.safe(planners.vllm_plan, ctx, gpu, util or 0.9, asked, _version(log))
    if planned:
        computed["vllm_plan"] = planned
    evidence = log.line_of(m)
    causes = [Cause(f"max_model_len {asked} needs more KV cache than the memory left after the weights and the "
                    f"profile run holds ({largest} tokens)", evidence)]
    if asked >= 32768:
        causes.append(Cause(f"{asked} is the model's default context (max_position_embeddings), not a length "
                            f"you need: vLLM reserves room for one full-length request", evidence))
    fix = (f"start with --max-model-len {safe}: the KV cache holds {largest} tokens (--max-model-len {largest} is "
           f"the log's ceiling) and {safe} leaves 2 % for the next start's profile")
    if log.has(r"device_config=cpu|CPU backend|cpu_worker|VLLM_CPU_KVCACHE_SPACE"):
        fix += "; or give the CPU backend a larger KV cache (VLLM_CPU_KVCACHE_SPACE, in GiB)"
    elif asked > 1.5 * largest:
        fix += (f"; raising --gpu-memory-utilization{' from ' + str(util) if util else ''} alone will not do: the KV "
                f"cache would have to grow {asked / largest:.1f}x (quantize the KV cache with --kv-cache-dtype fp8, "
                f"or the weights)")
    else:
        fix += (f"; or raise --gpu-memory-utilization{' from ' + str(util) if util else ''} a little (the KV cache "
                f"must grow {asked / largest:.2f}x), or quantize the KV cache (--kv-cache-dtype fp8)")
    if planned and "error" not in planned:
        if planned.get("smallest_gpu_memory_utilization"):
            fix += (f"; the planner predicts --gpu-memory-utilization {planned['smallest_gpu_memory_utilization']} "
                    f"starts {asked} tokens on {planned['card']}")
        elif planned.get("starts"):
            fix += (f"; the planner predicts {planned['kv_cache_tokens']} KV tokens for this model on {planned['card']}"
                    f": the log's {largest} means other memory use or settings the plan was not given")
    return [Finding("vllm_startup", f"vLLM refused to start: one request of {asked} tokens does not fit the KV cache",
                    causes, fix + ".", score=90, position=m.end(), figures_from_log=figures, computed=computed)]


def _loading_figures(log: Log) -> dict:
    f: dict = {}
    m = log.search(r"Model (?:loading|weights) took ([\d.]+) ?G(?:i)?B")
    if m:
        f["weights_bytes"] = int(float(m.group(1)) * GiB)  # vLLM divides by 2**30 and prints "GB"
    m = log.search(r"# GPU blocks: (\d+)")
    if m:
        f["gpu_blocks"] = int(m.group(1))
    util = _setting(log, _UTIL)
    if util:
        f["gpu_memory_utilization"] = util
    m = log.search(r"Available KV cache memory: (-?[\d.]+) GiB")
    if m:
        f["available_kv_bytes"] = int(float(m.group(1)) * GiB)
    return f


def recognise_no_blocks(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_NO_BLOCKS)
    if not m:
        return []
    f = _loading_figures(log)
    evidence = log.line_of(m)
    util = f.get("gpu_memory_utilization")
    causes = [Cause("the weights, the profile run's activations and non-torch memory already fill "
                    f"{'the ' + str(util) if util else 'the'} utilization share of the card: nothing is left for "
                    "KV cache blocks", log.evidence(r"Model (?:loading|weights) took.*") or evidence)]
    causes.append(Cause("in vLLM 0.6.4 (and V1 0.7-0.8) the share is measured against everything on the card, so "
                        "another process or a low utilization leaves nothing", evidence))
    fix = ("raise --gpu-memory-utilization (vLLM takes that share of the whole card; 0.9-0.95 when the card is "
           "free), lower --max-num-seqs and --max-num-batched-tokens (a smaller profile run), try --enforce-eager, "
           "or serve a smaller or quantized model")
    gpu = planners.gpu_for(ctx)
    computed = None
    if gpu is not None and f.get("weights_bytes"):
        need = f["weights_bytes"] / gpu.total_bytes
        computed = {"weights_share_of_card": round(need, 3), "card": gpu.name,
                    "source": "weights from the log over the card size given with --gpu-memory"}
        fix += (f"; the weights alone take {need:.0%} of {gpu.name}"
                + (": no utilization leaves room, use a quantized model" if need > 0.9 else
                   f", so --gpu-memory-utilization must be well above {need:.2f}"))
    planned = planners.safe(planners.vllm_plan, ctx, gpu, util or 0.9, 4096, _version(log))
    if planned:
        computed = dict(computed or {}, vllm_plan=planned)
    return [Finding("vllm_startup", "vLLM found no memory left for the KV cache at start-up", causes, fix + ".",
                    score=90, position=m.end(), figures_from_log=f, computed=computed)]


def recognise_free_memory(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_FREE)
    if not m:
        return []
    free, total = float(m.group(2)) * GiB, float(m.group(3)) * GiB
    asked, asked_bytes = float(m.group(4)), float(m.group(5)) * GiB
    starts = planners.utilization_that_starts(free, total)
    used = total - free
    figures = {"device": m.group(1), "free_bytes": int(free), "total_bytes": int(total),
               "gpu_memory_utilization": asked, "requested_bytes": int(asked_bytes), "in_use_bytes": int(used)}
    computed = {"gpu_memory_utilization": starts,
                "source": "the log: vLLM starts when utilization x total <= free; floor(free/total, 2 decimals) "
                          "- 0.01 for the next start's CUDA context"}
    evidence = log.line_of(m)
    causes = [Cause(f"{gib(used)} of the {gib(total)} card is already in use at start (another process, a "
                    f"previous vLLM still running, or this process's own allocations), so {asked} x total = "
                    f"{gib(asked_bytes)} is more than the {gib(free)} free", evidence)]
    if free / total < 0.5:
        fix = (f"free the card first: {gib(used)} is held by something else (nvidia-smi lists the processes; a "
               f"leftover vLLM or a training job); only then start, or start with --gpu-memory-utilization "
               f"{starts} if that share is enough for the model")
    else:
        fix = (f"start with --gpu-memory-utilization {starts} (the largest share the free memory allows), or free "
               f"the {gib(used)} other processes hold (nvidia-smi)")
    gpu = planners.gpu_for(ctx, int(total))
    planned = planners.safe(planners.vllm_plan, ctx, gpu, max(starts, 0.01), 4096, _version(log)) if ctx.config else None
    if planned:
        computed["vllm_plan_at_that_utilization"] = planned
    return [Finding("vllm_startup", f"vLLM refused to start: {gib(free)} free on the card, {asked} utilization asks "
                    f"for {gib(asked_bytes)}", causes, fix + ".", score=90, position=m.end(), figures_from_log=figures,
                    computed=computed)]


def _cc(n: int) -> str:
    return f"{n // 10}.{n % 10}"


def recognise_quantization(log: Log, ctx: Context) -> list[Finding]:
    m, s = log.search(_QUANT), log.search(_SCHEME)
    if not (m or s):
        return []
    method, minimum, current = (m.group(1).lower(), int(m.group(2)), int(m.group(3))) if m else \
        ("compressed-tensors scheme", int(s.group(1)), int(s.group(2)))
    evidence = log.line_of(m or s)
    causes = [Cause(f"the {method} kernels in this vLLM need compute capability {_cc(minimum)}; this GPU has "
                    f"{_cc(current)}", evidence)]
    lowered = LOWERED.get((method, minimum))
    fix = (f"{lowered}; otherwise " if lowered else "") + (
        f"use a GPU of compute capability >= {_cc(minimum)}, or a checkpoint format this card runs "
        f"(GPTQ from 6.0, AWQ from 7.5, bitsandbytes from 7.0, Marlin kernels and compressed-tensors W4A16 "
        f"from 8.0, FP8 W8A8 from 8.9), or the unquantized model in fp16")
    return [Finding("vllm_startup", f"vLLM cannot run {method} on a compute capability {_cc(current)} GPU", causes,
                    fix + ".", score=88, position=(m or s).end(),
                    figures_from_log={"method": method, "minimum_capability": _cc(minimum),
                                      "current_capability": _cc(current)})]


def _transformers_only(log: Log) -> bool:
    """A load through transformers alone (no vLLM in sight): then it is the directory's problem."""
    return log.has(r"from_pretrained|AutoTokenizer|AutoModel") and not log.from_vllm()


def recognise_misc(log: Log, ctx: Context) -> list[Finding]:
    out = []
    m = log.search(_BF16)
    if m:
        out.append(Finding("vllm_startup", "this GPU has no bfloat16 and the model's dtype is bf16",
                           [Cause("bf16 needs compute capability 8.0 (Ampere); older cards run fp16",
                                  log.line_of(m))],
                           "start with --dtype half (fp16); watch for overflow in models trained in bf16.",
                           score=85, position=m.end()))
    m = log.search(_REMOTE)
    if m:
        kind = "model_dir" if _transformers_only(log) else "vllm_startup"
        out.append(Finding(kind, "the model needs its own Python code (auto_map in config.json) to load",
                           [Cause("the directory's config names custom modeling/config code, which runs only with "
                                  "trust_remote_code", log.line_of(m))],
                           "pass --trust-remote-code to vLLM (trust_remote_code=True in Python) after reading the "
                           "directory's .py files: they run with your permissions (python -m harness check-dir "
                           "DIR lists them).", score=85, position=m.end()))
    m = log.search(_TOKENIZER)
    if m:
        kind = "model_dir" if _transformers_only(log) else "vllm_startup"
        sp = "SentencePiece" in m.group(0)
        out.append(Finding(kind, "the tokenizer could not be loaded",
                           [Cause("the tokenizer needs the sentencepiece package" if sp else
                                  "the model directory has no usable tokenizer files (tokenizer.json, "
                                  "tokenizer_config.json, tokenizer.model): merged or quantized directories often "
                                  "lack them", log.line_of(m))],
                           "pip install sentencepiece protobuf." if sp else
                           "copy the tokenizer files from the base model into the directory (or pass --tokenizer "
                           "BASE_MODEL to vLLM); python -m harness check-dir DIR reports what is missing.",
                           score=80, position=m.end()))
    return out


_DERIVED = (r"User-specified max_model_len \((\d+)\) is greater than the derived max_model_len \((\w+)=(\d+)"
            r"(?: or model_max_length=(\w+))?")
_ARCHITECTURE = r"Model architectures? \[?'?([\w', ]+?)'?\]? (?:are|is) not supported for now"


def recognise_model_support(log: Log, ctx: Context) -> list[Finding]:
    out = []
    m = log.search(_DERIVED)
    if m and not log.has(r"VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution"):
        asked, key, derived = int(m.group(1)), m.group(2), int(m.group(3))
        out.append(Finding("vllm_startup", f"--max-model-len {asked} is longer than the model's own limit",
                           [Cause(f"the config's {key} is {derived}: vLLM refuses a longer context (positions past "
                                  "it give NaN with RoPE)", log.line_of(m))],
                           f"start with --max-model-len {derived} (or less); only a model with rope scaling for the "
                           f"longer context should run past it (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 overrides the check).",
                           score=88, position=m.end(), figures_from_log={"max_model_len": asked, key: derived},
                           computed={"max_model_len": derived, "source": f"the log: the model's {key}"}))
    m = log.search(_ARCHITECTURE)
    if m:
        out.append(Finding("vllm_startup", "this vLLM has no implementation of the model's architecture",
                           [Cause(f"architectures {m.group(1).strip()} are not in this vLLM release's registry (a newer "
                                  "model, or a custom architecture)", log.line_of(m))],
                           "upgrade vLLM to a release that lists the architecture; for a custom architecture with "
                           "its own code, --trust-remote-code lets vLLM fall back to the transformers implementation.",
                           score=85, position=m.end()))
    return out


RECOGNISERS = (recognise_model_support, recognise_kv, recognise_no_blocks, recognise_free_memory, recognise_quantization, recognise_misc)
