"""What `explain` is given, read bounded and decoded tolerantly: a cap with the tail kept and said,
devices and endless streams, UTF-16 as PowerShell saves it, a UTF-8 BOM, CRLF, colours, empty input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.explain import explain
from harness.explain.reading import MAX_BYTES, decode
from harness.explain.text import condense

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 546.00 MiB. GPU 0 has a total capacity of "
       "15.77 GiB of which 514.19 MiB is free.")


def run(*args, stdin=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "harness", "explain", *args], stdin=stdin, capture_output=True,
                          timeout=timeout)


def _one_line_bad(proc, needle):
    err = proc.stderr.decode()
    assert proc.returncode == 2 and needle in err and "Traceback" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize("encoding, bom", [("utf-16-le", "\ufeff"), ("utf-16-le", ""), ("utf-16-be", "\ufeff"),
                                           ("utf-8", "\ufeff"), ("utf-8", "")])
def test_encodings_and_crlf_give_the_same_answer(tmp_path, encoding, bom):
    log = tmp_path / "log.txt"
    log.write_bytes((bom + "Loading model\r\n\x1b[31m" + OOM + "\x1b[0m\r\n").encode(encoding))
    proc = run(str(log), "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["kind"] == "cuda_oom"
    assert out["figures_from_log"]["tried"] == 546 * 1024**2 and out["input"]["encoding"].startswith(encoding[:6])


def test_dev_zero_is_refused_after_a_bounded_read():
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    _one_line_bad(run("/dev/zero", timeout=30), "binary")
    with open("/dev/zero", "rb") as zero:
        _one_line_bad(run("-", stdin=zero, timeout=30), "binary")


def test_an_endless_stream_is_cut_and_said(tmp_path):
    producer = subprocess.Popen(["yes", OOM], stdout=subprocess.PIPE)
    try:
        proc = run("-", stdin=producer.stdout, timeout=60)
    finally:
        producer.kill()
        producer.wait()
    lines = proc.stdout.decode().splitlines()
    assert proc.returncode == 0 and lines[0].startswith("read: stdin did not end after 64 MiB")
    assert lines[1].startswith("cuda_oom:")


def test_a_log_over_the_cap_is_read_from_its_tail_and_says_so(tmp_path):
    log = tmp_path / "big.log"
    with log.open("w") as handle:
        handle.write("KeyError: 'input_ids' in the first line, far outside the cap\n")
        line = "{'loss': 1.2345, 'learning_rate': 2e-05, 'epoch': 0.5}\n"
        handle.write(line * (MAX_BYTES // len(line) + 1000))
        handle.write(OOM + "\n")
    proc = run(str(log), "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["kind"] == "cuda_oom"
    assert out["input"]["bytes_kept"] <= MAX_BYTES and out["input"]["bytes_total"] > MAX_BYTES
    assert "explained its last 8 MiB" in out["input"]["cut"]


@pytest.mark.parametrize("data, needle", [(b"", "empty"), (b" \r\n\t\n", "empty"), ("\ufeff\r\n".encode("utf-16-le"),
                                                                                     "empty"),
                                          (b"\x00" * 4096, "binary"), (bytes(range(128, 256)) * 64, "not text")])
def test_bad_input_is_one_line(tmp_path, data, needle):
    path = tmp_path / "x.log"
    path.write_bytes(data)
    _one_line_bad(run(str(path)), needle)


def test_decode_refuses_nul_bytes_that_are_not_utf16():
    with pytest.raises(Exception, match="binary"):
        decode(b"PK\x03\x04\x00\x00\x00\x00" + b"\x00\x01" * 3 + bytes(range(256)), "x")


def test_condense_keeps_the_error_lines_before_the_tail():
    routine = "{'loss': 1.2345, 'learning_rate': 2e-05, 'epoch': 0.5}\n" * 40_000
    text = "Driver/library version mismatch\n" + routine + OOM + "\n"
    short = condense(text)
    assert len(short) < 300_000 and short.startswith("Driver/library version mismatch") and short.endswith(OOM + "\n")
    result = explain(text)
    assert {result.kind, *(a["kind"] for a in result.also)} == {"cuda_oom", "driver_cuda_mismatch"}
