"""`python -m harness gate` against the stand-in server (harness/serving/standin.py: a timed fake,
not a model), used here to exercise the gate's control flow: interleaved blocks, the sequential
stop, a planted delay found, the A/A not called a regression, the noise model written and read,
the last line and the exit code in agreement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.serving.standin import run_standin

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--model", "standin", "--num-prompts", "6", "--input-len", "16", "--output-len", "6", "--concurrency", "2",
         "--warmup", "1", "-q"]


def _gate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "gate", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def test_a_planted_delay_is_regressed_and_the_a_a_is_not(tmp_path):
    noise = tmp_path / "noise.json"
    with run_standin(ttft_ms=20, token_interval_ms=5, log_dir=tmp_path) as fast, \
            run_standin(ttft_ms=80, token_interval_ms=5, log_dir=tmp_path) as slow:
        proc = _gate("--baseline-endpoint", fast.base_url, "--candidate-endpoint", slow.base_url, *SMALL,
                     "--max-blocks", "6", "--noise-model", "none", "--ramp-up", "0.05", "--out", str(tmp_path / "ab.json"))
        last = proc.stdout.splitlines()[-1]
        assert proc.returncode == 1 and last.startswith("REGRESSED: "), proc.stdout + proc.stderr
        data = json.loads((tmp_path / "ab.json").read_text())
        assert data["verdict"] == "REGRESSED" and data["verdict_line"] == last
        assert data["order"][:2] == ["AB", "BA"]  # interleaved
        regressed = {c["metric"] for c in data["calls"] if c["decision"] == "REGRESSED"}
        assert regressed & {"ttft_p50", "ttft_mean", "server_ttft_mean"}, data["calls"]
        for side in ("baseline", "candidate"):  # each side's runs, readable by compare and report
            side_file = json.loads((tmp_path / f"ab.{side}.json").read_text())
            assert len(side_file["runs"]) == data["blocks"]
            assert side_file["workload"]["ramp_up_s"] == 0.05  # the runs were ramped as asked

        proc = _gate("--baseline-endpoint", fast.base_url, "--candidate-endpoint", fast.base_url, *SMALL,
                     "--max-blocks", "4", "--noise-model", str(noise))
        last = proc.stdout.splitlines()[-1]
        assert proc.returncode in (0, 3) and last.split(":")[0] in ("OK", "UNDECIDED"), proc.stdout + proc.stderr
        assert (proc.returncode == 0) == last.startswith("OK")
        saved = json.loads(noise.read_text())
        assert saved["a_a"] and saved["spread"] and "blocks_for_10_percent" in saved
        # the next gate reads it to plan its first look
        again = _gate("--baseline-endpoint", fast.base_url, "--candidate-endpoint", fast.base_url, *SMALL,
                      "--max-blocks", "3", "--noise-model", str(noise), "--undecided", "pass")
        assert f"noise model: {noise}" in again.stdout and again.returncode == 0, again.stdout + again.stderr
        if again.stdout.splitlines()[-1].startswith("UNDECIDED"):
            assert again.stdout.splitlines()[-1].endswith("(passed: --undecided pass)")


def test_bad_usage_is_one_line_exit_2():
    for args, words in ((["--model", "x"], "say what to gate"),
                        (["--baseline-endpoint", "http://127.0.0.1:9", "--model", "x"], "go together"),
                        (["--baseline-endpoint", "ftp://x", "--candidate-endpoint", "http://127.0.0.1:9", "--model", "x"],
                         "--baseline-endpoint"),
                        (["--baseline-python", "/nope", "--candidate-python", "/nope"], "go together"),
                        (["--baseline-endpoint", "http://a", "--candidate-endpoint", "http://b", "--model", "x",
                          "--max-blocks", "2"], "--max-blocks"),
                        (["--baseline-endpoint", "http://a", "--candidate-endpoint", "http://b", "--model", "x",
                          "--threshold", "bogus=1%"], "--threshold"),
                        (["--baseline-endpoint", "http://a", "--candidate-endpoint", "http://b", "--model", "x",
                          "--ramp-up", "-1"], "--ramp-up")):
        proc = _gate(*args)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, (args, proc.stderr)
