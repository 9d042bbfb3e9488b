"""`python -m harness`: every design command listed; unbuilt ones say so; bad usage is one line."""

import subprocess
import sys

from harness import __main__ as cli

DESIGN_COMMANDS = ["estimate", "plan", "check-dir", "bench", "compare", "report"]


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_every_design_command():
    out = run_cli("--help")
    assert out.returncode == 0
    for name in DESIGN_COMMANDS:
        assert name in out.stdout


def test_no_command_prints_help_and_exits_2():
    out = run_cli()
    assert out.returncode == 2 and "COMMAND" in out.stdout


def test_unknown_command_is_one_line_exit_2():
    out = run_cli("frobnicate")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and "invalid choice" in out.stderr


def test_command_not_built_says_so(monkeypatch, capsys):
    monkeypatch.setitem(cli.COMMANDS, "teleport", ("teleport_not_built", "move a model instantly"))
    assert cli.main(["teleport"]) == 2
    assert capsys.readouterr().err.strip() == "harness teleport: not built yet"


def test_every_command_has_help():
    for name in DESIGN_COMMANDS:
        out = run_cli(name, "--help")
        assert out.returncode == 0, out.stderr
        assert "usage:" in out.stdout
