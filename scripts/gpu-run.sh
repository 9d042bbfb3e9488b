#!/usr/bin/env bash
# Every GPU path of the harness in one call on a lent NVIDIA machine (no package registry there):
# the carried wheels (bitsandbytes, pytest-html, pytest-metadata) are installed to /tmp/site first:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD && bash scripts/gpu-run.sh
# Reports and logs go to $OUT (default reports/gpu).
set -u -o pipefail
export PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache NCCL_NVLS_ENABLE=0
OUT=${OUT:-reports/gpu}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
rc=0
start=$(date +%s)
python3 -m pytest suites/hw --expect-gpu -q -rs -p no:cacheprovider --report-dir "$OUT/hw" \
    >"$OUT/hw.log" 2>&1 || rc=$?
echo "== pytest suites/hw: exit $rc, wall $(( $(date +%s) - start )) s"; grep -E "^harness: |passed|failed" "$OUT/hw.log" | tail -4
start=$(date +%s)
python3 -m pytest tests/test_foundation_models.py suites/vram suites/nan -m "gpu" --expect-gpu --vram-budget 6GiB \
    -q -rA -p no:cacheprovider --report-dir "$OUT/gpu" >"$OUT/gpu.log" 2>&1 || rc=$?
echo "== GPU tests of foundation, vram, nan (6 GiB budget): exit $rc, wall $(( $(date +%s) - start )) s"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/gpu.log" | tail -40
# keep latest.{html,json} of each run: the device tool brings back at most 8 files
find "$OUT" -name "*-20??????-??????.*" -delete
exit $rc
