#!/usr/bin/env bash
# Issue 47's GPU vLLM start-ups of the hybrid families, on a lent GPU holding the carried vLLM
# (parts: scripts/gpu/vllm.sh parts 0.26.0 [0.25.1]; each carried by scripts/gpu/vllm_on_device.sh):
#   bash scripts/gpu/vllm-hybrid.sh [VERSION]    # results: $OUT/hybrid-startups[-VERSION].json, $OUT/startup-logs[-VERSION].tgz
# VERSION: the vLLM to start (default: the one in /tmp/vsite, .vp's). A VERSION that is not /tmp/vsite's
# is the second version (.vp2 carried, vllm_on_device.sh .vp2 second -> /tmp/vsite2): the upgrade
# delta's older release, 0.25.1. HYBRID_ONLY=h10,h11 picks settings (default: all, in the file's order).
# The settings are data (measurements/vllm_plan/hybrid-gpu-settings.json): reference configs with vLLM's
# dummy weights, a 6 GiB share and utilization 0.9, CUDA graphs captured (their memory logged); a
# setting's own start-up timeout (granite) is in the file.
set -uo pipefail
ver=${1:-}
OUT=${OUT:-/tmp/vllm-hybrid-out}
mkdir -p "$OUT"
bash scripts/gpu/vllm_on_device.sh .vp install | tail -2 || exit 1
export PYTHONPATH=/tmp/vsite:$PWD PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 NCCL_NVLS_ENABLE=0
py=python3
installed=$(python3 -c 'import vllm; print(vllm.__version__)' 2>/dev/null)
if [ -n "$ver" ] && [ "$ver" != "$installed" ]; then
  [ -d .vp2 ] && bash scripts/gpu/vllm_on_device.sh .vp2 second | tail -2
  py=/tmp/python-vllm2   # PYTHONPATH=/tmp/vsite2:/tmp/site; gpu_startups.py puts the tree on its own path
  got=$($py -c 'import vllm; print(vllm.__version__)' 2>/dev/null)
  [ "$got" = "$ver" ] || { echo "vllm-hybrid: vLLM $ver is not installed (/tmp/vsite: ${installed:-none}, /tmp/vsite2: ${got:-none})"; exit 1; }
fi
tag=${ver:+-$ver}
only=(); [ -n "${HYBRID_ONLY:-}" ] && only=(--only "$HYBRID_ONLY")
$py benchmarks/vllm_plan/gpu_startups.py --models /tmp/vmodels --out "$OUT/hybrid-startups$tag.json" \
  --settings "${HYBRID_SETTINGS:-measurements/vllm_plan/hybrid-gpu-settings.json}" --wait-graphs "${only[@]}" \
  --time-limit-s "${HYBRID_LIMIT_S:-500}" --start-timeout-s "${HYBRID_START_TIMEOUT_S:-150}"
mv "$OUT/startup-logs" "$OUT/startup-logs$tag" 2>/dev/null
tar czf "$OUT/startup-logs$tag.tgz" -C "$OUT" "startup-logs$tag" && rm -rf "$OUT/startup-logs$tag"
