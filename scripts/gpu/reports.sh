#!/usr/bin/env bash
# What ran on the lent H200 for issue 16: `pytest suites/hw` (quick) for the "GPU ready" report,
# then the timings suite (pytest-benchmark) on the GPU. Results JSON + HTML land in $OUT; the HTML
# re-renders from the JSON here (python -m harness report OUT/hw-....json --out X.html).
# Expects PYTHONPATH to hold the carried wheels (bitsandbytes) and the tree.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/reports-out}
mkdir -p "$OUT"
start=$(date +%s)
timeout 120 python3 -m pytest suites/hw --expect-gpu -q -rfE -p no:cacheprovider --report-dir /tmp/r-hw > "$OUT/run.log" 2>&1
echo "hw: exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/run.log"
timeout 70 python3 -m pytest suites/timings -q -p no:cacheprovider --report-dir /tmp/r-timings >> "$OUT/run.log" 2>&1
echo "timings: exit $? after $(( $(date +%s) - start )) s" | tee -a "$OUT/run.log"
cp /tmp/r-hw/hw-*.json /tmp/r-hw/hw-*.html /tmp/r-timings/timings-*.json /tmp/r-timings/timings-*.html "$OUT/" 2>/dev/null
tail -25 "$OUT/run.log"
