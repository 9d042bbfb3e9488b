"""`python -m harness`: every design command listed, each with its module; bad usage is one line."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

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


# -- one error path for every command (harness.__main__): one line, `harness <command>: error:`,
# the error's exit code, and with a --json switch one JSON object on stdout ----------------------

def _one_error_line(out, command: str) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"harness {command}: error: "), lines[0]
    return lines[0]


# (command, arguments of a bad input); each command that has a --json switch
JSON_COMMANDS = [
    ("env", ["--bogus"]),
    ("estimate", ["--config", "qwen2.5-0.5b", "--precision", "fp9", "--mode", "weights", "--seq-len", "128"]),
    ("plan", ["--config", "qwen2.5-0.5b", "--budget", "banana"]),
    ("plan", ["--engine", "vllm", "--config", "/nonexistent/dir", "--gpu-memory", "8GiB", "--max-model-len", "512"]),
    ("check-dir", ["/nonexistent/dir"]),
    ("drift", ["/nonexistent/a", "/nonexistent/b"]),
    ("explain", ["/nonexistent/log.txt"]),
]


@pytest.mark.parametrize("command,args", JSON_COMMANDS, ids=[" ".join(c[1][:2]) or c[0] for c in JSON_COMMANDS])
def test_every_json_command_prints_a_json_error_object(command, args):
    """Before: plan and explain printed nothing on stdout with --json, check-dir its own object."""
    out = run_cli(command, *args, "--json")
    assert out.returncode == 2, (out.stdout, out.stderr)
    line = _one_error_line(out, command)
    error = json.loads(out.stdout)
    assert error == {**error, "ok": False, "command": command, "error_code": "bad_usage", "exit_code": 2}
    assert error["error"] == line.removeprefix(f"harness {command}: error: ")


def test_every_command_with_a_json_switch_is_in_that_test():
    """A command that gains --json joins JSON_COMMANDS (and so the test above) with a bad input."""
    assert cli.build_parser().json_switch == {command for command, _ in JSON_COMMANDS}


def test_usage_errors_of_argparse_have_the_harness_prefix():
    """Before: `python -m harness estimate: error: ...` from argparse, `harness estimate: error:` from the rest."""
    out = run_cli("estimate", "--no-such-option")
    assert out.returncode == 2
    assert "--config" in _one_error_line(out, "estimate")
    top = run_cli("frobnicate")
    assert top.stderr.startswith("harness: error: ") and "python -m harness" not in top.stderr


def test_check_dir_keeps_its_findings_fields_in_the_error_object():
    out = run_cli("check-dir", "/nonexistent/dir", "--json")
    error = json.loads(out.stdout)
    assert error["findings"] == [] and error["directory"] == "/nonexistent/dir" and "no such directory" in error["error"]


def test_a_hub_id_as_config_suggests_the_reference_name():
    """Before: '... is neither a file, a model directory nor a reference name' and nothing more."""
    cases = {"Qwen/Qwen2.5-1.5B": "qwen2.5-1.5b", "meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b",
             "mistralai/Mistral-7B-Instruct-v0.3": "mistral-7b-v0.3", "google/gemma-3-1b-it": "gemma-3-1b"}
    for hub_id, name in cases.items():
        out = run_cli("estimate", "--config", hub_id, "--precision", "bf16", "--mode", "weights", "--seq-len", "128")
        assert out.returncode == 2
        assert f"did you mean {name}?" in _one_error_line(out, "estimate"), hub_id
    vllm = run_cli("plan", "--engine", "vllm", "--config", "Qwen/Qwen2.5-1.5B", "--gpu-memory", "8GiB",
                   "--max-model-len", "1024")
    assert vllm.returncode == 2 and "did you mean qwen2.5-1.5b?" in _one_error_line(vllm, "plan")
    nothing = run_cli("estimate", "--config", "acme/Nonsense-9000", "--precision", "bf16", "--mode", "weights",
                      "--seq-len", "128")
    assert nothing.returncode == 2 and "did you mean" not in _one_error_line(nothing, "estimate")


# An unwritable folder: /sys refuses new files even to root (permission bits do not stop root).
UNWRITABLE = "/sys"


def _results_file(tmp_path, name: str) -> Path:
    path = tmp_path / f"{name}.json"
    path.write_bytes(gzip.decompress((ROOT / f"tests/data/reports/{name}.json.gz").read_bytes()))
    return path


@pytest.mark.parametrize("results", ["gate-new", "hw-cpu"])  # bench results; a pytest run's RUN.json
@pytest.mark.parametrize("out", [f"{UNWRITABLE}/x.html", "/etc/passwd/x.html"])
def test_report_into_a_folder_it_cannot_write_is_one_line(tmp_path, out, results):
    """Before: PermissionError from tempfile.mkstemp as a traceback, exit 1."""
    done = run_cli("report", str(_results_file(tmp_path, results)), "--out", out)
    assert done.returncode == 2
    line = _one_error_line(done, "report")
    assert "--out" in line and ("cannot write" in line or "not a folder" in line or "does not exist" in line)


@pytest.mark.parametrize("out,words", [("/etc/passwd/x.json", "is a file, not a folder"),
                                       (f"{UNWRITABLE}/x.json", "cannot write into the folder"),
                                       (f"{UNWRITABLE}/new/x.json", "cannot write into the folder")])
def test_bench_out_that_cannot_be_written_is_refused_before_any_request(out, words):
    """Before: FileExistsError / PermissionError as a traceback after the run. The endpoint here
    answers nothing: the --out error coming first (exit 2, not 'cannot reach', exit 1) shows the
    check runs before any request is sent."""
    done = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "2",
                   "--input-len", "8", "--output-len", "4", "--out", out)
    assert done.returncode == 2, done.stderr
    line = _one_error_line(done, "bench")
    assert words in line and "cannot reach" not in line


def test_a_writable_new_folder_for_bench_is_not_refused_and_nothing_is_left(tmp_path):
    """The probe leaves nothing behind and does not refuse what bench may create (a new folder)."""
    done = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--num-prompts", "2",
                   "--input-len", "8", "--output-len", "4", "--out", str(tmp_path / "new" / "x.json"))
    assert done.returncode == 1 and "cannot reach" in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_os_error_about_a_path_is_one_line_on_any_command(tmp_path):
    """The safety net in harness.__main__: a command without its own check (compare --json FILE)
    that cannot write its file says which folder, in one line, exit 2 (before: a traceback)."""
    old, new = _results_file(tmp_path, "gate-old"), _results_file(tmp_path, "gate-new")
    done = run_cli("compare", str(old), str(new), "--allow-diff", "server_version", "--json", f"{UNWRITABLE}/c.json")
    assert done.returncode == 2, done.stderr
    assert f"cannot write into the folder '{UNWRITABLE}' (Permission denied)" in _one_error_line(done, "compare")
