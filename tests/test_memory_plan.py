"""plan and estimate as a new user meets them: the model's own context limit, plain why-texts, what
the card needs, --optimizer and LoRA targets, and offload placement (CPU: meta-device models)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness.__main__ import main
from harness.errors import UsageError
from harness.memory.fit import budget as B
from harness.memory.fit import estimate as E
from harness.memory.fit.shape import model_shape
from harness.memory.fit.weights import block_rounded, weight_bytes
from harness.memory.fit import offload as O

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=ROOT)


def run_json(capsys, *args) -> dict | list:
    assert main(list(args) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name,limit", [("tinyllama-1.1b", 2048), ("phi-3-mini-4k", 4096)])
def test_plan_never_goes_past_the_models_own_limit(capsys, name, limit):
    for train in ([], ["--train"]):
        data = run_json(capsys, "plan", "--config", name, "--budget", "24GiB", "--precision", "nf4,bf16", *train)
        assert data["context_limit"] == limit
        for p in data["plans"]:
            assert p["max_seq_len"] <= limit
            if p["max_seq_len"] == limit:
                assert p["limited_by"] == "model" and "the model's limit, not memory" in p["reason"]


def test_rope_scaling_extends_the_limit_as_vllm_does():
    base = {"max_position_embeddings": 32768}
    yarn = dict(base, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert B.context_limit(yarn).tokens == 131072 and "yarn" in B.context_limit(yarn).source
    assert B.context_limit(dict(base, rope_scaling={"rope_type": "linear", "factor": 2.0})).tokens == 65536
    # llama3 configs already state the extended length; transformers v5 names it rope_parameters
    llama3 = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 32.0}}
    assert B.context_limit(llama3).tokens == 131072
    assert B.context_limit(dict(base, rope_parameters={"rope_type": "default"})).tokens == 32768
    assert B.context_limit({}).tokens is None


def test_why_texts_are_plain(capsys):
    data = run_json(capsys, "plan", "--config", "qwen2.5-1.5b", "--budget", "6GiB", "--precision", "bf16,fp32")
    bf16 = next(p for p in data["plans"] if p["precision"] == "bf16")
    m = re.fullmatch(r"(\d+) tokens need ([\d.]+) GiB; ([\d.]+) GiB is usable after the 400 MiB CUDA context "
                     r"and 3% headroom", bf16["reason"])
    assert m, bf16["reason"]
    assert int(m.group(1)) == bf16["max_seq_len"] + 1 and float(m.group(2)) > float(m.group(3))
    assert bf16["limited_by"] == "memory"
    fp32 = next(p for p in data["plans"] if p["precision"] == "fp32")
    assert fp32["reason"].startswith("weights alone need") and not fp32["fits"]


def test_plan_train_takes_the_recipe(capsys):
    base = ["plan", "--config", "qwen2.5-1.5b", "--budget", "6GiB", "--train", "--no-replay", "--precision", "nf4-dq"]
    attn = run_json(capsys, *base, "--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--lora-r", "8")
    allx = run_json(capsys, *base, "--lora-targets", "all-linear", "--lora-r", "64")
    nogc = run_json(capsys, *base, "--no-grad-checkpointing")
    assert attn["plans"][0]["max_seq_len"] > allx["plans"][0]["max_seq_len"] > nogc["plans"][0]["max_seq_len"]
    assert attn["headroom"] == E.RESERVE_FRACTION["train"] and attn["optimizer"] == "adamw_torch"
    phi = run_json(capsys, "plan", "--config", "phi-3-mini-4k", "--budget", "6GiB", "--train", "--no-replay",
                   "--lora-targets", "q_proj,k_proj,v_proj,o_proj")
    assert "qkv_proj" in phi["lora_note"] and "only o_proj" in phi["lora_note"]


@pytest.mark.parametrize("args,needle", [
    (["--train", "--optimizer", "sgd"], "unknown optimizer"),
    (["--train", "--lora-targets", "c_attn"], "c_attn"),
    (["--offload", "--precision", "nf4"], "--offload plans"),
    (["--offload", "--hw-results", "/no/such.json"], "--hw-results"),
    (["--offload", "--cpu-memory", "lots"], "not a size"),
])
def test_plan_bad_input_is_one_line_exit_2(args, needle):
    r = cli("plan", "--config", "qwen2.5-0.5b", "--budget", "6GiB", *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_estimate_says_what_the_card_needs_and_the_verdict(capsys):
    out = run_json(capsys, "estimate", "--config", "qwen2.5-1.5b", "--precision", "nf4-dq", "--mode",
                   "prefill,train", "--seq-len", "1024,4096", "--budget", "6GiB", "--lora-targets",
                   "q_proj,k_proj,v_proj,o_proj", "--optimizer", "adamw_8bit")
    for o in out:  # the contract's fields stay, the new ones are added
        for key in ("precision", "mode", "seq_len", "batch", "peak_bytes", "breakdown"):
            assert key in o
        assert o["card_bytes"] == o["peak_bytes"] + o["reserve_bytes"] + o["context_bytes"]
        planned = o["peak_bytes"] + o["fragmentation_bytes"]
        assert o["reserve_bytes"] == int(planned * E.RESERVE_FRACTION[o["mode"]]) + o["fragmentation_bytes"]
        assert o["fits"] == (o["card_bytes"] <= o["budget_bytes"] + 1)  # the verdict is the card figure
        assert o["verdict"].startswith("fits: " if o["fits"] else "does not fit: ")
    train = [o for o in out if o["mode"] == "train"]
    assert all(o["optimizer"] == "adamw_8bit" and o["lora_modules"] == 4 * 28 for o in train)
    assert {o["fits"] for o in train} == {True, False}
    # estimate's verdict and plan's limit say the same thing
    plan = run_json(capsys, "plan", "--config", "qwen2.5-1.5b", "--budget", "6GiB", "--train", "--no-replay", "--precision",
                    "nf4-dq", "--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--optimizer", "adamw_8bit")
    limit = plan["plans"][0]["max_seq_len"]
    for seq, ok in ((limit, True), (limit + 1, False)):
        o = run_json(capsys, "estimate", "--config", "qwen2.5-1.5b", "--precision", "nf4-dq", "--mode", "train",
                     "--seq-len", str(seq), "--budget", "6GiB", "--lora-targets", "q_proj,k_proj,v_proj,o_proj",
                     "--optimizer", "adamw_8bit")[0]
        assert o["fits"] is ok


def test_estimate_table_shows_card_column():
    r = cli("estimate", "--config", "phi-3-mini-4k", "--precision", "nf4-dq", "--mode", "train", "--seq-len",
            "1024", "--lora-targets", "q_proj,k_proj,v_proj,o_proj", "--budget", "6GiB")
    assert r.returncode == 0, r.stderr
    assert "card needs" in r.stdout and "CUDA context" in r.stdout
    assert "match no module" in r.stderr  # the partial-match note


# ---------------------------------------------------------------------------------------------
# Offload


@pytest.fixture(scope="module")
def meta7b():
    return O.meta_model("qwen2.5-7b", "bf16")


def _plan(meta7b, budget, cpu=64 * GiB, **kw):
    return O.plan_offload("qwen2.5-7b", budget, "bf16", cpu_memory_bytes=cpu, model=meta7b, seq_len=512,
                          new_tokens=64, **kw)


def test_offload_places_what_does_not_fit(meta7b):
    total = weight_bytes(model_shape("qwen2.5-7b"), "bf16")
    six, ten, big = _plan(meta7b, 6 * GiB), _plan(meta7b, 10 * GiB), _plan(meta7b, 24 * GiB)
    for p in (six, ten, big):
        assert p.bytes_on_gpu + p.bytes_on_cpu + p.bytes_on_disk == pytest.approx(total, rel=0.01)
        assert p.bytes_on_gpu <= p.gpu_max_memory_bytes
        assert sum(p.layers_on.values()) == 28
    assert six.offloaded and six.bytes_on_cpu > ten.bytes_on_cpu > 0 and not big.offloaded
    assert six.predicted_decode_ms > ten.predicted_decode_ms > big.predicted_decode_ms
    assert six.host_ram_bytes >= six.bytes_on_cpu + O.HOST_BASELINE_BYTES
    assert "layers on the CPU" in six.reason and "no offload needed" in big.reason
    # whole decoder layers move (no_split_module_classes): the map names layers, not projections
    assert all(not k.endswith("_proj") for k in six.device_map)


def test_offload_spills_to_disk_when_host_ram_is_short(meta7b):
    p = _plan(meta7b, 6 * GiB, cpu=4 * GiB)
    assert p.bytes_on_disk > 0 and p.layers_on["disk"] > 0 and p.bytes_on_cpu <= 4 * GiB
    slow_disk = _plan(meta7b, 6 * GiB, cpu=4 * GiB, bandwidths=O.Bandwidths(disk_gbps=0.5))
    assert slow_disk.predicted_decode_ms > p.predicted_decode_ms


def test_offload_decode_time_follows_the_bytes_copied():
    bw = O.Bandwidths(h2d_gbps=10.0, device_gbps=1000.0, layer_ms=1.0)
    on = {"gpu": 4 * 10**9, "cpu": 10 * 10**9, "disk": 0}
    assert O.predict_decode_ms(on, 28, bw) == pytest.approx(4 + 1000 + 28)


def _hw_results(tmp_path, details) -> Path:
    path = tmp_path / "hw.json"
    tests = [{"nodeid": "suites/hw/test_stress_full.py::test_h2d_bandwidth", "outcome": "passed",
              "record": {"check": "h2d_bandwidth", "details": details}},
             {"nodeid": "suites/hw/test_stress_full.py::test_d2d_bandwidth", "outcome": "passed",
              "record": {"check": "d2d_bandwidth", "details": {"gbps": 350.0}}}]
    path.write_text(json.dumps({"schema_version": 1, "kind": "pytest-run", "tests": tests}))
    return path


def test_bandwidths_come_from_the_hw_suites_results(tmp_path, capsys):
    bw = O.bandwidths_from_results(_hw_results(tmp_path, {"gbps": 24.0, "pageable_gbps": 11.0}))
    assert bw.h2d_gbps == 11.0 and "pageable" in bw.h2d_source and bw.device_gbps == 350.0
    # offloaded weights are views of the mapped checkpoint: that copy rate wins when measured
    mapped = O.bandwidths_from_results(_hw_results(tmp_path, {"gbps": 24.0, "pageable_gbps": 11.0, "mmap_gbps": 6.5}))
    assert mapped.h2d_gbps == 6.5 and "memory-mapped" in mapped.h2d_source
    old = O.bandwidths_from_results(_hw_results(tmp_path, {"gbps": 24.0}))
    assert old.h2d_gbps == 24.0 and "pageable not measured" in old.h2d_source
    (tmp_path / "empty.json").write_text(json.dumps({"tests": []}))
    with pytest.raises(UsageError, match="no h2d_bandwidth"):
        O.bandwidths_from_results(tmp_path / "empty.json")
    data = run_json(capsys, "plan", "--config", "qwen2.5-7b", "--budget", "6GiB", "--offload", "--cpu-memory",
                    "64GiB", "--hw-results", str(_hw_results(tmp_path, {"gbps": 24.0, "pageable_gbps": 11.0})))
    off = data["offload"]
    for key in ("device_map", "bytes_on_gpu", "bytes_on_cpu", "bytes_on_disk", "host_ram_bytes",
                "predicted_decode_ms", "predicted_tokens_per_s", "h2d_gbps", "reason"):
        assert key in off
    assert off["h2d_gbps"] == 11.0 and off["offloaded"] and data["plans"]  # the usual plan stays


def test_training_verdicts_keep_room_for_the_holes_a_step_leaves(capsys):
    """A training verdict keeps room beyond the peak for holes the caching allocator cannot reuse:
    1.5 fp32 attention-score blocks where SDPA's math kernel materialises them (nf4 training of a
    grouped-query model; none for an MHA model, phi-3, or bf16), a share of one fp32 logits block,
    a share of the optimizer's states and step temporaries, and a share of what the step's
    transients leave unfilled of the bf16 embedding the k-bit upcast freed; estimate says so."""
    o = run_json(capsys, "estimate", "--config", "llama-3.2-1b", "--precision", "nf4-dq", "--mode", "train",
                 "--seq-len", "1024", "--batch", "2", "--budget", "6GiB")[0]
    shape = model_shape("llama-3.2-1b")
    holes = o["breakdown"]["fragmentation"]
    assert holes["attention_scores"] == int(E.FRAGMENTATION_BLOCKS * 2 * shape.heads * 1024 * 1024 * 4)
    assert holes["logits"] == int(E.REALLOCATED_HOLES["logits"] * 2 * 1024 * shape.vocab * 4)
    optimizer = o["breakdown"]["optimizer_states"] + o["breakdown"]["optimizer_step_transient"]
    assert optimizer > 0 and holes["optimizer_states"] == int(E.REALLOCATED_HOLES["optimizer_states"] * optimizer)
    assert o["fragmentation_bytes"] == sum(holes.values())
    assert "kept free for the holes" in o["verdict"]
    for config, precision in (("phi-3-mini-4k", "nf4-dq"), ("llama-3.2-1b", "bf16")):
        o = run_json(capsys, "estimate", "--config", config, "--precision", precision, "--mode", "train",
                     "--seq-len", "1024", "--budget", "6GiB")[0]
        assert o["breakdown"]["fragmentation"]["attention_scores"] == 0
        assert o["fragmentation_bytes"] == sum(o["breakdown"]["fragmentation"].values())
        if precision == "bf16":  # nothing upcast, nothing freed
            assert o["breakdown"]["fragmentation"]["upcast"] == 0
    # the upcast's hole: phi-4-mini's tied 200k x 3072 embedding leaves 1.15 GiB of bf16 behind; a
    # short step's transients fill little of it, a long one's all of it
    phi = model_shape("phi-4-mini")
    hole = block_rounded(phi.embedding_params * 2)
    for seq, filled in ((192, False), (2048, True)):
        o = run_json(capsys, "estimate", "--config", "phi-4-mini", "--precision", "nf4-dq", "--mode", "train",
                     "--lora-targets", "all-linear", "--lora-r", "32", "--optimizer", "adamw_8bit",
                     "--seq-len", str(seq), "--budget", "6GiB")[0]
        b = o["breakdown"]
        transients = o["peak_bytes"] - b["weights"] - b["lora_weights"] - b["optimizer_states"]
        assert b["fragmentation"]["upcast"] == int(E.REALLOCATED_HOLES["upcast"] * max(0, hole - transients))
        assert (b["fragmentation"]["upcast"] == 0) is filled, seq
        if not filled:
            assert "the embedding's freed bf16 copy" in o["verdict"]
    # an 8-bit optimizer's states are a quarter of AdamW's: less room kept for them
    eight = run_json(capsys, "estimate", "--config", "llama-3.2-1b", "--precision", "nf4-dq", "--mode", "train",
                     "--seq-len", "1024", "--optimizer", "adamw_8bit")[0]
    assert 0 < eight["breakdown"]["fragmentation"]["optimizer_states"] < holes["optimizer_states"]
    plan = run_json(capsys, "plan", "--config", "llama-3.2-1b", "--budget", "6GiB", "--train", "--no-replay", "--precision", "nf4-dq")
    p = plan["plans"][0]
    assert p["limited_by"] == "memory" and "kept free for the holes" in p["reason"]
    # the limit is where peak + allowance stops fitting, not the bare peak
    at = E.estimate(shape, E.Query("nf4-dq", "train", seq_len=p["max_seq_len"] + 1))
    assert not B.fits(at.planned_bytes, plan["budget_bytes"], plan["context_bytes"], p["headroom"])
    assert B.fits(at.peak_bytes, plan["budget_bytes"], plan["context_bytes"], p["headroom"])


def test_a_training_verdict_near_the_line_says_it_is_tight(capsys):
    """Within budget.TRAIN_VERDICT_UNCERTAINTY of the usable bytes (where the measured training
    runs went either way) the verdict keeps its answer and says how near the line it is; further
    away, and for inference, it says nothing more."""
    from harness.memory.fit import budget as B

    seen = set()
    for seq in range(500, 1001, 50):
        o = run_json(capsys, "estimate", "--config", "llama-3.2-1b", "--precision", "nf4-dq", "--mode", "train",
                     "--seq-len", str(seq), "--batch", "2", "--budget", "6GiB")[0]
        planned = o["peak_bytes"] + o["fragmentation_bytes"]
        margin = B.usable_for_peak(o["budget_bytes"], o["context_bytes"], B.default_headroom("train")) / planned - 1
        tight = abs(margin) <= B.TRAIN_VERDICT_UNCERTAINTY
        seen.add(tight)
        assert ("; tight: " in o["verdict"]) is tight, (seq, margin, o["verdict"])
        assert o["fits"] is (margin >= 0)
        if tight:
            assert f"{abs(margin):.1%} {'under' if margin >= 0 else 'over'} the line" in o["verdict"]
    assert seen == {True, False}  # the lengths span both
    o = run_json(capsys, "estimate", "--config", "llama-3.2-1b", "--precision", "bf16", "--mode", "prefill",
                 "--seq-len", "131072", "--budget", "6GiB")[0]
    assert "tight" not in o["verdict"]


def test_a_refusal_that_expandable_segments_would_let_run_says_so(capsys):
    """A training step refused for the holes the default allocator keeps, whose peak + 2% fits,
    names PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; `fits_expandable_segments` says the
    same in JSON at every length, and inference has no such field."""
    from harness.memory.fit import budget as B

    said = set()
    for seq in range(128, 1025, 64):
        o = run_json(capsys, "estimate", "--config", "phi-4-mini", "--precision", "nf4-dq", "--mode", "train",
                     "--lora-targets", "all-linear", "--lora-r", "32", "--optimizer", "adamw_8bit",
                     "--seq-len", str(seq), "--budget", "6GiB")[0]
        usable = B.usable_for_peak(o["budget_bytes"], o["context_bytes"], B.EXPANDABLE_TRAIN_RESERVE)
        assert o["fits_expandable_segments"] is (o["peak_bytes"] <= usable), seq
        note = "with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True it fits" in o["verdict"]
        assert note is (not o["fits"] and o["fits_expandable_segments"]), (seq, o["verdict"])
        said.add((o["fits"], o["fits_expandable_segments"]))
    assert said == {(True, True), (False, True), (False, False)}  # the lengths span all three
    o = run_json(capsys, "estimate", "--config", "phi-4-mini", "--precision", "nf4-dq", "--mode", "prefill",
                 "--seq-len", "1024", "--budget", "6GiB")[0]
    assert "fits_expandable_segments" not in o and "expandable" not in o["verdict"]


def test_plan_train_gives_the_limits_with_expandable_segments_too(capsys):
    """The longest context and largest batch with expandable segments are where that verdict
    (budget.fits_expandable) turns: the step at the limit fits, one token or one sequence more does
    not; never shorter than the default allocator's; absent outside training."""
    from harness.memory.fit.shape import model_shape

    out = run_json(capsys, "plan", "--config", "qwen3-1.7b", "--train", "--no-replay", "--precision", "nf4-dq,bf16",
                   "--budget", "6GiB", "--batch-seq-len", "256")
    shape = model_shape("qwen3-1.7b")
    for p in out["plans"]:
        seq, batch = p["max_seq_len_expandable"], p["max_batch_expandable"]
        assert seq >= p["max_seq_len"] and batch >= p["max_batch"], p
        step = lambda s, b: E.estimate(shape, E.Query(  # noqa: E731
            p["precision"], "train", seq_len=s, batch=b, lora_r=out["lora_r"], lora_targets=tuple(out["lora_targets"]),
            optimizer=out["optimizer"], grad_checkpointing=out["grad_checkpointing"]))
        ok = lambda s, b: B.fits_expandable(step(s, b), out["budget_bytes"], out["context_bytes"])  # noqa: E731
        assert ok(seq, 1) and not ok(seq + 1, 1), (p["precision"], seq)
        assert ok(256, batch) and not ok(256, batch + 1), (p["precision"], batch)
    served = run_json(capsys, "plan", "--config", "qwen3-1.7b", "--precision", "nf4-dq", "--budget", "6GiB")
    assert all(p["max_seq_len_expandable"] is None for p in served["plans"])
    main(["plan", "--config", "qwen3-1.7b", "--train", "--no-replay", "--precision", "nf4-dq", "--budget", "6GiB"])
    assert re.search(r"with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True .*: nf4-dq \d+ tokens", capsys.readouterr().out)


def test_plan_ends_with_its_verdict_and_the_exit_code_agrees(capsys):
    assert main(["plan", "--config", "qwen2.5-1.5b", "--budget", "6GiB", "--precision", "fp32,nf4-dq"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "verdict: fits (nf4-dq)"
    assert main(["plan", "--config", "qwen2.5-7b", "--budget", "6GiB", "--precision", "fp32,bf16"]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "verdict: does not fit at any precision asked (fp32, bf16)"
