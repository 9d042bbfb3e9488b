"""Asynchronous OpenAI-compatible streaming load client: one asyncio process, raw events kept.

Conventions (docs/architecture.md, Measurement conventions): TTFT is send -> first chunk whose text is non-empty (a role-only chat
delta is not a token); a request fails on a non-2xx status, an in-band error frame, a stream that
ends without ``[DONE]``, a stream with no content, a timeout or a broken connection.

The client measures itself. Every request has a scheduled send time (rate mode: its Poisson
arrival; closed loop: the moment its slot freed up, or its place in the ramp-up). *Schedule lag*
= actual send time - scheduled send time; a timed send wakes up on time, not up to a selector
tick late (_wake_at). A probe timer also samples how late the loop runs timers that are due
during the run (*loop lag*: chunk timestamps can be late by that much). Large lags mean
the client, not the server, was the bottleneck, and the results say so.
"""

from __future__ import annotations

import asyncio
import gc
import ctypes
import itertools
import json
import math
import os
import random
import secrets
import time
from dataclasses import dataclass, field, asdict
from typing import Callable, Sequence

import aiohttp

from . import hostload
from .http_ttft import frame_carries_token

try:  # optional: parses stream frames ~3x faster than json (measured in docs/serving.md)
    import orjson

    _loads = orjson.loads
except ImportError:  # pragma: no cover - the plain json fallback
    _loads = json.loads

def client_json_parser() -> str:
    return "orjson" if _loads is not json.loads else "json"


# Every timestamp is time.monotonic(): system-wide on Linux (CLOCK_MONOTONIC), so the records of
# several worker processes lie on one clock; and exact under any event loop (uvloop's loop.time()
# is cached per iteration in whole milliseconds).
_now = time.monotonic
# unique request ids over worker processes and runs, without a shared counter
_ID_PREFIX = f"hb-{secrets.token_hex(4)}"
_IDS = itertools.count()


@dataclass
class RequestSpec:
    """One request to send: the prompt and the token counts the client expects."""

    prompt: str | list[int]  # text, or token ids (completions only: token_prompts.py)
    input_tokens: int  # by the client's tokenizer, special tokens included as the server adds them
    output_tokens: int  # max_tokens = min_tokens
    seed: int | None = None  # a per-request sampling seed (off by default: see request_body)
    requested_input_tokens: int = 0  # what the workload asked for (--input-len); 0: not asked
    temperature: float = 1.0  # see request_body; 0 (greedy) where a test needs reproducible text


@dataclass
class RequestRecord:
    """Raw events of one request. Times are seconds since the run's start (monotonic clock)."""

    index: int
    scheduled_s: float
    dispatched_s: float = 0.0  # when the loop woke the sender up (timer latency part of the lag)
    sent_s: float = 0.0
    # When aiohttp handed the request's body (headers coalesced with it) to the transport, which
    # sends it at once on an idle socket: sent_s -> written_s is the client's own send path
    # (connection pick-up, the body-writer task's turn on the loop); None: not traced.
    written_s: float | None = None
    end_s: float = 0.0
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk carrying content
    # Arrival of the first frame carrying a choice, visible text or not: the first token, as vLLM's
    # bench and the server's own TTFT histogram count it (a random model's tokens often decode to
    # nothing; its first visible text can come many tokens later).
    first_token_s: float | None = None
    status: int | None = None
    error: str | None = None  # a failure class (http_<status>, error_frame, ...) or None
    error_detail: str | None = None
    prompt_tokens: int | None = None  # server usage
    completion_tokens: int | None = None
    expected_input_tokens: int = 0  # counted by a tokenizer before sending (0: not counted)
    expected_output_tokens: int = 0
    requested_input_tokens: int = 0
    finish_reason: str | None = None
    output_text: str = ""
    request_id: str | None = None  # sent as X-Request-Id: a server's own stamps match it (http_ttft.py)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def answered(self) -> bool:
        """The server completed the request (usage and [DONE]), visible text or not."""
        return self.error in (None, "no_content") and self.completion_tokens is not None

    @property
    def schedule_lag_s(self) -> float:
        """Actual send time - scheduled send time."""
        return self.sent_s - self.scheduled_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.sent_s

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.sent_s

    def to_json(self) -> dict:
        data = asdict(self)
        data["ttft_s"] = self.ttft_s
        return data


