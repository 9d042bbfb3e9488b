"""The interleaved A/B gate: baseline and candidate measured in alternating blocks inside one call
(A B, B A, A B, ...), on the bench runner's own runs, decided by harness.serving.sequential.

Both servers must be up (two endpoints, or two vLLM interpreters started one after the other by
the command); each block runs the same workload, same prompts, against each, with the warm-up
outside the measured window. A noise model (the spread of the blocks' log ratios per metric, on
this machine, for this workload) is saved after every gate and read by the next to plan its first
look (noise.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import __version__
from . import gate_metrics as gm
from . import noise, prompts, results, runner
from .client import Target, make_session, run_load
from .runner import BenchConfig
from .sequential import Rule, SequentialGate
from .workload import PromptTokenizer, Workload

SIDES = ("baseline", "candidate")


@dataclass
class Side:
    name: str  # baseline | candidate
    target: Target
    tokenizer_dir: Path | None = None
    environment: dict = field(default_factory=dict)


@dataclass
class GateConfig:
    baseline: Side
    candidate: Side
    workload: Workload
    concurrency: int = 4
    ramp_up_s: float = 0.0  # each run's first sends spread over this long (bench's --ramp-up)
    rule: Rule = field(default_factory=Rule)
    thresholds: dict[str, float] = field(default_factory=gm.default_thresholds)
    budget_s: float | None = None  # stop adding blocks once another would pass this
    warmup: int = 2
    prompt_calibration: str = "auto"
    workers: int | None = 1  # one client process: the same client cost on both sides
    noise_model: Path | None = None
    out: Path | None = None
    quiet: bool = False
    # one server at a time: called before a side is measured, returns its (base URL,
    # environment) once that side's server is up and the other's torn down (gate_servers.Servers.up)
    bring_up: Callable[[str], tuple[str, dict]] | None = None


@dataclass
class GateResult:
    verdict: str
    gate: SequentialGate
    stopped_by: str  # decided | regressed | max-blocks | budget
    wall_s: float
    runs: dict[str, list[dict]]
    order: list[str]
    behaviours: list[str]
    noise_note: str = ""
    servers_note: str = ""
    server_starts: list[dict] = field(default_factory=list)

    def to_json(self, undecided: str = "fail") -> dict:
        return {"kind": "harness-gate", "version": __version__, "verdict": self.verdict,
                "verdict_line": verdict_line(self, undecided), "stopped_by": self.stopped_by,
                "blocks": self.gate.blocks, "wall_s": round(self.wall_s, 2), "order": self.order,
                "rule": {"alpha": self.gate.rule.alpha, "min_blocks": self.gate.rule.min_blocks,
                         "max_blocks": self.gate.rule.max_blocks, "first_look": self.gate.rule.start,
                         "looks": self.gate.rule.looks},
                "calls": [c.to_json() for c in self.gate.calls.values()], "behaviours": self.behaviours,
                "noise_model": self.noise_note, "servers": self.servers_note, "server_starts": self.server_starts}


@dataclass
class _Prepared:
    side: Side
    cfg: BenchConfig
    specs: list
    warm_specs: list
    tokenizer: PromptTokenizer | None
    tolerance: int
    info: dict


def _say(cfg: GateConfig, text: str) -> None:
    if not cfg.quiet:
        print(text, file=sys.stderr, flush=True)


async def _prepare(session, cfg: GateConfig, side: Side) -> _Prepared:
    bench = BenchConfig(target=side.target, workload=cfg.workload, concurrencies=[cfg.concurrency], repeats=1,
                        ramp_up_s=cfg.ramp_up_s, warmup=cfg.warmup, tokenizer_dir=side.tokenizer_dir, environment=side.environment,
                        quiet=True, progress=False, prompt_calibration=cfg.prompt_calibration,
                        workers=cfg.workers, keep_requests=False)
    tokenizer = PromptTokenizer(side.tokenizer_dir) if side.tokenizer_dir else None
    info = await runner.preflight(session, side.target)
    calibration = await prompts.calibrate(session, side.target, tokenizer, cfg.prompt_calibration)
    specs = await prompts.build_specs(session, side.target, cfg.workload, calibration, tokenizer)
    warm = await runner._warmup_specs(session, bench, calibration, tokenizer)
    return _Prepared(side, bench, specs, warm, tokenizer, calibration.tolerance, info)


async def _measure(session, p: _Prepared, block: int, concurrency: int) -> dict:
    warm = None
    if p.warm_specs:  # outside the measured window, as bench does before every run
        warm = await run_load(p.side.target, p.warm_specs, concurrency=min(len(p.warm_specs), concurrency),
                              session=session)
    return await runner._one_run(p.cfg, session, p.specs, concurrency, block, p.tokenizer, p.tolerance, warm,
                                 results.machine())


def _behaviours(runs: dict[str, list[dict]]) -> list[str]:
    """New failures or invalid prompts on the candidate's side: a regression no interval can excuse."""
    notes = []
    failed = {s: sum(r["requests_failed"] for r in runs[s]) for s in SIDES}
    if failed["candidate"] > failed["baseline"]:
        notes.append(f"REGRESSION: {failed['candidate']} failed requests on the candidate (baseline {failed['baseline']})")
    for s in SIDES:
        bad = [r for r in runs[s] if not (r.get("prompt_tokens") or {}).get("valid", True)]
        if bad:
            notes.append(f"UNDECIDED: the {s}'s prompts missed the requested length in {len(bad)} run(s)")
    return notes


