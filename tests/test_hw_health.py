"""Fault injection for NVML health, the kernel log and the reference rule: throttling flags, ECC,
pending page retirement, a narrowed PCIe link, heat, a lowered power limit, Xid 79."""

from __future__ import annotations

import pytest

from harness.hw import bandwidth as bw
from harness.hw import health, kernel_log, references
from harness.hw.health import GpuHealth
from harness.hw.result import combine


def healthy(**changes) -> GpuHealth:
    h = GpuHealth(0, "NVIDIA GeForce RTX 4060", throttle_reasons=0x1, pcie_gen=4, pcie_width=8, pcie_max_gen=4,
                  pcie_max_width=8, pcie_gpu_max_gen=4, temperature_c=45, temp_slowdown_c=90, temp_shutdown_c=100,
                  power_w=20.0, power_limit_w=115.0, power_default_limit_w=115.0)
    h.__dict__.update(changes)
    return h


@pytest.mark.parametrize("rule", [health.check_ecc, health.check_retired_pages])
def test_consumer_card_without_ecc_skips_with_reason(rule):
    r = rule(healthy())
    assert r.verdict == "skip" and "not reported by NVML" in r.value


@pytest.mark.parametrize("rule", [health.check_throttle, health.check_pcie, health.check_temperature, health.check_power])
def test_healthy_card_passes(rule):
    assert rule(healthy()).verdict == "pass"


@pytest.mark.parametrize("mask, words", [(0x40, "hardware thermal"), (0x20, "software thermal"),
                                         (0x8, "HW slowdown"), (0x80, "power brake")])
def test_throttle_flags_fail_with_cause_and_fix(mask, words):
    r = health.check_throttle(healthy(throttle_reasons=mask | 0x4))
    assert r.verdict == "fail"
    assert words in r.fix and "airflow" in r.fix and "power cables" in r.fix
    assert f"0x{mask | 0x4:x}" in r.value


def test_power_cap_alone_is_a_warning_and_idle_is_fine():
    assert health.check_throttle(healthy(throttle_reasons=0x4)).verdict == "warn"
    r = health.check_throttle(healthy(throttle_reasons=0x1))
    assert r.verdict == "pass" and "GpuIdle" in r.value


def test_uncorrectable_ecc_since_boot_fails():
    r = health.check_ecc(healthy(ecc_enabled=True, ecc_volatile_uncorrected=2, ecc_aggregate_uncorrected=2,
                                 ecc_volatile_corrected=0))
    assert r.verdict == "fail" and "RMA" in r.fix
    r = health.check_ecc(healthy(ecc_enabled=True, ecc_volatile_uncorrected=0, ecc_aggregate_uncorrected=3,
                                 ecc_volatile_corrected=0))
    assert r.verdict == "warn"


def test_pending_retirement_or_remap_asks_for_a_reset_and_remap_failure_for_rma():
    r = health.check_retired_pages(healthy(remapped_correctable=0, remapped_uncorrectable=1, remap_pending=True,
                                           remap_failure=False))
    assert r.verdict == "fail" and "reboot" in r.fix
    r = health.check_retired_pages(healthy(remapped_correctable=0, remapped_uncorrectable=9, remap_pending=False,
                                           remap_failure=True))
    assert r.verdict == "fail" and "RMA" in r.fix
    r = health.check_retired_pages(healthy(retired_pages_sbe=40, retired_pages_dbe=25, retired_pages_pending=False))
    assert r.verdict == "fail" and "65 pages" in r.fix


def test_pcie_link_narrowed_or_slowed_under_load_fails():
    r = health.check_pcie(healthy(pcie_width=4))
    assert r.verdict == "fail" and "x4 of x8" in r.fix and "reseat" in r.fix
    r = health.check_pcie(healthy(pcie_gen=1))
    assert r.verdict == "fail" and "Gen1" in r.fix
    assert health.check_pcie(healthy(pcie_gen=1), under_load=False).verdict == "warn"  # idle power saving
    r = health.check_pcie(healthy(pcie_gen=3, pcie_max_gen=3, pcie_gpu_max_gen=4))
    assert r.verdict == "warn" and "slot" in r.fix


