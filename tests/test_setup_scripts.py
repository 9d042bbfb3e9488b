"""scripts/lib.sh: the set-up refuses in one line when the disk cannot hold what it would install."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "scripts" / "lib.sh"


@pytest.fixture
def checkout(tmp_path):
    """A checkout root with no venvs yet: lib.sh stamps .venv with pyproject.toml's hash."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _check_disk(root: Path, free_mb: int, browser: bool = True) -> subprocess.CompletedProcess:
    script = f"""
        source {LIB}
        ROOT={root}
        free_mb() {{ echo {free_mb}; }}
        have_browser() {{ {"true" if browser else "false"}; }}
        check_disk_space
    """
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def _stamp_everything(root: Path) -> None:
    """Stamps saying every venv is up to date, written by lib.sh's own stamp functions."""
    script = f"""
        source {LIB}
        ROOT={root}
        stamp() {{ mkdir -p "$1" && echo "$2" > "$1/.harness-stamp"; }}
        stamp "$ROOT/.venv" "$(harness_stamp)"
        for v in $VLLM_VERSIONS; do stamp "$ROOT/.venvs/vllm-$v" "$(vllm_stamp "$v")"; done
        stamp "$ROOT/.venvs/llmcompressor" "$(llmcompressor_stamp)"
        stamp "$ROOT/.venvs/scanners" "$SCANNERS_STAMP"
        stamp "$ROOT/.venv/.smollm2" "$SMOLLM2_WHEEL"
    """
    subprocess.run(["bash", "-c", script], check=True, timeout=30)


def test_fresh_checkout_on_a_small_disk_is_refused_in_one_line(checkout):
    result = _check_disk(checkout, free_mb=5000, browser=False)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "not enough disk" in lines[0] and "5.0 GB is" in lines[0]


def test_fresh_checkout_on_a_large_disk_goes_ahead(checkout):
    result = _check_disk(checkout, free_mb=200_000)
    assert result.returncode == 0, result.stderr


def test_venvs_already_built_need_only_room_for_the_test_run(checkout):
    _stamp_everything(checkout)
    assert _check_disk(checkout, free_mb=3000).returncode == 0  # a fresh set-up needs ~10 GB
    result = _check_disk(checkout, free_mb=500)
    assert result.returncode == 1 and "need about 1.0 GB" in result.stderr
    result = _check_disk(checkout, free_mb=500, browser=False)  # Chromium still to install
    assert result.returncode == 1 and "need about 1.7 GB" in result.stderr