async def _bring_up(session, cfg: GateConfig, prepared: dict, name: str) -> None:
    """One server at a time: have `name`'s server up (started, the other torn down) and point its
    side at it; the prompts are built once per side, on its first start."""
    if cfg.bring_up is None:
        return
    # called on the event loop's own (main) thread, blocking it while the server starts: nothing
    # else runs between runs, and a server forked from the main thread dies with the gate even
    # when the gate is killed (launcher's PR_SET_PDEATHSIG fires on the forking thread's exit)
    url, environment = cfg.bring_up(name)
    side = getattr(cfg, name)
    side.target = dataclasses.replace(side.target, base_url=url)
    side.environment = side.environment or environment
    if name not in prepared:
        prepared[name] = await _prepare(session, cfg, side)
    prepared[name].cfg.target = side.target


async def run_gate_async(cfg: GateConfig) -> GateResult:
    started = time.monotonic()
    session = make_session()
    runs: dict[str, list[dict]] = {s: [] for s in SIDES}
    order: list[str] = []
    try:
        prepared = {} if cfg.bring_up else {s: await _prepare(session, cfg, getattr(cfg, s)) for s in SIDES}
        gate = SequentialGate(cfg.rule, dict(cfg.thresholds))
        stopped_by, block_s = "max-blocks", 0.0
        while not gate.done():
            if cfg.budget_s is not None and time.monotonic() - started + block_s > cfg.budget_s:
                stopped_by = "budget" + (" (one look at the blocks in hand)" if gate.early_look() else "")
                break
            t0 = time.monotonic()
            sides = SIDES if gate.blocks % 2 == 0 else SIDES[::-1]  # A B, B A, ...
            block = {}
            for s in sides:
                await _bring_up(session, cfg, prepared, s)
                block[s] = await _measure(session, prepared[s], gate.blocks, cfg.concurrency)
                runs[s].append(block[s])
            order.append("".join("A" if s == "baseline" else "B" for s in sides))
            gate.add_block(block["baseline"], block["candidate"])
            block_s = time.monotonic() - t0
            _say(cfg, _block_line(gate, block, block_s))
            if any(b.startswith("REGRESSION") for b in _behaviours(runs)):
                stopped_by = "regressed"
                break
        else:
            stopped_by = ("regressed" if gate.verdict == gm.REGRESSED else
                          "decided" if gate.verdict == gm.OK else "max-blocks")
    finally:
        await session.close()
    behaviours = _behaviours(runs)
    verdict = gate.verdict
    if any(b.startswith("REGRESSION") for b in behaviours):
        verdict = gm.REGRESSED
    elif verdict == gm.OK and any(b.startswith("UNDECIDED") for b in behaviours):
        verdict = gm.UNDECIDED
    result = GateResult(verdict, gate, stopped_by, time.monotonic() - started, runs, order, behaviours)
    if cfg.out:
        _write_sides(cfg, prepared, runs)
    return result


def _write_sides(cfg: GateConfig, prepared: dict, runs: dict) -> None:
    """Each side's runs as a bench results file beside --out, for `compare` and `report`."""
    for s in (s for s in SIDES if s in prepared):
        data = runner._results_skeleton(prepared[s].cfg, prepared[s].info, prepared[s].tokenizer)
        data["runs"], data["complete"], data["valid"], data["invalid_reasons"] = runs[s], True, True, []
        results.write_atomic(side_path(cfg.out, s), data)


def side_path(out: Path, side: str) -> Path:
    return out.with_name(f"{out.stem}.{side}.json")


