#!/usr/bin/env bash
# The quantize step on the lent H200 (scripts/gpu/quant.py), run by the device tool as:
#   carry: .gpu/quant (this tree) and .gpu/quant-whl (wheels for Python 3.12 the machine lacks:
#   llmcompressor 0.14.0.1, compressed-tensors 0.19.0, loguru, datasets, dill, multiprocess,
#   pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions; 4.3 MB), fetched with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 ...
#   command: bash .gpu/quant/scripts/gpu/quant.sh
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/quant-whl/*.whl || exit 1
cd .gpu/quant || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 OUT="${OUT:-$PWD/reports/gpu-quant}"
mkdir -p "$OUT"
python3 -c "import torch, transformers, pyarrow, llmcompressor, compressed_tensors; print('torch', torch.__version__, 'transformers', transformers.__version__, 'pyarrow', pyarrow.__version__, 'llmcompressor', llmcompressor.__version__, 'compressed-tensors', compressed_tensors.__version__)" || exit 1
python3 scripts/gpu/quant.py "${1:-qwen2.5-1.5b}" 2>&1 | tee "$OUT/quant-gpu.log"