@dataclass
class LoadResult:
    records: list[RequestRecord]
    loop_lag_s: list[float]
    started_wall: float  # time.time() at the run's start, to line up with server samples
    duration_s: float  # first send to last end
    host: dict = field(default_factory=dict)  # hostload.delta over the run: CPU starvation the client saw
    t0: float = 0.0  # the run's start on time.monotonic() (records' times are relative to it)
    workers: list[dict] = field(default_factory=list)  # per worker process (workers.py); [] in-process


@dataclass
class Target:
    base_url: str  # http://127.0.0.1:8000
    model: str
    api: str = "completions"  # or "chat"
    timeout_s: float = 60.0


def request_body(target: Target, spec: RequestSpec) -> dict:
    body: dict = {
        "model": target.model,
        "max_tokens": spec.output_tokens,
        "min_tokens": spec.output_tokens,
        "ignore_eos": True,
        # Sampling, not greedy: greedy decoding of a random test model loops on one token, and
        # when that token is a special token or half a UTF-8 character the whole stream is
        # invisible ("no content"). Special tokens are sent as text for the same reason. No
        # per-request seed by default: vLLM 0.31.0's CPU build kills its engine when a seeded
        # request's prefill is chunked ("CPU Generator does not use offset").
        # ignore_eos, min_tokens and skip_special_tokens are vLLM's extensions of the OpenAI API.
        "temperature": spec.temperature,
        "skip_special_tokens": False,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.seed is not None:
        body["seed"] = spec.seed
    if target.api == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


def server_reason(body: str, limit: int = 500) -> str:
    """The server's own message in an error body: vLLM's {"object": "error", "message": ...} or the
    OpenAI {"error": {"message": ...}}; the body itself, cut short, when it is not such JSON."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    message = None
    if isinstance(data, dict):
        err = data.get("error")
        message = data.get("message") or (err.get("message") if isinstance(err, dict) else err) or data.get("detail")
    text = str(message) if message else body.strip()
    return " ".join(text.split())[:limit] or "(empty body)"


def _chunk_text(frame: dict) -> str:
    text = ""
    for choice in frame.get("choices") or ():
        if "text" in choice and choice["text"]:
            text += choice["text"]
        delta = choice.get("delta") or {}
        text += (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return text


def _error_of(frame: dict) -> str | None:
    if "error" in frame:
        err = frame["error"]
        return (err.get("message") if isinstance(err, dict) else str(err)) or "error frame"
    if frame.get("object") == "error":
        return frame.get("message") or "error frame"
    return None


async def send_one(
    session: aiohttp.ClientSession, target: Target, spec: RequestSpec, record: RequestRecord, t0: float
) -> RequestRecord:
    """Send one streaming request and fill `record` in. Never raises for a server fault."""
    path = "/v1/chat/completions" if target.api == "chat" else "/v1/completions"
    record.expected_input_tokens = spec.input_tokens
    record.requested_input_tokens = spec.requested_input_tokens
    record.expected_output_tokens = spec.output_tokens
    done = False
    pieces: list[str] = []
    record.request_id = record.request_id or f"{_ID_PREFIX}-{next(_IDS)}"
    headers = {"X-Request-Id": record.request_id}
    record.sent_s = _now() - t0
    try:
        async with asyncio.timeout(target.timeout_s):
            async with session.post(target.base_url + path, json=request_body(target, spec), headers=headers,
                                    trace_request_ctx=(record, t0)) as resp:
                record.status = resp.status
                if resp.status >= 300:
                    record.error = f"http_{resp.status}"
                    record.error_detail = server_reason(await resp.text())
                    return record
                buffer = b""
                async for data in resp.content.iter_any():
                    now = _now() - t0
                    buffer += data
                    while not done:
                        cut = buffer.find(b"\n")
                        if cut < 0:
                            break
                        line, buffer = buffer[:cut].strip(), buffer[cut + 1:]
                        if not line.startswith(b"data:"):
                            continue
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            done = True
                            break
                        try:
                            frame = _loads(payload)
                        except ValueError:
                            record.error, record.error_detail = "error_frame", f"unparsable frame {payload[:120]!r}"
                            return record
                        message = _error_of(frame)
                        if message is not None:
                            record.error, record.error_detail = "error_frame", str(message)[:300]
                            return record
                        text = _chunk_text(frame)
                        if record.first_token_s is None and (text or frame_carries_token(frame)):
                            record.first_token_s = now
                        if text:
                            record.chunk_s.append(now)
                            pieces.append(text)
                        for choice in frame.get("choices") or ():
                            if choice.get("finish_reason"):
                                record.finish_reason = choice["finish_reason"]
                        usage = frame.get("usage")
                        if usage:
                            record.prompt_tokens = usage.get("prompt_tokens")
                            record.completion_tokens = usage.get("completion_tokens")
                    if done:
                        break
    except asyncio.CancelledError:
        record.error, record.error_detail = "interrupted", "the client was stopped while this request ran"
        raise
    except TimeoutError:
        record.error, record.error_detail = "timeout", f"no complete answer within {target.timeout_s:g} s"
    except (aiohttp.ClientError, ConnectionError, OSError) as exc:
        record.error, record.error_detail = "connection", f"{type(exc).__name__}: {exc}"[:300]
    finally:
        record.end_s = _now() - t0
        record.output_text = "".join(pieces)
    if record.error is None:
        if not done:
            record.error, record.error_detail = "no_done", "stream ended without data: [DONE]"
        elif not record.chunk_s:
            record.error = "no_content"
            record.error_detail = f"stream carried no visible text ({record.completion_tokens} tokens by usage)"
    return record


async def _on_body_written(session, ctx, params) -> None:
    """aiohttp's on_request_chunk_sent runs just before a body chunk (with the buffered headers)
    goes to transport.write, with no suspension between (on_request_headers_sent fires before
    the headers are even serialized, on_request_end once the response's headers are in)."""
    if isinstance(ctx.trace_request_ctx, tuple):
        record, t0 = ctx.trace_request_ctx
        record.written_s = _now() - t0


def write_trace() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_on_body_written)
    return trace


def make_session(limit: int = 0, trace: bool = True) -> aiohttp.ClientSession:
    # A large read buffer: small ones throttle long streams (docs/architecture.md, Serving benchmarks); no connection cap.
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit, force_close=False),
        read_bufsize=2**20,
        timeout=aiohttp.ClientTimeout(total=None),
        trace_configs=[write_trace()] if trace else None,
    )


