"""The allocator replayed on recorded H200 histories reproduces their OOMs under the 6 GiB cap, and a
step traced on the meta device (harness.memory.step_trace) lays its allocations the way the H200's
history did (benchmarks/vram/measured-families-14, -15)."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UnsupportedError
from harness.memory.allocator_sim import events_from_history, replay, smallest_cap
from harness.memory.estimate import Query
from harness.memory.shape import load_config

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "benchmarks" / "vram"
ROWS = {14: ROOT / "measured-families-14" / "families-out" / "rows",
        15: ROOT / "measured-families-15" / "families-out" / "rows"}
CAP = 6 * 2**30 - 639631360  # the rows' budget less their measured CUDA context


def history(run: int, name: str) -> list:
    return json.loads(gzip.decompress((ROWS[run] / f"{name}.trace.json.gz").read_bytes()))


def row(run: int, name: str) -> dict:
    return json.loads((ROWS[run] / f"{name}.json").read_text())


PHI = "002-snapshot-train-phi-4-mini-all-r32-b1-s128-adamw_torch-uncapped"
GEMMA = "004-snapshot-train-gemma-3-1b-all-r64-b2-s320-adamw_torch-uncapped"
MISTRAL_OOM = "001-snapshot-train-mistral-7b-v0.3-attn-r8-b2-s320-adamw_torch-uncapped"
MISTRAL_FIT = "002-snapshot-train-mistral-7b-v0.3-all-r8-b1-s256-adamw_torch-uncapped"


@pytest.mark.parametrize("run,name,where,size", [
    (14, PHI, "_functions.py:384:backward", None),  # bitsandbytes' MatMul4Bit backward
    (14, GEMMA, None, 2 * 320 * 262144 * 4),  # Gemma-3's fp32 logits
])
def test_the_replayed_allocator_runs_out_where_the_capped_run_did(run, name, where, size):
    hist = history(run, name)
    capped = row(run, name.replace("-uncapped", "-capped").replace("002-", "001-").replace("004-", "003-"))
    assert capped["oom"] and capped["allocator_cap_bytes"] == CAP  # what ran
    uncapped = row(run, name)
    events = events_from_history(hist)
    free = replay(events)
    # the row's peak is over the steps (reset after loading); phi-4-mini's whole-process peak is at
    # the fp32 upcast of its embedding, Gemma-3's in the steps: the same bytes, counted alike
    assert not free.oom and uncapped["peak_bytes"] <= free.allocated_peak < 1.03 * uncapped["peak_bytes"]
    if "gemma" in name:
        assert free.allocated_peak == uncapped["peak_bytes"]
    got = replay(events, CAP)
    assert got.oom
    failing = events[got.oom_event]
    if size:
        assert failing[2] == size
    if where:
        assert hist[failing[1]][3] == where


def test_the_replay_separates_two_mistral_steps_a_reserve_rule_could_not():
    """Both within 1% of the line: the history that ran out needs more than the cap, the one that
    fitted less (the runs' verdicts, measured-families-3 and -2)."""
    need = {name: smallest_cap(events_from_history(history(15, name))) / CAP - 1 for name in (MISTRAL_OOM, MISTRAL_FIT)}
    assert 0 < need[MISTRAL_OOM] < 0.01
    assert -0.01 < need[MISTRAL_FIT] < 0
    assert not row(15, MISTRAL_FIT)["oom"] and not row(15, MISTRAL_OOM)["oom"]  # uncapped, both ran


TRACE_PHI = """
import json, sys
from harness.memory.allocator_sim import smallest_cap
from harness.memory.estimate import Query
from harness.memory.shape import load_config
from harness.memory.step_trace import replay_verdict, trace_training_step
q = Query("nf4-dq", "train", seq_len=128, batch=1, lora_r=32, lora_targets=("all-linear",),
          grad_checkpointing=True, optimizer="adamw_torch")
trace = trace_training_step(load_config("phi-4-mini")[0], q)
verdict = replay_verdict(trace, 6 * 2**30, 639631360)
json.dump({"load": [e[2] for e in trace.events[:trace.train_at] if e[0] == "alloc" and e[2] >= 8 << 20],
           "peak": trace.train_peak_bytes, "need": smallest_cap(trace.events), "verdict": verdict.as_dict()},
          open(sys.argv[1], "w"))
"""


def test_a_traced_step_is_laid_out_as_the_h200_history(tmp_path):
    """In a process of its own: the tracer imports transformers, peft and bitsandbytes and patches
    two torch functions while it runs."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    out = tmp_path / "trace.json"
    r = subprocess.run([sys.executable, "-c", TRACE_PHI, str(out)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads(out.read_text())
    hist = history(14, PHI)
    start = next(i for i, h in enumerate(hist) if h[0] == "alloc" and "optimizer_steps" in h[3])
    # every allocation of 8 MiB or more up to the first step, in order: the warmup, the embedding,
    # each weight in bf16 and packed, the fp32 upcasts, peft's adapters
    recorded = [h[2] for h in hist[:start] if h[0] == "alloc" and h[2] >= 8 << 20]
    assert got["load"] == recorded and len(recorded) > 150
    measured = row(14, PHI)["peak_bytes"]
    assert abs(got["peak"] - measured) / measured < 0.01  # the workspaces included
    traced_need = got["need"] / CAP - 1
    real_need = smallest_cap(events_from_history(hist)) / CAP - 1
    assert abs(traced_need - real_need) < 0.02 and traced_need > 0.05  # refused, as it ran out (+5.6% vs +7.3%)
    assert not got["verdict"]["fits"] and got["verdict"]["cap_bytes"] == CAP


def test_precisions_the_tracer_cannot_stand_in_for_are_refused():
    from harness.memory.step_trace import trace_training_step

    with pytest.raises(UnsupportedError, match="int8"):
        trace_training_step(load_config("phi-4-mini")[0], Query("int8", "train"))


def test_estimate_replay_gives_the_replayed_verdict_beside_the_reserve_rule():
    """The committed refusal that ran out (phi-4-mini all-linear r32 128 x 1): both verdicts refuse,
    the replay with the need it traced; the JSON names each figure."""
    pytest.importorskip("bitsandbytes")
    r = subprocess.run([sys.executable, "-m", "harness", "estimate", "--config", "phi-4-mini", "--precision", "nf4-dq",
                        "--mode", "train", "--seq-len", "128", "--lora-r", "32", "--lora-targets", "all-linear",
                        "--optimizer", "adamw_torch", "--budget", "6GiB", "--context-bytes", "610MiB", "--replay",
                        "--json"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    (obj,) = json.loads(r.stdout)
    replay = obj["replay"]
    assert obj["fits"] is False and replay["fits"] is False
    assert replay["cap_bytes"] == 6 * 2**30 - 610 * 2**20 and replay["need_bytes"] > replay["cap_bytes"]
    assert "step 3/3" in r.stderr  # progress while it traces


def test_estimate_replay_without_a_card_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "harness", "estimate", "--config", "phi-4-mini", "--mode", "train",
                        "--replay"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "--budget" in r.stderr and "Traceback" not in r.stderr
