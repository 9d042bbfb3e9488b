"""vLLM's Prometheus /metrics: parsing, snapshots, deltas, and a sampler for time series."""

from __future__ import annotations

import asyncio
import math
import re
import time
from dataclasses import dataclass, field

import aiohttp

# The names the harness reads (docs/architecture.md, Serving benchmarks: "current names"); a suite checks they exist.
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
TTFT_HIST = "vllm:time_to_first_token_seconds"
REQUEST_SUCCESS = "vllm:request_success_total"
READ_NAMES = (PROMPT_TOKENS, GENERATION_TOKENS, RUNNING, WAITING, KV_USAGE, PREFIX_QUERIES,
              PREFIX_HITS, TTFT_HIST + "_sum", TTFT_HIST + "_count", REQUEST_SUCCESS)

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass
class Snapshot:
    """Series name -> value summed over label sets (one engine, any model name)."""

    values: dict[str, float] = field(default_factory=dict)
    taken_wall: float = 0.0

    def get(self, name: str, default: float = math.nan) -> float:
        return self.values.get(name, default)

    def names(self) -> set[str]:
        return set(self.values)


def parse(text: str) -> Snapshot:
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            continue
        name, _labels, raw = match.groups()
        if name.endswith("_bucket"):
            continue  # histogram buckets: sum and count are enough here
        try:
            value = float(raw)
        except ValueError:
            continue
        values[name] = values.get(name, 0.0) + value
    return Snapshot(values=values, taken_wall=time.time())


async def fetch(session: aiohttp.ClientSession, base_url: str, timeout_s: float = 10.0) -> Snapshot | None:
    """The server's /metrics, or None if it has none (a non-vLLM endpoint) or cannot answer."""
    try:
        async with asyncio.timeout(timeout_s):
            async with session.get(base_url + "/metrics") as resp:
                if resp.status != 200:
                    return None
                return parse(await resp.text())
    except (TimeoutError, aiohttp.ClientError, OSError):
        return None


async def settled(session: aiohttp.ClientSession, base_url: str, tries: int = 8, pause_s: float = 0.25) -> Snapshot | None:
    """A snapshot taken once the token counters stop moving (the engine updates them a little
    after the last [DONE])."""
    last = await fetch(session, base_url)
    for _ in range(tries):
        if last is None:
            return None
        await asyncio.sleep(pause_s)
        now = await fetch(session, base_url)
        if now is not None and all(now.get(n, 0) == last.get(n, 0) for n in (PROMPT_TOKENS, GENERATION_TOKENS, TTFT_HIST + "_count")):
            return now
        last = now
    return last


def delta(before: Snapshot | None, after: Snapshot | None) -> dict | None:
    """Counter deltas over a run, and the server's mean TTFT from its histogram."""
    if before is None or after is None:
        return None

    def d(name: str) -> float | None:
        a, b = after.get(name), before.get(name)
        return None if math.isnan(a) or math.isnan(b) else a - b

    count = d(TTFT_HIST + "_count")
    total = d(TTFT_HIST + "_sum")
    queries, hits = d(PREFIX_QUERIES), d(PREFIX_HITS)
    return {
        "prompt_tokens": d(PROMPT_TOKENS),
        "generation_tokens": d(GENERATION_TOKENS),
        "requests_finished": d(REQUEST_SUCCESS),
        "ttft_count": count,
        "ttft_mean_ms": (1000.0 * total / count) if count else None,
        "prefix_cache_queries": queries,
        "prefix_cache_hits": hits,
        "prefix_cache_hit_rate": (hits / queries) if queries else None,
    }


class Sampler:
    """Polls /metrics in the background: running and waiting requests and KV-cache use over time."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, interval_s: float = 0.5):
        self.session, self.base_url, self.interval_s = session, base_url, interval_s
        self.samples: list[dict] = []
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            snap = await fetch(self.session, self.base_url, timeout_s=2.0)
            if snap is not None:
                self.samples.append({
                    "wall": snap.taken_wall,
                    "running": snap.get(RUNNING, None),
                    "waiting": snap.get(WAITING, None),
                    "kv_cache_usage": snap.get(KV_USAGE, None),
                })
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> list[dict]:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        return self.samples
