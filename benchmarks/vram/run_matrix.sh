#!/usr/bin/env bash
# The command that measured measurements/vram/*.json on a lent NVIDIA H200 (the `run` tool of
# this workplace; any CUDA machine works). It brings bitsandbytes as a wheel (.whl/, git-ignored),
# then runs the matrix, one worker process per architecture, writing rows as it goes.
#   benchmarks/vram/run_matrix.sh OUTDIR [ARCHS] [TIME_LIMIT_S] [RESUME_FROM_DIR]
# With RESUME_FROM_DIR, rows measured by an earlier (cut-short) run are copied in and skipped.
# VRAM_MATRIX_ARGS passes more options (e.g. "--precisions bf16,nf4 --no-train").
# The committed matrix took three calls: run 1 (calibration, 5 archs, 330 s), run 2 (resume + the
# held-out llama-3.2-3b, 220 s), run 3 (bf16/nf4 weights rows again, after fixing a runner bug).
set -uo pipefail
out=${1:?OUTDIR}
archs=${2:-qwen2.5-0.5b,llama-3.2-1b,tinyllama-1.1b,qwen2.5-1.5b,smollm2-1.7b}
limit=${3:-330}
if [ -d .whl ] && ! python3 -c "import bitsandbytes" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p "$out"
if [ -n "${4:-}" ]; then cp "$4"/rows-*.json "$out"/ || exit 1; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.csv" 2>&1
python3 -m harness.memory.measured.matrix --archs "$archs" --out "$out" --time-limit-s "$limit" ${VRAM_MATRIX_ARGS:-} 2> >(grep -v "Loading weights\|MatMul8bitLt\|UserWarning\|warnings.warn" | tee "$out/log.txt" >&2)
