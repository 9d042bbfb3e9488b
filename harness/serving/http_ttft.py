"""The server's TTFT at its HTTP layer: a pure-ASGI middleware for vLLM's OpenAI server.

vLLM's own histogram (vllm:time_to_first_token_seconds) starts when the renderer begins with
the request, after uvicorn and the API process have parsed and validated it, and stops when the
engine core's output reaches the API process, before it is detokenized, framed and written
(0.26.0: renderers/base.py render_cmpl_async, v1/metrics/stats.py IterationStats). What the API
server's one event loop spends on either side, which grows with load, is outside it, so no
client can come within a few percent of it. This middleware stamps what a client's TTFT covers,
minus the network: the moment the request reached the ASGI app (headers parsed) and the moment
the first body chunk carrying a token (a completions choice, or a chat delta other than the role
announcement, as harness.serving.client counts) was handed to the server to send.

Enable: `vllm serve ... --middleware harness.serving.http_ttft.HttpTtftMiddleware` with the
harness on the server's PYTHONPATH (launch_vllm(..., http_ttft=True) does both). Read back:
- `harness:http_ttft_seconds`, a histogram on the server's /metrics (prometheus_client's default
  registry, which vLLM's /metrics serves; under vLLM's multiprocess collector the value files
  carry it);
- `GET /harness/http_ttft?after=SEQ`: JSON {"clock", "boot_id", "seq", "requests": [...]} with
  the stamps (time.monotonic() of the server, comparable with a client's on the same kernel,
  same boot_id) of the most recent requests, keyed by the X-Request-Id the client sent;
- with HARNESS_HTTP_TTFT_LOG=FILE, one JSON line per request appended to FILE.
Standard library only, and prometheus_client where installed (vLLM always has it).
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

PATH = "/harness/http_ttft"
LOG_ENV = "HARNESS_HTTP_TTFT_LOG"
KEEP = 65536  # stamps kept for GET PATH
# vLLM's own TTFT buckets (0.26.0), so both histograms read alike
BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
           20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_HIST = None


def _histogram():
    global _HIST
    if _HIST is None:
        try:
            from prometheus_client import Histogram
        except ImportError:
            return None
        try:
            _HIST = Histogram("harness:http_ttft_seconds", "Request arrival at the ASGI app to the first "
                              "response chunk carrying a token (llm-harness middleware)", buckets=BUCKETS)
        except ValueError:  # registered already (the app's middleware stack was built twice)
            from prometheus_client import REGISTRY

            _HIST = REGISTRY._names_to_collectors.get("harness:http_ttft_seconds")
    return _HIST


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def carries_token(body: bytes) -> bool:
    """Whether an SSE body chunk holds a frame with a token: a completions choice, or a chat delta
    that is not only the role announcement."""
    for line in body.split(b"\n"):
        line = line.strip()
        if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
            continue
        try:
            frame = json.loads(line[5:])
        except ValueError:
            continue
        if isinstance(frame, dict) and frame_carries_token(frame):
            return True
    return False


def frame_carries_token(frame: dict) -> bool:
    """A completions choice, or a chat delta that is not only the role announcement (an OpenAI
    server may send that before any token; vLLM sends the role with the first one). The client
    (harness.serving.client) times its TTFT by this same rule; it lives here because this module
    must import in the server's process with the standard library alone."""
    for c in frame.get("choices") or ():
        delta = c.get("delta") or {}
        if "text" in c or ("delta" in c and (delta.get("content") or delta.get("reasoning_content")
                                             or "role" not in delta)):
            return True
    return False


class HttpTtftMiddleware:
    """Pure ASGI: wraps `send` of POST requests to stamp the first token-carrying body chunk."""

    def __init__(self, app):
        self.app = app
        self.seq = 0
        self.recent: collections.deque = collections.deque(maxlen=KEEP)
        self.hist = _histogram()
        self.log_path = os.environ.get(LOG_ENV) or None
        self.boot_id = _boot_id()

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        if scope.get("path") == PATH and scope.get("method") == "GET":
            return await self._serve(scope, send)
        if scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        arrived = time.monotonic()
        stamp = {"request_id": _header(scope, b"x-request-id"), "path": scope.get("path"),
                 "arrival_s": arrived, "first_token_s": None, "end_s": None, "status": None}

        async def wrapped_send(message):
            kind = message.get("type")
            if kind == "http.response.start":
                stamp["status"] = message.get("status")
            elif kind == "http.response.body" and stamp["first_token_s"] is None:
                if carries_token(message.get("body") or b""):
                    stamp["first_token_s"] = time.monotonic()
            await send(message)

        try:
            await self.app(scope, receive, wrapped_send)
        finally:
            self._finish(stamp)

    def _finish(self, stamp: dict) -> None:
        stamp["end_s"] = time.monotonic()
        self.seq += 1
        stamp["seq"] = self.seq
        if stamp["first_token_s"] is not None:
            stamp["ttft_s"] = stamp["first_token_s"] - stamp["arrival_s"]
            if self.hist is not None:
                self.hist.observe(stamp["ttft_s"])
        self.recent.append(stamp)
        if self.log_path:
            try:
                with open(self.log_path, "a") as f:
                    f.write(json.dumps(stamp) + "\n")
            except OSError:
                self.log_path = None  # a log that cannot be written must not fail requests

    async def _serve(self, scope, send) -> None:
        after = 0
        for part in (scope.get("query_string") or b"").decode("latin-1").split("&"):
            key, _, value = part.partition("=")
            if key == "after" and value.isdigit():
                after = int(value)
        body = json.dumps({"clock": "monotonic", "boot_id": self.boot_id, "seq": self.seq,
                           "requests": [s for s in self.recent if s["seq"] > after]}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value.decode("latin-1")
    return None
