"""Run the quantize step in the llm-compressor venv: one subprocess, progress on the terminal.

The harness venv and llm-compressor's pin different transformers and compressed-tensors, so the
step runs `worker.py` with that venv's python. Jobs share one process (llm-compressor's import
costs ~10 s); each job writes its directory and comes back as a QuantizeResult. The whole log goes to a file; the terminal gets the worker's own lines, the
layer llm-compressor is on, and a heartbeat.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from ..errors import HarnessError

WORKER = Path(__file__).resolve().parent / "worker.py"
METHODS = ("gptq", "awq", "rtn")  # rtn: round-to-nearest, no calibration (seconds on a CPU)


class QuantizeError(HarnessError):
    """The quantizer could not run or failed; the message carries its cause and the log path."""


@dataclass(frozen=True)
class QuantizeJob:
    model_dir: Path
    out_dir: Path
    samples: list[list[int]]  # calibration token ids, one list per sample
    method: str = "gptq"  # gptq | awq | rtn
    scheme: str = "W4A16"  # a compressed-tensors preset (W4A16, W4A16_ASYM, W8A16, ...)
    group_size: int | None = None  # None: the scheme's (128 for W4A16)
    ignore: tuple[str, ...] = ("lm_head",)
    actorder: str | None = None  # GPTQ only; None: llm-compressor's default (static)
    awq_n_grid: int | None = None  # AWQ's scale grid (default 20); fewer points = faster, coarser
    device: str = "cpu"
    dtype: str | None = None  # load dtype: bf16, fp16, fp32 (None: the checkpoint's)

    def request(self) -> dict:
        if self.method not in METHODS:
            raise QuantizeError(f"unknown quantization method {self.method!r} (choose from {', '.join(METHODS)})")
        if self.method != "rtn" and (not self.samples or not all(self.samples)):
            raise QuantizeError("no calibration samples")
        out = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}
        out["ignore"] = list(self.ignore)
        out["action"] = "quantize"
        return out


@dataclass
class QuantizeResult:
    out_dir: Path
    method: str
    scheme: str
    seconds: float  # load + quantize + save, inside the worker
    quantize_s: float
    peak_rss_bytes: int  # the worker process's peak resident memory (all jobs so far)
    peak_gpu_bytes: int | None  # torch.cuda.max_memory_allocated during the job
    versions: dict = field(default_factory=dict)
    quantization_config: dict | None = None
    log_path: Path | None = None
    process_seconds: float | None = None  # the whole worker process, imports included

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def llmcompressor_problem(python: str | Path | None) -> str | None:
    """Why the quantizer cannot run from `python`, or None when llm-compressor is importable."""
    if python is None:
        return "no llm-compressor interpreter (--llmcompressor-python, or .venvs/llmcompressor: run scripts/test)"
    python = Path(python)
    if not python.exists():
        return f"llm-compressor interpreter {python} does not exist"
    probe = ("import importlib.metadata as m, importlib.util as u; "
             "print(m.version('llmcompressor') if u.find_spec('llmcompressor') else '')")
    try:
        done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{python} does not run: {exc}"
    if done.returncode != 0 or not done.stdout.strip():
        return f"llm-compressor is not installed in {python.parent.parent}"
    return None


_SHOWN = ("[quant]", "Quantizing ", "METRIC - error")


def _pump(stream, log, show: bool, last: list[str]) -> None:
    for raw in iter(stream.readline, b""):
        log.write(raw)
        log.flush()
        line = raw.decode(errors="replace").rstrip()
        for part in line.split("\r"):
            if part.strip():
                last[0] = part.strip()[:160]
        if show and any(marker in line for marker in _SHOWN):
            print(line.split("| INFO - ")[-1][:200], file=sys.stderr, flush=True)


def run_quantize(python: str | Path, jobs: Sequence[QuantizeJob], log_path: Path | None = None,
                 progress: bool = True, timeout_s: float = 3600.0, heartbeat_s: float = 15.0) -> list[QuantizeResult]:
    """Run `jobs` in order in one worker process; raises QuantizeError naming the failing job's cause."""
    requests = [job.request() for job in jobs]
    names = [f"{job.method.upper()} {job.scheme} -> {job.out_dir}" for job in jobs]
    outcomes = _run_requests(python, requests, names, log_path, progress, timeout_s, heartbeat_s)
    return [QuantizeResult(
        out_dir=Path(data["out_dir"]), method=job.method, scheme=job.scheme, seconds=data["seconds"],
        quantize_s=data["quantize_s"], peak_rss_bytes=data["peak_rss_bytes"],
        peak_gpu_bytes=data.get("peak_gpu_bytes"), versions=data.get("versions", {}),
        quantization_config=data.get("quantization_config"), log_path=Path(data["log_path"]),
        process_seconds=data["process_seconds"]) for job, data in zip(jobs, outcomes)]


