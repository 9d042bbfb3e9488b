"""The meta-device count kept on disk (harness/memory/fit/meta_count.py over harness/disk_cache.py):
another process asking for the same config reads the count without importing torch and gets the
same shape; another version of torch or transformers, or of the counting code, counts again; a
file that cannot be read is counted over; the cache can be turned off."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from harness import disk_cache
from harness.memory.fit import meta_count
from harness.memory.fit.config_file import load_config

ROOT = Path(__file__).resolve().parents[1]
# An architecture the estimator has no layout rule for: its shape comes from the meta device.
_OLMO3 = load_config("olmo-3-7b")[0]
CONFIG = {**_OLMO3, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "layer_types": _OLMO3["layer_types"][:2]}
SHAPE = ("import json, sys; from dataclasses import asdict; from harness.memory.fit.shape import model_shape; "
         "shape = model_shape(json.loads(sys.argv[1])); "
         "print(json.dumps({'torch': 'torch' in sys.modules, 'shape': asdict(shape)}))")


def _shape_in_a_new_process(cache: Path, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", SHAPE, json.dumps(CONFIG)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={"PATH": "/usr/bin:/bin", "HARNESS_CACHE_DIR": str(cache), **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _stored(cache: Path) -> list[Path]:
    return sorted((cache / "meta-counts").glob("*.json.gz"))


def test_a_second_process_reads_the_count_without_torch_and_gets_the_same_shape(tmp_path):
    first = _shape_in_a_new_process(tmp_path)
    assert first["torch"] and first["shape"]["source"] == "meta" and len(_stored(tmp_path)) == 1
    second = _shape_in_a_new_process(tmp_path)
    assert not second["torch"]  # read back: neither torch nor transformers imported
    assert second["shape"] == first["shape"]


def test_turned_off_it_neither_reads_nor_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    tally, layout = meta_count.count_on_meta(CONFIG)
    (path,) = _stored(tmp_path)
    path.write_bytes(gzip.compress(json.dumps({"tally": {**tally.to_json(), "emb": 1}, "cache": []}).encode()))
    assert meta_count.count_on_meta(CONFIG)[0].emb == 1  # read back: a planted count proves the read
    monkeypatch.setenv("HARNESS_META_CACHE", "0")
    again, layout_again = meta_count.count_on_meta(CONFIG)
    assert again.to_json() == tally.to_json() and layout_again == layout  # counted, not read
    assert json.loads(gzip.decompress(path.read_bytes()))["tally"]["emb"] == 1  # and not written


def test_other_versions_or_counting_code_count_again(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    key = meta_count._CACHE.key(CONFIG, meta_count._COUNTING_CODE)
    assert meta_count._CACHE.key(dict(reversed(list(CONFIG.items()))), meta_count._COUNTING_CODE) == key
    changed = tmp_path / "cache_layout.py"
    changed.write_text(meta_count._COUNTING_CODE[1].read_text() + "\n# edited\n")
    assert meta_count._CACHE.key(CONFIG, (meta_count._COUNTING_CODE[0], changed)) != key
    real = disk_cache.versions(("torch", "transformers"))
    monkeypatch.setattr(disk_cache, "versions", lambda packages: {**real, "transformers": "0.0.1"})
    assert meta_count._CACHE.key(CONFIG, meta_count._COUNTING_CODE) != key


@pytest.mark.parametrize("content", [b"not gzip", gzip.compress(b"{\"tally\": {\"linears\": 3}, \"cache\": []}")],
                         ids=["not-gzip", "foreign-format"])
def test_an_unreadable_or_foreign_file_is_counted_over(tmp_path, monkeypatch, content):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path))
    tally, layout = meta_count.count_on_meta(CONFIG)
    (path,) = _stored(tmp_path)
    path.write_bytes(content)
    again, layout_again = meta_count.count_on_meta(CONFIG)
    assert again.to_json() == tally.to_json() and layout_again == layout
    stored = json.loads(gzip.decompress(path.read_bytes()))
    assert stored["tally"] == tally.to_json() and stored["cache"] == [asdict(layer) for layer in layout]
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left beside it
