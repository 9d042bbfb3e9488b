"""plan --train's limits replayed on torch's caching allocator (harness.memory.replay.replay_limits): the
search closes in on the setting where the replay turns, in few traces, and the plan it answers is
the one `estimate --replay` confirms setting by setting."""

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness.memory.replay.limit_bracket import MAX_TRACES, ReplayPoint, largest_fitting

REPO = Path(__file__).resolve().parents[1]
MiB = 2**20


def need_curve(base: int, per_unit: int, granule: int = 2 * MiB):
    """A step's need as the allocator sees it: linear in tokens, in whole granules."""
    return lambda n: -(-(base + per_unit * n) // granule) * granule


class Traced:
    """A probe over a need curve, fitting where the need is within target; counts its traces."""

    def __init__(self, need, target: int, refuse: frozenset = frozenset()):
        self.need, self.target, self.refuse, self.calls = need, target, refuse, []

    def __call__(self, n: int) -> ReplayPoint:
        self.calls.append(n)
        need = self.need(n)
        return ReplayPoint(n, 1, need <= self.target and n not in self.refuse, need, need, 0.0)


def search(probe: Traced, start: int, lo: int = 16, hi: int = 32768, slope: float | None = None):
    per_unit = (probe.need(2000) - probe.need(1000)) / 1000
    return largest_fitting(probe, lambda p: p.seq_len, probe.target, start, lo, hi,
                           per_unit if slope is None else slope)


@pytest.mark.parametrize("start", [100, 1400, 1490, 1512, 1600, 3000])
def test_the_search_lands_where_the_replay_turns_from_any_start(start):
    need = need_curve(4 * 2**30, 700_000)
    target = 5 * 2**30
    probe = Traced(need, target)
    value, closed = search(probe, start)
    assert closed and need(value) <= target < need(value + 1)
    assert value in probe.calls and value + 1 in probe.calls  # both sides traced, not inferred


def test_a_start_near_the_answer_costs_a_handful_of_traces():
    """The reserve rule's answer is within a few percent: the traced need steers to the line."""
    need = need_curve(4 * 2**30, 700_000)
    probe = Traced(need, 5 * 2**30)
    search(probe, 1480)
    assert len(probe.calls) <= 6, probe.calls


def test_a_wrong_slope_still_closes_by_bisection():
    need = need_curve(4 * 2**30, 700_000)
    probe = Traced(need, 5 * 2**30)
    value, closed = search(probe, 1400, slope=50 * 700_000)  # the estimate's slope 50x too steep
    assert closed and need(value) <= probe.target < need(value + 1)
    assert len(probe.calls) <= MAX_TRACES


def test_the_ends_of_the_range():
    need = need_curve(4 * 2**30, 700_000)
    assert search(Traced(need, 64 * 2**30), 1000, hi=4096) == (4096, True)  # the model's limit stops it
    assert search(Traced(need, 3 * 2**30), 1000) == (None, True)  # not even 16 tokens
    assert search(Traced(need, 5 * 2**30), 10**6, hi=4096)[0] < 4096  # a start past the range is clamped


def test_not_monotone_the_answer_is_a_traced_fit_with_a_traced_refusal_right_above():
    """A refusal below settings that fit (a release before a retry changed the layout): the search
    answers a fit next to a refusal it traced, never a setting it only inferred."""
    need = need_curve(4 * 2**30, 700_000)
    target = 5 * 2**30
    turn = max(n for n in range(16, 5000) if need(n) <= target)
    for odd, start in ((turn - 40, turn - 40), (turn - 1, turn - 60)):
        probe = Traced(need, target, refuse=frozenset({odd}))
        value, closed = search(probe, start)
        assert closed and value + 1 in probe.calls and not probe(value + 1).fits
        assert value in probe.calls and probe(value).fits and value <= turn


def test_a_search_out_of_traces_answers_the_largest_fit_it_saw():
    need = need_curve(4 * 2**30, 700_000)
    probe = Traced(need, 5 * 2**30)
    value, closed = largest_fitting(probe, lambda p: p.seq_len, probe.target, 16, 16, 32768, 1e12, max_traces=2)
    assert not closed and value == max(n for n in probe.calls if need(n) <= probe.target)


# A two-layer Llama with a 32k vocabulary: its trace takes a second or two, and the logits decide the
# context, so the limit lands inside the model's 4096 tokens on a 1400 MiB card.
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 32000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "rope_theta": 10000.0, "hidden_act": "silu"}


