#!/usr/bin/env bash
# What ran on the lent GPU machine (nvidia-h200-x2) for issue 3: `harness env`, then the hw suite at
# the quick and the full level, each timed. Results land in $OUT (JSON + HTML per level, logs).
# Expects PYTHONPATH to hold the carried wheels (pytest-html, bitsandbytes) and the tree.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/hw-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv 2>&1 | head -5
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)"
python3 -m harness env --json > "$OUT/env.json"; python3 -m harness env
rc=0
for level in quick full; do
    start=$(date +%s.%N)
    timeout 270 python3 -m pytest suites/hw --hw-level "$level" --expect-gpu -v -rA -p no:cacheprovider \
        --report-dir "/tmp/reports-$level" >"$OUT/$level.log" 2>&1 || rc=$?
    end=$(date +%s.%N)
    echo "== $level: wall $(python3 -c "print(round($end - $start, 1))") s, exit $rc"
    grep -E "^[a-z0-9_]+: (PASS|FAIL|SKIP|WARN) -|^\[hw\]|passed|failed|^E  " "$OUT/$level.log" | tail -45
    cp "/tmp/reports-$level/latest.json" "$OUT/$level.json" 2>/dev/null
    cp "/tmp/reports-$level/latest.html" "$OUT/$level.html" 2>/dev/null
done
exit $rc
