"""scripts/lib.sh and scripts/setup: the set-up refuses in one line when the disk cannot hold what it
would install or the Python is too old (before uv's resolver can fail in many lines), makes a venv
again when its interpreter changed, and scripts/setup builds only what it is asked for. Nothing is
installed here: fake pythons (scripts that answer as another version) and --dry-run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import settings

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "scripts" / "lib.sh"
PYTHON = sys.executable  # the interpreter the fake venvs below "run on"
VLLM_VENVS = (settings.DEFAULT_VLLM_VENV.name, settings.DEFAULT_BASELINE_VLLM_VENV.name)  # harness/vllm_pins.txt


@pytest.fixture
def checkout(tmp_path):
    """A checkout root with no venvs yet: lib.sh stamps .venv with pyproject.toml's hash."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "harness").mkdir()
    shutil.copy(ROOT / "harness" / "vllm_pins.txt", tmp_path / "harness" / "vllm_pins.txt")  # lib.sh's VLLM_VERSIONS
    return tmp_path


def _check_disk(root: Path, free_mb: int, browser: bool = True) -> subprocess.CompletedProcess:
    script = f"""
        source {LIB}
        ROOT={root}
        free_mb() {{ echo {free_mb}; }}
        PYTHON={PYTHON}
        have_browser() {{ {"true" if browser else "false"}; }}
        check_disk_space
    """
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def _stamp_everything(root: Path) -> None:
    """Stamps saying every venv is up to date, written by lib.sh's own stamp functions."""
    script = f"""
        source {LIB}
        ROOT={root}
        PYTHON={PYTHON}
        stamp() {{ mkdir -p "$1/bin" && echo "$2" > "$1/.harness-stamp" && ln -sf "$PYTHON" "$1/bin/python"; }}
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


# ---- the interpreter ------------------------------------------------------------------------------

def fake_python(path: Path, version: tuple[int, int, int], base: str | None = None) -> Path:
    """A python that runs `-c CODE` with the real interpreter but reports `version` (and, with
    `base`, another base executable, as a venv made by another Python would)."""
    patch = f"sys.version_info = {version + ('final', 0)!r}"
    if base:
        patch += f"; sys._base_executable = {base!r}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"""#!/bin/sh
