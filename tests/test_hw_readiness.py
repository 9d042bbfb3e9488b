"""Readiness knows the machine: NVIDIA GPUs on the PCI bus are read from sysfs ($HARNESS_SYSFS_ROOT
points the probe at a fake tree), a card without a usable driver is NOT READY with the fix (exit 1),
a CPU-only box says so in one line (exit 0), --expect-gpu on it fails, and every run of suites/hw
ends with its verdict as the last line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import env as env_mod
from harness import pci
from harness.hw import compat
from harness.hw.verdict import CheckOutcome, decide

ROOT = Path(__file__).resolve().parents[1]


def fake_sysfs(root: Path, devices: dict[str, tuple[str, str, str]], drivers: dict[str, str] | None = None) -> Path:
    """A sysfs tree: {address: (vendor, device, class)}, each as sysfs writes it ("0x10de\\n"),
    and {address: driver name} as the `driver` link the kernel makes when a driver binds."""
    base = root / "bus" / "pci" / "devices"
    for address, (vendor, device, pci_class) in devices.items():
        entry = base / address
        entry.mkdir(parents=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", pci_class)):
            (entry / name).write_text(value + "\n")
    for address, driver in (drivers or {}).items():
        target = root / "bus" / "pci" / "drivers" / driver
        target.mkdir(parents=True, exist_ok=True)
        (base / address / "driver").symlink_to(target)
    return root


HOST_BRIDGE = {"0000:00:00.0": ("0x8086", "0x1237", "0x060000")}
RTX_4090 = {"0000:01:00.0": ("0x10de", "0x2684", "0x030000")}  # VGA controller
RTX_4090_AUDIO = {"0000:01:00.1": ("0x10de", "0x22ba", "0x040300")}  # its HDMI audio function
H100_3D = {"0000:41:00.0": ("0x10de", "0x2330", "0x030200")}  # 3D controller (datacenter cards)


def _driver_here() -> bool:
    """A real NVIDIA driver on this machine makes the fake bus moot (the probes would see the card)."""
    return env_mod.probe_nvml().available or any(os.path.exists(p) for p in env_mod.DRIVER_FILES)


needs_driverless_machine = pytest.mark.skipif(_driver_here(), reason="this machine has an NVIDIA driver")


# ---- the probe --------------------------------------------------------------------------------

def test_probe_finds_nvidia_display_and_3d_controllers_not_their_audio_or_other_vendors(tmp_path):
    root = fake_sysfs(tmp_path, {**HOST_BRIDGE, **RTX_4090, **RTX_4090_AUDIO, **H100_3D}, {"0000:41:00.0": "nouveau"})
    gpus = pci.nvidia_gpus(root)
    assert [(g.address, g.device_id, g.pci_class, g.kernel_driver) for g in gpus] == [
        ("0000:01:00.0", "0x2684", "0x030000", None), ("0000:41:00.0", "0x2330", "0x030200", "nouveau")]
    assert "nouveau" in pci.missing_driver_fix(gpus) and "reboot" in pci.missing_driver_fix(gpus)


def test_probe_reads_the_root_from_the_environment_and_says_when_there_is_no_bus(tmp_path, monkeypatch):
    monkeypatch.setenv(pci.SYSFS_ENV, str(fake_sysfs(tmp_path / "sys", RTX_4090)))
    assert [g.address for g in pci.nvidia_gpus()] == ["0000:01:00.0"]
    monkeypatch.setenv(pci.SYSFS_ENV, str(tmp_path / "nowhere"))
    assert pci.nvidia_gpus() is None  # cannot tell: not the same as "no NVIDIA device"


def test_card_on_the_bus_without_driver_is_broken_not_absent_and_the_driver_check_fails(tmp_path):
    gpus = pci.nvidia_gpus(fake_sysfs(tmp_path, {**HOST_BRIDGE, **RTX_4090}))
    environment = env_mod.Environment(
        nvml=env_mod.NvmlProbe(False, "no NVIDIA driver found (NVML: NVMLError_LibraryNotFound: not found)"),
        torch=env_mod.TorchProbe("2.13.0+cpu"), packages={}, vllm=env_mod.VllmProbe(None, error="none"),
        pci_gpus=gpus)
    readiness = env_mod.gpu_readiness(environment)
    assert readiness.state == "broken" and "install the NVIDIA driver" in readiness.reason
    result = compat.check_driver(None, None, 0, environment.nvml.reason, [], gpus)
    assert result.verdict == "fail" and "0000:01:00.0" in result.value and "reboot" in result.fix
    environment.pci_gpus = []
    assert env_mod.gpu_readiness(environment).state == "absent"
    assert compat.check_driver(None, None, 0, environment.nvml.reason, [], []).verdict == "skip"
    asked = compat.check_driver(None, None, 0, environment.nvml.reason, [], [], gpu_asked="--device cuda")
    assert asked.verdict == "fail" and asked.value.startswith("--device cuda: CPU-only")


def test_verdict_agrees_with_outcomes():
    ok = [CheckOutcome("kernel_log_xid", "passed"), CheckOutcome("vllm_importable", "passed")]
    assert decide(ok, "absent", "", pci_read=True).line.startswith("CPU-only: no NVIDIA device")
    assert decide(ok, "absent", "", pci_read=True).exit_code == 0
    assert decide(ok, "broken", "a driver is installed but torch cannot use it", True).exit_code == 1
    failed = ok + [CheckOutcome("driver", "failed", "driver: no driver")]
    assert decide(failed, "broken", "x", True).line == "NOT READY: driver: no driver"
    gaps = ok + [CheckOutcome("bnb_int8_matmul", "skipped", "bitsandbytes is not installed"),
                 CheckOutcome("d2d_bandwidth", "skipped", "full level only (--hw-level full)")]
    ready = decide(gaps, "ready", "1 GPU(s)", True)
    assert ready.exit_code == 0 and ready.line == "READY: 2 checks passed, 1 not run (bnb_int8_matmul: bitsandbytes is not installed)"
    assert decide([], "ready", "", True).word == "NO VERDICT"


# ---- end to end: pytest suites/hw and scripts/check-machine --------------------------------

def _hw(tmp_path: Path, sysfs: Path, *args: str, command: list[str] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, HARNESS_SYSFS_ROOT=str(sysfs))
    cmd = command or [sys.executable, "-m", "pytest", "suites/hw"]
    return subprocess.run([*cmd, "-p", "no:cacheprovider", "--report-dir", str(tmp_path / "reports"), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def _last_line(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout.rstrip().splitlines()[-1]


@needs_driverless_machine
def test_driverless_nvidia_card_is_not_ready_with_the_fix_exit_1(tmp_path):
    proc = _hw(tmp_path, fake_sysfs(tmp_path / "sys", {**HOST_BRIDGE, **RTX_4090}))
    last = _last_line(proc)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert last.startswith("NOT READY: driver: 1 NVIDIA GPU on the PCI bus (0000:01:00.0 [10de:2684]"), last
    assert "install the NVIDIA driver" in last and "reboot" in last
    # the cause is named by one failing check; the GPU checks say they did not run because of it
    assert [ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED")] == [
        ln for ln in proc.stdout.splitlines() if ln.startswith("FAILED suites/hw/test_quick.py::test_driver")]
    assert proc.stdout.count("no usable NVIDIA driver") <= 4  # the failure, its captured print, the verdict


@needs_driverless_machine
def test_cpu_only_box_says_so_in_one_line_exit_0(tmp_path):
    proc = _hw(tmp_path, fake_sysfs(tmp_path / "sys", HOST_BRIDGE))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _last_line(proc).startswith("CPU-only: no NVIDIA device, GPU checks skipped")


@needs_driverless_machine
def test_expect_gpu_on_a_cpu_only_box_fails_the_driver_check_exit_1(tmp_path):
    proc = _hw(tmp_path, fake_sysfs(tmp_path / "sys", HOST_BRIDGE), "--expect-gpu")
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert _last_line(proc).startswith("NOT READY: driver: --expect-gpu: CPU-only: no NVIDIA device on the PCI bus")
    assert sum(ln.startswith("FAILED") for ln in proc.stdout.splitlines()) == 1


def _harness_venv_current() -> bool:
    script = f'source {ROOT}/scripts/lib.sh; venv_current "$ROOT/.venv" "$(harness_stamp)"'
    return subprocess.run(["bash", "-c", script], capture_output=True, timeout=60).returncode == 0


@needs_driverless_machine
def test_check_machine_on_a_driverless_nvidia_box_ends_not_ready_exit_1(tmp_path):
    if not _harness_venv_current():
        pytest.skip("the harness venv is not built (check-machine would build it first)")
    proc = _hw(tmp_path, fake_sysfs(tmp_path / "sys", {**HOST_BRIDGE, **H100_3D}),
               command=[str(ROOT / "scripts" / "check-machine")])
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert _last_line(proc).startswith("NOT READY: driver: 1 NVIDIA GPU on the PCI bus (0000:41:00.0 [10de:2330]")
