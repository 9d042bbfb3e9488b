"""Start a server process (vLLM from any interpreter, or the stand-in), wait for it, always kill it.

The server runs in its own process group (same session) on 127.0.0.1 and a free port, logging
to a file. While waiting for /health the process is watched: a crash at start raises
ServerStartError naming the log's cause. The group dies with the harness however it ends
(process_group.py): on exit it gets SIGTERM, then SIGKILL; killed, a reaper in the group does it.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, asdict
from pathlib import Path
from typing import Callable, Iterator, Sequence

from ..errors import HarnessError
from .process_group import STOP_GRACE_S, can_die_with_parent, die_with_parent, stop_group, watch

class ServerStartError(HarnessError):
    """The server exited or never became healthy; the message carries the log's cause."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class StartupInfo:
    """What vLLM's startup log says about its KV cache (None where the log did not say)."""

    version: str | None = None
    kv_cache_tokens: int | None = None
    kv_cache_memory_gib: float | None = None
    max_concurrency: float | None = None
    max_concurrency_at_tokens: int | None = None
    startup_s: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


_KV_TOKENS = re.compile(r"KV cache size:\s*([\d,]+)\s*tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for\s*([\d,]+)\s*tokens per request:\s*([\d.,]+)x")
_KV_MEM_GPU = re.compile(r"Available KV cache memory:\s*([\d.]+)\s*GiB")
_KV_MEM_CPU = re.compile(r"\(([\d.]+)/[\d.]+\)\s*GiB for KV cache")
_VERSION = re.compile(r"(?:vLLM API server version|version)\s+v?(\d+\.\d+\.\d+\S*)")


def parse_startup_log(text: str) -> StartupInfo:
    info = StartupInfo()
    if m := _KV_TOKENS.search(text):
        info.kv_cache_tokens = int(m.group(1).replace(",", ""))
    if m := _MAX_CONC.search(text):
        info.max_concurrency_at_tokens = int(m.group(1).replace(",", ""))
        info.max_concurrency = float(m.group(2).replace(",", ""))
    if m := _KV_MEM_GPU.search(text) or _KV_MEM_CPU.search(text):
        info.kv_cache_memory_gib = float(m.group(1))
    if m := _VERSION.search(text):
        info.version = m.group(1)
    return info


# What a GPU vLLM is busy with while /health is not up yet, last match wins (a first start spends
# ~20 s in torch.compile and ~60 s capturing CUDA graphs: a bare "waiting 90 s" looks hung).
_PHASES = (
    (re.compile(r"Initializing a V1 LLM engine|Initializing an LLM engine"), "starting the engine"),
    (re.compile(r"Starting to load model|Loading (?:safetensors|weights)"), "loading weights"),
    (re.compile(r"Model loading took"), "profiling memory"),
    # not vLLM's "Enforce eager set, disabling torch.compile, ..." (logged first thing on the CPU build)
    (re.compile(r"(?<!disabling )torch\.compile|Compiling a graph|Dynamo bytecode transform"), "torch.compile"),
    (re.compile(r"KV cache size|Available KV cache memory"), "KV cache sized"),
    (re.compile(r"Capturing CUDA graph|cudagraph capturing|Graph capturing"), "capturing CUDA graphs"),
    (re.compile(r"Graph capturing finished|init engine .* took"), "starting the API server"),
)


def startup_phase(text: str) -> str:
    """The latest start-up phase the log shows ('' before the first)."""
    best, where = "", -1
    for pattern, label in _PHASES:
        for m in pattern.finditer(text):
            if m.start() > where:
                best, where = label, m.start()
    return best


_CAUSE = re.compile(r"(Error|Exception|error:|ERROR|Traceback|Killed|RuntimeError)")


def log_cause(text: str, lines: int = 3) -> str:
    """The most telling lines of a crash log: the last error/exception lines, else the tail."""
    all_lines = [line.strip() for line in text.splitlines() if line.strip()]
    hits = [line for line in all_lines if _CAUSE.search(line) and not line.startswith("warnings.warn")]
    chosen = hits[-lines:] if hits else all_lines[-lines:]
    return " | ".join(line[:300] for line in chosen) or "(empty log)"


def explained(text: str) -> str:
    """What harness.explain makes of a failed start-up log, as a suffix ('' when not recognised)."""
    from ..explain import explain_short

    note = explain_short(text)
    return f" -- {note}" if note else ""


