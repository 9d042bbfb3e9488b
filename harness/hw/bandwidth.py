"""Full-level measurements: device memory bandwidth, bf16 matmul throughput, pinned host-to-device
bandwidth, a whole-memory write/verify pass, and on several GPUs NCCL all-reduce and peer access.

Each `measure_*` returns a plain dict of figures; `*_result` turns one into a CheckResult held
against the per-model reference table (references.py). torch is imported inside the functions.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from .references import judge
from .result import CheckResult

GiB = 2**30


def _progress(text: str) -> None:
    print(f"[hw] {text}", file=sys.stderr, flush=True)


def _timed(device: str, fn, iters: int, warmup: int = 3) -> float:
    """Seconds per call of fn on the GPU, by CUDA events, after warm-up."""
    import torch

    # Events record on the *current* device's stream: without this, work on cuda:1 is timed by
    # cuda:0's idle stream (seen on 2 x H200: 196 TB/s "copies").
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(device)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / 1000 / iters


def _free_bytes(device: str) -> int:
    import torch

    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def measure_d2d(device: str, nbytes: int | None = None, iters: int = 20) -> dict:
    """Device-to-device copy; bytes read + written per second (the convention of bandwidthTest)."""
    import torch

    nbytes = nbytes or min(2 * GiB, _free_bytes(device) // 4)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    sec = _timed(device, lambda: dst.copy_(src), iters)
    ok = bool(torch.equal(dst[:: 4096], src[:: 4096]))
    return {"gbps": 2 * nbytes / sec / 1e9, "nbytes": nbytes, "seconds_per_copy": sec, "copy_correct": ok}


def measure_matmul_tflops(device: str, n: int | None = None, iters: int = 10) -> dict:
    """Dense bf16 GEMM throughput on random data (zeros run faster and flatter the card)."""
    import torch

    n = n or (8192 if _free_bytes(device) > 4 * GiB else 4096)
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
    out = torch.empty(n, n, device=device, dtype=torch.bfloat16)
    sec = _timed(device, lambda: torch.matmul(a, b, out=out), iters)
    return {"tflops": 2 * n**3 / sec / 1e12, "n": n, "seconds_per_matmul": sec}


def measure_h2d(device: str, nbytes: int = 512 * 2**20, iters: int = 10) -> dict:
    import torch

    host = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    host.fill_(7)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    sec = _timed(device, lambda: dev.copy_(host, non_blocking=True), iters)
    # accelerate's offload hooks copy from ordinary (pageable) memory: harness.memory.fit.offload
    # predicts offloaded decode from this figure
    pageable = torch.empty(nbytes, dtype=torch.uint8)
    pageable.fill_(7)
    pageable_sec = _timed(device, lambda: dev.copy_(pageable), max(2, iters // 2), warmup=1)
    # ... and transformers 5 keeps CPU-offloaded weights as views of the memory-mapped checkpoint
    import tempfile

    with tempfile.NamedTemporaryFile(prefix="h2d-", suffix=".bin") as fh:
        fh.truncate(nbytes)
        mapped = torch.from_file(fh.name, shared=True, size=nbytes, dtype=torch.uint8)
        mapped.fill_(7)
        mapped_sec = _timed(device, lambda: dev.copy_(mapped), max(2, iters // 2), warmup=1)
    return {"gbps": nbytes / sec / 1e9, "nbytes": nbytes, "seconds_per_copy": sec,
            "pageable_gbps": nbytes / pageable_sec / 1e9, "mmap_gbps": nbytes / mapped_sec / 1e9,
            **measure_offload_h2d(device)}


# One decoder layer of a 7B model, by tensor (MiB): three MLP matrices, q and o, k and v.
OFFLOAD_LAYER_MIB = (128, 128, 128, 32, 32, 4, 4)


def measure_offload_h2d(device: str, layers: int = 4, passes: int = 3) -> dict:
    """Host-to-device copies the way accelerate's offload hooks make them every forward: tensor by
    tensor, `.to(device)` into a fresh allocation, from a memory-mapped file whose pages are
    already resident (a checkpoint transformers keeps mapped). A single large pageable copy is a
    poor stand-in: on the lent H200 machines it read 4.4-9.4 GB/s while offloaded decode ran at
    6-8 GB/s. Median over `passes` after one untimed pass."""
    import statistics

    import torch

    sizes = [mib * 2**20 for mib in OFFLOAD_LAYER_MIB] * layers
    total = sum(sizes)
    with tempfile.NamedTemporaryFile(prefix="offload-", suffix=".bin") as fh:
        fh.truncate(total)
        mapped = torch.from_file(fh.name, shared=True, size=total, dtype=torch.uint8)
        mapped.fill_(7)
        views, at = [], 0
        for n in sizes:
            views.append(mapped[at:at + n])
            at += n
        times = []
        with torch.cuda.device(device):
            for i in range(passes + 1):
                torch.cuda.synchronize(device)
                t0 = time.perf_counter()
                copies = [v.to(device) for v in views]
                torch.cuda.synchronize(device)
                if i:
                    times.append(time.perf_counter() - t0)
                del copies
        del views, mapped
    sec = statistics.median(times)
    return {"offload_gbps": total / sec / 1e9, "offload_bytes": total, "offload_tensors": len(sizes),
            "offload_seconds": [round(t, 4) for t in times]}


def measure_memory_write_verify(device: str, fraction: float = 0.9, chunk_bytes: int | None = None) -> dict:
    """Fill most of free VRAM with two address-dependent patterns and verify each; count bad words."""
    import torch

    torch.cuda.empty_cache()  # blocks cached by earlier checks would otherwise sit outside the test
    free = _free_bytes(device)
    chunk_bytes = chunk_bytes or max(64 * 2**20, min(GiB, free // 32))
    n = chunk_bytes // 4
    # Room for one scratch chunk and the comparison's temporary (n bools) beside the chunks under test.
    budget = int(free * fraction) - chunk_bytes - n
    count = max(1, budget // chunk_bytes)
    t0 = time.perf_counter()
    scratch = torch.empty(n, dtype=torch.int32, device=device)
    chunks = []
    for i in range(count):
        chunks.append(torch.empty(n, dtype=torch.int32, device=device))
        if count >= 10 and (i + 1) % max(1, count // 5) == 0:
            _progress(f"memory write/verify: allocated {i + 1}/{count} chunks of {chunk_bytes // 2**20} MiB")
    errors = 0

    def expected(i: int, out):
        torch.arange(n, dtype=torch.int32, device=device, out=out)
        return out.bitwise_xor_((i * 0x9E3779B1) & 0x7FFFFFFF)

    for i, c in enumerate(chunks):
        expected(i, c)
    torch.cuda.synchronize(device)
    for i, c in enumerate(chunks):
        errors += int(torch.ne(c, expected(i, scratch)).sum())
        c.bitwise_not_()  # second pattern: every bit flipped
    for i, c in enumerate(chunks):
        errors += int(torch.ne(c, expected(i, scratch).bitwise_not_()).sum())
    tested = count * chunk_bytes
    del chunks, scratch
    torch.cuda.empty_cache()
    return {"bytes_tested": tested, "free_bytes": free, "bad_words": errors, "seconds": time.perf_counter() - t0,
            "passes": 2}


def measure_peer(devices: list[str], nbytes: int = 512 * 2**20, iters: int = 10) -> dict:
    """Peer access between every pair, and the copy bandwidth from the first GPU to the second."""
    import torch

    idx = [torch.device(d).index for d in devices]
    pairs = {f"{a}->{b}": bool(torch.cuda.can_device_access_peer(a, b)) for a in idx for b in idx if a != b}
    src = torch.empty(nbytes, dtype=torch.uint8, device=devices[0]).fill_(3)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=devices[1])
    for _ in range(2):
        dst.copy_(src)
    torch.cuda.synchronize(devices[0]); torch.cuda.synchronize(devices[1])
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(devices[0]); torch.cuda.synchronize(devices[1])
    sec = (time.perf_counter() - t0) / iters
    ok = bool(torch.equal(dst[:: 4096].cpu(), src[:: 4096].cpu()))
    return {"peer_access": pairs, "gbps": nbytes / sec / 1e9, "copy_correct": ok}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _allreduce_worker(rank: int, world: int, port: int, nbytes: int, iters: int, out_path: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120),
                            device_id=torch.device("cuda", rank))
    try:
        n = nbytes // 4
        x = torch.full((n,), float(rank + 1), device="cuda")
        dist.all_reduce(x)
        want = world * (world + 1) / 2
        wrong = torch.tensor([int((x != want).sum())], device="cuda")
        dist.all_reduce(wrong)
        y = torch.ones(n, device="cuda")
        for _ in range(5):
            dist.all_reduce(y)
        torch.cuda.synchronize()
        dist.barrier()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(y)
        stop.record()
        stop.synchronize()
        sec = torch.tensor([start.elapsed_time(stop) / 1000 / iters], device="cuda")
        dist.all_reduce(sec, op=dist.ReduceOp.MAX)
        if rank == 0:
            algbw = nbytes / sec.item() / 1e9
            result = {"world": world, "nbytes": nbytes, "wrong_elements": int(wrong.item()),
                      "seconds_per_allreduce": sec.item(), "algbw_gbps": algbw,
                      "busbw_gbps": algbw * 2 * (world - 1) / world}
            Path(out_path).write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def measure_allreduce(world: int, nbytes: int = 256 * 2**20, iters: int = 20, timeout: float = 300) -> dict:
    """NCCL all-reduce over `world` GPUs, one process each: correctness, algbw and busbw (nccl-tests)."""
    import torch.multiprocessing as mp

    # NVLink multicast (NVLS) stays off unless the user chose otherwise: this check needs plain rings.
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "allreduce.json"
        port = _free_port()
        procs = [ctx.Process(target=_allreduce_worker, args=(r, world, port, nbytes, iters, str(out)))
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        hung = [p for p in procs if p.is_alive()]
        for p in hung:
            p.terminate()
            p.join(10)
        if hung:
            return {"error": f"all-reduce did not finish in {timeout:.0f} s (NCCL hang)"}
        codes = [p.exitcode for p in procs]
        if any(codes) or not out.exists():
            return {"error": f"all-reduce workers exited {codes}"}
        return json.loads(out.read_text())


# ---- figures -> verdicts ---------------------------------------------------------------------

def d2d_result(fig: dict, gpu: str) -> CheckResult:
    r = judge("d2d_bandwidth", "d2d_bandwidth", fig["gbps"], gpu, fig)
    if not fig.get("copy_correct", True):
        return CheckResult(r.check, "fail", r.value + ", copy corrupted", r.expectation,
                           "the copied data differs from the source: the card's memory is faulty", fig)
    return r


def matmul_result(fig: dict, gpu: str) -> CheckResult:
    return judge("bf16_matmul_tflops", "bf16_matmul", fig["tflops"], gpu, fig)


def h2d_result(fig: dict, gpu: str) -> CheckResult:
    return judge("h2d_bandwidth", "h2d_bandwidth", fig["gbps"], gpu, fig)


def memory_result(fig: dict, gpu: str) -> CheckResult:
    from harness.units import format_bytes

    exp = "0 bad words over >= 80% of free memory"
    value = (f"{gpu}: {format_bytes(fig['bytes_tested'])} of {format_bytes(fig['free_bytes'])} free, "
             f"{fig['passes']} patterns, {fig['bad_words']} bad words, {fig['seconds']:.1f} s")
    if fig["bad_words"]:
        return CheckResult("memory_write_verify", "fail", value, exp,
                           "memory returned different data than written: check ECC/retired pages and "
                           "temperature; on a card without ECC this is faulty VRAM (service/RMA)", fig)
    return CheckResult("memory_write_verify", "pass", value, exp, details=fig)


def allreduce_result(fig: dict, gpu: str) -> CheckResult:
    exp = "every element correct; bus bandwidth reported (and >= 0.75 x reference where known)"
    if "error" in fig:
        return CheckResult("nccl_allreduce", "fail", fig["error"], exp,
                           "NCCL could not complete: check peer access, NCCL_P2P_DISABLE/NCCL_IB settings, "
                           "IOMMU/ACS in the BIOS; run with NCCL_DEBUG=INFO for the transport it chose", fig)
    if fig["wrong_elements"]:
        return CheckResult("nccl_allreduce", "fail",
                           f"{fig['wrong_elements']} wrong elements after all-reduce over {fig['world']} GPUs", exp,
                           "all-reduce returned wrong sums: a faulty link or GPU; test pairs of GPUs to find it", fig)
    r = judge("nccl_allreduce", "allreduce_busbw", fig["busbw_gbps"], gpu, fig)
    r.value = (f"{fig['world']} GPUs, {fig['nbytes'] // 2**20} MiB: correct; busbw {fig['busbw_gbps']:.1f} GB/s "
               f"(algbw {fig['algbw_gbps']:.1f})" + (f"; {r.value}" if r.verdict == "fail" else ""))
    return r


def peer_result(fig: dict, gpu: str) -> CheckResult:
    pairs = fig["peer_access"]
    missing = [k for k, ok in pairs.items() if not ok]
    r = judge("peer_access", "p2p_bandwidth", fig["gbps"], gpu, fig)
    value = f"peer access {len(pairs) - len(missing)}/{len(pairs)} pairs; GPU copy {fig['gbps']:.1f} GB/s"
    if not fig.get("copy_correct", True):
        return CheckResult("peer_access", "fail", value + ", copy corrupted", r.expectation,
                           "data copied between GPUs differs from the source: a faulty link or GPU", fig)
    if missing:
        return CheckResult("peer_access", "warn", value + f" (no peer access: {', '.join(missing)})", r.expectation,
                           "copies between these GPUs go through host memory: GeForce cards have P2P disabled "
                           "by the driver; on datacenter cards check IOMMU/ACS settings and the topology "
                           "(nvidia-smi topo -m)", fig)
    return CheckResult("peer_access", r.verdict, value + (f"; {r.value}" if r.verdict == "fail" else ""),
                       r.expectation, r.fix, fig)
