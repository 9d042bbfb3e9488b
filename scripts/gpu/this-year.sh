#!/usr/bin/env bash
# Issue 47's family measurements on a lent H200, one call (from the repository root, `.whl` carried):
#   bash scripts/gpu/this-year.sh            # results: $OUT/families-out.tar.gz, $OUT/preflight.txt
# The job set is data, drawn before the run (benchmarks/vram/this_year_jobs.py ->
# measurements/vram/this-year-jobs.json). bitsandbytes goes to /tmp/site (every job), the fused
# Gated DeltaNet kernels (flash-linear-attention, fla-core) to /tmp/site-fla (only the jobs that name
# that path: the others run transformers' reference PyTorch path). Commit the run with
#   python scripts/pack_measurement.py DIR vram/families/run-20 --script "bash scripts/gpu/this-year.sh" ...
# In the background of the calls that carry vLLM's parts (the next hold, docs/gpu.md "The next hold"):
#   FAMILIES_JOBS=measurements/vram/next-hold-jobs.json bash scripts/gpu/this-year.sh start
# returns at once; `bash scripts/gpu/vllm_steps.sh wait-families S` waits for it (/tmp/families.pid,
# /tmp/families-out/DONE) and then the GPU is free; /tmp/families-out.tar.gz holds the run.
set -uo pipefail
if [ "${1:-}" = start ]; then
  (setsid bash "$0" > /tmp/this-year.log 2>&1 < /dev/null & echo $! > /tmp/families.pid)
  echo "this-year.sh started in the background (pid $(cat /tmp/families.pid), jobs ${FAMILIES_JOBS:-measurements/vram/this-year-jobs.json})"
  exit 0
fi
OUT=${OUT:-/tmp/this-year-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
pip_target() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$@"; }
pip_target /tmp/site .whl/bitsandbytes-*.whl || echo "bitsandbytes: install failed"
pip_target /tmp/site-fla .whl/fla_core-*.whl .whl/flash_linear_attention-*.whl || echo "fla: install failed"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 - <<'PY'
import torch, transformers
from transformers import AutoConfig
print("torch", torch.__version__, "transformers", transformers.__version__)
for t in ("gemma3_text", "gemma4_text", "qwen3_5_text", "lfm2", "granitemoehybrid", "gpt_oss"):
    try:
        AutoConfig.for_model(t)
        print(t, "known")
    except Exception as exc:
        print(t, "UNKNOWN:", str(exc).splitlines()[0][:120])
PY
  PYTHONPATH=/tmp/site-fla python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1
} > "$OUT/preflight.txt" 2>&1
cat "$OUT/preflight.txt"
FAMILIES_JOBS=${FAMILIES_JOBS:-measurements/vram/this-year-jobs.json} FAMILIES_LIMIT_S=${FAMILIES_LIMIT_S:-420} \
  FAMILIES_SAVE_LIMIT_S=${FAMILIES_SAVE_LIMIT_S:-200} FAMILIES_SLOTS=${FAMILIES_SLOTS:-12} \
  FAMILIES_OUT=/tmp/families-out bash scripts/gpu/families.sh
tail -5 /tmp/families-out/log.txt
cp /tmp/families-out.tar.gz "$OUT/"
