"""Calibration stand-in server: an OpenAI-compatible streaming server with known timing and faults.

It is not a model. It answers /v1/completions and /v1/chat/completions by streaming `max_tokens`
chunks, the first after `--ttft-ms`, then one every `--token-interval-ms`, so a client's figures
can be checked against known values, and so the client's own limits (schedule lag at hundreds of
streams) can be measured. It serves several model names, each a behaviour:

  standin               a well-behaved stream (chat streams a role-only delta first)
  standin-http500       HTTP 500 before any token
  standin-error-frame   a few tokens, then an in-band `data: {"error": ...}` frame and [DONE]
  standin-drop          a few tokens, then the connection is cut (a crash mid-stream)
  standin-no-done       every token, then the stream ends without [DONE]
  standin-stall         a few tokens, then silence (a hung engine) until the client gives up
  standin-invisible     a well-behaved stream whose first few tokens decode to nothing (empty
                        text, as a random model's ids past its tokenizer do)

Any other model name gets a 404 as vLLM answers it. /metrics exposes vLLM-named counters.

Its "tokenizer" is known, and unlike word counting: a completion prompt costs one special token
plus, per whitespace-separated word, one token per started 8 characters; a chat prompt costs the
words plus a 5-token template. `--tokenize` adds vLLM's POST /tokenize (without it the harness
must calibrate prompt lengths from usage).
Run: python -m harness.serving.standin --port 8001 [--ttft-ms 20] [--token-interval-ms 10] [--tokenize]
     [--processes N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Iterator

from .process_group import die_with_parent

MODELS = ("standin", "standin-http500", "standin-error-frame", "standin-drop", "standin-no-done", "standin-stall",
          "standin-invisible")
FAULT_AFTER_TOKENS = 3
SPECIAL_TOKENS = 1  # a BOS on completion prompts
CHAT_TEMPLATE_TOKENS = 5


def count_tokens(text: str) -> int:
    return sum(1 + (len(word) - 1) // 8 for word in str(text).split())


def prompt_tokens(body: dict, chat: bool) -> int:
    if chat:
        return CHAT_TEMPLATE_TOKENS + sum(count_tokens(m.get("content", "")) for m in body.get("messages", [])
                                          if isinstance(m, dict))
    return SPECIAL_TOKENS + count_tokens(body.get("prompt", ""))


class _Stats:
    def __init__(self):
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.running = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.finished = 0


def _frame(model: str, chat: bool, text: str | None, finish: str | None = None) -> bytes:
    """One SSE chunk; on chat, text None is the role-only first delta."""
    if chat:
        delta = {"role": "assistant", "content": ""} if text is None else {"content": text}
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish}
    return b"data: " + json.dumps({"object": "chunk", "model": model, "choices": [choice]}).encode() + b"\n\n"


class _StandIn:
    """The stand-in's handlers, over one process's counters."""

    def __init__(self, ttft_s: float, interval_s: float, seed: int):
        self.ttft_s, self.interval_s = ttft_s, interval_s
        self.stats = _Stats()
        self.rng = random.Random(seed)

    async def health(self, _):
        from aiohttp import web

        return web.Response(text="")

    async def version(self, _):
        from aiohttp import web

        return web.json_response({"version": "standin-1"})

    async def models(self, _):
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in MODELS]})

    async def metrics(self, _):
        from aiohttp import web

        stats = self.stats
        lines = [
            f'vllm:prompt_tokens_total{{model_name="standin"}} {stats.prompt_tokens}',
            f'vllm:generation_tokens_total{{model_name="standin"}} {stats.generation_tokens}',
            f'vllm:num_requests_running{{model_name="standin"}} {stats.running}',
            'vllm:num_requests_waiting{model_name="standin"} 0',
            'vllm:kv_cache_usage_perc{model_name="standin"} 0',
            f'vllm:time_to_first_token_seconds_sum{{model_name="standin"}} {stats.ttft_sum}',
            f'vllm:time_to_first_token_seconds_count{{model_name="standin"}} {stats.ttft_count}',
            f'vllm:request_success_total{{model_name="standin",finished_reason="length"}} {stats.finished}',
        ]
        return web.Response(text="\n".join(lines) + "\n")

    async def tokenize(self, request):
        from aiohttp import web

        body = await request.json()
        chat = "messages" in body
        n = prompt_tokens(body, chat) - (0 if chat or body.get("add_special_tokens", True) else SPECIAL_TOKENS)
        return web.json_response({"count": n, "max_model_len": 4096, "tokens": list(range(n))})

    async def complete(self, request):
        from aiohttp import web

        received = time.monotonic()
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        model = body.get("model")
        if model not in MODELS:
            return web.json_response({"object": "error", "message": f"The model `{model}` does not exist.",
                                      "type": "NotFoundError", "code": 404}, status=404)
        if model == "standin-http500":
            return web.json_response({"object": "error", "message": "internal error", "code": 500}, status=500)
        n = int(body.get("max_tokens") or 16)
        n_prompt = prompt_tokens(body, chat)
        if not body.get("stream"):
            return self._whole(model, chat, n, n_prompt)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.stats.running += 1
        self.stats.prompt_tokens += n_prompt
        try:
            await self._stream(request, resp, model, chat, n, n_prompt, received)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.stats.running -= 1
        return resp

    def _whole(self, model: str, chat: bool, n: int, n_prompt: int):
        from aiohttp import web

        text = "".join(f" t{i}" for i in range(n))
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                  if chat else {"index": 0, "text": text, "finish_reason": "length"})
        self.stats.prompt_tokens += n_prompt
        self.stats.generation_tokens += n
        self.stats.finished += 1
        return web.json_response({"object": "chat.completion" if chat else "text_completion", "model": model,
                                  "choices": [choice], "usage": {"prompt_tokens": n_prompt, "completion_tokens": n,
                                                                 "total_tokens": n_prompt + n}})

    async def _stream(self, request, resp, model: str, chat: bool, n: int, n_prompt: int, received: float) -> None:
        stats = self.stats
        if chat:
            await resp.write(_frame(model, chat, None))
        # A random phase within one token interval: streams that start together do not stay in
        # lock-step (a real engine's batches do not deliver every stream's token at one instant).
        phase = self.rng.uniform(0.0, self.interval_s)
        await asyncio.sleep(max(0.0, self.ttft_s + phase - (time.monotonic() - received)))
        for i in range(n):
            if i == 0:
                stats.ttft_sum += time.monotonic() - received
                stats.ttft_count += 1
            elif self.interval_s:
                await asyncio.sleep(self.interval_s)
            if i == FAULT_AFTER_TOKENS and model != "standin":
                if await self._fault(request, resp, model):
                    return
            invisible = model == "standin-invisible" and i < FAULT_AFTER_TOKENS
            await resp.write(_frame(model, chat, "" if invisible else f" t{i}", "length" if i == n - 1 else None))
            stats.generation_tokens += 1
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n, "total_tokens": n_prompt + n}
        await resp.write(b"data: " + json.dumps({"object": "chunk", "choices": [], "usage": usage}).encode() + b"\n\n")
        if model != "standin-no-done":
            await resp.write(b"data: [DONE]\n\n")
        stats.finished += 1
        await resp.write_eof()

    @staticmethod
    async def _fault(request, resp, model: str) -> bool:
        """The faulty models' fault, after FAULT_AFTER_TOKENS tokens; True when the stream ends here."""
        if model == "standin-error-frame":
            await resp.write(b'data: {"error": {"message": "engine failed mid-stream", "code": 500}}\n\n')
            await resp.write(b"data: [DONE]\n\n")
            return True
        if model == "standin-drop":
            request.transport.close()
            return True
        if model == "standin-stall":
            await asyncio.sleep(3600)
        return False


