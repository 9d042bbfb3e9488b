"""check-dir's cost cuts keep every verdict: torch and transformers are imported only when a
directory needs them (a pickle, an architecture or template not seen before), the weight sample
reads values as torch would, and the verdict cache answers only for the inputs it was built on."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from harness.modeldir import check_dir
from harness.modeldir.weight_sample import _as_float32

IMPORTED = ("import sys; from harness.modeldir import check_dir; r = check_dir(sys.argv[1]); "
            "print(int(r.ok), int('torch' in sys.modules), int('transformers' in sys.modules))")


def _check_in_fresh_process(d, cache) -> tuple[int, int, int]:
    env = {**os.environ, "HARNESS_CACHE_DIR": str(cache), "HARNESS_CHECKDIR_CACHE": "1"}
    run = subprocess.run([sys.executable, "-c", IMPORTED, str(d)], capture_output=True, text=True, env=env, check=True)
    ok, torch_in, transformers_in = map(int, run.stdout.split()[-3:])
    return ok, torch_in, transformers_in


def test_a_directory_checked_before_needs_neither_torch_nor_transformers(tiny_model_dir, tmp_path):
    cache = tmp_path / "cache"
    first = _check_in_fresh_process(tiny_model_dir, cache)
    again = _check_in_fresh_process(tiny_model_dir, cache)
    assert first == (1, 0, 1)  # the family rule confirmed the tensors (no torch), the template rendered
    assert again == (1, 0, 0)  # same verdict from the cache; no pickle in the directory: no torch at all


def test_the_cache_answers_only_for_the_config_it_was_built_on(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    assert check_dir(tiny_model_dir).ok
    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] * 2}))
    assert "vocab.config_mismatch" in {f.code for f in check_dir(d).errors}
    (d / "config.json").write_text(json.dumps({**config, "layer_types": ["full_attention"] * 7}))  # refused
    for _ in range(2):  # a refusal is never cached: the second check says it again, in transformers' words
        assert "config.rejected" in {f.code for f in check_dir(d).errors}


def test_a_changed_template_is_rendered_again(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    assert check_dir(tiny_model_dir).ok
    d = tmp_path / "m"
    shutil.copytree(tiny_model_dir, d)
    (d / "chat_template.jinja").write_text("{{ ().__class__.__base__.__subclasses__() }}")
    assert "chat_template.unsafe" in {f.code for f in check_dir(d).errors}


@pytest.mark.parametrize("dtype,name", [(torch.bfloat16, "BF16"), (torch.float16, "F16"), (torch.float32, "F32"),
                                        (torch.float64, "F64")])
def test_sampled_values_read_as_torch_reads_them(dtype, name):
    values = torch.randn(4096, dtype=torch.float64) * 50
    values[[1, 2, 3]] = torch.tensor([float("nan"), float("inf"), -float("inf")], dtype=torch.float64)
    if dtype is torch.float64:
        values[4] = 1e300  # narrowed to float32: Inf, as torch's .float() gives it
    stored = values.to(dtype)
    data = stored.view(torch.int16 if dtype is torch.bfloat16 else dtype).numpy().tobytes()
    want = torch.frombuffer(bytearray(data), dtype=dtype).float().numpy()
    got = _as_float32(data, name)
    assert got.dtype == np.float32 and np.array_equal(got, want, equal_nan=True)
