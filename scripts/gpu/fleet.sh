#!/usr/bin/env bash
# What ran on the lent GPU machine (nvidia-h200, one GPU) for issue 17: the xdist path, one worker
# per visible GPU (`-n auto`), suites/hw at the quick level plus the full level's bandwidth and
# TFLOP/s figures (the whole-memory pass left out to stay inside the device budget). The merged
# JSON and HTML land in $OUT. Expects PYTHONPATH to hold the carried wheels and the tree.
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
OUT=${OUT:-/tmp/fleet-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader
python3 -c "import xdist, torch; print('pytest-xdist', xdist.__version__, 'torch', torch.__version__)"
start=$(date +%s.%N)
timeout 110 python3 -m pytest -n auto suites/hw --hw-level full -k "not memory_write_verify" --expect-gpu \
    -p no:cacheprovider -rA --report-dir /tmp/reports-xdist >"$OUT/xdist.log" 2>&1
rc=$?
end=$(date +%s.%N)
echo "== pytest -n auto suites/hw: wall $(python3 -c "print(round($end - $start, 1))") s, exit $rc"
grep -E "created:|^harness: |^\[gw|passed|failed" "$OUT/xdist.log" | tail -12
cp /tmp/reports-xdist/latest.json "$OUT/xdist.json" 2>/dev/null
cp /tmp/reports-xdist/latest.html "$OUT/xdist.html" 2>/dev/null
ls /tmp/reports-xdist
exit $rc
