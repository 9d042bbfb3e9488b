"""Real vLLM start-ups on a GPU, for `plan --engine vllm` to be checked against (CPU test:
tests/test_vllm_plan_gpu.py recomputes the plan from what this writes).

Each setting starts `python3 -m vllm.entrypoints.openai.api_server` in its own session (setsid),
reads its log until vLLM has sized the KV cache ("Maximum concurrency for N tokens per request")
or the process exits (a refused start), and kills its process group: CUDA graph capture, which
comes after the KV cache is sized, is not waited for. The served setting (s05) is started by
gpu_bench.py through the harness's launcher, benchmarked, and recorded here the same way.

    python3 benchmarks/vllm_plan/gpu_startups.py --models /tmp/vmodels --out OUT/startups.json \
        [--only s01,s02] [--group eager|graphs] [--time-limit-s 540]

The JSON (a list, rewritten atomically after every start): per setting, the flags, the card's
total and free memory as CUDA reports them just before the start, the model's config.json and
stored tensor bytes, the outcome (started / refused / timeout), the start-up seconds, what the log
says (KV cache tokens, max concurrency, KV cache GiB, model loading GiB) and its key lines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from harness.atomic import write_json  # noqa: E402
from harness.memory.vllm.vllm_model import _safetensors_bytes  # noqa: E402
from harness.serving.launcher import log_cause, parse_startup_log  # noqa: E402

BF16, W4A16, GPTQ, AWQ = "qwen2.5-1.5b", "qwen2.5-1.5b-w4a16", "qwen2.5-1.5b-gptq", "qwen2.5-1.5b-awq"
Q05 = "qwen2.5-0.5b"
BUILT_HERE = {Q05}  # small enough to build with random bf16 weights on the spot (CPU, ~0.5B params)
# id -> model, flags (the names of vLLM's own options), kept as data, in the order they run; settings
# without enforce_eager capture CUDA graphs; s05 is served to the end (the bench step reuses it).
DEFAULT_SETTINGS = ROOT / "measurements" / "vllm_plan" / "gpu-startups-settings.json"
SETTINGS = {sid: (model, flags) for sid, (model, flags) in json.loads(DEFAULT_SETTINGS.read_text())["settings"].items()}
SERVED = {"s05", "s11", "s12"}
PROBE = {"input_len": 256, "output_len": 64, "num_prompts": 16, "concurrency": 4}
# vLLM's debug log says where "Model loading" grows ("Peak GPU memory after loading weights"):
# V2's is 0.11 GiB above the parameters and the rotary cache (docs/gpu.md)
DEBUG_LOG = {"s02"}
KV_SIZED = re.compile(r"Maximum concurrency for\s*[\d,]+\s*tokens per request")
KEY_LINE = re.compile(r"(Model loading took|Peak GPU memory|KV cache|Maximum concurrency|memory profiling|Memory profiling|"
                      r"non-torch|CUDA graph|cudagraph|torch.compile|Free memory|gpu_memory_utilization|"
                      r"Using .* backend|model runner|Error|error:|Traceback|ValueError|RuntimeError|"
                      r"Available|vLLM API server version|max_num_batched_tokens|max_num_seqs|chunked)", re.I)
_DEBUG_KEPT = re.compile(r"Peak GPU memory|weights took|Loading weights")
_LOADING = re.compile(r"Model loading took\s*([\d.]+)\s*GiB")


def flag_args(flags: dict) -> list[str]:
    out = []
    for name, value in flags.items():
        opt = "--" + name.replace("_", "-")
        if value is True:
            out.append(opt)
        elif isinstance(value, dict):  # e.g. --hf-overrides: vLLM parses the value as JSON
            out += [opt, json.dumps(value)]
        elif value is not False:
            out += [opt, str(value)]
    return out


def cuda_memory() -> tuple[int, int]:
    """(free, total) bytes as a fresh CUDA context sees them (a subprocess: this one stays CUDA-free)."""
    code = "import torch; f, t = torch.cuda.mem_get_info(); print(f, t)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
    return (int(out[0]), int(out[1])) if len(out) == 2 else (0, 0)  # (0, 0): no CUDA device


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(port: int) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


GRAPHS_DONE = re.compile(r"Graph capturing finished in\s*[\d.]+\s*secs?, took\s*([-\d.]+)\s*GiB")


def start_once(sid: str, model_dir: Path, flags: dict, serve: bool, log_dir: Path, timeout_s: float,
               wait_graphs: bool = False) -> dict:
    port = free_port()
    log_path = log_dir / f"{sid}.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", model_dir.name, "--host", "127.0.0.1", "--port", str(port), *flag_args(flags)]
    free, total = cuda_memory()
    env = {**os.environ, "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1",
           **({"VLLM_LOGGING_LEVEL": "DEBUG"} if sid in DEBUG_LOG else {})}
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                start_new_session=True)
    outcome, sized_s, probe = "timeout", None, None
    try:
        while time.monotonic() - started < timeout_s:
            text = log_path.read_text(errors="replace")
            if sized_s is None and KV_SIZED.search(text):
                sized_s = round(time.monotonic() - started, 1)
            if sized_s is not None and not serve and (not wait_graphs or GRAPHS_DONE.search(text)):
                outcome = "started"
                break
            if serve and sized_s is not None and healthy(port):
                outcome = "started"
                probe = token_probe(port, model_dir, log_dir / f"{sid}-probe.json")
                break
            if proc.poll() is not None:
                outcome = "refused"
                break
            time.sleep(0.25)
    finally:
        seconds = round(time.monotonic() - started, 1)
        if outcome == "timeout" and sized_s is not None and not serve:
            outcome = "started"  # the KV cache was sized; graph capture did not end in time
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    text = log_path.read_text(errors="replace")
    rec = startup_record(sid, model_dir, flags, serve, outcome, seconds, sized_s, proc.returncode, text, free, total)
    return rec | ({"token_probe": probe} if probe else {})


def token_probe(port: int, model_dir: Path, out: Path) -> dict:
    """A served start answers: PROBE's requests through the harness's runner, each asked for
    output_len tokens with ignore_eos; the record keeps whether every request came back with
    exactly its prompt and output tokens (usage, the server's counters, the tokenizer); the run's
    results file (with each request's text) lies beside the start-up logs."""
    from harness.serving.client import Target
    from harness.serving.runner import BenchConfig, run_bench
    from harness.serving.workload import Workload

    work = Workload(input_len=PROBE["input_len"], output_len=PROBE["output_len"], num_prompts=PROBE["num_prompts"],
                    seed=11)
    cfg = BenchConfig(target=Target(f"http://127.0.0.1:{port}", model_dir.name, timeout_s=60), workload=work,
                      concurrencies=[PROBE["concurrency"]], warmup=1, tokenizer_dir=model_dir, out=out, quiet=True,
                      workers=1)
    try:
        run = run_bench(cfg)["runs"][0]
    except Exception as exc:  # a probe that fails is a finding, not a crash of the whole sweep
        return {"error": f"{type(exc).__name__}: {exc}"[:400]}
    requests = run.get("requests") or []
    return {**PROBE, "requests_ok": run.get("requests_ok"), "requests_failed": run.get("requests_failed"),
            "errors": run.get("errors"), "input_tokens": run.get("input_tokens"),
            "output_tokens": run.get("output_tokens"), "token_accounting": run.get("token_accounting"),
            "exact": all(r.get("prompt_tokens") == PROBE["input_len"] and r.get("completion_tokens") == PROBE["output_len"]
                         for r in requests) and len(requests) == PROBE["num_prompts"],
            "output_throughput": run.get("output_throughput")}


def startup_record(sid: str, model_dir: Path, flags: dict, serve: bool, outcome: str, seconds: float,
                   sized_s: float | None, exit_code: int | None, text: str, free: int, total: int) -> dict:
    """One start-up as the JSON keeps it (gpu_bench.py writes its served start the same way)."""
    info = parse_startup_log(text)
    loading = _LOADING.search(text)
    config = json.loads((model_dir / "config.json").read_text())
    return {
        "id": sid, "model": model_dir.name, "model_config": config,
        "stored_bytes": sum(p.stat().st_size for p in model_dir.glob("*.safetensors")),
        "stored_weights_bytes": _safetensors_bytes(model_dir),  # as the plan counts them (floats at 2 bytes)
        "flags": flags, "argv": flag_args(flags), "served": serve,
        "cuda_total_bytes": total, "cuda_free_bytes_before": free,
        "outcome": outcome, "seconds": seconds, "kv_sized_s": sized_s, "exit_code": exit_code,
        "logged": {"vllm_version": info.version, "kv_cache_tokens": info.kv_cache_tokens,
                   "max_concurrency": info.max_concurrency, "max_concurrency_at_tokens": info.max_concurrency_at_tokens,
                   "kv_cache_memory_gib": info.kv_cache_memory_gib,
                   "model_loading_gib": float(loading.group(1)) if loading else None,
                   "cuda_graph_gib": float(graphs.group(1)) if (graphs := GRAPHS_DONE.search(text)) else None},
        "cause": log_cause(text) if outcome != "started" else "",
        "key_lines": [line.strip()[:400] for line in text.splitlines() if KEY_LINE.search(line)
                      and (" DEBUG " not in line or _DEBUG_KEPT.search(line))][:80],
    }


def append(out: Path, rec: dict) -> None:
    records = json.loads(out.read_text()) if out.is_file() else []
    records.append(rec)
    write_json(out, records, indent=1)


def ensure_config_only(models_dir: Path, name: str) -> bool:
    """A reference config with no weights, for `--load-format dummy` (vLLM fills random weights
    itself: nothing this large is saved or carried), and the test tokenizer grown to its vocabulary."""
    target = models_dir / name
    if not (target / "config.json").is_file():
        from gpu_models import copy_tokenizer

        from harness.models import reference_config_path

        target.mkdir(parents=True, exist_ok=True)
        config = json.loads(reference_config_path(name).read_text())
        config.pop("quantization_config", None)  # bf16 dummy weights; a quantized layout needs real ones
        if config.get("model_type") == "qwen3_5_text":  # shipped as the multimodal wrapper (vLLM registers only it)
            config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                      "text_config": config, "vision_config": {}, "image_token_id": 248056,
                      "video_token_id": 248057, "vision_start_token_id": 248053, "vision_end_token_id": 248054,
                      "tie_word_embeddings": config.get("tie_word_embeddings", False)}
        write_json(target / "config.json", config, indent=1)
        copy_tokenizer(target)
    return (target / "config.json").is_file()


def settings_from(path: Path) -> tuple[dict, dict, dict]:
    """A job set kept as data: {"settings": {id: [model, {vLLM flag: value}]}, "start_timeout_s":
    {id: seconds}, "share_gib": {id: GiB}} (the last two optional: a setting known to start slowly
    gets its own timeout; a share in GiB becomes the utilization of the card it runs on, see
    share_utilization); flags with load_format "dummy" start a reference config with vLLM's random weights."""
    data = json.loads(path.read_text())
    return ({sid: (model, flags) for sid, (model, flags) in data["settings"].items()},
            {sid: float(s) for sid, s in (data.get("start_timeout_s") or {}).items()},
            {sid: float(g) for sid, g in (data.get("share_gib") or {}).items()})


def share_utilization(share_gib: float, total_bytes: int) -> float:
    """--gpu-memory-utilization that gives `share_gib` of a card of `total_bytes` (3 digits: 6 GiB
    of the H200's 139.8 GiB is 0.043, as the earlier holds ran it; of an H100's 79.2 GiB, 0.076)."""
    return round(share_gib * 2**30 / total_bytes, 3)


def ensure_model(models_dir: Path, name: str) -> bool:
    """Whether the model directory is there, building one of BUILT_HERE when it is not: random bf16
    weights on the CPU (this process stays CUDA-free) and gpu_models.py's test tokenizer."""
    target = models_dir / name
    if not (target / "config.json").is_file() and name in BUILT_HERE:
        from gpu_models import copy_tokenizer

        from harness import models

        began = time.monotonic()
        models.save_random_model(name, target, dtype="bf16")
        copy_tokenizer(target)
        print(f"{name}: built in {time.monotonic() - began:.0f} s", flush=True)
    return (target / "config.json").is_file()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="/tmp/vmodels")
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", help="comma list of setting ids")
    parser.add_argument("--group", choices=("eager", "graphs"), help="only the eager or only the CUDA-graph settings")
    parser.add_argument("--time-limit-s", type=float, default=540, help="start no setting after this many seconds")
    parser.add_argument("--start-timeout-s", type=float, default=240)
    parser.add_argument("--settings", type=Path, help="a job set kept as data (settings_from; default: "
                        "measurements/vllm_plan/gpu-startups-settings.json)")
    parser.add_argument("--wait-graphs", action="store_true",
                        help="after the KV cache is sized, wait for CUDA graph capture (its memory is logged)")
    args = parser.parse_args()
    settings, timeouts, shares = settings_from(args.settings) if args.settings else (SETTINGS, {}, {})
    total = cuda_memory()[1] if shares else 0
    ids = args.only.split(",") if args.only else [i for i in settings if i not in SERVED]
    if args.group:
        ids = [i for i in ids if settings[i][1].get("enforce_eager", False) == (args.group == "eager")]
    out = Path(args.out)
    log_dir = out.parent / "startup-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    for sid in ids:
        left = args.time_limit_s - (time.monotonic() - began)
        if left < 45:
            print(f"{sid}: skipped, {left:.0f} s left", flush=True)
            continue
        model, flags = settings[sid]
        if sid in shares and total:
            flags = {**flags, "gpu_memory_utilization": share_utilization(shares[sid], total)}
        if model == W4A16 and (Path(args.models) / GPTQ / "config.json").is_file():
            model = GPTQ  # the quantize chain's own output, when it ran
        config_only = flags.get("load_format") == "dummy"
        if not (ensure_config_only if config_only else ensure_model)(Path(args.models), model):
            print(f"{sid}: skipped, no {model} (its build did not run or failed)", flush=True)
            continue
        rec = start_once(sid, Path(args.models) / model, flags, sid in SERVED, log_dir,
                         min(timeouts.get(sid, args.start_timeout_s), left - 5),
                         args.wait_graphs and not flags.get("enforce_eager"))
        append(out, rec)
        lg = rec["logged"]
        probe = rec.get("token_probe")
        said = f"; probe: exact tokens {probe.get('exact')}, {probe.get('requests_ok')} ok" if probe else ""
        print(f"{sid} {model} {' '.join(rec['argv'])}: {rec['outcome']} in {rec['seconds']} s, "
              f"KV {lg['kv_cache_tokens']} tokens, {lg['kv_cache_memory_gib']} GiB, conc {lg['max_concurrency']}"
              f"{'; ' + rec['cause'][:200] if rec['cause'] else ''}{said}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
