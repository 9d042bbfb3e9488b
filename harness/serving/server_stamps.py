"""The bench's side of http_ttft.py: read the server's HTTP-layer stamps of a run and set them
beside the client's, request by request (matched by X-Request-Id).

The per-request difference client TTFT - server HTTP TTFT is the client's own error (its send
path, the network, its parsing and its event loop's lateness). On the same kernel (same boot_id)
both clocks are time.monotonic(), so the difference splits into the send side (server arrival -
client send) and the receive side (client's first token - server's first send); the send side
splits again at the moment aiohttp handed the request to the transport (RequestRecord.written_s):
the client's own write path (client_write) and the server's read up to its ASGI app (server_read).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Mapping, Sequence

import aiohttp

from .client import RequestRecord
from .http_ttft import PATH
from .stats import summary


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


async def fetch(session: aiohttp.ClientSession, base_url: str, after: int = 0) -> dict | None:
    """The middleware's stamps after sequence number `after`; None where the server has none."""
    try:
        async with asyncio.timeout(10):
            async with session.get(f"{base_url}{PATH}?after={after}") as resp:
                if resp.status != 200:
                    return None
                data = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("requests"), list) else None


async def cursor(session: aiohttp.ClientSession, base_url: str) -> int | None:
    """The server's latest sequence number (stamps after it belong to what comes next)."""
    data = await fetch(session, base_url, after=2**62)
    return data.get("seq") if data else None


def summarize(records: Sequence[RequestRecord] | Mapping[str, float], t0: float | None,
              data: dict | None) -> dict | None:
    """The run's server HTTP TTFT beside the client's, with the client's excess per request.

    `records`: the harness's own RequestRecords, `t0` their run's start on time.monotonic(); or,
    for an outside client that gives no more than its TTFT per successful request (`vllm bench
    serve`: request id -> client TTFT in s), a mapping, `t0` None: its excess is matched the same
    way, and its send and receive split, needing the client's send stamps, is None."""
    if not data:
        return None
    stamps = {s.get("request_id"): s for s in data["requests"] if s.get("request_id")}
    same_clock = data.get("boot_id") is not None and data.get("boot_id") == _boot_id()
    timed = same_clock and t0 is not None and not isinstance(records, Mapping)
    rows = ([(rid, ttft_s, None) for rid, ttft_s in records.items()] if isinstance(records, Mapping)
            else [(r.request_id, r.ttft_s, r) for r in records if r.ok])  # (id, client TTFT, record)
    server, excess, send, receive, write, read = [], [], [], [], [], []
    for rid, ttft_s, r in rows:
        s = stamps.get(rid)
        if s is None or s.get("ttft_s") is None or ttft_s is None:
            continue
        server.append(s["ttft_s"])
        excess.append(ttft_s - s["ttft_s"])
        if timed:
            send.append(s["arrival_s"] - (t0 + r.sent_s))
            receive.append(t0 + r.first_token_s - s["first_token_s"])
            if r.written_s is not None:
                write.append(r.written_s - r.sent_s)
                read.append(s["arrival_s"] - (t0 + r.written_s))
    return {
        "definition": "server: ASGI request arrival -> first response chunk carrying a token (http_ttft.py); "
                      "client_excess: client TTFT - server HTTP TTFT, per request",
        "requests_ok": len(rows), "matched": len(server),
        "ttft_ms": summary(server),
        "client_excess_ms": summary(excess) | {"min": min(excess) * 1000 if excess else None},
        "same_clock": same_clock,
        "send_delay_ms": summary(send) if timed else None,
        "receive_delay_ms": summary(receive) if timed else None,
        # the send delay's two parts, per request: client_write + server_read = send_delay
        "client_write_ms": _with_min(write),
        "server_read_ms": _with_min(read),
    }


def _with_min(values: list[float]) -> dict | None:
    return summary(values) | {"min": min(values) * 1000} if values else None
