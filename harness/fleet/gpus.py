"""Which GPUs this host shows, and which one an xdist worker gets.

CUDA_VISIBLE_DEVICES is read the way the CUDA runtime reads it (harness.hw.compat): indices or
GPU-/MIG- UUIDs, cut at the first bad entry ("" and "-1" hide every GPU).
"""

from __future__ import annotations

from ..hw.compat import visible_device_entries


def visible_gpus(cuda_visible_devices: str | None, gpu_count: int) -> list[str]:
    """The GPUs a process started here would see, as entries for a child's CUDA_VISIBLE_DEVICES.

    `gpu_count` is what the driver lists (NVML); it is used only when CUDA_VISIBLE_DEVICES is unset.
    """
    entries = visible_device_entries(cuda_visible_devices)
    return [str(i) for i in range(gpu_count)] if entries is None else entries


def pick_gpu(assigned: dict[str, str], gpus: list[str]) -> str | None:
    """The GPU for a new worker: the one fewest live workers hold (the first listed on a tie).

    `assigned` maps live workers to their GPU; once a crashed worker is dropped from it, its
    replacement gets the GPU it left.
    """
    if not gpus:
        return None
    load = {g: 0 for g in gpus}
    for gpu in assigned.values():
        if gpu in load:
            load[gpu] += 1
    return min(gpus, key=lambda g: (load[g], gpus.index(g)))
