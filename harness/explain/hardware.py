"""GPU hardware faults (kernel-log Xid lines, "fallen off the bus", ECC) and NCCL failures.

Xid meanings from NVIDIA's Xid catalogue: some are the application's fault (13, 31, 43), some the
card's (48 and 94/95 ECC, 63/64 row remapping, 74 NVLink, 79 off the bus, 119/120 GSP). An
"illegal memory access" is usually software, and explain says so.
"""

from __future__ import annotations

import re

from .model import Cause, Context, Finding
from .text import Log
from .kinds import declare

declare("gpu_hardware", "GPU hardware",
        "check dmesg for Xid lines and nvidia-smi -q for ECC/row remapping; reseat, cool and power the card; "
        "reboot")
declare("nccl", "NCCL",
        "rerun with NCCL_DEBUG=INFO; in docker use --ipc=host; NCCL_P2P_DISABLE=1 if P2P fails; set "
        "NCCL_SOCKET_IFNAME across nodes")


XID = {
    13: ("graphics engine exception: usually the application (an out-of-range access in a kernel)", "software"),
    31: ("GPU memory page fault: usually an application or driver bug", "software"),
    43: ("the GPU stopped a channel after an application fault", "software"),
    45: ("preemptive cleanup after another error (look at the Xid before it)", "software"),
    48: ("double-bit (uncorrectable) ECC error in GPU memory", "hardware"),
    61: ("internal micro-controller breakpoint/warning", "hardware"),
    62: ("internal micro-controller halt", "hardware"),
    63: ("ECC page retirement or row remapping recorded", "hardware"),
    64: ("ECC page retirement or row remapping failed", "hardware"),
    74: ("NVLink error", "hardware"),
    79: ("the GPU has fallen off the bus: power, thermals, seating or PCIe", "hardware"),
    92: ("high single-bit ECC error rate", "hardware"),
    94: ("contained ECC error (the affected application must restart)", "hardware"),
    95: ("uncontained ECC error (every application on the GPU is affected)", "hardware"),
    119: ("GSP firmware RPC timeout", "hardware"),
    120: ("GSP firmware error", "hardware"),
}
_XID = r"Xid\s*(?:\(PCI:[^)]*\))?\s*:?\s*(\d+)|XID\s+(\d+)"
_OFF_BUS = r"fallen off the bus|GPU is lost|ERROR_GPU_IS_LOST|GPU lost from the bus"
_ECC = r"uncorrectable ECC error"
_ILLEGAL = r"an illegal memory access was encountered|CUDA_ERROR_ILLEGAL_ADDRESS|cudaErrorIllegalAddress"


def _xids(log: Log) -> list[tuple[int, re.Match]]:
    found = []
    for m in re.finditer(_XID, log.text):
        code = int(m.group(1) or m.group(2))
        found.append((code, m))
    return found


def _hardware_fix(codes: set[int], off_bus: bool) -> str:
    parts = []
    if 79 in codes or off_bus:
        parts.append("the card dropped off PCIe: check power (PSU capacity, cables), thermals and cooling (fans, "
                     "temperatures under load), reseat the card, update the system BIOS; limiting clocks "
                     "(nvidia-smi -lgc) tests a power cause; a reboot is needed to get the GPU back")
    if codes & {48, 63, 64, 92, 94, 95} or not parts:
        parts.append("for ECC errors: reset the GPU (nvidia-smi -r) or reboot, then read nvidia-smi -q -d "
                     "ECC,ROW_REMAPPER; row-remapping failures (Xid 64) or repeated double-bit errors mean the "
                     "card should be replaced")
    if codes & {74}:
        parts.append("for NVLink errors: reset the GPUs and check the NVLink bridge/fabric")
    if codes & {119, 120}:
        parts.append("for GSP errors: update the driver, or set NVreg_EnableGpuFirmware=0 on drivers that allow it")
    return "; ".join(parts)


def recognise_hardware(log: Log, ctx: Context) -> list[Finding]:
    xids = _xids(log)
    off = log.search(_OFF_BUS)
    ecc = log.search(_ECC)
    codes = {c for c, _ in xids}
    hw_codes = {c for c in codes if XID.get(c, ("", "hardware"))[1] == "hardware"}
    if not (codes or off or ecc):
        return []
    if not (hw_codes or off or ecc):
        return [_software_xid(log, xids)]
    causes = []
    for code, m in xids:
        meaning = XID.get(code, (f"Xid {code}", "unknown"))[0]
        if not any(c.cause.startswith(f"Xid {code}:") for c in causes):
            causes.append(Cause(f"Xid {code}: {meaning}", log.line_of(m)))
    if off and not (codes & {79}):
        causes.append(Cause("the GPU fell off the bus: power, thermals, seating or PCIe", log.line_of(off)))
    if ecc:
        causes.append(Cause("an uncorrectable ECC error in GPU memory", log.line_of(ecc)))
    causes.sort(key=lambda c: 0 if any(f"Xid {h}:" in c.cause for h in hw_codes) or "fell off" in c.cause else 1)
    last = max([m.end() for _, m in xids] + [x.end() for x in (off, ecc) if x])
    return [Finding("gpu_hardware", "the GPU reported a hardware fault", causes, _hardware_fix(codes, bool(off)) + ".",
                    score=95, position=last, figures_from_log={"xid": sorted(codes)} if codes else {})]


