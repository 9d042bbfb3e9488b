"""Nothing outside DIR is ever opened; bad DIRs get a one-line error and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.modeldir import check_dir

from modeldir_helpers import codes, copy_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def good(tiny_model_dir, tmp_path):
    return copy_model(tiny_model_dir, tmp_path / "model")


def _fifo(path: Path) -> Path:
    os.mkfifo(path)  # opening a FIFO for reading blocks: a checker that opens it hangs the test
    return path


@pytest.mark.timeout(60)
def test_symlink_out_of_dir_is_reported_and_never_opened(good, tmp_path):
    outside = _fifo(tmp_path / "outside.safetensors")
    (good / "model.safetensors").unlink()
    (good / "model.safetensors").symlink_to(outside)
    (good / "notes.txt").symlink_to(tmp_path)  # a symlinked folder out of DIR
    report = check_dir(good, deep=True)
    escapes = {f.path for f in report.findings if f.code == "safety.path_escape"}
    assert escapes == {"model.safetensors", "notes.txt"}
    assert not report.ok


@pytest.mark.timeout(60)
def test_index_entries_that_leave_the_dir(good, tmp_path):
    _fifo(tmp_path / "evil.safetensors")
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "../evil.safetensors",
                                             "model.norm.weight": "/etc/passwd"}}
    (good / "model.safetensors").rename(good / "model-00001-of-00001.safetensors")
    (good / "model.safetensors.index.json").write_text(json.dumps(index))
    report = check_dir(good)
    escapes = {f.path for f in report.findings if f.code == "safety.path_escape"}
    assert escapes == {"../evil.safetensors", "/etc/passwd"}


def test_symlink_inside_dir_is_fine(good):
    blobs = good / "blobs"
    blobs.mkdir()
    (good / "model.safetensors").rename(blobs / "abc123")
    (good / "model.safetensors").symlink_to(Path("blobs") / "abc123")
    report = check_dir(good)
    assert report.ok, report.findings


@pytest.mark.timeout(60)
def test_fifo_inside_dir_is_not_opened(good):
    _fifo(good / "pytorch_model.bin")
    report = check_dir(good)
    assert "safety.special_file" in codes(report)


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "harness", "check-dir", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120, **kw)


def test_bad_dirs_one_line_exit_2(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    for target, words in ((tmp_path / "nope", "no such directory"), (tmp_path / "file", "not a directory"),
                          (tmp_path / "empty", "empty")):
        with pytest.raises(UsageError):
            check_dir(target)
        result = _cli(str(target), "--json")
        assert result.returncode == 2, result
        assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr
        assert json.loads(result.stdout)["ok"] is False  # --json always prints JSON (issue 12)
        assert "Traceback" not in result.stderr


def test_unreadable_dir_exit_2(good, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "config.json").write_text("{}")
    locked.chmod(0o700)
    kwargs = {}
    if os.geteuid() == 0:  # root reads anything: check as an unprivileged user
        kwargs["user"] = 65534
        tmp_path.chmod(0o755)
    else:
        locked.chmod(0)
    try:
        result = _cli(str(locked), **kwargs)
    except PermissionError as exc:
        pytest.skip(f"running as root and the unprivileged user cannot run this venv's python: {exc}")
    finally:
        locked.chmod(0o700)
    if "No module named" in result.stderr or "Permission denied" in result.stderr and "harness" not in result.stderr:
        pytest.skip(f"the unprivileged user cannot run the harness here: {result.stderr.strip()[-200:]}")
    assert result.returncode == 2, result.stderr
    assert "permission denied" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_cli_json_contract(good):
    (good / "generation_config.json").unlink()
    result = _cli(str(good), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is True
    assert [f["code"] for f in data["findings"]] == ["generation_config.missing"]
    assert set(data["findings"][0]) >= {"code", "severity", "path", "message"}
    (good / "config.json").unlink()
    result = _cli(str(good), "--json")
    assert result.returncode == 1 and json.loads(result.stdout)["ok"] is False


def test_unlistable_dir_message(tmp_path, monkeypatch):
    """The branch the unprivileged run above covers, for runs where it must skip (root without
    a world-executable venv): listing raises PermissionError -> one clear UsageError."""
    (tmp_path / "config.json").write_text("{}")

    def deny(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(os, "listdir", deny)
    with pytest.raises(UsageError, match="permission denied"):
        check_dir(tmp_path)
