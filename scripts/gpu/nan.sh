#!/usr/bin/env bash
# The GPU run of the NaN suite (issue 5), as launched on the lent H200 with the device tool:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; bash scripts/gpu/nan.sh
# (carry=[".whl"]: bitsandbytes 0.50.2, pytest-html, pytest-metadata). Reports go to $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 HARNESS_CACHE_DIR=/tmp/harness-cache
OUT=${OUT:-reports}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, transformers, peft, bitsandbytes as b; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'peft', peft.__version__, 'bitsandbytes', b.__version__)"
python3 -m pytest suites/nan tests/test_nan_detect.py tests/test_nan_guard.py tests/test_nan_twomodels.py \
    -p no:cacheprovider --expect-gpu --vram-budget 6GiB --report-dir "$OUT" -rA -q --durations=15 2>&1 | tee "$OUT/nan-gpu.log"