def make_app(ttft_s: float, interval_s: float, seed: int = 0, tokenize: bool = False):
    from aiohttp import web

    handlers = _StandIn(ttft_s, interval_s, seed)
    app = web.Application()
    if tokenize:
        app.router.add_post("/tokenize", handlers.tokenize)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/version", handlers.version)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_get("/metrics", handlers.metrics)
    app.router.add_post("/v1/completions", handlers.complete)
    app.router.add_post("/v1/chat/completions", handlers.complete)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.serving.standin", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--token-interval-ms", type=float, default=10.0)
    parser.add_argument("--tokenize", action="store_true", help="serve POST /tokenize as vLLM does")
    parser.add_argument("--processes", type=int, default=1,
                        help="serve from this many processes on one port (SO_REUSEPORT), so that the stand-in "
                             "outruns a multi-process client; /metrics then counts one process's share")
    args = parser.parse_args(argv)
    from aiohttp import web

    seed = 0
    for k in range(1, max(1, args.processes)):
        if os.fork() == 0:
            seed = k
            die_with_parent()  # and the launcher's reaper empties the whole group
            break
    web.run_app(make_app(args.ttft_ms / 1000, args.token_interval_ms / 1000, seed=seed, tokenize=args.tokenize),
                host="127.0.0.1", port=args.port, reuse_port=args.processes > 1,
                print=None, backlog=4096, access_log=None, shutdown_timeout=1.0)
    return 0


@contextlib.contextmanager
def run_standin(ttft_ms: float = 20.0, token_interval_ms: float = 10.0, log_dir: Path | None = None,
                tokenize: bool = False, processes: int = 1) -> Iterator:
    """The stand-in in its own process (so it never competes with the client's event loop)."""
    from .launcher import free_port, start_process

    port = free_port()
    command = [sys.executable, "-m", "harness.serving.standin", "--port", str(port),
               "--ttft-ms", str(ttft_ms), "--token-interval-ms", str(token_interval_ms),
               "--processes", str(processes)] + (["--tokenize"] if tokenize else [])
    root = str(Path(__file__).resolve().parents[2])
    env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    log_path = Path(log_dir) / f"standin-{port}.log" if log_dir else None
    with start_process(command, port=port, env=env, log_path=log_path, startup_timeout_s=60,
                       name="stand-in", progress=False) as server:
        server.model = "standin"
        yield server


if __name__ == "__main__":
    sys.exit(main())