async def preconnect(session: aiohttp.ClientSession, target: Target, connections: int,
                     timeout_s: float = 5.0) -> int:
    """Open `connections` keep-alive connections before the clock starts: `connections` GET
    /v1/models at once, each leaves its connection in the session's pool. Without it a closed
    loop's first burst pays a TCP connect (and the server's accept) per slot inside the measured
    schedule (an H200 run at 256 slots over 4 workers had its lag p99 of 12.4 ms in that burst,
    docs/gpu.md; not re-measured there since). Best effort: a server without /v1/models, or one
    that closes idle connections, only leaves the burst as it was. Returns how many answered."""
    if connections <= 1:
        return 0
    url = target.base_url.rstrip("/") + "/v1/models"

    async def one() -> bool:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                await resp.read()
                return resp.status < 500
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    return sum(await asyncio.gather(*(one() for _ in range(connections))))


# How coarsely each selector waits: epoll_wait(2), poll(2) and /dev/poll take whole milliseconds,
# and selectors rounds every timeout up to them (math.ceil(timeout * 1e3)), so as to wait at least
# that long; select(2) takes a timeval, kqueue a timespec. Another loop (uvloop: libuv's timers and
# its epoll_wait count whole milliseconds too) gets the millisecond.
_SELECTOR_TICK_S = {"EpollSelector": 1e-3, "PollSelector": 1e-3, "DevpollSelector": 1e-3,
                    "SelectSelector": 1e-6, "KqueueSelector": 1e-9}


