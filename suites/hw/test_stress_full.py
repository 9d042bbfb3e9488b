"""Full level (--hw-level full): bandwidth and throughput against the per-model reference table
(0.75 x reference, DCGM's rule), a whole-memory write/verify pass, and on several GPUs NCCL
all-reduce and peer access."""

from __future__ import annotations

import pytest

from harness.hw import bandwidth as bw
from harness.hw.result import combine

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _name(harness_env, device: str) -> str:
    index = int(device.split(":")[1])
    return next(d.name for d in harness_env.torch.devices if d.index == index)


def test_d2d_bandwidth(full_level, harness_env, cuda_devices, verdict, show_progress):
    with show_progress():
        bw._progress("device-to-device copy bandwidth")
        verdict(combine("d2d_bandwidth", [bw.d2d_result(bw.measure_d2d(d), _name(harness_env, d)) for d in cuda_devices]))


def test_bf16_matmul_tflops(full_level, harness_env, cuda_devices, verdict, show_progress):
    with show_progress():
        bw._progress("bf16 matmul throughput")
        verdict(combine("bf16_matmul_tflops",
                        [bw.matmul_result(bw.measure_matmul_tflops(d), _name(harness_env, d)) for d in cuda_devices]))


def test_h2d_bandwidth(full_level, harness_env, cuda_devices, verdict, show_progress):
    with show_progress():
        bw._progress("pinned host-to-device bandwidth")
        verdict(combine("h2d_bandwidth", [bw.h2d_result(bw.measure_h2d(d), _name(harness_env, d)) for d in cuda_devices]))


def test_memory_write_verify(full_level, harness_env, cuda_devices, verdict, show_progress):
    with show_progress():
        results = []
        for d in cuda_devices:
            bw._progress(f"whole-memory write/verify on {d}")
            results.append(bw.memory_result(bw.measure_memory_write_verify(d), _name(harness_env, d)))
        verdict(combine("memory_write_verify", results))


@pytest.mark.multi_gpu
def test_nccl_allreduce(full_level, harness_env, cuda_devices, verdict, show_progress):
    with show_progress():
        bw._progress(f"NCCL all-reduce over {len(cuda_devices)} GPUs")
        verdict(bw.allreduce_result(bw.measure_allreduce(len(cuda_devices)), _name(harness_env, cuda_devices[0])))


@pytest.mark.multi_gpu
def test_peer_access(full_level, harness_env, cuda_devices, verdict, show_progress):
    with show_progress():
        bw._progress("peer access and GPU-to-GPU copy bandwidth")
        verdict(bw.peer_result(bw.measure_peer(cuda_devices), _name(harness_env, cuda_devices[0])))
