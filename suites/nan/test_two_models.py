"""Two models on one small GPU: resident or switched within a VRAM budget, the load-order
experiment, and the KV-cache handoff race between two CUDA streams (issue 5, case 6 on a GPU).
GPU only: on a CPU machine these skip with the probe's reason (case 6's CPU half is in
test_faults.py)."""

from __future__ import annotations

import pytest
import torch

from harness import nan
from harness.nan.lora import attach_lora, lora_config
from harness.models import load_model, save_random_model
from harness.nan.twomodels import TwoModelManager, emulate_budget, handoff_race, load_order_experiment, usable_budget
from harness.units import format_bytes, parse_bytes

pytestmark = pytest.mark.gpu
DEVICE = "cuda:0"
TABLE = "Two models on one GPU"


@pytest.fixture(scope="session")
def budget(settings) -> int:
    return settings.vram_budget or parse_bytes("6GiB")


@pytest.fixture(scope="session")
def reference_dirs(tmp_path_factory):
    """Random-weight bf16 copies of three reference architectures, on disk (loads are real)."""
    dirs = {}

    def get(name: str):
        if name not in dirs:
            print(f"[harness] writing random {name} (bf16) ...", flush=True)
            dirs[name] = save_random_model(name, tmp_path_factory.mktemp(name), dtype="bf16", device=DEVICE)
            torch.cuda.empty_cache()
        return dirs[name]

    return get


def _loader(path):
    return lambda: load_model(path, "bf16", DEVICE)


def _forward_ok(model) -> bool:
    ids = torch.randint(0, 1000, (1, 16), device=DEVICE)
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return bool(torch.isfinite(logits).all())


def _run_pair(names, reference_dirs, budget, record, expected_mode):
    loaders = {name: _loader(reference_dirs(name)) for name in names}
    with emulate_budget(budget, DEVICE):
        manager = TwoModelManager(loaders, device=DEVICE, budget_bytes=budget)
        try:
            manager.measure()
            assert manager.mode == expected_mode, {n: format_bytes(f.bytes) for n, f in manager.footprints.items()}
            for name in (*names, *names):  # A, B, A, B: in switch mode, three switches after the first load
                assert _forward_ok(manager.get(name))
        finally:
            manager.close()
    cap = usable_budget(budget, DEVICE)
    for event in manager.events:
        assert event.peak_bytes <= cap
        record.row(TABLE, {"pair": " + ".join(names), "mode": manager.mode, "load": event.to,
                           "released": ", ".join(event.released) or "-", "latency_s": round(event.latency_s, 3),
                           "release_s": round(event.release_s, 3), "peak": format_bytes(event.peak_bytes),
                           "reserved": format_bytes(event.reserved_bytes), "budget": format_bytes(budget)})
    record(mode=manager.mode, footprints={n: f.bytes for n, f in manager.footprints.items()},
           switches=[(e.to, e.latency_s, e.peak_bytes) for e in manager.events])
    return manager


def test_two_models_resident_when_they_fit(reference_dirs, budget, record):
    manager = _run_pair(("qwen2.5-0.5b", "qwen2.5-1.5b"), reference_dirs, budget, record, "resident")
    assert len(manager.events) == 2  # each loaded once, never released


def test_two_models_switched_when_they_do_not_fit(reference_dirs, budget, record):
    manager = _run_pair(("qwen2.5-1.5b", "smollm2-1.7b"), reference_dirs, budget, record, "switch")
    assert len(manager.events) == 4 and all(e.released for e in manager.events[1:])


def test_load_order_large_first_vs_small_first(reference_dirs, budget, record):
    large, small = reference_dirs("smollm2-1.7b"), reference_dirs("qwen2.5-0.5b")
    results = load_order_experiment(_loader(large), _loader(small), DEVICE, budget_bytes=budget)
    assert [r.order for r in results] == ["large-first", "small-first"]
    for r in results:
        assert r.oom is None, r.oom
        record.row("Load order (smollm2-1.7b + qwen2.5-0.5b, bf16)", {
            "order": r.order, "peak": format_bytes(r.peak_bytes), "allocated": format_bytes(r.allocated_bytes),
            "reserved": format_bytes(r.reserved_bytes), "fragmentation": format_bytes(r.fragmentation_bytes),
            "after a switch cycle: reserved": format_bytes(r.cycle_reserved_bytes),
            "after a switch cycle: fragmentation": format_bytes(r.cycle_fragmentation_bytes)})
    record(load_order={r.order: {"peak": r.peak_bytes, "fragmentation": r.fragmentation_bytes,
                                 "cycle_fragmentation": r.cycle_fragmentation_bytes} for r in results})


def test_case6_stream_race_contaminates_cache_and_sync_fixes_it(tiny_model_dir, record):
    model_a = load_model(tiny_model_dir, "fp32", DEVICE)
    # model B: a fine-tune of the same base (adapter on q/o/MLP, merged) reusing A's prompt cache
    tuned = attach_lora(load_model(tiny_model_dir, "fp32", DEVICE),
                        lora_config(r=8, targets=("q_proj", "o_proj", "up_proj"), dropout=0.0), init_nonzero=True)
    model_b = tuned.merge_and_unload().eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 2000, (4, 264), generator=generator).to(DEVICE)
    prefix, following = ids[:, :256], ids[:, 256:]

    results = {sync: handoff_race(model_a, model_b, prefix, following, sync=sync)
               for sync in ("none", "wait_stream", "event")}
    race = results["none"]
    assert race.cache_findings, "no contamination seen: the race did not happen"
    assert not race.matches_reference
    for sync in ("wait_stream", "event"):
        assert results[sync].cache_findings == [] and results[sync].matches_reference, results[sync]
    for sync, r in results.items():
        record.row("Stream race (KV-cache handoff between two models)", {
            "synchronisation": sync, "cache findings": len(r.cache_findings),
            "first": r.cache_findings[0].describe() if r.cache_findings else "-",
            "non-finite logits": r.nonfinite_logits, "max |diff| vs reference": r.max_abs_diff,
            "verdict": "clean" if r.matches_reference else "contaminated"})
    record(race_findings=[f.describe() for f in race.cache_findings][:4])
    assert {f.kind for f in race.cache_findings} == {"key", "value"}
    assert isinstance(race.cache_findings[0], nan.CacheFinding)
