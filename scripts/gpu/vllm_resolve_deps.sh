#!/usr/bin/env bash
# Resolve the wheels a vLLM release needs on the lent H200 that the machine lacks:
#   scripts/gpu/vllm_resolve_deps.sh VERSION   ->  scripts/gpu/deps-VERSION.txt
# pip resolves vllm==VERSION for CPython 3.12 / manylinux x86_64 (a Python 3.12 venv with a
# current pip, so wheel metadata is read without installing anything); from what it would
# install we drop (1) what the machine's image already has (the package list in the device
# tool's KINDS.md, copied below), (2) what vLLM imports only lazily or for other backends:
# flashinfer and its JIT toolchain (nvcc, nvvm, crt, cccl, tileiras, cuda-tile), tilelang, z3,
# tokenspeed-triton, PyNvVideoCodec, torchcodec. deps-0.26.0.txt (../shared/gpu-vllm) was made
# the same way; deps-0.25.1.txt was made by this script on 2026-12-02 (not yet run on the GPU).
set -euo pipefail
ver=${1:?VERSION}
here=$(cd "$(dirname "$0")" && pwd)
work=${VLLM_RESOLVE_DIR:-/tmp/vllm-resolve}
py312=${PYTHON312:-$(command -v python3.12 || true)}
[ -n "$py312" ] || { echo "needs a python3.12 (set PYTHON312)"; exit 2; }
mkdir -p "$work"
[ -x "$work/venv/bin/pip" ] || { "$py312" -m venv "$work/venv" && "$work/venv/bin/pip" install -q -U pip; }
"$work/venv/bin/pip" install --dry-run --ignore-installed --only-binary=:all: --report "$work/report-$ver.json" \
  "vllm==$ver" > "$work/resolve-$ver.log"
python3 - "$work/report-$ver.json" "$here/deps-$ver.txt" <<'EOF'
import json, re, sys
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
MACHINE = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet
filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore
httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
LAZY = {"vllm", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "nvidia-cuda-nvcc",
        "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cuda-tileiras", "cuda-tile", "tilelang",
        "z3-solver", "tokenspeed-triton", "pynvvideocodec", "torchcodec"}
skip = {norm(n) for n in MACHINE} | LAZY
report = json.load(open(sys.argv[1]))
rows = sorted((norm(i["metadata"]["name"]), i["metadata"]["version"]) for i in report["install"])
keep = [(n, v) for n, v in rows if n not in skip]
open(sys.argv[2], "w").write("".join(f"{n.replace('-', '_')}=={v}\n" for n, v in keep))
print(f"{len(keep)} wheels -> {sys.argv[2]}")
EOF
