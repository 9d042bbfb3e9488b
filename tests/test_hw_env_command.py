"""`python -m harness env`: the probe and readiness as text or JSON, exit 0; bad input exits 2."""

from __future__ import annotations

import json

from harness.__main__ import main


def test_env_json_reports_probe_readiness_and_checks(capsys):
    assert main(["env", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["environment"]["torch"]["version"]
    assert data["readiness"]["state"] in ("ready", "absent", "broken")
    checks = {c["check"]: c for c in data["checks"]}
    assert checks["driver"]["verdict"] in ("pass", "fail", "skip")
    if data["readiness"]["state"] == "absent":  # this CPU machine: the probes' reasons, not a guess
        assert "driver" in data["readiness"]["reason"]
        nvml = data["environment"]["nvml"]["reason"]  # "no NVIDIA driver found (NVML: ...)"
        assert nvml[nvml.index("(") + 1:-1] in checks["driver"]["value"]
        if data["environment"]["pci_gpus"] == []:  # the PCI bus was read and holds no NVIDIA device
            assert checks["driver"]["value"].startswith("CPU-only: no NVIDIA device on the PCI bus")
            assert data["readiness"]["reason"].endswith("no NVIDIA device on the PCI bus (CPU-only)")


def test_env_text_starts_with_the_machine_summary(capsys):
    assert main(["env"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("GPU: ") and "torch: " in lines[0]
    assert lines[1].startswith("GPU readiness: ")
    assert any(line.startswith("driver: ") for line in lines)


def test_env_bad_vllm_python_is_one_line_exit_2(capsys, tmp_path):
    assert main(["env", "--vllm-python", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--vllm-python" in err[0] and "does not exist" in err[0]
