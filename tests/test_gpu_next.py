"""The next GPU hold's drivers, checked on the CPU (issue 47; docs/gpu.md, "The next hold"): the
hybrid settings run what the first hold did not, in order, at a 6 GiB share of whatever card;
the gate's GPU profile plants the issue's two regressions and resumes from its summary; the
families remainder puts the fused-kernel jobs first."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "vllm_plan"))

import gpu_startups  # noqa: E402


def _module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gms = _module("benchmarks/serving/gate_must_show.py", "gate_must_show")
SETTINGS = ROOT / "measurements" / "vllm_plan" / "hybrid-gpu-settings.json"
H200_TOTAL, H100_TOTAL = 150_119_989_248, 85_031_714_816  # torch.cuda.mem_get_info()'s totals


def test_the_hybrid_settings_start_with_what_the_first_hold_did_not_run():
    settings, timeouts, shares = gpu_startups.settings_from(SETTINGS)
    first = [(sid, settings[sid][0]) for sid in list(settings)[:3]]
    assert first == [("h10", "gemma-4-e2b"), ("h11", "granite-4.0-h-tiny"), ("h12", "lfm2-1.2b")]
    assert shares["h10"] == shares["h11"] == 6 and "h12" not in shares
    assert settings["h12"][1]["gpu_memory_utilization"] == 0.9
    assert timeouts["h11"] > 130 and timeouts["h06"] > 130  # granite ran out at 130 s
    # the first hold's six started settings follow: the upgrade delta's pairs on 0.25.1
    assert {"h02", "h09", "h04", "h08", "h05", "h07"} <= set(list(settings)[5:])


def test_gemma_4_passes_its_config_override_to_vllm_as_json():
    settings, _, _ = gpu_startups.settings_from(SETTINGS)
    for sid in ("h10", "h03"):
        argv = gpu_startups.flag_args(settings[sid][1])
        value = argv[argv.index("--hf-overrides") + 1]
        assert json.loads(value) == {"allow_global_per_layer_attribute_access": True}


@pytest.mark.parametrize("total, utilization", [(H200_TOTAL, 0.043), (H100_TOTAL, 0.076)])
def test_a_six_gib_share_is_six_gib_of_the_card_it_runs_on(total, utilization):
    got = gpu_startups.share_utilization(6, total)
    assert got == utilization
    assert abs(got * total / 2**30 - 6) < 0.05


def test_the_gate_gpu_profile_halves_max_num_seqs_and_interleaves_the_planted_kinds():
    args = gms.parse_args(["--profile", "gpu"])
    assert (args.gates, args.planted, args.planted_kinds) == (10, 5, ["max-num-seqs-half", "delay-20"])
    assert args.parts == {"aa", "planted"}
    flags = args.server_flags.split()
    halved = gms.seqs_flags(flags, "max-num-seqs-half")
    assert halved[halved.index("--max-num-seqs") + 1] == "16" and flags[flags.index("--max-num-seqs") + 1] == "32"
    assert args.concurrency == 32  # the halved batch binds at the gate's concurrency
    order = gms.schedule(args)
    assert order[:4] == [("aa", 0), ("aa", 1), ("max-num-seqs-half", 0), ("delay-20", 0)]
    assert [k for k, _ in order].count("aa") == 10 and len(order) == 20


def test_a_resumed_gate_runs_only_what_its_summary_lacks():
    args = gms.parse_args(["--profile", "gpu"])
    row = {"verdict": "UNDECIDED", "wall_s": 30.0}
    summary = {"aa": [row] * 3, "planted": {"max-num-seqs-half": [row], "delay-20": [row]}}
    todo = gms.remaining(args, summary)
    assert todo[0] == ("aa", 3) and len(todo) == 20 - 5
    assert ("max-num-seqs-half", 0) not in todo and ("max-num-seqs-half", 1) in todo
    assert gms.remaining(args, {"aa": [row] * 10, "planted": {k: [row] * 5 for k in args.planted_kinds}}) == []


def test_the_gate_driver_refuses_an_unknown_planted_kind_with_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        gms.parse_args(["--profile", "gpu", "--planted-kinds", "delay-20,slower"])
    assert exc.value.code == 2
    assert "unknown planted kind or part: slower" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gms.parse_args(["--planted-kinds", "max-num-seqs-half", "--server-flags", "--enforce-eager"])


def test_the_families_remainder_puts_the_fused_kernel_jobs_first():
    jobs = json.loads((ROOT / "measurements" / "vram" / "next-hold-jobs.json").read_text())["jobs"]
    fla = [j for j in jobs if j.get("pythonpath") == "/tmp/site-fla"]
    assert len(fla) == 9 and jobs[:9] == fla and all(j["arch"] == "qwen3.5-2b" for j in fla)
    rest = jobs[9:]
    assert {j["arch"] for j in rest} == {"gemma-4-e4b", "granite-4.0-h-tiny"}
    assert all(j["kind"] == "train" and j["case"]["precision"] == "nf4-dq" and "build" not in j for j in rest)
    assert [j["arch"] for j in rest[:2]] == ["gemma-4-e4b", "granite-4.0-h-tiny"]  # alternating


def test_a_gate_run_whose_server_cannot_start_stops_with_one_line_and_exit_1(tmp_path):
    """An interpreter without vLLM: the driver keeps its summary, says why in its last line, exits 1
    (scripts/gpu/gate.sh then says the driver stopped early; a call again resumes)."""
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/serving/gate_must_show.py"), "--profile", "gpu",
                           "--vllm-python", sys.executable, "--model", "tiny", "--server-flags", "--max-num-seqs 4",
                           "--gates", "1", "--planted", "0", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert last.startswith("gate must-show incomplete: 0 of 1 gates (a server did not start:") and "vllm" in last
    assert "Traceback" not in proc.stderr
    summary = json.loads((tmp_path / "gate-must-show.json").read_text())
    assert summary["profile"] == "gpu" and "complete" not in summary and summary["stopped"].startswith("a server")
