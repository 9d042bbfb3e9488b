"""The report a run names is the report it wrote: scripts/test's last line follows --report-dir and
HARNESS_REPORT_DIR; a run that runs no test (--collect-only) writes nothing at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import settings

ROOT = Path(__file__).resolve().parent.parent


def run(pytester, *args):
    return pytester.runpytest_subprocess("-p", "harness.plugin", "-p", "no:cacheprovider", *args)


@pytest.fixture
def script_root(tmp_path) -> Path:
    """scripts/test and the root conftest.py as shipped, beside a lib.sh whose set-up is already done (the venvs exist:
    this python stands in for each), so the script's own lines run without building anything."""
    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "test", root / "scripts" / "test")
    shutil.copy(ROOT / "conftest.py", root / "conftest.py")  # declares the options scripts/test passes
    (root / "scripts" / "lib.sh").write_text(
        'ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"\nensure_all_venvs() { :; }\n'
        f'VLLM_VERSIONS="{settings.PINNED_VLLM} {settings.BASELINE_VLLM}"\n')
    for venv in (".venv", str(settings.DEFAULT_VLLM_VENV), str(settings.DEFAULT_BASELINE_VLLM_VENV)):
        python = root / venv / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        python.chmod(0o755)
    (root / "t").mkdir()
    (root / "t" / "test_one.py").write_text("def test_one():\n    pass\n")
    return root


def _script(root: Path, *args, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "HARNESS_REPORT_DIR"} | env
    return subprocess.run(["bash", str(root / "scripts" / "test"), "-n0", "-p", "no:cacheprovider", *args, "t"],
                          cwd=root, capture_output=True, text=True, timeout=300, env=environ)


def _reports_line(done) -> list[Path]:
    """The paths on scripts/test's 'Reports:' line (just above its verdict line)."""
    line = next(l for l in reversed(done.stdout.splitlines()) if l.startswith("Reports: "))
    return [Path(p) for p in line.removeprefix("Reports: ").split()]


def test_scripts_test_names_the_report_written_under_report_dir(script_root, tmp_path):
    """Before: 'Report: <repo>/reports/latest.html' whatever --report-dir said (an older file). The
    second (`-m alone`) run selects nothing here and writes no report, so one path is named."""
    out = tmp_path / "elsewhere"
    done = _script(script_root, "--report-dir", str(out))
    assert done.returncode == 0, done.stdout[-2000:]
    (html,) = _reports_line(done)
    assert html.parent == out and html.suffix == ".html" and html.is_file()
    assert html.with_suffix(".json").is_file()
    assert (out / "latest.html").read_text() == html.read_text()  # not an empty page of the second run
    assert not (script_root / "reports").exists()


def test_scripts_test_follows_harness_report_dir(script_root, tmp_path):
    out = tmp_path / "from-env"
    done = _script(script_root, HARNESS_REPORT_DIR=str(out))
    assert done.returncode == 0
    (html,) = _reports_line(done)
    assert html.parent == out and html.is_file()


def test_scripts_test_says_when_no_report_was_written(script_root, tmp_path):
    out = tmp_path / "never"
    done = _script(script_root, "--collect-only", "--report-dir", str(out))
    line = next(l for l in reversed(done.stdout.splitlines()) if l.startswith("Reports: "))
    assert line == "Reports: none written (no test ran)", done.stdout[-500:]
    assert not out.exists()


def test_a_run_that_selects_no_test_writes_nothing(pytester):
    """scripts/test's `-m alone` run with nothing selected would otherwise replace latest.html
    with an empty page; its results JSON (written at the start) is removed too."""
    pytester.makepyfile(test_x="def test_x(): pass")
    out = pytester.path / "reports"
    out.mkdir()
    (out / "latest.html").write_text("the last real run")
    result = run(pytester, "-k", "no_such_test", "--report-dir", str(out))
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED
    assert sorted(p.name for p in out.iterdir()) == ["latest.html"]
    assert any("harness: no report written (no test selected)" in line for line in result.outlines)


@pytest.mark.parametrize("option", ["--collect-only", "--setup-plan", "--fixtures", "--markers"])
def test_a_run_of_no_test_writes_nothing(pytester, option):
    """Before: --collect-only replaced reports/latest.html with an empty page and added it to the index."""
    pytester.makepyfile(test_x="def test_x(): pass")
    out = pytester.path / "reports"
    out.mkdir()
    (out / "latest.html").write_text("the last real run")
    (out / "index.html").write_text("the index of real runs")
    result = run(pytester, option, "--report-dir", str(out))
    assert result.ret == 0
    assert sorted(p.name for p in out.iterdir()) == ["index.html", "latest.html"]
    assert (out / "latest.html").read_text() == "the last real run"
    assert (out / "index.html").read_text() == "the index of real runs"
    if option == "--collect-only":
        assert any("harness: no report written (--collect-only: no test ran)" in line for line in result.outlines)
