"""One bench session: preflight, warm-up, runs per concurrency (or rate) and repeat, results on disk
after every run (an interrupted bench leaves what it measured)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from .. import __version__
from ..env import usable_cores
from ..errors import CheckFailed, UsageError
from . import capacity, hostload, metrics, prompts, results, server_stamps
from .client import LoadResult, RequestSpec, Target, client_json_parser, make_session, run_load
from .stats import SLO, summarize_run
from . import sweep
from .sweep import SweepPlan, next_rate
from .workers import default_workers, run_load_workers
from .workload import PromptTokenizer, Workload


class Interrupted(Exception):
    """Carries the partial run of an interrupted bench up to where it is written."""

    def __init__(self, run: dict):
        super().__init__("interrupted")
        self.run = run


@dataclass
class BenchConfig:
    target: Target
    workload: Workload
    concurrencies: list[int] = field(default_factory=lambda: [1])
    request_rate: float | None = None  # Poisson mode (concurrency then caps requests in flight)
    rates: SweepPlan | None = None  # several rates, or a sweep to saturation (sweep.py); overrides request_rate
    slo_target: float = 0.9  # the share of requests within the SLO for a rate to meet it
    ramp_up_s: float = 0.0  # closed loop: spread the slots' first sends over this long
    repeats: int = 1
    warmup: int = 2
    slo: SLO | None = None
    tokenizer_dir: Path | None = None
    out: Path | None = None
    keep_requests: bool = True
    environment: dict = field(default_factory=dict)  # extra facts (flags, startup info) to record
    metrics_interval_s: float = 0.1  # /metrics every 100 ms: a 1 s run still gives ~10 samples
    quiet: bool = False  # no per-run lines at all (-q)
    progress: bool | None = None  # the ticking "n/N requests" lines; default: when stderr is a terminal
    prompt_calibration: str = "auto"  # prompts.METHODS
    workers: int | None = None  # client worker processes; None: the cores nobody else uses (workers.py)
    report_dir: Path = Path("reports")  # where a saved client calibration is looked for (capacity.py)


def _say(cfg: BenchConfig, text: str) -> None:
    if not cfg.quiet:
        print(text, file=sys.stderr, flush=True)


def _ticking(cfg: BenchConfig) -> bool:
    if cfg.quiet:
        return False
    return sys.stderr.isatty() if cfg.progress is None else cfg.progress


async def preflight(session: aiohttp.ClientSession, target: Target, timeout_s: float = 10.0) -> dict:
    """Reach the server and check it serves the model; raises CheckFailed with one clear line."""
    info: dict = {}
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(target.base_url + "/v1/models") as resp:
                if resp.status != 200:
                    raise CheckFailed(f"{target.base_url} is not an OpenAI-compatible server "
                                      f"(GET /v1/models: {resp.status})")
                try:
                    listing = await resp.json(content_type=None)
                    entries = [m for m in listing.get("data", []) if isinstance(m, dict)]
                except (ValueError, AttributeError, TypeError, aiohttp.ContentTypeError):
                    raise CheckFailed(f"{target.base_url} is not an OpenAI-compatible server "
                                      "(GET /v1/models: not a JSON model list)") from None
                served = [m.get("id") for m in entries]
                info["served_models"] = served
                if served and target.model not in served:
                    raise UsageError(f"--model: {target.model!r} is not served by {target.base_url} "
                                     f"(it serves: {', '.join(map(str, served))})")
                for m in entries:
                    if m.get("id") == target.model and isinstance(m.get("max_model_len"), int):
                        info["max_model_len"] = m["max_model_len"]
            try:
                async with session.get(target.base_url + "/version") as resp:
                    if resp.status == 200:
                        info["server_version"] = (await resp.json()).get("version")
            except (aiohttp.ClientError, ValueError):
                pass
    except TimeoutError:
        raise CheckFailed(f"{target.base_url} did not answer /v1/models within {timeout_s:g} s") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise CheckFailed(f"cannot reach {target.base_url}: {type(exc).__name__}: {exc}") from None
    return info


def _results_skeleton(cfg: BenchConfig, info: dict, tokenizer: PromptTokenizer | None) -> dict:
    env = {
        "server_url": cfg.target.base_url,
        "server_version": info.get("server_version"),
        "served_models": info.get("served_models"),
        "max_model_len": info.get("max_model_len"),
        "model": cfg.target.model,
        "model_id": cfg.environment.get("model_id") or Path(cfg.target.model).name,
        "tokenizer": tokenizer.source if tokenizer else None,
        "flags": cfg.environment.get("flags", []),
        "machine": results.machine(),
        "client": {"workers": cfg.workers or "auto", "json_parser": client_json_parser()},
    }
    env.update({k: v for k, v in cfg.environment.items() if k not in env or env[k] is None})
    workload = cfg.workload.to_json() | {
        "concurrency": cfg.concurrencies,
        "request_rate": (("sweep" if cfg.rates.auto else list(cfg.rates.rates)) if cfg.rates else cfg.request_rate),
        "repeats": cfg.repeats,
        "warmup": cfg.warmup,
        "ramp_up_s": cfg.ramp_up_s,
        "timeout_s": cfg.target.timeout_s,
        "api": cfg.target.api,
    }
    return {
        "schema_version": results.SCHEMA_VERSION,
        "tool": {"name": "llm-harness", "version": __version__, "argv": sys.argv,
                 "definitions": {"ttft": "send -> first chunk with content",
                                 "tpot": "(e2e - ttft) / (output tokens - 1), per request",
                                 "itl": "gaps between content chunks, pooled",
                                 "e2e": "send -> end of stream"}},
        "environment": env,
        "workload": workload,
        "runs": [],
        "complete": False,
    }


async def run_bench_async(cfg: BenchConfig) -> dict:
    tokenizer = PromptTokenizer(cfg.tokenizer_dir) if cfg.tokenizer_dir else None
    session = make_session()
    try:
        info = await preflight(session, cfg.target)
        # The server's own count of the prompts, unless a local tokenizer is given (prompts.py).
        calibration = await prompts.calibrate(session, cfg.target, tokenizer, cfg.prompt_calibration)
        specs = await prompts.build_specs(session, cfg.target, cfg.workload, calibration, tokenizer)
        warm_specs = await _warmup_specs(session, cfg, calibration, tokenizer)
        data = _results_skeleton(cfg, info, tokenizer)
        data["prompt_calibration"] = calibration.to_json()  # not in the workload: not fingerprinted
        data["valid"], data["invalid_reasons"] = True, []
        first = await metrics.fetch(session, cfg.target.base_url)
        data["environment"]["metric_names"] = sorted(n for n in first.names() if n.startswith("vllm:")) if first else None
        if cfg.out:
            results.write_atomic(cfg.out, data)
        ctx = _Context(cfg, session, specs, warm_specs, tokenizer, calibration, data)
        plan = cfg.rates or (SweepPlan(rates=(cfg.request_rate,)) if cfg.request_rate else None)
        if plan is None:
            for level in cfg.concurrencies:
                if not await _level_runs(ctx, level, None):
                    return data
        else:
            cap = cfg.concurrencies[0] if cfg.concurrencies else None
            while (rate := next_rate(plan, data["runs"])) is not None:
                if not await _level_runs(ctx, cap, rate):
                    return data
            data["sweep"] = sweep.summarize(data["runs"], cfg.slo.to_json() if cfg.slo else {}, cfg.slo_target)
            _say(cfg, sweep.line(data["sweep"]))
        data["complete"] = True
        if cfg.out:
            results.write_atomic(cfg.out, data)
        return data
    finally:
        await session.close()


@dataclass
class _Context:
    cfg: BenchConfig
    session: aiohttp.ClientSession
    specs: list
    warm_specs: list
    tokenizer: PromptTokenizer | None
    calibration: prompts.Calibration
    data: dict


async def _level_runs(ctx: _Context, level: int | None, rate: float | None) -> bool:
    """Every repeat at one concurrency (or rate); results on disk after each. False: stop the
    bench (a run whose prompts missed the requested length is another workload)."""
    cfg, data = ctx.cfg, ctx.data
    for rep in range(cfg.repeats):
        warm = None
        if ctx.warm_specs:
            warm = await run_load(cfg.target, ctx.warm_specs, concurrency=min(len(ctx.warm_specs), level or 1),
                                  session=ctx.session)
        try:
            run = await _one_run(cfg, ctx.session, ctx.specs, level, rep, ctx.tokenizer, ctx.calibration.tolerance,
                                 warm, data["environment"]["machine"], rate)
        except Interrupted as stop:
            data["runs"].append(stop.run)
            data["interrupted"] = True
            if cfg.out:
                results.write_atomic(cfg.out, data)
            raise asyncio.CancelledError from None
        data["runs"].append(run)
        _say(cfg, _run_line(run))
        if not run["prompt_tokens"]["valid"]:
            data["valid"] = False
            data["invalid_reasons"].append(invalid_reason(run, ctx.calibration.method))
            if cfg.out:
                results.write_atomic(cfg.out, data)
            return False
        if cfg.out:
            results.write_atomic(cfg.out, data)
    return True


def invalid_reason(run: dict, method: str) -> str:
    p = run["prompt_tokens"]
    return (f"prompt lengths missed the request: {p['off']} of {p['checked']} requests off by more than "
            f"{p['tolerance']} token(s) (requested {p['requested_mean']:.0f}, server counted "
            f"{p['actual_min']}..{p['actual_max']}, mean {p['actual_mean']:.1f}; prompts built with {method})")


async def _warmup_specs(session, cfg: BenchConfig, calibration, tokenizer) -> list[RequestSpec]:
    if cfg.warmup <= 0:
        return []
    w = cfg.workload
    warm = Workload(input_len=w.input_len, output_len=min(w.output_len, 4), num_prompts=cfg.warmup,
                    prefix_len=0, api=w.api, seed=w.seed + 10_000)
    return await prompts.build_specs(session, cfg.target, warm, calibration, tokenizer)


def seconds_per_token(warm: LoadResult | None) -> float | None:
    """The median gap between a warm-up stream's tokens (None without at least one gap)."""
    from .stats import itls_s, percentile

    gaps = [g for r in (warm.records if warm else []) if r.ok for g in itls_s(r)]
    return percentile(gaps, 50) if gaps else None