def test_hot_card_and_lowered_power_limit():
    r = health.check_temperature(healthy(temperature_c=91))
    assert r.verdict == "fail" and "airflow" in r.fix
    assert health.check_temperature(healthy(temperature_c=87)).verdict == "warn"
    r = health.check_power(healthy(power_limit_w=70.0))
    assert r.verdict == "warn" and "nvidia-smi -pl" in r.fix


def test_combined_verdict_is_the_worst_gpu():
    r = combine("clock_throttle", [health.check_throttle(healthy()), health.check_throttle(healthy(throttle_reasons=0x40))])
    assert r.verdict == "fail" and ";" in r.value and "airflow" in r.fix


# ---- kernel log ---------------------------------------------------------------------------------------

OFF_BUS = [
    "[ 1234.5] NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    "[ 1234.6] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
]


def test_xid_79_fails_with_power_thermals_seating():
    r = kernel_log.check_kernel_log(kernel_log.KernelLog(["boot ok"] + OFF_BUS, "dmesg"))
    assert r.verdict == "fail"
    assert "Xid 79" in r.value and "reseat" in r.fix and "power" in r.fix
    r = kernel_log.check_kernel_log(kernel_log.KernelLog([OFF_BUS[1]], "/var/log/kern.log"))
    assert r.verdict == "fail" and "Xid 79" in r.value  # the bus line alone counts


def test_application_xids_warn_and_clean_or_unreadable_logs():
    r = kernel_log.check_kernel_log(kernel_log.KernelLog(
        ["NVRM: Xid (PCI:0000:01:00): 13, pid=99, Graphics Exception"], "dmesg"))
    assert r.verdict == "warn" and "Xid 13" in r.value
    clean = kernel_log.check_kernel_log(kernel_log.KernelLog(["nothing here"], "dmesg"))
    assert clean.verdict == "pass" and clean.fix == "" and clean.details["source"] == "dmesg"
    r = kernel_log.check_kernel_log(kernel_log.KernelLog(None, "dmesg: Operation not permitted"))
    assert r.verdict == "skip" and "not permitted" in r.value


# ---- references (0.75 x rule) and full-level verdicts ---------------------------------------------

def test_reference_rule_passes_at_three_quarters_and_fails_below():
    assert references.judge("d2d_bandwidth", "d2d_bandwidth", 4100, "NVIDIA H200").verdict == "pass"
    r = references.judge("d2d_bandwidth", "d2d_bandwidth", 3000, "NVIDIA H200")
    assert r.verdict == "fail" and "0.75" in r.expectation and "throttling" in r.fix
    assert r.details["floor"] == pytest.approx(0.75 * 4300)


def test_impossible_figure_is_flagged_as_a_measuring_error():
    # seen on 2 x H200 before the fix: cuda:1's copy timed on cuda:0's idle stream read 196 TB/s
    r = references.judge("d2d_bandwidth", "d2d_bandwidth", 196_684.8, "NVIDIA H200")
    assert r.verdict == "warn" and "measurement itself is suspect" in r.fix


def test_gpu_missing_from_table_is_reported_not_failed():
    r = references.judge("bf16_matmul_tflops", "bf16_matmul", 12.0, "NVIDIA GeForce RTX 4060")
    assert r.verdict == "pass" and "figure reported only" in r.expectation and "12.0" in r.value


def test_longest_name_wins():
    key, ref = references.reference_for("NVIDIA GeForce RTX 4060 Ti", "d2d_bandwidth")
    assert key == "RTX 4060 Ti" and ref.value == 288


def test_full_level_faults_fail():
    assert bw.memory_result({"bytes_tested": 1 << 30, "free_bytes": 2 << 30, "bad_words": 3, "seconds": 1.0,
                             "passes": 2}, "GPU").verdict == "fail"
    r = bw.allreduce_result({"world": 2, "nbytes": 1 << 28, "wrong_elements": 7, "seconds_per_allreduce": 0.01,
                             "algbw_gbps": 1.0, "busbw_gbps": 1.0}, "NVIDIA H200")
    assert r.verdict == "fail" and "7 wrong" in r.value
    assert bw.allreduce_result({"error": "all-reduce did not finish in 300 s (NCCL hang)"}, "GPU").verdict == "fail"
    r = bw.peer_result({"peer_access": {"0->1": False, "1->0": False}, "gbps": 20.0, "copy_correct": True},
                       "NVIDIA GeForce RTX 4090")
    assert r.verdict == "warn" and "GeForce" in r.fix