def harness(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=REPO, env=env)


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "config.json"
    path.write_text(json.dumps(TINY))
    return path


def test_plan_train_replays_its_limits_and_estimate_replay_agrees(tiny_config):
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    card = ["--budget", "1400MiB", "--context-bytes", "400MiB"]
    r = harness("plan", "--config", str(tiny_config), *card, "--train", "--precision", "nf4-dq,fp4-dq,bf16",
                "--batch-seq-len", "1024", "--json")
    assert r.returncode == 0, r.stderr[-2000:]
    nf4, fp4, bf16 = json.loads(r.stdout)["plans"]
    assert nf4["limits_from"] == fp4["limits_from"] == "replay" and bf16["limits_from"] == "reserve rule"
    assert "traces nf4-dq and fp4-dq only" in bf16["replay"]["skipped"]
    seq = nf4["max_seq_len"]
    assert (seq, nf4["max_batch"]) == (fp4["max_seq_len"], fp4["max_batch"])  # they allocate alike
    assert 16 < seq < 4096 and nf4["max_batch"] >= 1
    points = {(p["seq_len"], p["fits"]) for p in nf4["replay"]["seq_len"]["points"]}
    assert {(seq, True), (seq + 1, False)} <= points and nf4["replay"]["seq_len"]["closed"]
    assert f"{seq + 1} tokens do not fit, replayed" in nf4["reason"]
    assert "x 1: fits (traced need" in r.stderr  # progress while it traces
    # each side of the limit, replayed on its own by estimate, says the same
    est = harness("estimate", "--config", str(tiny_config), *card, "--mode", "train", "--precision", "nf4-dq",
                  "--seq-len", f"{seq},{seq + 1}", "--replay", "--json")
    assert est.returncode == 0, est.stderr[-2000:]
    rows = json.loads(est.stdout)
    assert [row["replay"]["fits"] for row in rows] == [True, False]
    assert [row["fits"] for row in rows] == [True, False]  # one answer: estimate's verdict is the replayed one
    said = lambda text: text.split("replayed on torch's caching allocator: ")[1].split(" (the reserve rule")[0]  # noqa: E731
    assert said(rows[1]["verdict"]) == said(nf4["reason"])  # the same figures, in the same words
    # the batch at 1024 tokens: the largest that fits, one more refused
    batch = nf4["max_batch"]
    est = harness("estimate", "--config", str(tiny_config), *card, "--mode", "train", "--precision", "nf4-dq",
                  "--seq-len", "1024", "--batch", f"{batch},{batch + 1}", "--replay", "--json")
    assert [row["replay"]["fits"] for row in json.loads(est.stdout)] == [True, False]


def test_no_replay_answers_by_the_reserve_rule_at_once(tiny_config):
    r = harness("plan", "--config", str(tiny_config), "--budget", "1400MiB", "--train", "--no-replay",
                "--precision", "nf4-dq", "--json")
    assert r.returncode == 0 and "replay" not in r.stderr
    (plan,) = json.loads(r.stdout)["plans"]
    assert plan["limits_from"] == "reserve rule" and plan["replay"] is None