def _timer_slack_s() -> float:
    """How late the kernel may end this thread's sleeps (prctl PR_GET_TIMERSLACK; Linux's default
    is 50 us), and the share of a sleep it may add on top (fs/select.c, select_estimate_accuracy:
    a poll or epoll_wait of T may end max(slack, T/1000) late, T/200 for a niced process)."""
    try:
        slack_ns = ctypes.CDLL(None, use_errno=True).prctl(30, 0, 0, 0, 0)  # PR_GET_TIMERSLACK
    except (OSError, AttributeError):
        slack_ns = -1
    return (slack_ns if slack_ns > 0 else 50_000) * 1e-9, (1 / 200 if os.nice(0) > 0 else 1 / 1000)


_SLACK_S, _SLACK_SHARE = _timer_slack_s()


def _longest_exact_ms() -> int:
    """The longest wait in whole milliseconds that a millisecond selector keeps: selectors hands
    epoll k * 1e-3 s, which CPython turns into nanoseconds rounding up, so where that float is a
    hair over k ms (k = 9, 13, 18, ...) epoll_wait gets k + 1 ms (epoll.poll(0.009) waits 10 ms)."""
    k = 1
    while math.ceil((k + 1) * 1e-3 * 1e9) <= (k + 1) * 1_000_000:
        k += 1
    return k


_EXACT_S = _longest_exact_ms() * 1e-3


def wake_margin_s(loop: asyncio.AbstractEventLoop, wait_s: float = 0.0) -> float:
    """How long before a due time a timer must fire so that neither the selector's rounding up
    nor the kernel's timer slack can make it late: one selector tick plus that slack."""
    tick = _SELECTOR_TICK_S.get(type(getattr(loop, "_selector", None)).__name__, 1e-3)
    return tick + max(_SLACK_S, wait_s * _SLACK_SHARE)


def _wake_at(loop: asyncio.AbstractEventLoop, when: float, fut: asyncio.Future) -> None:
    """Resolve `fut` with the wake-up time at monotonic time `when` (timers relative to _now, so
    the schedule is kept on the one clock whatever the loop's own time base), punctually: a timer
    sleeps until the wake margin before `when`, then the wake-up yields with call_soon until the
    clock reaches it, every loop iteration still serving I/O. A plain call_later fires up to a
    selector tick (1 ms) late by construction. Cost: at most the margin (~1.05 ms) of yielding per
    wake-up, less where the loop has other work; wake-ups due together share it."""
    tick = wake_margin_s(loop) - _SLACK_S
    longest = _EXACT_S if tick >= 1e-3 else math.inf

    def check() -> None:
        if fut.done():  # the waiter was cancelled
            return
        now = _now()
        margin = tick + max(_SLACK_S, (when - now) * _SLACK_SHARE)
        sleep = when - now - margin
        if now >= when:
            fut.set_result(now)
        elif sleep > 0:  # a long sleep stops `longest` short, so that the last one is kept exactly
            loop.call_later(sleep - longest if sleep > longest else sleep, check)
        else:
            loop.call_soon(check)

    check()


