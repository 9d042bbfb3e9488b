#!/usr/bin/env bash
# Issue 47's GPU vLLM start-ups of the hybrid families, on a lent H200 holding the carried vLLM
# (parts: scripts/gpu/vllm.sh parts 0.26.0; each carried by scripts/gpu/vllm_on_device.sh .vp):
#   bash scripts/gpu/vllm-hybrid.sh      # results: $OUT/hybrid-startups.json, $OUT/startup-logs.tgz
# The settings are data (measurements/vllm_plan/hybrid-gpu-settings.json): reference configs with
# vLLM's dummy weights, a 6 GiB share and utilization 0.9, CUDA graphs captured (their memory logged).
set -uo pipefail
OUT=${OUT:-/tmp/vllm-hybrid-out}
mkdir -p "$OUT"
bash scripts/gpu/vllm_on_device.sh .vp install || exit 1
export PYTHONPATH=/tmp/vsite:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0
python3 benchmarks/vllm_plan/gpu_startups.py --models /tmp/vmodels --out "$OUT/hybrid-startups.json" \
  --settings "${HYBRID_SETTINGS:-measurements/vllm_plan/hybrid-gpu-settings.json}" --wait-graphs \
  --time-limit-s "${HYBRID_LIMIT_S:-500}" --start-timeout-s "${HYBRID_START_TIMEOUT_S:-150}"
tar czf "$OUT/startup-logs.tgz" -C "$OUT" startup-logs && rm -rf "$OUT/startup-logs"
