"""A planted regression for the gate's must-show: an OpenAI-compatible proxy in front of a real
server that makes it slower in a known way.

--slow F        every streamed chunk is delivered at (1 + F) x its arrival time from the upstream,
                counted from the send, so TTFT, ITL and E2E are (1 + F)x;
--max-inflight K at most K requests reach the upstream at once (a throughput cut at concurrency > K).

GET routes (/v1/models, /metrics, /version, /health) and POST /tokenize pass through unchanged,
so the upstream's own /metrics histogram still times the upstream, not the proxy.
Run: python benchmarks/serving/delay_proxy.py --upstream http://127.0.0.1:8000 --port 8100 --slow 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
from aiohttp import web


def make_app(upstream: str, slow: float, max_inflight: int | None) -> web.Application:
    gate = asyncio.Semaphore(max_inflight) if max_inflight else None
    app = web.Application()

    async def on_startup(app):
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                               read_bufsize=2 ** 20)

    async def on_cleanup(app):
        await app["session"].close()

    async def passthrough(request: web.Request) -> web.Response:
        body = await request.read()
        async with app["session"].request(request.method, upstream + request.path_qs, data=body or None,
                                          headers={"Content-Type": request.headers.get("Content-Type", "application/json")}) as resp:
            return web.Response(body=await resp.read(), status=resp.status,
                                content_type=resp.content_type or "application/json")

    async def stream(request: web.Request) -> web.StreamResponse:
        if gate is not None:
            async with gate:
                return await _stream(request)
        return await _stream(request)

    async def _stream(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        sent = time.monotonic()
        async with app["session"].post(upstream + request.path, data=body,
                                       headers={"Content-Type": "application/json"}) as resp:
            out = web.StreamResponse(status=resp.status, headers={"Content-Type": resp.headers.get("Content-Type", "text/event-stream")})
            await out.prepare(request)
            queue: asyncio.Queue = asyncio.Queue()

            async def read() -> None:  # the upstream's arrival times, taken as they come
                async for chunk in resp.content.iter_any():
                    queue.put_nowait((time.monotonic(), chunk))
                queue.put_nowait((None, None))

            reader = asyncio.create_task(read())
            try:
                while True:
                    arrived, chunk = await queue.get()
                    if chunk is None:
                        break
                    # delivered at (1 + slow) x its offset from the send: TTFT, ITL and E2E all stretched
                    wait = sent + (1 + slow) * (arrived - sent) - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    await out.write(chunk)
            finally:
                reader.cancel()
            await out.write_eof()
            return out

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    app.router.add_post("/v1/completions", stream)
    app.router.add_post("/v1/chat/completions", stream)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slow", type=float, default=0.0)
    parser.add_argument("--max-inflight", type=int, default=None)
    args = parser.parse_args()
    web.run_app(make_app(args.upstream.rstrip("/"), args.slow, args.max_inflight), host="127.0.0.1", port=args.port,
                print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
