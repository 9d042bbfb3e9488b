"""safetensors headers: parsed from the first bytes only, every damage named."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from hypothesis import given, settings as hsettings, strategies as st
from safetensors.torch import save_file

from harness.modeldir.paths import DirView
from harness.modeldir.safetensors_header import HeaderProblem, read_header


def _write_valid(path):
    save_file({"a": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(5, dtype=torch.bfloat16)},
              str(path), metadata={"format": "pt"})
    return path


def _parse(path):
    view = DirView.open(path.parent)
    with view.open_binary(path.name) as fh:
        return read_header(fh, path.stat().st_size), view.bytes_read


def _problem(path) -> str:
    with pytest.raises(HeaderProblem) as info:
        _parse(path)
    return info.value.code


def _raw(path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def test_valid_header_reads_only_the_header(tmp_path):
    path = _write_valid(tmp_path / "model.safetensors")
    header, read = _parse(path)
    assert header.tensors["a"].shape == (3, 4) and header.tensors["b"].dtype == "BF16"
    assert header.metadata == {"format": "pt"}
    assert read == 8 + header.header_len  # not one byte of tensor data


def test_truncated_and_trailing(tmp_path):
    path = _write_valid(tmp_path / "model.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    assert _problem(path) == "safetensors.truncated"
    path.write_bytes(data + b"\0")
    assert _problem(path) == "safetensors.trailing_bytes"
    path.write_bytes(data[:5])
    assert _problem(path) == "safetensors.truncated"


@hsettings(max_examples=40, deadline=None)
@given(cut=st.integers(min_value=1, max_value=200))
def test_any_truncation_is_detected(tmp_path_factory, cut):
    path = _write_valid(tmp_path_factory.mktemp("cut") / "model.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: max(0, len(data) - cut)])
    with pytest.raises(HeaderProblem):
        _parse(path)


def test_lfs_pointer_and_html_are_named(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:4d7a\nsize 1340000\n")
    assert _problem(path) == "safetensors.lfs_pointer"
    path.write_text("<!DOCTYPE html><html><body>Sign in to continue</body></html>")
    assert _problem(path) == "safetensors.html_page"
    path.write_bytes(struct.pack("<Q", 2**40) + b"\x00" * 64)
    assert _problem(path) == "safetensors.header_too_large"


def test_header_damage(tmp_path):
    path = tmp_path / "model.safetensors"
    blob = b"{not json"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    assert _problem(path) == "safetensors.header_invalid"
    _raw(path, {"w": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
    assert _problem(path) == "safetensors.unknown_dtype"
    _raw(path, {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4)
    assert _problem(path) == "safetensors.bad_offsets"  # 2 floats need 8 bytes
    _raw(path, {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "v": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12)
    assert _problem(path) == "safetensors.bad_offsets"  # a gap
    _raw(path, {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "v": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8)
    assert _problem(path) == "safetensors.bad_offsets"  # an overlap


def test_multi_gb_header_check_reads_no_data(tmp_path):
    """A 4 GiB (sparse) shard: the header is checked, no tensor byte read (the time it takes is
    benchmarks/pickle/scan_time.py's and suites/timings' to measure, not a test's)."""
    rows = 4 * 2**30 // (4096 * 2)
    header = {"w": {"dtype": "BF16", "shape": [rows, 4096], "data_offsets": [0, rows * 4096 * 2]}}
    blob = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        fh.truncate(8 + len(blob) + rows * 4096 * 2)
    parsed, read = _parse(path)
    assert parsed.tensors["w"].shape == (rows, 4096)
    assert read == 8 + len(blob)
    assert os.stat(path).st_size > 4 * 2**30