[ "$1" = -c ] || exit 3
exec {PYTHON} -c "import sys; {patch}
$2"
""")
    path.chmod(0o755)
    return path


def _bash(script: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})), **kw)


@pytest.mark.parametrize("command", [["scripts/check-machine"], ["scripts/setup", "--serving"]])
def test_too_old_python_is_refused_in_one_line_before_any_install(tmp_path, command):
    python310 = fake_python(tmp_path / "python3.10", (3, 10, 12))
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, HARNESS_PYTHON=str(python310)))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert lines == [f"[setup] the harness needs Python >= 3.11; {python310} is 3.10.12: install python3.11 or newer "
                     "(e.g. apt install python3.11 python3.11-venv) and run again with HARNESS_PYTHON=python3.11"]
    assert proc.stdout == ""


def test_missing_python_is_one_line(tmp_path):
    proc = subprocess.run(["scripts/setup"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, HARNESS_PYTHON=str(tmp_path / "python9")))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"[setup] no Python at '{tmp_path / 'python9'}': the harness needs Python >= 3.11 "
        "(set HARNESS_PYTHON=/path/to/python3.11 or newer)"]


def test_venv_made_by_another_interpreter_is_not_current_and_is_made_again(checkout):
    _stamp_everything(checkout)
    venv = checkout / ".venv"
    script = f"""
        source {LIB}
        ROOT={checkout}; PYTHON={PYTHON}
        venv_current "$ROOT/.venv" "$(harness_stamp)" && echo current
        write_stamp "$ROOT/.venv" "$(harness_stamp)" && venv_current "$ROOT/.venv" "$(harness_stamp)" && echo still
        sed -n 2p "$ROOT/.venv/.harness-stamp"
    """
    out = _bash(script).stdout.splitlines()
    assert out[:2] == ["current", "still"] and out[2].startswith("python ") and out[2].split()[-1].count(".") == 2
    # the same venv, its python now a 3.10 (a first run with Ubuntu 22.04's python3 left it so)
    (venv / "bin" / "python").unlink()
    fake_python(venv / "bin" / "python", (3, 10, 12), base="/usr/bin/python3.10")
    script = f"""
        source {LIB}
        ROOT={checkout}; PYTHON={PYTHON}
        venv_current "$ROOT/.venv" "$(harness_stamp)" || echo stale
        drop_foreign_venv "$ROOT/.venv"
        [ -e "$ROOT/.venv" ] || echo removed
    """
    proc = _bash(script)
    assert proc.stdout.splitlines() == ["stale", "removed"]
    assert proc.stderr.startswith("[setup] .venv runs on /usr/bin/python3.10 3.10.12, not on ")
    assert proc.stderr.strip().endswith(": making it again")


def test_venv_of_the_same_interpreter_is_kept(checkout):
    _stamp_everything(checkout)
    proc = _bash(f'source {LIB}; ROOT={checkout}; PYTHON={PYTHON}; drop_foreign_venv "$ROOT/.venv"; ls "$ROOT/.venv"')
    assert proc.returncode == 0 and proc.stderr == "" and "bin" in proc.stdout


# ---- scripts/setup ----------------------------------------------------------------------------

@pytest.fixture
def setup_checkout(checkout):
    """A checkout with the scripts and the harness venv already built (fake: stamp + python link)."""
    shutil.copytree(ROOT / "scripts", checkout / "scripts", ignore=shutil.ignore_patterns("gpu", "*.py"))
    _stamp_everything(checkout)
    for venv in (*VLLM_VENVS, "llmcompressor", "scanners"):
        shutil.rmtree(checkout / ".venvs" / venv)
    return checkout


def _setup(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(root / "scripts" / "setup"), *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, HARNESS_PYTHON=PYTHON))


def test_setup_serving_builds_the_cpu_vllm_venvs_only(setup_checkout):
    assert _setup(setup_checkout, "--dry-run").stdout == "set-up: up to date\n"
    assert _setup(setup_checkout, "--serving", "--dry-run").stdout == \
        f"set-up: would build .venvs/{VLLM_VENVS[0]} .venvs/{VLLM_VENVS[1]}\n"
    out = _setup(setup_checkout, "--all", "--dry-run").stdout
    assert out.startswith(f"set-up: would build .venvs/{VLLM_VENVS[0]} .venvs/{VLLM_VENVS[1]} .venvs/llmcompressor "
                          ".venvs/scanners fleet extra")


def test_setup_bad_option_is_one_line_exit_2(setup_checkout):
    proc = _setup(setup_checkout, "--servng")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "scripts/setup: unknown option '--servng' (--serving, --quant, --all, --dry-run)"]


def test_vllm_hint_points_at_the_setup_that_builds_it():
    from harness.env import probe_vllm

    hint = probe_vllm(None).error
    assert "scripts/setup --serving" in hint
    text = (ROOT / "scripts" / "setup").read_text()
    assert "--serving) serving=1" in text and 'ensure_vllm_venv "$v"' in text


def test_lib_sh_and_settings_read_the_one_vllm_pin(tmp_path):
    def versions(env):
        out = subprocess.run(["bash", "-c", f'source {LIB}; echo "$VLLM_VERSIONS"'], capture_output=True, text=True,
                             timeout=30, env=env)
        return out.stdout.split()

    environ = {k: v for k, v in os.environ.items() if k != "HARNESS_VLLM_VERSIONS"}
    assert versions(environ) == [settings.PINNED_VLLM, settings.BASELINE_VLLM]
    assert settings.DEFAULT_VLLM_VENV.name == f"vllm-{settings.PINNED_VLLM}"
    assert versions(dict(environ, HARNESS_VLLM_VERSIONS="9.1.0 9.0.0")) == ["9.1.0", "9.0.0"]
