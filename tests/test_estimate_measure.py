"""The memory tracker and the budget helpers on a CPU-only machine: they report what they can."""

from __future__ import annotations

import pytest

from harness.memory.fit.budget import fits, plan
from harness.memory.fit.shape import model_shape
from harness.errors import UsageError


# Run in a fresh process: in a pytest worker two other things move the resident size while the block
# is held. A worker of 2 GiB has hundreds of MiB of file-backed pages that the kernel reclaims when CI's
# vLLM servers press on memory (once 64 MiB touched showed +8 MiB), and threads left by earlier tests
# free memory of their own. A fresh process has a few MiB of file pages and no other threads, and the
# box has no swap, so the touched block can only show.
_RSS_PROBE = """
import json, mmap, time
from harness.memory.tracking.measure import MemoryTracker
with MemoryTracker("cpu", interval_s=0.002) as t:
    block = mmap.mmap(-1, 64 * 2**20)
    block.write(b"\\1" * len(block))
    seen, waited = t.rss_samples, time.monotonic()
    while t.rss_samples < seen + 2 and time.monotonic() - waited < 30:
        time.sleep(0.01)
    block.close()
r = t.result
print(json.dumps({k: getattr(r, k) for k in (
    "peak_bytes", "nvml_peak_bytes", "host_rss_samples", "host_rss_peak_bytes",
    "host_rss_start_bytes", "seconds")}))
"""


def test_tracker_on_cpu_reports_host_rss_peak():
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _RSS_PROBE], capture_output=True, text=True,
                          timeout=120, check=True)
    r = json.loads(done.stdout.strip().splitlines()[-1])
    assert r["peak_bytes"] is None and r["nvml_peak_bytes"] is None  # nothing to read on a CPU
    assert r["host_rss_samples"] >= 2, "the sampler never ran in 30 s"
    assert r["host_rss_peak_bytes"] >= r["host_rss_start_bytes"] + 48 * 2**20
    assert r["seconds"] > 0


def test_fits_accounts_context_and_headroom():
    gib = 2**30
    assert fits(5 * gib, 6 * gib, context_bytes=400 * 2**20, headroom=0.05)
    assert not fits(int(5.5 * gib), 6 * gib, context_bytes=400 * 2**20, headroom=0.05)


def test_plan_rejects_budget_below_context():
    with pytest.raises(UsageError, match="CUDA context"):
        plan(model_shape("qwen2.5-0.5b"), 100 * 2**20)
