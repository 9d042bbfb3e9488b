"""`python -m harness`: every design command listed, each with its module; bad usage is one line."""

import subprocess
import sys
from pathlib import Path

from harness import __main__ as cli

ROOT = Path(__file__).resolve().parent.parent

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


def test_every_registered_command_has_its_module():
    """A command is registered in one line of COMMANDS; its module must exist with the two entry points."""
    for name in cli.COMMANDS:
        module = cli._load(name)
        assert callable(module.add_arguments) and callable(module.run), name


def test_a_closed_pipe_is_not_a_traceback():
    """`python -m harness estimate ... | head -1`: the reader leaves early; exit 1, nothing on stderr."""
    cmd = (f"{sys.executable} -m harness estimate --config qwen2.5-0.5b --precision bf16,nf4,fp32,int8 "
           "--mode weights,prefill,generate,train --seq-len 128,256,512,1024,2048,4096 --batch 1,2,4,8 --json | head -c 1")
    out = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1 and out.stderr == "", out.stderr


def test_every_command_has_help():
    for name in DESIGN_COMMANDS:
        out = run_cli(name, "--help")
        assert out.returncode == 0, out.stderr
        assert "usage:" in out.stdout
