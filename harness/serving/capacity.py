"""What this machine's load client can keep up with, and a warning before a run that asks more.

The client's capacity is counted in content chunks (tokens) per second with its schedule lag p99
at most 1 ms: benchmarks/serving/client_capacity.py measures it against the stand-in server for
1, 2, 4, 8 worker processes and saves it (REPORT_DIR/client-capacity.json, with the machine it was
measured on). Without a saved calibration for this machine, a quick estimate times the client's
per-chunk work (frame split, JSON parse, text pick) in this process and scales it by how much of
a chunk's cost that work is, measured once on the 2-core development box (CHUNK_WORK_SHARE).

Before a run, the rate asked of the client is predicted from the warm-up: concurrency / the
warm-up's time per output token. That is an upper bound (a batching server slows each stream as
concurrency grows), so the warning says "may".
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from .client import _chunk_text, _loads

CAPACITY_FILE = "client-capacity.json"
LAG_P99_BAR_MS = 1.0
# Of the client's whole cost per chunk (socket read, event-loop wake-up, bookkeeping), the share
# the timed parsing work accounts for (client_capacity.py prints the figure it measures).
CHUNK_WORK_SHARE = 0.12


@dataclass
class Capacity:
    source: str  # said in the warning: where the figures come from
    tokens_per_s: dict[int, float] = field(default_factory=dict)  # workers -> chunks/s at lag p99 <= bar_ms
    bar_ms: float = LAG_P99_BAR_MS

    def at(self, workers: int) -> float | None:
        """The rate `workers` processes keep up with: measured, interpolated, or scaled linearly
        (with a 0.8 discount) past the largest measured count."""
        if not self.tokens_per_s:
            return None
        known = sorted(self.tokens_per_s)
        if workers in self.tokens_per_s:
            return self.tokens_per_s[workers]
        below = [w for w in known if w < workers]
        above = [w for w in known if w > workers]
        if below and above:
            a, b = below[-1], above[0]
            t = (workers - a) / (b - a)
            return self.tokens_per_s[a] + t * (self.tokens_per_s[b] - self.tokens_per_s[a])
        if below:
            top = below[-1]
            return self.tokens_per_s[top] * (1 + 0.8 * (workers - top) / top)
        return self.tokens_per_s[known[0]] * workers / known[0]


def machine_key(machine: dict) -> dict:
    return {k: machine.get(k) for k in ("hostname", "cpu_model", "cpu_count")}


def load_saved(report_dir: Path, machine: dict) -> Capacity | None:
    """The saved calibration, if it was measured on this machine."""
    path = Path(report_dir) / CAPACITY_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("machine") != machine_key(machine):
        return None
    source = f"calibration {path} ({data.get('measured', '?')})"
    for key, bar in (("tokens_per_s", LAG_P99_BAR_MS), ("tokens_per_s_10ms", 10.0)):
        # a machine too busy to keep lag p99 under 1 ms at any rate: its 10 ms figure (bench's
        # client-bound limit) is the one worth warning with
        rates = {int(k): float(v) for k, v in (data.get(key) or {}).items() if isinstance(v, (int, float)) and v > 0}
        if rates:
            return Capacity(source, rates, bar)
    return None


def quick_estimate(max_workers: int, frames: int = 4000) -> Capacity:
    """Time the per-chunk parsing work here; capacity = that rate x CHUNK_WORK_SHARE per worker."""
    frame = b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":' \
            b'[{"index":0,"text":" token","logprobs":null,"finish_reason":null}]}\n\n'
    started = time.perf_counter()
    buffer, count = b"", 0
    for _ in range(frames):  # the same steps as client.send_one per network read
        buffer += frame
        while True:
            cut = buffer.find(b"\n")
            if cut < 0:
                break
            line, buffer = buffer[:cut].strip(), buffer[cut + 1:]
            if line.startswith(b"data:"):
                count += bool(_chunk_text(_loads(line[5:].strip())))
    per_chunk = (time.perf_counter() - started) / max(1, count)
    one = CHUNK_WORK_SHARE / per_chunk
    rates = {w: one * w for w in (1, 2, 4, 8, 16) if w <= max(1, max_workers)}
    return Capacity(f"quick estimate (no saved calibration for this machine; {1e6 * per_chunk:.1f} us of "
                    f"parsing per chunk)", rates)


def asked_rate(concurrency: int | None, request_rate: float | None, output_len: int,
               seconds_per_token: float | None) -> tuple[float | None, str]:
    """(tokens/s the run may ask of the client, how that was predicted)."""
    if request_rate:
        return request_rate * output_len, f"rate {request_rate:g}/s x {output_len} output tokens"
    if not concurrency or not seconds_per_token or seconds_per_token <= 0 or not math.isfinite(seconds_per_token):
        return None, ""
    return concurrency / seconds_per_token, (f"concurrency {concurrency} at the warm-up's "
                                             f"{1000 * seconds_per_token:.1f} ms per token per stream")


def warning(want: float | None, how: str, workers: int, cap: Capacity) -> dict:
    """{"predicted_tokens_per_s", "capacity_tokens_per_s", "source", "warning"}: the warning is a
    line when the predicted rate is past the capacity, else None."""
    can = cap.at(workers)
    out = {"workers": workers, "predicted_tokens_per_s": want, "predicted_from": how or None,
           "capacity_tokens_per_s": can, "lag_p99_bar_ms": cap.bar_ms, "source": cap.source, "warning": None}
    if want is not None and can is not None and want > can:
        out["warning"] = (f"this run may ask ~{want:,.0f} tokens/s of the client ({how}); {workers} client "
                          f"worker(s) keep schedule lag p99 <= {cap.bar_ms:g} ms up to ~{can:,.0f} tokens/s "
                          f"[{cap.source}]: expect a client-bound run (more --workers, fewer streams)")
    return out


def for_machine(report_dir: Path, machine: dict, max_workers: int) -> Capacity:
    """The saved calibration of this machine, else a quick estimate."""
    return load_saved(report_dir, machine) or quick_estimate(max_workers)