def worker_logits(python: str | Path, model_dirs: Sequence[Path], input_ids, device: str = "cpu",
                  log_path: Path | None = None, progress: bool = True, prompts: list[list[int]] | None = None,
                  max_new_tokens: int = 32) -> list:
    """[batch, seq, vocab] float32 logits of each directory on `input_ids`, computed in the
    quantizer's venv: its transformers and compressed-tensors wrote the checkpoints, and newer
    transformers releases do not load every compressed-tensors layout (transformers 5.24 refuses
    the asymmetric W4A16 zero points that compressed-tensors 0.19 packs). With `prompts` (token ids), each item is (logits, greedy continuation ids per prompt)."""
    from safetensors.torch import load_file

    work = Path(tempfile.mkdtemp(prefix="harness-logits-"))
    ids = [list(map(int, row)) for row in input_ids]
    requests = [{"action": "logits", "model_dir": str(d), "samples": ids, "device": device,
                 "logits_path": str(work / f"logits-{i}.safetensors")} for i, d in enumerate(model_dirs)]
    if prompts is not None:
        requests = [r | {"prompts": prompts, "max_new_tokens": max_new_tokens} for r in requests]
    try:
        outcomes = _run_requests(python, requests, [f"logits of {d}" for d in model_dirs], log_path, progress,
                                 3600.0, 15.0)
        values = [load_file(data["logits_path"])["logits"] for data in outcomes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if prompts is None:
        return values
    return [(v, data["greedy"]) for v, data in zip(values, outcomes)]


def _run_requests(python, requests: list[dict], names: list[str], log_path: Path | None, progress: bool,
                  timeout_s: float, heartbeat_s: float) -> list[dict]:
    problem = llmcompressor_problem(python)
    if problem:
        raise QuantizeError(problem)
    if not requests:
        return []
    work = Path(tempfile.mkdtemp(prefix="harness-quant-"))
    try:
        return _run_in(work, python, requests, names, log_path, progress, timeout_s, heartbeat_s)
    finally:  # the requests and results go; the log stays where it was asked for, or here if nowhere
        if log_path:
            shutil.rmtree(work, ignore_errors=True)
        else:
            for path in work.iterdir():
                if path.name != "quantize.log":
                    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _run_in(work: Path, python, requests: list[dict], names: list[str], log_path: Path | None, progress: bool,
            timeout_s: float, heartbeat_s: float) -> list[dict]:
    log_path = Path(log_path) if log_path else work / "quantize.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    requests = [r | {"result_path": str(work / f"result-{i}.json")} for i, r in enumerate(requests)]
    request_path = work / "request.json"
    request_path.write_text(json.dumps({"jobs": requests}))
    if progress:
        print(f"[quant] {len(requests)} job(s) in {Path(python).parent.parent} (log {log_path})", file=sys.stderr, flush=True)
    started = time.monotonic()
    with open(log_path, "ab") as log:
        code, last = _run_worker(python, request_path, log, log_path, progress, timeout_s, heartbeat_s,
                                 _worker_env(requests))
    process_s = round(time.monotonic() - started, 2)
    outcomes = []
    for name, request in zip(names, requests):
        try:
            data = json.loads(Path(request["result_path"]).read_text())
        except (OSError, ValueError):
            raise QuantizeError(f"quantizer exited with code {code} before {name} finished: {last} "
                                f"(log: {log_path})") from None
        if "error" in data:
            raise QuantizeError(f"{name} failed: {data['error']} (log: {log_path})")
        outcomes.append(data | {"log_path": str(log_path), "process_seconds": process_s})
    return outcomes


def _run_worker(python, request_path: Path, log, log_path: Path, progress: bool, timeout_s: float,
                heartbeat_s: float, env: dict) -> tuple[int, str]:
    started = time.monotonic()
    proc = subprocess.Popen([str(python), str(WORKER), str(request_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    last = [""]
    pump = threading.Thread(target=_pump, args=(proc.stdout, log, progress, last), daemon=True)
    pump.start()
    try:
        while True:
            try:
                proc.wait(timeout=heartbeat_s)
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed > timeout_s:
                    raise QuantizeError(f"quantizer still running after {timeout_s:.0f} s: killed (log: {log_path})")
                if progress:
                    print(f"[quant] running {elapsed:.0f} s: {last[0]}", file=sys.stderr, flush=True)
    finally:
        if proc.poll() is None:  # timeout, Ctrl-C: the worker does not outlive the caller
            proc.kill()
            proc.wait()
    pump.join(timeout=10)
    return proc.returncode, last[0]


def _worker_env(requests: list[dict]) -> dict:
    """Offline, unbuffered; on the CPU one OpenMP thread unless OMP_NUM_THREADS is set: beside any
    other busy process on a 2-core runner, spinning OpenMP threads made llm-compressor's CPU runs
    and logits ~10x slower (docs/quant.md)."""
    import os

    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    if all(str(r.get("device", "cpu")) == "cpu" for r in requests):
        env.setdefault("OMP_NUM_THREADS", "1")
    return env