async def _probe_loop_lag(samples: list[float], stop: asyncio.Event, interval_s: float = 0.01,
                          runnable: list[int] | None = None) -> None:
    """Sample how late the loop runs a timer that is due: the probe's timer is set two wake margins
    early, so the selector's rounding cannot make it late, and it does not yield until due. A
    sample is how far past its due time the loop ran it, 0 where the loop was free by then: a stall
    shows in full, loop iterations shorter than ~1 ms barely (a punctual wake would show them, at
    ~6% of a core more on the 2-core box: the gate needs the stalls, not that resolution)."""
    loop = asyncio.get_running_loop()
    # early by two ticks: the selector's ceiling and, for some waits, CPython's second (_EXACT_S)
    margin = 2 * wake_margin_s(loop, interval_s)
    tick = 0
    while not stop.is_set():
        due = _now() + interval_s
        fut = loop.create_future()
        loop.call_later(interval_s - margin, lambda f=fut: f.done() or f.set_result(None))
        await fut
        # stamped when this task runs, not when the timer's callback did: a callback that ran just
        # before another task stalled the loop in the same iteration would hide the whole stall
        samples.append(max(0.0, _now() - due))
        tick += 1
        if runnable is not None and tick % 10 == 0:  # every ~100 ms: the machine's runnable tasks
            count = hostload.runnable()
            if count is not None:
                runnable.append(count)


