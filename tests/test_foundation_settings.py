"""Settings and sizes: every option is validated in one place, with one-line errors."""

import pytest

from harness import settings as s
from harness.errors import UsageError
from harness.units import format_bytes, parse_bytes


@pytest.mark.parametrize("text, expected", [
    ("6GiB", 6 * 1024**3), ("6gib", 6 * 1024**3), ("8GB", 8 * 10**9), ("6gb", 6 * 10**9),
    ("6144MiB", 6 * 1024**3), ("1.5GiB", int(1.5 * 1024**3)), ("4096B", 4096), ("512 MB", 512 * 10**6),
])
def test_parse_bytes_accepts_binary_and_decimal_units(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text, needle", [
    ("6", "'6' has no unit: 6GiB or 6GB?"), (" 4096 ", "has no unit"),
    ("6G", "'6G' is ambiguous: 6GiB or 6GB?"), ("6g", "ambiguous"), ("512M", "512MiB or 512MB?"),
])
def test_parse_bytes_refuses_a_size_whose_unit_is_unclear(text, needle):
    """A bare number (6 bytes?) and G (GiB to some tools, GB to others) are refused, never guessed."""
    with pytest.raises(UsageError) as err:
        parse_bytes(text, "--budget")
    assert str(err.value).startswith("--budget: ") and needle in str(err.value)


def test_format_size_shows_a_size_as_what_it_is():
    from harness.units import format_size

    assert format_size(parse_bytes("6GiB")) == "6 GiB"
    assert format_size(parse_bytes("6GB")) == "6 GB (5.59 GiB)"
    assert format_size(parse_bytes("300MiB")) == "300 MiB"
    assert format_size(12345) == format_bytes(12345)


def test_comma_lists_are_parsed_one_way():
    from harness.units import comma_list, int_list

    assert comma_list(" a, b,,c ", "--x") == ("a", "b", "c")
    assert comma_list("BF16,nf4", "--precision", choices=("bf16", "nf4"), lower=True) == ("bf16", "nf4")
    assert int_list("512, 2048", "--seq-len") == (512, 2048)
    for call, needle in ((lambda: comma_list(" , ", "--x"), "--x: no value given"),
                         (lambda: comma_list("fp5", "--precision", choices=("bf16",)), "--precision: unknown value fp5"),
                         (lambda: int_list("512,2k", "--seq-len"), "--seq-len: '2k' is not an integer"),
                         (lambda: int_list("0", "--batch"), "--batch: 0 must be an integer >= 1")):
        with pytest.raises(UsageError, match=needle):
            call()


@pytest.mark.parametrize("text", ["banana", "6 parsecs", "", "-1GiB", "0GiB", "GiB"])
def test_parse_bytes_rejects_non_sizes_with_one_line(text):
    with pytest.raises(UsageError) as err:
        parse_bytes(text, "--vram-budget")
    assert "\n" not in str(err.value) and "--vram-budget" in str(err.value)


def test_format_bytes_is_readable():
    assert format_bytes(6 * 1024**3) == "6.00 GiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(None) == "-"


def test_resolve_defaults(tmp_path):
    resolved = s.resolve({}, root=tmp_path)
    assert resolved.device == "auto"
    assert resolved.precisions == s.PRECISIONS
    assert resolved.report_dir == tmp_path / "reports"
    assert resolved.vram_budget is None and resolved.vllm_python is None


def test_resolve_parses_budget_and_precisions(tmp_path):
    resolved = s.resolve({"vram_budget": "6GiB", "precisions": "bf16, nf4-dq"}, root=tmp_path)
    assert resolved.vram_budget == 6 * 1024**3
    assert resolved.precisions == ("bf16", "nf4-dq")


@pytest.mark.parametrize("options, needle", [
    ({"device": "tpu"}, "--device"),
    ({"precisions": "fp8"}, "fp8"),
    ({"model": "/no/such/model"}, "does not exist"),
    ({"endpoint": "localhost:8000"}, "--endpoint"),
    ({"baseline": "/no/such.json"}, "--baseline"),
    ({"hw_level": "extreme"}, "--hw-level"),
    ({"vllm_python": "/no/python"}, "--vllm-python"),
])
def test_resolve_rejects_bad_options(tmp_path, options, needle):
    with pytest.raises(UsageError, match=needle):
        s.resolve(options, root=tmp_path)


def test_model_must_be_a_model_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no config.json"):
        s.resolve({"model": str(tmp_path / "empty")}, root=tmp_path)
    assert s.resolve({"model": "qwen2.5-0.5b"}, root=tmp_path).model == "qwen2.5-0.5b"


def test_vllm_venv_found_under_root(tmp_path):
    python = tmp_path / s.DEFAULT_VLLM_VENV / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    resolved = s.resolve({}, root=tmp_path)
    assert resolved.vllm_python == python and not resolved.vllm_python_explicit


def test_one_option_table_gives_the_pytest_options_their_help_and_their_parsing(pytestconfig, tmp_path, monkeypatch):
    """settings.options() is the only declaration: pytest knows every flag of it, the help names
    the default the parser applies, an environment variable stands in for a missing flag."""
    table = dict(s.options())
    assert {opt.flag for opt in table.values()} >= {"--model", "--device", "--vram-budget", "--precisions",
                                                   "--expect-gpu", "--report-dir", "--vllm-python", "--endpoint",
                                                   "--baseline", "--hw-level", "--llmcompressor-python"}
    for name, opt in table.items():
        pytestconfig.getoption(name)  # declared by the plugin from the table (ValueError if not)
        assert opt.flag == "--" + name.replace("_", "-")
    assert "(default: auto)" in table["device"].help_text() and s.resolve({}, root=tmp_path).device == "auto"
    assert "$HARNESS_REPORT_DIR, else reports/" in table["report_dir"].help_text()
    monkeypatch.setenv("HARNESS_REPORT_DIR", str(tmp_path / "elsewhere"))
    assert s.resolve({}, root=tmp_path).report_dir == tmp_path / "elsewhere"
    assert s.resolve({"report_dir": str(tmp_path / "flag")}, root=tmp_path).report_dir == tmp_path / "flag"


def test_a_bad_value_from_the_environment_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_VLLM_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(UsageError, match=r"^--vllm-python: .*no-python' does not exist \(from \$HARNESS_VLLM_PYTHON\)$"):
        s.resolve({}, root=tmp_path)
    with pytest.raises(UsageError, match=r"does not exist$"):  # the flag's own value: no env note
        s.resolve({"vllm_python": str(tmp_path / "other")}, root=tmp_path)
