"""Every failure says why in one line: a server that is not OpenAI-compatible, the server's own
reason for a refused request, the fields two runs differ in, an output folder that does not exist.
(The over-length prompt against a real vLLM is in test_serving_vocab.py, which starts one.)"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import CheckFailed
from harness.serving import compare as cmp
from harness.serving.client import server_reason
from harness.serving.endpoint import served_models
from harness.serving.launcher import free_port, start_process
from tests.serving_results import make_results

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def _one_line(proc: subprocess.CompletedProcess, code: int) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def plain_http_server(tmp_path_factory):
    """Python's own file server: GET /v1/models is a 404, every POST a 501 (issue 25: `http_501 x4`)."""
    port = free_port()
    folder = tmp_path_factory.mktemp("www")
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(folder)]
    with start_process(command, port=port, env={}, log_path=folder / "log.txt", startup_timeout_s=30,
                       name="http.server", progress=False, health_path="/") as server:
        yield f"http://127.0.0.1:{port}"


def test_bench_against_a_server_that_is_not_openai_compatible_says_so(plain_http_server, tmp_path):
    line = _one_line(_cli("bench", "--endpoint", plain_http_server, "--model", "m", "--num-prompts", "4",
                          "--input-len", "8", "--output-len", "4", "--out", str(tmp_path / "r.json")), 1)
    assert line.endswith(f"{plain_http_server} is not an OpenAI-compatible server (GET /v1/models: 404)")


def test_the_suites_endpoint_check_says_the_same(plain_http_server):
    with pytest.raises(CheckFailed, match=r"not an OpenAI-compatible server \(GET /v1/models: 404\)"):
        served_models(plain_http_server)


@pytest.mark.parametrize("body, reason", [
    # vLLM's error body (its ErrorResponse), and the OpenAI shape newer releases nest it in
    ('{"object":"error","message":"This model\'s maximum context length is 2048 tokens. However, you '
     'requested 3000 tokens (2990 in the messages, 10 in the completion).","type":"BadRequestError",'
     '"param":null,"code":400}', "This model's maximum context length is 2048 tokens. However, you requested 3000"),
    ('{"error":{"message":"min_tokens must be less than or equal to max_tokens=4, got 8.","type":'
     '"BadRequestError","param":null,"code":400}}', "min_tokens must be less than or equal to max_tokens=4, got 8."),
    ('{"detail":"Not Found"}', "Not Found"),
    ("<html><body>\n<h1>Bad   Gateway</h1></body></html>", "<html><body> <h1>Bad Gateway</h1></body></html>"),
    ("", "(empty body)"),
])
def test_the_servers_own_reason_is_kept_on_one_line(body, reason):
    got = server_reason(body)
    assert got.startswith(reason) and "\n" not in got


def test_compare_names_each_differing_field():
    base = make_results(seed=1)
    cand = copy.deepcopy(make_results(seed=2, flags=["--enforce-eager"]))
    cand["workload"].update(output_len=64, max_tokens=64, min_tokens=64)
    base["workload"].update(max_tokens=16, min_tokens=16)
    with pytest.raises(cmp.RefusedComparison) as err:
        cmp.compare(base, cand)
    text = str(err.value)
    assert "workload.output_len 16 vs 64" in text and "flags (none) vs --enforce-eager" in text
    assert "max_tokens" not in text and "{" not in text and "--allow-diff flags,workload" in text


def test_compare_cli_names_the_field_in_one_line(tmp_path):
    base, cand = make_results(seed=1), make_results(seed=2)
    cand["environment"]["server_version"] = "2.0"
    (tmp_path / "a.json").write_text(json.dumps(base))
    (tmp_path / "b.json").write_text(json.dumps(cand))
    line = _one_line(_cli("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")), 2)
    assert "server_version 1.0 vs 2.0" in line


def test_report_refuses_an_output_folder_that_does_not_exist(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(make_results(seed=1)))
    missing = tmp_path / "nonexistent" / "dir"
    line = _one_line(_cli("report", str(tmp_path / "a.json"), "--out", str(missing / "r.html")), 2)
    assert "does not exist" in line and not missing.exists()
    line = _one_line(_cli("report", "--index", str(tmp_path / "nonexistent")), 2)
    assert "is not a directory" in line and not (tmp_path / "nonexistent").exists()
    line = _one_line(_cli("report", "--index", str(tmp_path), "--out", str(missing / "index.html")), 2)
    assert "does not exist" in line and not missing.exists()


def test_a_pytest_user_is_told_the_suites_option_not_benchs(tmp_path):
    """An error that tells the user what to pass names the option of the caller (the serving suite
    gives `tokenizer_option="--model DIR ..."`), not bench's --tokenizer, which pytest does not have:
    a server without /tokenize whose chat endpoint gives no usage cannot be calibrated for chat."""
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from harness.errors import UsageError
    from harness.serving import prompts
    from harness.serving.client import Target, make_session

    async def completions(request):  # one token per space-separated word, plus one special
        body = await request.json()
        n = len(str(body["prompt"]).split()) + 1
        return web.json_response({"choices": [{"text": "x"}], "usage": {"prompt_tokens": n, "completion_tokens": 1}})

    async def calibrate(api: str, method: str = "auto"):
        app = web.Application()
        app.router.add_post("/v1/completions", completions)  # no /tokenize, no chat: a 404 there
        async with TestServer(app, host="127.0.0.1") as server:
            session = make_session()
            try:
                target = Target(str(server.make_url("")).rstrip("/"), "m", api=api, timeout_s=10)
                return await prompts.calibrate(session, target, None, method, tokenizer_option="--model DIR")
            finally:
                await session.close()

    assert asyncio.run(calibrate("completions")).method == "usage-probes"
    with pytest.raises(CheckFailed, match=r"answered 404 without usage.prompt_tokens.*\(give --model DIR\)$"):
        asyncio.run(calibrate("chat"))
    with pytest.raises(UsageError, match=r"--prompt-calibration tokenizer needs --model DIR$"):
        asyncio.run(calibrate("completions", "tokenizer"))
