#!/usr/bin/env bash
# Issue 13 on a lent H200, in one `run` call (the device tool of this workplace; any CUDA machine
# works), from the repository root with bitsandbytes on PYTHONPATH:
#   scripts/gpu/vram.sh OUTDIR [TIME_LIMIT_S [memory_truth.py options...]]
# It ran as: pip install --target /tmp/site .whl/*.whl (bitsandbytes 0.50.2, pytest-html,
# pytest-metadata); export PYTHONPATH=/tmp/site:$PWD; scripts/gpu/vram.sh $OUT 470
# The second run (the validation set): scripts/gpu/vram.sh $OUT 450 --validation
# -> OUTDIR/train_rows.json, offload_rows.json, log.txt, gpu.csv, case-logs.tgz, pytest-offload.txt
set -uo pipefail
out=${1:?OUTDIR}
limit=${2:-470}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false TRANSFORMERS_VERBOSITY=error HF_HUB_OFFLINE=1
mkdir -p "$out"
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.csv" 2>&1
python3 benchmarks/vram/memory_truth.py --out "$out" --time-limit-s "$limit" "${@:3}" 2> >(grep -v "warnings.warn\|UserWarning\|FutureWarning" | tee "$out/log.txt" >&2)
tar czf "$out/case-logs.tgz" -C /tmp truth-train truth-offload 2>/dev/null
# the suite's GPU offload test, on the random qwen2.5-3b the matrix saved, if time is left
left=$(( ${VRAM_END_S:-570} - $(date +%s) + start ))
if [ "$left" -gt 45 ] && [ -d /tmp/vram-models/qwen2.5-3b ]; then
  timeout $(( left - 10 )) python3 -m pytest suites/vram/test_offload.py -p no:cacheprovider -q -rA \
    --model /tmp/vram-models/qwen2.5-3b --expect-gpu --report-dir /tmp/reports > "$out/pytest-offload.txt" 2>&1
  echo "pytest exit $?" >> "$out/pytest-offload.txt"
fi