def poisson_arrivals(n: int, request_rate: float, seed: int) -> list[float]:
    """Send times (s from the start) of `n` Poisson arrivals at `request_rate` per second."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        arrivals.append(t)
        t += rng.expovariate(request_rate)
    return arrivals


@dataclass
class _Run:
    """One load run's shared state: what every request task reads, and the run's clock."""
    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    target: Target
    specs: Sequence[RequestSpec]
    records: list[RequestRecord]
    indices: list[int]
    go: asyncio.Future  # every task is created and parked on it before the clock starts
    on_record: Callable[[RequestRecord], None] | None = None
    on_progress: Callable[[int, int], None] | None = None
    t0: float = 0.0
    finished: int = 0

    async def due(self, when_s: float) -> float:
        fut = self.loop.create_future()
        _wake_at(self.loop, self.t0 + when_s, fut)
        return await fut - self.t0

    async def send(self, k: int, record: RequestRecord) -> None:
        await send_one(self.session, self.target, self.specs[k], record, self.t0)
        self.finished += 1
        if self.on_record:
            self.on_record(record)
        if self.on_progress:
            self.on_progress(self.finished, len(self.specs))


def _open_loop_tasks(run: _Run, arrivals: Sequence[float], concurrency: int | None) -> list[asyncio.Future]:
    """One task per request, each sent at its arrival time (at most `concurrency` in flight)."""
    gate = asyncio.Semaphore(concurrency) if concurrency else None

    async def one(k: int) -> None:
        await run.go
        record = RequestRecord(index=run.indices[k], scheduled_s=arrivals[k])
        record.dispatched_s = await run.due(arrivals[k])
        run.records.append(record)
        if gate is None:
            await run.send(k, record)
            return
        async with gate:
            await run.send(k, record)

    return [asyncio.ensure_future(one(k)) for k in range(len(run.specs))]


def _closed_loop_tasks(run: _Run, concurrency: int, ramp_up_s: float,
                       ramp_slots: tuple[int, int] | None) -> list[asyncio.Future]:
    """One task per slot: each sends its next request as soon as its previous one ended."""
    next_k = iter(range(len(run.specs)))
    slots = min(concurrency, len(run.specs))
    first_slot, all_slots = ramp_slots or (0, slots)

    async def slot_task(slot: int) -> None:
        await run.go
        free_at = ramp_up_s * (first_slot + slot) / all_slots
        for k in next_k:
            record = RequestRecord(index=run.indices[k], scheduled_s=free_at)
            record.dispatched_s = await run.due(free_at)
            run.records.append(record)
            await run.send(k, record)
            free_at = _now() - run.t0

    return [asyncio.ensure_future(slot_task(k)) for k in range(slots)]


async def _clocked(run: _Run, tasks: list[asyncio.Future], start_at: float | None,
                   lag_samples: list[float]) -> tuple[float, dict]:
    """Start the clock (at `start_at`, or now), release the tasks, probe the loop until they end;
    (started_wall, the host's CPU figures over the run)."""
    await asyncio.sleep(0)  # let every task reach `await go`
    # A full cyclic-GC pass over hundreds of streams' objects stalls the loop for milliseconds:
    # collect now, then keep the collector off while the clock runs.
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    if start_at is not None:  # wait for the common start on the shared clock
        started = run.loop.create_future()
        _wake_at(run.loop, start_at, started)
        await started
    run.t0 = start_at if start_at is not None else _now()
    started_wall = time.time() - (_now() - run.t0)
    cpu_before = hostload.snapshot()
    runnable: list[int] = []
    stop = asyncio.Event()
    probe = asyncio.create_task(_probe_loop_lag(lag_samples, stop, runnable=runnable))
    run.go.set_result(None)
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        stop.set()
        await probe
        host = hostload.delta(cpu_before, hostload.snapshot()) | hostload.in_run(runnable)
        if gc_was_enabled:
            gc.enable()
    return started_wall, host


async def run_load(
    target: Target,
    specs: Sequence[RequestSpec],
    *,
    concurrency: int | None = None,
    request_rate: float | None = None,
    ramp_up_s: float = 0.0,
    seed: int = 0,
    on_progress: Callable[[int, int], None] | None = None,
    session: aiohttp.ClientSession | None = None,
    records: list[RequestRecord] | None = None,
    indices: Sequence[int] | None = None,
    arrivals: Sequence[float] | None = None,
    start_at: float | None = None,
    ramp_slots: tuple[int, int] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> LoadResult:
    """Send every spec: closed loop with `concurrency` slots, or open loop at Poisson `request_rate`.

    Closed loop: a slot sends its next request as soon as its previous one ends; the slots' first
    requests are all due at 0, or spread evenly over `ramp_up_s` (a burst of hundreds of sends is
    itself a client artefact). Rate mode: `concurrency`, when given, caps the requests in flight
    (a request waiting for a slot counts that wait as schedule lag: the client delayed it).
    `records`, when given, is filled as requests start, so an interrupted caller keeps them.

    One worker of several (workers.py) passes its share of the schedule: `indices` (the requests'
    numbers in the whole run), `arrivals` (their send times, rate mode), `start_at` (the run's
    start on time.monotonic(), the same for every worker), `ramp_slots` (its first slot's number
    and the run's slot count, so the ramp-up stays one ramp), and `on_record` (each finished one).
    """
    if not concurrency and not request_rate and arrivals is None:
        raise ValueError("give concurrency or request_rate")
    own_session = session is None
    loop = asyncio.get_running_loop()
    run = _Run(loop=loop, session=session or make_session(), target=target, specs=specs,
               records=records if records is not None else [],
               indices=list(indices) if indices is not None else list(range(len(specs))),
               go=loop.create_future(), on_record=on_record, on_progress=on_progress)
    if request_rate or arrivals is not None:
        if arrivals is None:
            arrivals = poisson_arrivals(len(specs), request_rate, seed)
        tasks = _open_loop_tasks(run, arrivals, concurrency)
    else:
        if own_session:  # a caller's session was warmed by the caller (workers.py, before "ready")
            await preconnect(run.session, target, min(concurrency, len(specs)))
        tasks = _closed_loop_tasks(run, concurrency, ramp_up_s, ramp_slots)
    lag_samples: list[float] = []
    try:
        started_wall, host = await _clocked(run, tasks, start_at, lag_samples)
    finally:
        if own_session:
            await run.session.close()
    run.records.sort(key=lambda r: r.index)
    return LoadResult(records=run.records, loop_lag_s=lag_samples, started_wall=started_wall,
                      duration_s=span_s(run.records), host=host, t0=run.t0)


def span_s(records: Sequence[RequestRecord]) -> float:
    """First send to last end (0 with no records)."""
    return (max(r.end_s for r in records) - min(r.sent_s for r in records)) if records else 0.0
