"""plan --train traces its first lengths side by side in forked copies of the process
(harness.memory.replay.side_by_side): each copy's result comes back, an exception in a copy is
its result, an exception here leaves no copy running, and the limits are the ones a single
process finds tracing one length after another."""

import os
import sys
import time
from dataclasses import replace

import pytest

from harness.memory.replay.side_by_side import ForkedError, side_by_side

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork: Linux only")


def test_each_copy_sends_back_its_result_or_its_exception():
    here, (a, b, c) = side_by_side(os.getpid, [os.getpid, lambda: 1 // 0, lambda: (lambda: 0)])
    assert here == os.getpid() and isinstance(a, int) and a != here  # run in another process
    assert isinstance(b, ZeroDivisionError)
    assert isinstance(c, ForkedError) and "pickle" in str(c).lower()  # a result that cannot travel, said


def test_a_copy_runs_torch_cpu_kernels_after_the_parent_started_its_threads():
    """The parent ran a parallel CPU kernel before the fork (an OpenMP team the copy does not
    have): the copy's own parallel kernel must not wait on it for ever (plan_verdicts' pool workers
    hung there), and nothing times out."""
    torch = pytest.importorskip("torch")
    if torch.get_num_threads() < 2:
        torch.set_num_threads(2)
    big = 1 << 22
    assert float(torch.ones(big).add_(1).sum()) == 2 * big  # the team exists now
    _, (value,) = side_by_side(lambda: None, [lambda: float(torch.ones(big).add_(1).sum())])
    assert value == 2 * big


def test_an_exception_here_leaves_no_copy_running(tmp_path):
    pid_file = tmp_path / "pid"

    def copy():
        pid_file.write_text(str(os.getpid()))
        time.sleep(600)

    def here():
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.01)
        raise KeyError("stop")

    with pytest.raises(KeyError):
        side_by_side(here, [copy])
    with pytest.raises(ProcessLookupError):  # killed and reaped, not left behind as a zombie
        os.kill(int(pid_file.read_text()), 0)


def test_limits_are_the_same_traced_side_by_side_or_one_after_another(tmp_path, monkeypatch):
    """The tiny Llama of test_replay_limits on a 1400 MiB card: the context limit at batch 1 and
    every setting's verdict and need, with two processes and with one (the batch axis traces each
    batch it asks for either way)."""
    pytest.importorskip("bitsandbytes")
    pytest.importorskip("peft")
    from harness.memory.fit import budget as B
    from harness.memory.fit.estimate import Query
    from harness.memory.fit.shape import shape_from_config
    from harness.memory.replay.replay_limits import StepReplayer, limit_search
    from test_replay_limits import TINY

    shape = shape_from_config(TINY)
    recipe = Query("nf4-dq", "train", lora_r=8, lora_targets=("q_proj", "v_proj"))
    budget, context = 1400 * 2**20, 400 * 2**20
    (plan,) = B.plan(shape, budget, train=True, precisions=("nf4-dq",), context_bytes=context,
                     reference_seq_len=1024, lora_r=8, lora_targets=recipe.lora_targets, max_seq_len=4096)
    found = {}
    for processes in (2, 1):
        monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / f"cache-{processes}"))  # cold each time
        said = []
        replayer = StepReplayer(TINY, shape, recipe, budget, context, progress=said.append, processes=processes)
        r = limit_search(plan, shape, replayer, "seq_len", lo_seq=B.TRAIN_MIN_SEQ, hi_seq=4096, max_batch=256)
        found[processes] = (r.value, r.closed, [replace(p, seconds=0) for p in r.points])
        assert any("side by side" in s for s in said) == (processes == 2), said
    assert found[2] == found[1]
    assert found[2][0] is not None and found[2][1]  # a closed context limit, not a refusal