def _block_line(gate: SequentialGate, block: dict, seconds: float) -> str:
    open_ = [n for n, c in gate.calls.items() if c.decision == gm.UNDECIDED]
    tput = [f"{block[s]['output_throughput']:.0f}" for s in SIDES]
    return (f"block {gate.blocks}: output tok/s {tput[0]} vs {tput[1]}, {seconds:.1f} s; "
            f"open: {', '.join(open_) or 'none'}")


def format_table(result: GateResult) -> str:
    rows = [("metric", "change", "interval", "threshold", "blocks", "decision", "why")]
    for c in result.gate.calls.values():
        ci = "-" if c.ci_low is None else f"[{100 * c.ci_low:+.1f}%, {100 * c.ci_high:+.1f}%]"
        change = "-" if c.change is None else f"{100 * c.change:+.1f}%"
        why = f"decided at block {c.decided_at}" if c.decided_at else c.needs
        rows.append((f"{c.metric} ({c.unit})", change, ci, f"{'+' if c.higher_is_worse else '-'}{100 * c.threshold:g}%",
                     str(c.blocks), c.decision, why))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    rule = result.gate.rule
    lines = [f"gate: {result.gate.blocks} blocks ({' '.join(result.order)}), paired by block, "
             f"{100 * (1 - rule.alpha / rule.looks):.2f}% intervals at each of up to {rule.looks} looks "
             f"(first look at block {rule.start}); stopped: {result.stopped_by}; {result.wall_s:.0f} s"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += result.behaviours
    if result.servers_note:
        lines.append(result.servers_note + (f"; {len(result.server_starts)} starts" if result.server_starts else ""))
    if result.noise_note:
        lines.append(result.noise_note)
    return "\n".join(lines)


def verdict_line(result: GateResult, undecided: str = "fail") -> str:
    calls = [c for c in result.gate.calls.values() if c.decision != gm.NOT_GATED]
    where = f" after {result.gate.blocks} blocks, {result.wall_s:.0f} s"
    if result.verdict == gm.REGRESSED:
        bad = [f"{c.metric} {100 * c.change:+.1f}% in [{100 * c.ci_low:+.1f}%, {100 * c.ci_high:+.1f}%]"
               for c in calls if c.decision == gm.REGRESSED]
        bad += [b.removeprefix("REGRESSION: ") for b in result.behaviours if b.startswith("REGRESSION")]
        return f"REGRESSED: {'; '.join(bad)}{where}"
    if result.verdict == gm.UNDECIDED:
        unsure = [c for c in calls if c.decision == gm.UNDECIDED]
        more = [c.more_blocks for c in unsure if c.more_blocks is not None]
        line = f"UNDECIDED: {len(unsure)} of {len(calls)} metrics{where} (stopped: {result.stopped_by})"
        if unsure:
            c = unsure[0]
            ci = "" if c.ci_low is None else f" in [{100 * c.ci_low:+.1f}%, {100 * c.ci_high:+.1f}%]"
            line += f": {c.metric}{ci}"
        if more:
            line += f"; about {max(more)} more blocks would decide at this spread (--max-blocks, --budget-s)"
        elif unsure:
            line += f"; needs {unsure[0].needs}"
        else:
            line += "; " + "; ".join(b.removeprefix("UNDECIDED: ") for b in result.behaviours if b.startswith("UNDECIDED"))
        if undecided == "pass":
            line += " (passed: --undecided pass)"
        return line
    return f"OK: {len(calls)} of {len(calls)} metrics within their thresholds{where}"


def run_gate(cfg: GateConfig) -> GateResult:
    """Plan from the saved noise model, run, save the noise model."""
    spreads, note = noise.read(cfg.noise_model, cfg) if cfg.noise_model else ({}, "")
    if spreads:
        from .sequential import plan_first_look

        first = plan_first_look(spreads, cfg.thresholds, cfg.rule)
        if first is not None:
            cfg.rule = Rule(cfg.rule.alpha, cfg.rule.min_blocks, cfg.rule.max_blocks, first, cfg.rule.power)
            note += f"; first look planned at block {cfg.rule.start}"
            if first > cfg.rule.max_blocks:
                note += f" (an A/A gate here needs ~{first} blocks to end OK: raise --max-blocks)"
    result = asyncio.run(run_gate_async(cfg))
    result.noise_note = note
    if cfg.noise_model:
        saved = noise.write(cfg.noise_model, cfg, result)
        result.noise_note = (note + "; " if note else "") + saved
    return result
