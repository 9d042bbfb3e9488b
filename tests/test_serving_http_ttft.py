"""The HTTP-layer TTFT middleware (harness/serving/http_ttft.py) on a fake ASGI app, and the
bench's matching of its stamps to the client's records (server_stamps.py)."""

from __future__ import annotations

import asyncio
import json

from harness.serving import http_ttft, server_stamps
from harness.serving.client import RequestRecord


def _app(frames: list[bytes], gap_s: float = 0.01):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for frame in frames:
            await asyncio.sleep(gap_s)
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def _call(mw, method: str, path: str, headers=(), query: bytes = b"") -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "headers": list(headers), "query_string": query}
    asyncio.run(mw(scope, receive, send))
    return sent


def _frame(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_chat_role_chunk_is_not_a_token():
    assert not http_ttft.carries_token(_frame({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
    assert http_ttft.carries_token(_frame({"choices": [{"delta": {"content": "x"}}]}))
    assert http_ttft.carries_token(_frame({"choices": [{"text": ""}]}))
    assert not http_ttft.carries_token(b"data: [DONE]\n\n")


def test_stamps_first_token_chunk_and_serves_them(tmp_path, monkeypatch):
    monkeypatch.setenv(http_ttft.LOG_ENV, str(tmp_path / "stamps.jsonl"))
    frames = [_frame({"choices": [{"delta": {"role": "assistant", "content": ""}}]}),
              _frame({"choices": [{"delta": {"content": "a"}}]}), b"data: [DONE]\n\n"]
    mw = http_ttft.HttpTtftMiddleware(_app(frames, gap_s=0.02))
    _call(mw, "POST", "/v1/chat/completions", [(b"x-request-id", b"r-1")])
    body = json.loads(_call(mw, "GET", http_ttft.PATH, query=b"after=0")[-1]["body"])
    (stamp,) = body["requests"]
    assert stamp["request_id"] == "r-1" and stamp["status"] == 200
    assert 0.035 <= stamp["ttft_s"] <= stamp["end_s"] - stamp["arrival_s"]  # the second frame, not the role
    assert json.loads((tmp_path / "stamps.jsonl").read_text())["request_id"] == "r-1"
    assert json.loads(_call(mw, "GET", http_ttft.PATH, query=b"after=1")[-1]["body"])["requests"] == []


def test_summarize_matches_by_request_id():
    t0 = 100.0
    recs = [RequestRecord(index=i, scheduled_s=0, sent_s=0.001 * i, first_token_s=0.050 + 0.001 * i, end_s=0.1,
                          chunk_s=[0.05], request_id=f"r{i}") for i in range(3)]
    stamps = [{"request_id": f"r{i}", "arrival_s": t0 + 0.001 * i + 0.002, "first_token_s": t0 + 0.001 * i + 0.047,
               "ttft_s": 0.045} for i in range(2)]
    out = server_stamps.summarize(recs, t0, {"boot_id": server_stamps._boot_id(), "requests": stamps})
    assert out["matched"] == 2 and out["requests_ok"] == 3
    assert abs(out["client_excess_ms"]["p50"] - 5.0) < 1e-6
    assert abs(out["send_delay_ms"]["p50"] - 2.0) < 1e-6 and abs(out["receive_delay_ms"]["p50"] - 3.0) < 1e-6
