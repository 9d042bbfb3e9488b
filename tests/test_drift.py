"""Drift statistics (llama.cpp's KL summary, top-1, perplexity), the gate, and `harness drift`."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from harness.quant.drift import Gate, drift


def _logits(rows, seq, vocab, seed):
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, seq, vocab, generator=g) * 3


def test_identical_logits_have_no_drift():
    import torch

    ref = _logits(2, 16, 50, 0)
    ids = torch.randint(0, 50, (2, 16))
    d = drift(ref, ref.clone(), ids, gate=Gate(max_mean_kl=1e-9, max_p99_kl=1e-9, min_top1=1.0))
    assert d.ok and d.mean_kl < 1e-12 and d.p99_kl < 1e-12 and d.top1_agreement == 1.0
    assert d.tokens == 2 * 15 and math.isclose(d.ppl_reference, d.ppl_quantized)


def test_kl_statistics_match_a_hand_computation():
    """Two positions over two tokens: KL(p||q) = sum p log(p/q), mean/max/percentiles of those."""
    import torch

    p = torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    q = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    ids = torch.tensor([[0, 1, 0]])
    d = drift(p.log()[None], q.log()[None], ids)  # the last position predicts nothing
    kl0 = 0.9 * math.log(0.9 / 0.6) + 0.1 * math.log(0.1 / 0.4)
    assert math.isclose(d.mean_kl, kl0 / 2, rel_tol=1e-9) and math.isclose(d.max_kl, kl0, rel_tol=1e-9)
    assert d.median_kl == pytest.approx(kl0 / 2) and d.p90_kl == pytest.approx(0.9 * kl0)
    assert d.top1_agreement == 1.0  # argmax 0 at position 0, a tie broken the same way at position 1
    assert d.ppl_reference == pytest.approx(math.exp(-(math.log(0.1) + math.log(0.5)) / 2))


def test_each_gate_limit_fails_on_its_own():
    import torch

    ref = _logits(1, 64, 30, 1)
    quant = ref + torch.randn_like(ref) * 2
    ids = torch.randint(0, 30, (1, 64))
    loose = drift(ref, quant, ids, gate=Gate(max_mean_kl=100, max_p99_kl=100, min_top1=0.0))
    assert loose.ok and loose.failures == []
    for gate, word in [(Gate(max_mean_kl=loose.mean_kl / 2, max_p99_kl=100), "mean KL"),
                       (Gate(max_mean_kl=100, max_p99_kl=loose.p99_kl / 2), "p99 KL"),
                       (Gate(max_mean_kl=100, min_top1=min(1.0, loose.top1_agreement + 0.01)), "top-1")]:
        d = drift(ref, quant, ids, gate=gate)
        assert not d.ok and len(d.failures) == 1 and word in d.failures[0], d.failures
    assert "DRIFTED" in d.verdict()


def test_nan_logits_fail_the_gate():
    import torch

    ref = _logits(1, 8, 10, 2)
    quant = ref.clone()
    quant[0, 3] = float("nan")
    assert not drift(ref, quant, torch.zeros(1, 8, dtype=torch.long)).ok


def _cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "harness", "drift", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def test_bad_usage_is_one_line_and_exit_2(tmp_path, tiny_model_dir):
    (tmp_path / "empty").mkdir()
    short = tmp_path / "short.txt"
    short.write_text("Too short.")
    cases = [
        (tmp_path / "nope", tiny_model_dir),
        (tmp_path / "empty", tiny_model_dir),
        (tiny_model_dir, tiny_model_dir, "--min-top1", "1.5"),
        (tiny_model_dir, tiny_model_dir, "--max-mean-kl", "0"),
        (tiny_model_dir, tiny_model_dir, "--text", tmp_path / "missing.txt"),
        (tiny_model_dir, tiny_model_dir, "--text", short),
    ]
    for args in cases:
        done = _cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr


def _copy(model_dir, where):
    import shutil

    shutil.copytree(model_dir, where)
    return where


def _one_line_exit_2(done, *needles):
    assert done.returncode == 2, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("harness drift: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_the_same_directory_twice_is_refused_at_once(tiny_model_dir, tmp_path):
    """drift DIR DIR would load one model twice and call it no drift: refused before any model runs;
    a link to the same directory is the same directory."""
    (tmp_path / "link").symlink_to(tiny_model_dir)
    for other in (tiny_model_dir, tmp_path / "link"):
        done = _cli(tiny_model_dir, other, timeout=60)
        _one_line_exit_2(done, "the same directory")
        assert "[drift]" not in done.stderr  # no model ran


def test_a_truncated_weights_file_is_one_line_with_a_check_dir_hint(tiny_model_dir, tmp_path):
    """Before: safetensors' SafetensorError as a traceback, exit 1. After: one line naming the file."""
    quant = _copy(tiny_model_dir, tmp_path / "quant")
    weights = quant / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    line = _one_line_exit_2(_cli(tiny_model_dir, quant, timeout=60), "QUANT_DIR", "model.safetensors", "check-dir")
    assert "cut short" in line or "missing" in line
    as_json = _cli(tiny_model_dir, quant, "--json", timeout=60)
    _one_line_exit_2(as_json)
    error = json.loads(as_json.stdout)
    assert error["ok"] is False and error["exit_code"] == 2 and "check-dir" in error["error"]


def test_two_vocabularies_are_refused_before_any_model_runs(tiny_model_dir, tmp_path):
    """Before: both models ran (minutes on a real pair) and then failed on the logits' widths."""
    quant = _copy(tiny_model_dir, tmp_path / "quant")
    config = json.loads((quant / "config.json").read_text())
    config["vocab_size"] += 64
    (quant / "config.json").write_text(json.dumps(config))
    done = _cli(tiny_model_dir, quant, timeout=60)
    _one_line_exit_2(done, "different vocabularies", str(config["vocab_size"]))
    assert "[drift]" not in done.stderr


@pytest.fixture(scope="module")
def perturbed_dir(tiny_model_dir, tmp_path_factory):
    """The tiny model with every Linear's weights scaled by 3: a quantizer with wrong scales."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("perturbed") / "model"
    shutil.copytree(tiny_model_dir, out)
    tensors = load_file(str(out / "model.safetensors"))
    tensors = {k: (v * 3 if "proj" in k else v).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def test_cli_same_model_passes_and_a_broken_one_fails(tiny_model_dir, perturbed_dir, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("The model loads the weights quickly on the cpu, 12 times. Question: why? Answer: the cache! " * 30)
    same = _cli(tiny_model_dir, _copy(tiny_model_dir, tmp_path / "copy"), "--text", text, "--seq-len", "64", "--json")
    assert same.returncode == 0, same.stderr
    data = json.loads(same.stdout)
    assert data["ok"] and data["drift"]["mean_kl"] < 1e-9 and data["drift"]["top1_agreement"] == 1.0
    assert all(a["same"] for a in data["answers"]) and len(data["answers"]) == 6
    broken = _cli(tiny_model_dir, perturbed_dir, "--text", text, "--seq-len", "64", "--max-mean-kl", "0.05")
    assert broken.returncode == 1, broken.stderr
    assert "DRIFTED" in broken.stdout and "greedy answers" in broken.stdout
