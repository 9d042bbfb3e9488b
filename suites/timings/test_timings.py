"""How long do the harness's in-process steps take on this machine? Timed with pytest-benchmark
(a few rounds on the tiny models, so it stays fast on a CPU): model load per precision, a switch
between two models, a check-dir header pass, and a training step with and without the NaN guard.

Not pass/fail thresholds: each test checks the step did its job; the times go to the report's
Timings table. Keep them across runs with `--benchmark-autosave`, compare with
`--benchmark-compare` (pytest-benchmark's own options).
"""

from __future__ import annotations

import itertools
import math

import pytest

pytestmark = pytest.mark.alone  # measures time or contention: scripts/test runs it after the rest, alone

ROUNDS = 3


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8", "nf4"])
def test_model_load(benchmark, tiny_model_dir, device, precision):
    import torch

    from harness.models import bitsandbytes_problem, load_model

    if precision in ("int8", "nf4") and bitsandbytes_problem():
        pytest.skip(bitsandbytes_problem())
    benchmark.group = "model load (tiny qwen2)"
    benchmark.extra_info.update(precision=precision, device=device)

    def load():
        model = load_model(tiny_model_dir, precision, device)
        _sync(device)
        return model

    model = benchmark.pedantic(load, rounds=ROUNDS, iterations=1, warmup_rounds=1)
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]], device=device)).logits
    assert torch.isfinite(logits).all()


def test_two_model_switch(benchmark, tiny_model_dir, tiny_llama_dir, device):
    """Two models that do not fit together: each get() releases one and loads the other."""
    from harness.models import load_model
    from harness.nan.twomodels import TwoModelManager

    loaders = {"tiny-qwen2": lambda: load_model(tiny_model_dir, "fp32", device),
               "tiny-llama": lambda: load_model(tiny_llama_dir, "fp32", device)}
    manager = TwoModelManager(loaders, device=device, headroom_bytes=0)
    footprints = manager.measure()
    manager.budget_bytes = int(1.5 * max(f.bytes for f in footprints.values()))  # room for one, not both
    manager.mode = None
    manager.measure()
    assert manager.mode == "switch"
    names = itertools.cycle(loaders)
    benchmark.group = "two-model switch"
    benchmark.extra_info.update(device=device)

    def switch():
        manager.get(next(names))
        _sync(device)

    try:
        benchmark.pedantic(switch, rounds=4, iterations=1, warmup_rounds=1)
        assert len(manager.resident) == 1
        assert all(e.released for e in manager.events[1:])
    finally:
        manager.close()


def test_check_dir_header_pass(benchmark, tiny_model_dir):
    from harness.modeldir import check_dir

    benchmark.group = "check-dir"
    report = benchmark.pedantic(check_dir, args=(tiny_model_dir,), rounds=2 * ROUNDS, iterations=1, warmup_rounds=1)
    weights = sum(p.stat().st_size for p in tiny_model_dir.glob("*.safetensors"))
    benchmark.extra_info.update(bytes_read=report.bytes_read, weights_bytes=weights)
    assert report.ok, report.findings
    assert report.bytes_read < weights / 4  # headers, not tensors


@pytest.mark.parametrize("guarded", [False, True], ids=["plain", "nan-guard"])
def test_training_step(benchmark, tiny_model_dir, device, tmp_path, guarded):
    """One LoRA step (forward, backward, AdamW) on the tiny model, without and with TrainingGuard:
    the difference is the guard's overhead per step."""
    import torch

    from harness.models import load_model
    from harness.nan import TrainingGuard, lora

    model = lora.attach_lora(load_model(tiny_model_dir, "fp32", device), r=8)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(3, 200, (2, 64), device=device)
    batch = {"input_ids": ids, "labels": ids}
    benchmark.group = "training step (tiny qwen2, LoRA r 8, batch 2 x 64)"
    benchmark.extra_info.update(guarded=guarded, device=device)
    losses = []
    if guarded:
        with TrainingGuard(model, optimizer, save_dir=tmp_path / "guard") as guard:
            def step():
                losses.append(guard.train_step(batch))
                _sync(device)

            benchmark.pedantic(step, rounds=5, iterations=1, warmup_rounds=1)
        assert guard.finding is None
    else:
        def step():
            loss = model(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            _sync(device)

        benchmark.pedantic(step, rounds=5, iterations=1, warmup_rounds=1)
    assert losses and all(math.isfinite(x) for x in losses)
