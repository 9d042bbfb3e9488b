#!/usr/bin/env bash
# Issue 27 on a lent H200 (the GPU vLLM helper runs it in the background of its own call):
#   FAMILIES_OUT=/tmp/families-out setsid bash scripts/gpu/families.sh
# FAMILIES_SET picks the driver's job set: issue27 (default, the first run: Gemma-2/3, Qwen3, Phi-4-mini)
# or mistral-moe (the second: Mistral-7B v0.3 training/boundary/inference, Qwen3-30B-A3B inference and
# plan --offload checked by a real offloaded run; measurements/vram/families/run-02) or fresh (the
# third: Mistral-7B checkpointed batch-2 steps and 30 new plan --train 6 GiB boundary cases over five
# families, ~35 cases in ~150 s; measurements/vram/families/run-03). Commit a run with
#   python scripts/pack_measurement.py families-out vram/families/run-NN --script ... --date ...
#   FAMILIES_SET=fresh FAMILIES_LIMIT_S=250 bash scripts/gpu/families.sh
# From the repository root. Uses python3 there (torch 2.11+cu130, transformers 5.17, peft) and the
# bitsandbytes wheel under .whl/ (installed to /tmp/site unless it imports already). Stops itself
# within FAMILIES_LIMIT_S (default 285 s of cases, 305 s hard; the pip install and tar add ~20 s), writes $FAMILIES_OUT/DONE, then
# packs everything into /tmp/families-out.tar.gz (< 16 MiB: the case logs go first if it is not).
set -uo pipefail
out=${FAMILIES_OUT:-/tmp/families-out}
limit=${FAMILIES_LIMIT_S:-285}
mkdir -p "$out"
start=$(date +%s)
if ! python3 -c "import bitsandbytes" 2>/dev/null; then
  if ls .whl/bitsandbytes-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/bitsandbytes-*.whl \
      > "$out/pip.txt" 2>&1 || echo "bitsandbytes install failed" >> "$out/pip.txt"
  fi
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv > "$out/gpu.csv" 2>&1
python3 -c "import bitsandbytes, torch, transformers, peft; print(bitsandbytes.__version__, torch.__version__, transformers.__version__, peft.__version__)" > "$out/versions.txt" 2>&1
# FAMILIES_JOBS: a job set kept as data (a jobs file) instead of FAMILIES_SET's drawn one
jobs=(--set "${FAMILIES_SET:-issue27}")
[ -n "${FAMILIES_JOBS:-}" ] && jobs=(--jobs "$FAMILIES_JOBS")
timeout -k 5 $(( limit + 20 )) python3 benchmarks/vram/families.py --out "$out" --time-limit-s "$limit" "${jobs[@]}" \
  --slots "${FAMILIES_SLOTS:-10}" --save-limit-s "${FAMILIES_SAVE_LIMIT_S:-90}" \
  2> >(grep -v "warnings.warn\|UserWarning\|FutureWarning" > "$out/log.txt")
echo "exit $? after $(( $(date +%s) - start )) s" >> "$out/log.txt"
[ -f "$out/DONE" ] || echo '{"incomplete": true}' > "$out/DONE"
tar czf /tmp/families-out.tar.gz -C "$(dirname "$out")" "$(basename "$out")"
if [ "$(stat -c %s /tmp/families-out.tar.gz)" -gt 16000000 ]; then
  rm -rf "$out/logs" "$out"/rows/*.d
  tar czf /tmp/families-out.tar.gz -C "$(dirname "$out")" "$(basename "$out")"
fi
