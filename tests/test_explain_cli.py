"""`python -m harness explain` as outside checks call it: exit codes, the one JSON object, bad usage
in one line without a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.explain import KINDS

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
       "4.00 GiB of which 2.35 GiB is free. Of the allocated memory 825.15 MiB is allocated by PyTorch, and 24.85 MiB "
       "is reserved by PyTorch but unallocated.")


def run(*args, stdin: bytes | None = None):
    return subprocess.run([sys.executable, "-m", "harness", "explain", *args], input=stdin, capture_output=True,
                          timeout=120)


def test_json_is_one_object_with_the_contract_fields(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(OOM)
    proc = run(str(log), "--json")
    assert proc.returncode == 0, proc.stderr
    obj = json.loads(proc.stdout)  # exactly one JSON document
    assert obj["recognised"] is True and obj["kind"] == "cuda_oom" and obj["kind"] in KINDS
    assert isinstance(obj["causes"], list) and {"cause", "evidence"} <= set(obj["causes"][0])
    assert isinstance(obj["fix"], str) and obj["fix"] and "computed" in obj


def test_stdin_and_dash():
    for args in ((), ("-",)):
        proc = run(*args, "--json", stdin=OOM.encode())
        assert proc.returncode == 0 and json.loads(proc.stdout)["kind"] == "cuda_oom"


def test_not_recognised_exits_1_with_null_kind():
    proc = run("-", "--json", stdin=b"everything went fine\n")
    obj = json.loads(proc.stdout)
    assert proc.returncode == 1 and obj["recognised"] is False and obj["kind"] is None and obj["computed"] is None


def test_text_output_names_causes_and_fix():
    proc = run("-", stdin=OOM.encode())
    out = proc.stdout.decode()
    assert proc.returncode == 0 and "likely causes" in out and "fix:" in out and "evidence:" in out
    assert out.strip().splitlines()[-1] == "verdict: recognised as cuda_oom"  # the last line is the verdict
    quiet = run("-", stdin=b"everything went fine\n").stdout.decode().strip().splitlines()
    assert quiet[-1].startswith("not recognised:")


def _bad(proc, needle: str):
    err = proc.stderr.decode()
    assert proc.returncode == 2, err
    assert needle in err and "Traceback" not in err and err.count("\n") == 1


def test_bad_usage(tmp_path):
    _bad(run(str(tmp_path / "missing.log")), "no such file")
    _bad(run(str(tmp_path)), "is a directory")
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x80\x02}q\x00" + bytes(range(256)) * 4)
    _bad(run(str(binary)), "binary")
    garbage = tmp_path / "garbage.txt"
    garbage.write_bytes(bytes(range(128, 256)) * 64)
    _bad(run(str(garbage)), "not text")
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    _bad(run(str(empty)), "empty")
    log = tmp_path / "log.txt"
    log.write_text(OOM)
    _bad(run(str(log), "--gpu-memory", "6G"), "--gpu-memory")
    _bad(run(str(log), "--config", str(tmp_path / "nope")), "--config")
    _bad(run(str(log), "--bogus"), "unrecognized arguments")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path):
    log = tmp_path / "log.txt"
    log.write_text(OOM)
    log.chmod(0)
    _bad(run(str(log)), "permission denied")


def test_a_large_log_is_read_from_its_end(tmp_path):
    log = tmp_path / "big.log"
    with log.open("w") as handle:
        handle.write(("INFO step ok\n" * 200_000))
        handle.write(OOM + "\n")
    proc = run(str(log), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["kind"] == "cuda_oom"


def test_no_file_and_a_terminal_on_stdin_is_bad_usage():
    """With no FILE and stdin a terminal, explain says so instead of waiting for input forever."""
    pty = pytest.importorskip("pty")
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin/stdout are the pseudo-terminal
        os.execv(sys.executable, [sys.executable, "-m", "harness", "explain"])
    out = b""
    try:
        while chunk := os.read(fd, 1024):
            out += chunk
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 2 and b"no input" in out and b"Traceback" not in out