def _capacity_check(cfg: BenchConfig, level, rate, workers: int, warm, machine: dict) -> dict:
    cap = capacity.for_machine(cfg.report_dir, machine, workers)
    want, how = capacity.asked_rate(level, rate, cfg.workload.output_len, seconds_per_token(warm))
    check = capacity.warning(want, how, workers, cap)
    if check["warning"]:
        _say(cfg, "warning: " + check["warning"])
    return check


async def _settled_or_none(session, base_url: str, before) -> metrics.Snapshot | None:
    """The counters after a run: only where there were some before it (a server with /metrics)."""
    return await metrics.settled(session, base_url) if before else None


async def _one_run(cfg, session, specs, level, rep, tokenizer, tolerance: int, warm=None, machine=None,
                   rate: float | None = None) -> dict:
    label = f"rate {rate:g}/s" if rate else f"concurrency {level}"
    # the server's counters settling and the machine's idle load are both read while nothing is sent:
    # side by side, not one after the other (~0.45 s less a run, the gate's blocks two runs each)
    before, idle = await asyncio.gather(metrics.settled(session, cfg.target.base_url), hostload.sample_runnable())
    sampler = metrics.Sampler(session, cfg.target.base_url, cfg.metrics_interval_s) if before else None
    if sampler:
        sampler.start()
    started = time.monotonic()
    last = [0.0]

    ticking = _ticking(cfg)

    def progress(done: int, total: int) -> None:
        if not ticking:
            return
        now = time.monotonic()
        if now - last[0] >= 2.0 or done == total:
            last[0] = now
            _say(cfg, f"  {label} repeat {rep + 1}/{cfg.repeats}: {done}/{total} requests, {now - started:.0f} s")

    records: list = []
    n_workers = cfg.workers or default_workers(usable_cores(), hostload.background(idle)["background_runnable"])
    check = _capacity_check(cfg, level, rate, n_workers, warm, machine or {}) if rep == 0 else None
    server = hostload.server_pids(cfg.target.base_url)
    stamps_after = await server_stamps.cursor(session, cfg.target.base_url)  # None: no http_ttft middleware
    cpu_before = hostload.cpu_times(server, {os.getpid()})
    try:
        if n_workers > 1:
            load = await run_load_workers(cfg.target, specs, workers=n_workers, concurrency=level,
                                          request_rate=rate, ramp_up_s=cfg.ramp_up_s,
                                          seed=cfg.workload.seed + rep, on_progress=progress, records=records)
        else:
            load = await run_load(cfg.target, specs, concurrency=level, request_rate=rate,
                                  ramp_up_s=cfg.ramp_up_s, seed=cfg.workload.seed + rep, on_progress=progress,
                                  session=session, records=records)
    except asyncio.CancelledError:
        # Ctrl-C: keep what finished, say how many were cut off, let the caller write it.
        done = [r for r in records if r.end_s > 0 and r.error != "interrupted"]
        cut = len(records) - len(done)
        partial = LoadResult(records=done, loop_lag_s=[], started_wall=time.time(),
                             duration_s=(max(r.end_s for r in done) - min(r.sent_s for r in done)) if done else 0.0)
        run = summarize_run(partial, concurrency=level, request_rate=rate, slo=cfg.slo,
                            keep_requests=cfg.keep_requests, repeat=rep, prompt_tolerance=tolerance)
        run.update(interrupted=True, requests_cut_off=cut, requests_not_sent=len(specs) - len(records))
        raise Interrupted(run) from None
    finally:
        series = await sampler.stop() if sampler else []
    load.host.update(hostload.others_during(cpu_before, hostload.cpu_times(server, {os.getpid()})))
    after, idle_after = await asyncio.gather(_settled_or_none(session, cfg.target.base_url, before),
                                             hostload.sample_runnable())
    idle += idle_after
    load.host.update(hostload.background(idle))
    run = summarize_run(
        load, concurrency=level, request_rate=rate, slo=cfg.slo,
        server_delta=metrics.delta(before, after), server_timeseries=series,
        count_output=tokenizer.count_output if tokenizer else None,
        keep_requests=cfg.keep_requests, repeat=rep, prompt_tolerance=tolerance,
    )
    if check:
        run["client_capacity"] = check
    if stamps_after is not None:
        stamps = await server_stamps.fetch(session, cfg.target.base_url, stamps_after)
        run["server_http_ttft"] = server_stamps.summarize(load.records, load.t0, stamps)
    return run