def _software_xid(log: Log, xids: list[tuple[int, re.Match]]) -> Finding:
    causes = [Cause(f"Xid {code}: {XID.get(code, ('an Xid NVIDIA does not list as a hardware fault', ''))[0]}",
                    log.line_of(m)) for code, m in xids]
    return Finding("gpu_hardware", "the driver logged an Xid that points at the application, not the card", causes,
                   "find the failing kernel (CUDA_LAUNCH_BLOCKING=1, compute-sanitizer); update the driver and the "
                   "library that launched it; suspect the card only if hardware Xids (48, 63, 64, 79, 94, 95) follow.",
                   score=65, position=xids[-1][1].end(), figures_from_log={"xid": sorted({c for c, _ in xids})})


def recognise_illegal_access(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_ILLEGAL)
    if not m or recognise_hardware(log, ctx):
        return []
    return [Finding("gpu_hardware", "a CUDA kernel read or wrote memory it does not own (illegal memory access)",
                    [Cause("usually software, not the card: a kernel bug or a build mismatch (flash-attn, a custom "
                           "or Triton kernel, a torch/vLLM version pair), or an out-of-range index", log.line_of(m)),
                     Cause("hardware only when the kernel log shows an Xid 48/94/95 (ECC) or 79 at the same time",
                           "no hardware Xid in this text")],
                    "rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel; try without custom attention kernels "
                    "(attn_implementation='sdpa', vLLM --enforce-eager) and upgrade or pin the library versions; "
                    "check dmesg for Xid lines before suspecting the card.", score=60, position=m.end())]


_NCCL = (r"NCCL WARN|ncclSystemError|ncclInternalError|ncclUnhandledCudaError|ncclInvalidUsage|ncclRemoteError|"
         r"NCCL error|NCCL Error \d|unhandled system error|unhandled cuda error|Watchdog caught collective operation "
         r"timeout|NCCL communicator was aborted|ProcessGroupNCCL.*(?:timeout|Timeout)|Test NCCL failure")
_TIMEOUT = (r"Watchdog caught collective operation timeout: WorkNCCL\((?:SeqNum=(\d+), )?OpType=(\w+).*?"
            r"Timeout\(ms\)=(\d+)\) ran for (\d+) milliseconds")


def _nccl_timeout(log: Log, m: re.Match) -> Finding:
    op, timeout_ms, ran_ms = m.group(2), int(m.group(3)), int(m.group(4))
    causes = [Cause(f"the {op} waited {ran_ms / 60000:.1f} min (timeout {timeout_ms / 60000:.0f} min): at least one "
                    "rank never reached it", log.line_of(m)),
              Cause("that rank was busy or stuck elsewhere: uneven data (one rank gets more batches), work only rank "
                    "0 does (evaluation, saving, preprocessing), a different code path per rank, or a hung GPU",
                    "the usual reasons a collective times out")]
    fix = ("find the rank that did not arrive (the others name the same SeqNum; TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
           "with TORCH_NCCL_DUMP_ON_TIMEOUT=1 dumps what each rank ran); give every rank the same number of "
           "batches; raise the timeout (init_process_group(timeout=...) or Trainer's ddp_timeout) only when a "
           "rank legitimately takes longer, e.g. dataset preprocessing on rank 0")
    return Finding("nccl", f"an NCCL {op} timed out after {timeout_ms / 60000:.0f} min", causes, fix + ".", score=80,
                   position=m.end(), figures_from_log={"op": op, "timeout_ms": timeout_ms, "ran_for_ms": ran_ms})


def recognise_nccl(log: Log, ctx: Context) -> list[Finding]:
    m = log.search(_NCCL)
    if not m:
        return []
    t = log.search(_TIMEOUT)
    if t:
        return [_nccl_timeout(log, t)]
    evidence = log.line_of(m)
    causes = []
    if log.has(r"/dev/shm|shared memory|docker|container|--ipc"):
        causes.append(Cause("in a container, /dev/shm is too small for NCCL's shared-memory transport",
                            log.evidence(r"/dev/shm|shared memory|docker|container") or evidence))
    if log.has(r"peer access|P2P|NCCL_P2P"):
        causes.append(Cause("peer-to-peer access between the GPUs does not work (consumer cards, IOMMU/ACS)",
                            log.evidence(r"peer access|P2P") or evidence))
    if log.has(r"NET/Socket|NET/IB|ibv_|Connection refused|Socket Timeout|multi-?node"):
        causes.append(Cause("the network between nodes: wrong interface, InfiniBand set-up or a firewall",
                            log.evidence(r"NET/Socket|NET/IB|ibv_|Connection refused|Socket Timeout") or evidence))
    causes.append(Cause("an NCCL system call failed; NCCL_DEBUG=INFO names which (shared memory, sockets, P2P, "
                        "a driver/library mismatch)", evidence))
    fix = ("rerun with NCCL_DEBUG=INFO to see the failing call; in docker run with --ipc=host (or --shm-size=16g); "
           "if P2P fails set NCCL_P2P_DISABLE=1; across nodes set NCCL_SOCKET_IFNAME to the right interface (and "
           "NCCL_IB_DISABLE=1 without InfiniBand); check that the driver and torch's NCCL match; as a stopgap, "
           "run on one GPU (CUDA_VISIBLE_DEVICES=0)")
    return [Finding("nccl", "NCCL (the GPUs' collective communication) failed", causes, fix + ".", score=70,
                    position=m.end())]


RECOGNISERS = (recognise_hardware, recognise_illegal_access, recognise_nccl)
