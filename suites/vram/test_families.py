"""The families people fine-tune now (issue 27), against the H200 run of benchmarks/vram/families.py
committed under benchmarks/vram/measured-families/: every figure is recomputed from the rows with
the estimator as it is now. qwen3-1.7b and phi-4-mini never informed a term (held out); the
Gemma terms come from the modeling code, not from these rows.

Skipped while the run's rows are not committed (the H200 results arrive after the code)."""

from __future__ import annotations

import pytest

from harness.memory import families_truth as T

MEDIAN_GOAL = 0.02  # issue 27: per family, inference and training (checkpointing on and off apart)
WORST_GOAL = 0.05
UNDER_GOAL = -0.03  # no under-prediction beyond 3%: the direction that makes a predicted fit OOM
AGREEMENT = 0.95
MIN_BOUNDARY = 20


@pytest.fixture(scope="module")
def summary():
    if not T.row_files():
        pytest.skip(f"no rows under {T.FAMILIES_DIR.relative_to(T.FAMILIES_DIR.parents[2])}/rows: the H200 run "
                    "(scripts/gpu/families.sh) is not committed yet")
    return T.evaluate_families()


def _tables(summary):
    return (("inference", summary.inference), ("training with checkpointing", summary.train_gc),
            ("training without checkpointing", summary.train_nogc))


def test_every_family_within_the_goals(summary, record):
    misses = []
    for title, table in _tables(summary):
        for arch, st in table.items():
            if st is None:
                continue
            record.row("families", {"what": title, "arch": arch, "held_out": arch in T.HELD_OUT, **st.as_dict()})
            if st.median > MEDIAN_GOAL or st.worst > WORST_GOAL or st.worst_under < UNDER_GOAL:
                misses.append(f"{title} {arch}: median {st.median:.1%}, worst {st.worst:.1%}, "
                              f"worst under {st.worst_under:.1%}")
    record(lines=T.summary_lines(summary))
    assert summary.inference or summary.train_gc, "the committed run holds no usable rows"
    assert not misses, "; ".join(misses)


def test_plan_train_agrees_with_real_oom_under_6gib(summary, record):
    b = summary.boundary
    record(boundary_cases=len(b), agreement=summary.agreement, false_fits=len(summary.false_fits))
    assert len(b) >= MIN_BOUNDARY, f"only {len(b)} boundary cases came back"
    assert not summary.false_fits, [(r["arch"], r["seq_len"], r["batch"]) for r in summary.false_fits]
    assert summary.agreement >= AGREEMENT