@dataclass
class ServerProcess:
    """A running server: where to reach it, its log, and (for vLLM) what its startup log said."""

    base_url: str
    port: int
    pid: int
    log_path: Path
    command: list[str]
    flags: list[str] = field(default_factory=list)
    model: str | None = None
    startup: StartupInfo = field(default_factory=StartupInfo)
    _proc: subprocess.Popen | None = None
    _until_healthy: Callable[[], None] | None = None  # set while a start that did not wait is pending

    def wait_healthy(self) -> None:
        """For a start with wait=False: block until /health answers (ServerStartError as a start
        that waits would raise); at once when already waited for."""
        if self._until_healthy is not None:
            wait, self._until_healthy = self._until_healthy, None
            wait()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def kill(self, grace_s: float = STOP_GRACE_S) -> None:
        if self._proc is not None:
            stop_group(self._proc, grace_s)

    def environment(self) -> dict:
        """Facts for the results' environment block."""
        return {"flags": self.flags, "startup": self.startup.to_json(), "server_log": str(self.log_path),
                "server_command": self.command}


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@contextlib.contextmanager
def start_process(
    command: Sequence[str],
    *,
    port: int,
    env: dict | None = None,
    log_path: Path | None = None,
    startup_timeout_s: float = 600.0,
    name: str = "server",
    health_path: str = "/health",
    progress: bool = True,
    wait: bool = True,
) -> Iterator[ServerProcess]:
    """`wait`: yield once /health answers; False: yield the process at once, and the caller waits
    with server.wait_healthy() (several servers started side by side, each from this thread)."""
    log_path = Path(log_path or tempfile.mkstemp(prefix=f"{name}-", suffix=".log")[1])
    log_path.parent.mkdir(parents=True, exist_ok=True)
    base_url = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        # Its own process group (killpg reaches vLLM's engine and worker processes; a terminal's
        # Ctrl-C does not), but the caller's session: with the kernel's autogroup scheduling a new
        # session is a separate CPU group, and on a small machine the client's crowded group then
        # stalls 100-250 ms at a time while the server's group runs (measured with an independent
        # probe on a 2-core VM), which corrupts every client-side timestamp.
        proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, **(env or {})}, process_group=0,
                                preexec_fn=die_with_parent if can_die_with_parent() else None)
    watch(proc)
    server = ServerProcess(base_url=base_url, port=port, pid=proc.pid, log_path=log_path, command=list(command), _proc=proc)
    started = time.monotonic()

    def until_healthy() -> None:
        last_note = 0.0
        while True:
            code = proc.poll()
            if code is not None:
                raise ServerStartError(f"{name} exited with code {code} during start-up: {log_cause(server.log_text())}{explained(server.log_text())} (log: {log_path})")
            if _healthy(base_url + health_path):
                break
            elapsed = time.monotonic() - started
            if elapsed > startup_timeout_s:
                raise ServerStartError(f"{name} not healthy after {startup_timeout_s:.0f} s: {log_cause(server.log_text())}{explained(server.log_text())} (log: {log_path})")
            if progress and elapsed - last_note >= 10:
                last_note = elapsed
                phase = startup_phase(server.log_text())
                print(f"waiting for {name} on {base_url}: {elapsed:.0f} s{f' ({phase})' if phase else ''}",
                      file=sys.stderr, flush=True)
            time.sleep(0.5)
        server.startup = parse_startup_log(server.log_text())
        server.startup.startup_s = round(time.monotonic() - started, 1)
        if progress:
            print(f"{name} ready on {base_url} after {server.startup.startup_s:.0f} s", file=sys.stderr, flush=True)

    server._until_healthy = until_healthy
    try:
        if wait:
            server.wait_healthy()
        yield server
    finally:
        stop_group(proc)


def gpu_env(python: str | Path) -> dict:
    """Environment a CUDA vLLM needs when flashinfer is not installed beside it: without flashinfer
    the sampler must be told not to use it (VLLM_USE_FLASHINFER_SAMPLER=0), or the engine dies at
    start with "No module named 'flashinfer'". A caller's own setting wins."""
    if "VLLM_USE_FLASHINFER_SAMPLER" in os.environ:
        return {}
    code = "import importlib.util as u; print(int(u.find_spec('flashinfer') is not None))"
    try:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {"VLLM_USE_FLASHINFER_SAMPLER": "0"} if out == "0" else {}


AMX_SITE = Path(__file__).resolve().parent / "amx_site"