@pytest.mark.parametrize("args,needle", [
    (["--replay"], "--replay replays training steps: add --train"),
    (["--train", "--replay", "--config", "qwen2.5-0.5b"], "--replay replays one model's training"),
])
def test_replay_where_it_has_nothing_to_replay_is_a_usage_error(args, needle):
    r = harness("plan", "--config", "qwen2.5-1.5b", "--budget", "6GiB", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_machine_that_cannot_trace_gets_the_reserve_rule_and_says_why(tiny_config, tmp_path):
    """A bitsandbytes that fails to import (no CUDA library, a broken wheel): the plan still
    answers, by the reserve rule, and says why it did not replay."""
    broken = tmp_path / "site" / "bitsandbytes"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('libbitsandbytes_cpu.so: cannot open shared object file')\n")
    env = {**__import__("os").environ, "PYTHONPATH": f"{broken.parent}:{REPO}"}
    args = [sys.executable, "-m", "harness", "plan", "--config", str(tiny_config), "--budget", "1400MiB", "--train",
            "--precision", "nf4-dq"]
    r = subprocess.run([*args, "--json"], capture_output=True, text=True, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    (plan,) = json.loads(r.stdout)["plans"]
    assert plan["limits_from"] == "reserve rule" and "libbitsandbytes_cpu.so" in plan["replay"]["error"]
    r = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=env)
    assert "note: nf4-dq not replayed, its limits are the reserve rule's: the replay needs bitsandbytes" in r.stdout


def test_a_model_the_tracer_cannot_step_keeps_the_reserve_rule_with_the_reason(tmp_path):
    """Qwen3-30B-A3B's experts are 3-D parameters peft wraps with ParamWrapper, which refuses LoRA
    dropout: the trace fails inside peft. plan still answers (the reserve rule, and why), estimate
    --replay says so in its row; neither prints a traceback. The failure is kept in the trace cache:
    the same step asked again is refused with the same reason, without tracing it again."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    env = {**__import__("os").environ, "HARNESS_CACHE_DIR": str(tmp_path)}
    card = ["--config", "qwen3-30b-a3b", "--budget", "100GiB", "--precision", "nf4-dq"]  # its experts stay bf16
    r = harness("plan", *card, "--train", "--json", env=env)
    # an unverified family (qwen3_moe) with no trace: refused, not answered by a dense stand-in
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    (plan,) = json.loads(r.stdout)["plans"]
    assert plan["verdict"] == "unknown" and not plan["fits"] and plan["max_seq_len"] is None
    assert plan["reason"].startswith("refused: the training step of this unverified family cannot be traced")
    assert plan["replay"]["error"].startswith("the step could not be traced: ValueError: ")
    assert list(tmp_path.glob("step-traces/*/*.failed.txt")) and "not traced again" not in r.stderr
    text = harness("plan", *card, "--train", env=env)
    assert text.returncode == 1 and text.stdout.strip().splitlines()[-1].startswith("verdict: unknown: refused")
    assert "not traced again" in text.stderr and plan["replay"]["error"] in text.stdout, text.stderr[-2000:]
    est = harness("estimate", *card, "--mode", "train", "--seq-len", "256", "--replay", "--json", env=env)
    assert est.returncode == 0 and "Traceback" not in est.stderr
    row = json.loads(est.stdout)[0]
    assert "could not be traced" in row["replay"]["error"] and row["fit"] == "unknown" and not row["fits"]


@pytest.mark.parametrize("error, kept", [(ValueError("peft refuses this layer"), True),
                                          (MemoryError(), False), (OSError(24, "Too many open files"), False)])
def test_a_failed_trace_is_kept_only_when_it_is_the_models_not_the_machines(error, kept, tmp_path, monkeypatch):
    """A step the meta-device run cannot take fails the same way with the same key (kept, then said
    without tracing); running out of memory or file handles is this machine at this time (not kept)."""
    from harness.errors import UnsupportedError
    from harness.memory.fit.estimate import Query
    from harness.memory.fit.shape import shape_from_config
    from harness.memory.replay import step_trace
    from harness.memory.replay.replay_limits import StepReplayer

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    calls = []

    def failing(*args, **kwargs):
        calls.append(args)
        raise error

    monkeypatch.setattr(step_trace, "trace_training_step", failing)
    recipe = Query("nf4-dq", "train", lora_r=8, lora_targets=("q_proj", "v_proj"))
    reasons = []
    for _ in range(2):
        said = []
        replayer = StepReplayer(TINY, shape_from_config(TINY), recipe, 2**30, 0, progress=said.append, processes=1)
        with pytest.raises(UnsupportedError) as exc:
            replayer.point(128, 1)
        reasons.append(str(exc.value))
    assert reasons[0] == reasons[1] and reasons[0].startswith(f"the step could not be traced: {type(error).__name__}")
    assert len(calls) == (1 if kept else 2)
    assert bool(list(tmp_path.glob("step-traces/*/128x1.failed.txt"))) == kept
    assert any("not traced again" in s for s in said) == kept


def test_a_length_made_from_three_traced_lengths_is_the_traced_one(tiny_config):
    """plan --train traces three lengths and makes the others (trace_synthesis.synthesized_trace):
    every allocation of a fourth length, byte for byte; a window between the lengths, or traces of
    another batch, make nothing."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    from harness.memory.fit.estimate import Query
    from harness.memory.replay.trace_synthesis import synthesized_trace
    from harness.memory.replay.step_trace import trace_training_step

    recipe = Query("nf4-dq", "train", lora_r=8, lora_targets=("q_proj", "v_proj"))
    traced = {s: trace_training_step(TINY, replace(recipe, seq_len=s)) for s in (100, 300, 700, 1000)}
    made = synthesized_trace([(s, traced[s]) for s in (100, 300, 1000)], 700, None)
    assert made is not None and made.events == traced[700].events and made.train_at == traced[700].train_at
    assert synthesized_trace([(s, traced[s]) for s in (100, 300, 1000)], 700, 512) is None
    assert synthesized_trace([(s, traced[s]) for s in (100, 300)], 700, None) is None


def test_a_second_replay_takes_its_trace_from_the_cache(tiny_config, tmp_path):
    """A trace does not depend on the card: at another budget the same setting is replayed from the
    trace cache (harness.memory.replay.trace_cache), with the verdict the fresh trace gives there."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    env = {**__import__("os").environ, "HARNESS_CACHE_DIR": str(tmp_path)}
    args = [sys.executable, "-m", "harness", "estimate", "--config", str(tiny_config), "--mode", "train",
            "--precision", "nf4-dq", "--seq-len", "512", "--replay", "--json"]
    first = subprocess.run([*args, "--budget", "1400MiB"], capture_output=True, text=True, cwd=REPO, env=env)
    assert first.returncode == 0 and "step 1/3" in first.stderr and list(tmp_path.glob("step-traces/*/*.json.gz"))
    again = subprocess.run([*args, "--budget", "600MiB"], capture_output=True, text=True, cwd=REPO, env=env)
    assert "step 1/3" not in again.stderr and "from the trace cache" in again.stderr
    fresh = subprocess.run([*args, "--budget", "600MiB"], capture_output=True, text=True, cwd=REPO,
                           env={**env, "HARNESS_CACHE_DIR": str(tmp_path / "cold")})
    assert json.loads(again.stdout)[0]["replay"] == json.loads(fresh.stdout)[0]["replay"]


def test_three_cached_lengths_make_a_new_one_without_tracing(tiny_config, tmp_path):
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    env = {**__import__("os").environ, "HARNESS_CACHE_DIR": str(tmp_path)}
    args = [sys.executable, "-m", "harness", "estimate", "--config", str(tiny_config), "--mode", "train",
            "--precision", "nf4-dq", "--replay", "--json", "--budget", "1400MiB"]
    first = subprocess.run([*args, "--seq-len", "256,512,1024"], capture_output=True, text=True, cwd=REPO, env=env)
    assert first.returncode == 0 and first.stderr.count("step 1/3") == 3
    made = subprocess.run([*args, "--seq-len", "700"], capture_output=True, text=True, cwd=REPO, env=env)
    assert "step 1/3" not in made.stderr and "made from 3 traced lengths" in made.stderr
    fresh = subprocess.run([*args, "--seq-len", "700"], capture_output=True, text=True, cwd=REPO,
                           env={**env, "HARNESS_CACHE_DIR": str(tmp_path / "cold")})
    assert json.loads(made.stdout)[0]["replay"] == json.loads(fresh.stdout)[0]["replay"]


def test_a_trace_leaves_bitsandbytes_quantizing_real_weights(tiny_model_dir):
    """bitsandbytes caches its 8-bit map on the device of the first tensor it quantizes: a trace
    (meta tensors) must not leave a meta map behind for the real loads of the same process."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    from harness.memory.fit.estimate import Query
    from harness.memory.replay.step_trace import trace_training_step
    from harness.models import load_model

    trace_training_step(TINY, Query("nf4-dq", "train", seq_len=64, lora_r=8, lora_targets=("q_proj", "v_proj")))
    model = load_model(tiny_model_dir, "nf4-dq", "cpu")
    assert any(type(m).__name__ == "Linear4bit" for m in model.modules())