def _run_line(run: dict) -> str:
    ttft = run["ttft_ms"]["p50"]
    level = (f"rate {run['request_rate']:g}/s" + (f" (cap {run['concurrency']})" if run['concurrency'] else "")
             if run.get("request_rate") else f"concurrency {run['concurrency']}")
    failed = f"{run['requests_failed']} failed" + (f" {run['errors']}" if run["errors"] else "")
    text = (f"{level} repeat {run['repeat'] + 1}: {run['requests_ok']} ok, {failed}, TTFT p50 "
            f"{'-' if ttft is None else f'{ttft:.1f} ms'}, {run['output_throughput']:.1f} output tok/s")
    p = run.get("prompt_tokens") or {}
    if p.get("checked"):
        text += f", prompt {p['actual_mean']:.0f}/{p['requested_mean']:.0f} tokens"
        if not p["valid"]:
            text += " [INVALID: prompt lengths missed the request]"
    http = run.get("server_http_ttft") or {}
    if (http.get("ttft_ms") or {}).get("p50") is not None:
        text += (f", server HTTP TTFT p50 {http['ttft_ms']['p50']:.1f} ms (client excess p50 "
                 f"{http['client_excess_ms']['p50']:.2f} ms)")
    if run.get("workers", 1) > 1:
        text += f", {run['workers']} client workers"
    for failure in run.get("worker_failures") or ():
        text += f" [CLIENT WORKER DIED: {failure}]"
    if run["client_bound"]:
        text += " [CLIENT-BOUND: " + "; ".join(run["client_bound_reasons"]) + "]"
    if not run["token_accounting"]["agree"]:
        text += " [TOKENS: " + "; ".join(run["token_accounting"]["findings"]) + "]"
    return text


def run_bench(cfg: BenchConfig) -> dict:
    return asyncio.run(run_bench_async(cfg))