def amx_env(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """On a host whose CPU has AMX tiles, amx_site/ first on the server's PYTHONPATH: vLLM's CPU
    attention runs AMX instructions in bf16 without asking Linux for the tile state, and dies with
    SIGILL (amx_site/sitecustomize.py asks in every process of the server). Elsewhere nothing."""
    try:
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        return {}
    if "amx_tile" not in flags.split():
        return {}
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(AMX_SITE), os.environ.get("PYTHONPATH")) if p)}


HTTP_TTFT_MIDDLEWARE = "harness.serving.http_ttft.HttpTtftMiddleware"
HARNESS_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the harness package


def server_pythonpath(current: str | None) -> str:
    """The server's PYTHONPATH with the harness importable (for --middleware), after what was there
    (amx_site's sitecustomize must stay first)."""
    parts = [p for p in (current or os.environ.get("PYTHONPATH") or "").split(os.pathsep) if p]
    return os.pathsep.join(parts + ([str(HARNESS_ROOT)] if str(HARNESS_ROOT) not in parts else []))


IPC_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


def inductor_cache_dir() -> str:
    """Where torch keeps its compiled kernels when TORCHINDUCTOR_CACHE_DIR is unset: the temp folder's
    torchinductor_<user> (torch/_inductor/runtime/cache_dir_utils.py, default_cache_dir)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def server_temp_env(env: dict, folder: str) -> dict:
    """What goes into a server's own temp folder, removed with it: vLLM's ZeroMQ socket files
    (VLLM_RPC_BASE_PATH) and whatever it writes to the temp folder (TMPDIR: the FileStore of its
    distributed init, vllm_dist_*); by default each start leaves both in /tmp. The folder is made in
    this process's temp folder (a TMPDIR of the user's is where it goes); torch's compiled kernels
    stay where they were, shared between starts (TORCHINDUCTOR_CACHE_DIR). What the caller sets in
    env stands, and a VLLM_RPC_BASE_PATH or TORCHINDUCTOR_CACHE_DIR of this process's environment."""
    given = lambda name: name in env or name in os.environ  # noqa: E731
    out = {}
    if not given("VLLM_RPC_BASE_PATH"):
        # a socket is <base>/<uuid4>, and a Unix socket's path holds 107 bytes at most (ZeroMQ refuses
        # more): a folder too deep for that leaves the sockets where vLLM would have put them
        fits = len(os.fsencode(folder)) + 1 + 36 <= IPC_PATH_MAX
        out["VLLM_RPC_BASE_PATH"] = folder if fits else env.get("TMPDIR") or tempfile.gettempdir()
    if "TMPDIR" not in env:
        out["TMPDIR"] = folder
        if not given("TORCHINDUCTOR_CACHE_DIR"):
            out["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache_dir()
    return out


@contextlib.contextmanager
def launch_vllm(
    python: str | Path,
    model_dir: str | Path,
    flags: Sequence[str] = (),
    env: dict | None = None,
    *,
    log_dir: Path | None = None,
    startup_timeout_s: float = 600.0,
    served_model_name: str | None = None,
    http_ttft: bool = False,
    wait: bool = True,
) -> Iterator[ServerProcess]:
    """vLLM's OpenAI server from interpreter `python` (its own venv), on 127.0.0.1:<free port>.
    `http_ttft`: add the harness's middleware that stamps the TTFT at the HTTP layer (http_ttft.py).
    `wait`: as start_process's."""
    python = Path(python)
    if not python.exists():
        raise ServerStartError(f"vLLM interpreter {python} does not exist")
    port = free_port()
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--host", "127.0.0.1", "--port", str(port), *flags]
    if served_model_name:
        command += ["--served-model-name", served_model_name]
    if http_ttft:
        command += ["--middleware", HTTP_TTFT_MIDDLEWARE]
    full_env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", **gpu_env(python), **amx_env(), **(env or {})}
    if http_ttft:
        full_env["PYTHONPATH"] = server_pythonpath(full_env.get("PYTHONPATH"))
    log_path = None
    if log_dir is not None:
        log_path = Path(log_dir) / f"vllm-{port}.log"
    with contextlib.ExitStack() as stack:
        full_env.update(server_temp_env(full_env, stack.enter_context(tempfile.TemporaryDirectory(prefix="hv-"))))
        server = stack.enter_context(start_process(
            command, port=port, env=full_env, log_path=log_path, startup_timeout_s=startup_timeout_s,
            name=f"vLLM ({python.parent.parent.name})", wait=wait))
        server.flags = list(flags)
        server.model = served_model_name or str(model_dir)
        yield server
