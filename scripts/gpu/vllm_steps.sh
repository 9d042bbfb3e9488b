#!/usr/bin/env bash
# The GPU vLLM steps, run ON the lent machine from the repo root, one step per device call
# (scripts/gpu/vllm.sh prints the whole sequence; docs/gpu.md explains it):
#   bash scripts/gpu/vllm_steps.sh STEP [ARGS]
# Steps:
#   begin             the first call: extras, families and models (run from /tmp/snap, the tree of
#                     .vx/tree.tgz: a committed state, not whatever the checkout held at call time)
#   after-install     the quantize chain's GPTQ and AWQ, in the background (GPTQ=0: skipped)
#   extras            carried .vx/: pytest-html + pytest-metadata -> /tmp/site, llm-compressor -> /tmp/lcsite
#   families          .whl/ (bitsandbytes) -> /tmp/site, then scripts/gpu/families.sh in the background
#                     (setsid, from a snapshot of the tree, FAMILIES_OUT=/tmp/families-out)
#   carry             move the carried .vp/part.* to /tmp/vparts (vllm_on_device.sh)
#   install           carry, then join the parts and install vLLM into /tmp/vsite
#   models            random qwen2.5-1.5b bf16 + W4A16 layout -> /tmp/vmodels (CPU, background)
#   gptq              the quantize chain's GPTQ and AWQ W4A16 of it on the GPU (llm-compressor from /tmp/lcsite)
#   wait-families S   wait up to S seconds for /tmp/families-out/DONE, then kill what is left of it
#   startups GROUP    gpu_startups.py --group eager|graphs
#   serving STEPS     gpu_serving.py --steps bench,gate (server A = s05, B = s05 + --enforce-eager)
#   suite             pytest suites/serving with the harness starting this vLLM itself (--vllm-python)
#   pipeline          the GPU steps after the install, one after the other in the background (setsid), so
#                     that the calls in the meantime can carry the second version: wait-families,
#                     the client's stand-in capacity (CAPACITY=, empty: skipped) beside the
#                     startups (PIPELINE_STARTUPS; set and empty: none, and the capacity runs alone),
#                     serving bench, serving gate (GATE_TIME_S), suite (with the second version as the
#                     upgrade baseline when it is installed); progress in /tmp/vres/pipeline.log
#   poll S            wait up to S seconds for the pipeline (printing its new lines), then pack
#   second            install the second version's parts (.vp2, vllm_on_device.sh second)
#   pack              (every step does it) /tmp/vres -> $OUT/vres.tgz; families' tarball -> $OUT
# Everything a step measures stays in /tmp/vres while the machine is held; $OUT gets a tarball of it.
set -u -o pipefail
step=${1:?STEP}; shift
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
  HARNESS_CACHE_DIR=/tmp/harness-cache VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 NCCL_NVLS_ENABLE=0 \
  PYTHONPATH=/tmp/vsite:/tmp/site:$PWD
R=/tmp/vres; mkdir -p $R
OUT=${OUT:-/tmp/vout}; mkdir -p "$OUT"
models_built() { grep -q '"model": "w4a16"' $R/models.txt 2>/dev/null; }  # the models step wrote both
pip_target() { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$@"; }

pack() {
  tar czf "$OUT/vres.tgz" -C /tmp vres 2>/dev/null
  [ -f /tmp/families-out.tar.gz ] && cp /tmp/families-out.tar.gz "$OUT/"
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu memory: /'
  ls -la "$OUT" | tail -n +2
}

case $step in
  begin)
    bash "$0" extras && bash "$0" families && bash "$0" models; exit $? ;;
  after-install)
    [ "${GPTQ:-1}" = 0 ] && { echo "gptq skipped (GPTQ=0)"; exit 0; }
    (GPTQ_TIMEOUT=${GPTQ_TIMEOUT:-240} setsid bash "$0" gptq > $R/gptq.txt 2>&1 < /dev/null &)
    echo "gptq started" ;;
  extras)
    pip_target /tmp/site .vx/wheels/*.whl && echo "extras -> /tmp/site"
    pip_target /tmp/lcsite .vx/lc/*.whl && echo "llm-compressor -> /tmp/lcsite"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $R/gpu.csv
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a $R/gpu.csv ;;
  families)
    pip_target /tmp/site .whl/*.whl && echo "bitsandbytes -> /tmp/site"
    if [ -f scripts/gpu/families.sh ]; then
      rm -rf /tmp/fam-tree && mkdir -p /tmp/fam-tree /tmp/families-out
      tar --exclude=./.whl --exclude=./.vx --exclude=./.vp -cf - . | tar xf - -C /tmp/fam-tree
      (cd /tmp/fam-tree && FAMILIES_OUT=/tmp/families-out PYTHONPATH=/tmp/site:/tmp/fam-tree \
        setsid bash scripts/gpu/families.sh > /tmp/families.log 2>&1 < /dev/null & echo $! > /tmp/families.pid)
      echo "families.sh started (pid $(cat /tmp/families.pid))"
    else
      echo "no scripts/gpu/families.sh: skipped"
    fi ;;
  pipeline)
    (setsid bash "$0" pipeline-run > $R/pipeline.log 2>&1 < /dev/null &)
    echo "pipeline started: $(date +%T)" ;;
  pipeline-run)
    stamp() { echo "[$(date +%T)] $*"; }
    stamp "wait-families"; bash "$0" wait-families "${FAMILIES_WAIT_S:-300}" > $R/p-families.txt 2>&1; tail -2 $R/p-families.txt
    # PIPELINE_STARTUPS: the start-ups to run (default: the third hold's out-of-sample ones, s14
    # qwen2.5-0.5b, s13 16k batched tokens, s12 the quantize chain's AWQ, s15 sampler-bound, s16
    # CUDA graphs); set and empty: none. The client's stand-in capacity (CAPACITY=, empty: skipped)
    # runs beside the start-ups (they need the GPU quiet, not the 16 CPUs), or alone without them.
    only=${PIPELINE_STARTUPS-s14,s13,s12,s15,s16}
    capacity=(timeout ${CAPACITY_LIMIT_S:-240} python3 benchmarks/serving/client_capacity.py --out $R/capacity)
    if [ -z "$only" ]; then
      [ -n "${CAPACITY-1}" ] && { stamp "capacity (alone)"; "${capacity[@]}" > $R/capacity.txt 2>&1 < /dev/null; tail -8 $R/capacity.txt | cut -c1-200; }
      for i in $(seq 1 ${MODELS_WAIT_S:-200}); do models_built && break; sleep 1; done
    else
      [ -n "${CAPACITY-1}" ] && (setsid "${capacity[@]}" > $R/capacity.txt 2>&1 < /dev/null &)
      stamp "startups $only"
      STARTUPS_ONLY=$only STARTUPS_LIMIT_S=${STARTUPS_LIMIT_S:-240} bash "$0" startups > $R/p-startups.txt 2>&1
      grep -E "^s[0-9]+ |skipped" $R/p-startups.txt | cut -c1-240
    fi
    stamp "serving bench"; SERVING_LIMIT_S=${BENCH_LIMIT_S:-400} bash "$0" serving bench > $R/p-bench.txt 2>&1
    grep -E "^c=|Error" $R/p-bench.txt | cut -c1-400
    stamp "serving gate"; SERVING_LIMIT_S=${GATE_LIMIT_S:-330} bash "$0" serving gate > $R/p-gate.txt 2>&1
    grep -E "^gate|Error" $R/p-gate.txt | cut -c1-300
    for i in $(seq 1 60); do [ -f /tmp/vsite2/.done ] && break; sleep 1; done
    stamp "suite (baseline: $([ -f /tmp/vsite2/.done ] && echo /tmp/python-vllm2 || echo none))"
    SUITE_LIMIT_S=${SUITE_LIMIT_S:-360} bash "$0" suite > $R/p-suite.txt 2>&1; grep -E "exit|passed|failed" $R/p-suite.txt | tail -3
    stamp "pipeline done"; touch $R/PIPELINE_DONE ;;
  poll)
    limit=${1:-60}; t=0; off=$(cat $R/.poll_off 2>/dev/null || echo 0)
    while [ $t -lt "$limit" ] && [ ! -f $R/PIPELINE_DONE ]; do sleep 5; t=$((t + 5)); done
    tail -c +$((off + 1)) $R/pipeline.log 2>/dev/null; stat -c %s $R/pipeline.log > $R/.poll_off 2>/dev/null
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | head -5 ;;
  second)
    bash scripts/gpu/vllm_on_device.sh .vp2 second 2>&1 | tail -4 | tee $R/install2.txt ;;
  carry)
    bash scripts/gpu/vllm_on_device.sh .vp ;;
  install)
    bash scripts/gpu/vllm_on_device.sh .vp install 2>&1 | tail -5 | tee $R/install.txt ;;
  models)
    # on the CPU, in the background (setsid: it outlives this call): bf16 and W4A16 layout
    (PYTHONPATH=/tmp/vsite:/tmp/site:$PWD setsid python3 benchmarks/vllm_plan/gpu_models.py --out /tmp/vmodels \
      > $R/models.txt 2>&1 < /dev/null &)
    echo "model build started" ;;
  gptq)
    # waits for the CPU builds, then the quantize chain's GPTQ on the GPU; its worker needs
    # llm-compressor's compressed-tensors (0.19), not vLLM's (0.17): /tmp/lcsite first
    for i in $(seq 1 120); do models_built && break; sleep 2; done
    PYTHONPATH=/tmp/lcsite:/tmp/vsite:/tmp/site:$PWD timeout ${GPTQ_TIMEOUT:-150} \
      python3 benchmarks/vllm_plan/gpu_models.py --out /tmp/vmodels --gptq --awq >> $R/models.txt 2>&1
    tail -n 40 /tmp/vmodels/gptq.log /tmp/vmodels/awq.log 2>/dev/null | grep -iE "error|took|GPTQ|AWQ|saving" | tail -8
    grep '^{' $R/models.txt ;;
  wait-families)
    limit=${1:-300}; t=0
    while [ ! -f /tmp/families-out/DONE ] && [ -f /tmp/families.pid ] && [ $t -lt "$limit" ]; do sleep 5; t=$((t + 5)); done
    if [ -f /tmp/families-out/DONE ]; then
      echo "families done after waiting $t s"   # it packs its own tarball after DONE: let it finish
      for i in $(seq 1 30); do kill -0 "$(cat /tmp/families.pid)" 2>/dev/null || break; sleep 1; done
    elif [ -f /tmp/families.pid ]; then
      echo "families not done after $t s: killing its process group"; kill -9 -- -"$(cat /tmp/families.pid)" 2>/dev/null
    fi
    kill -9 -- -"$(cat /tmp/families.pid 2>/dev/null)" 2>/dev/null   # nothing of it may share the GPU with vLLM
    [ -f /tmp/families-out.tar.gz ] || { [ -d /tmp/families-out ] && tar czf /tmp/families-out.tar.gz -C /tmp families-out; }
    tail -3 /tmp/families.log 2>/dev/null ;;
  startups)
    # nothing else may hold GPU memory while vLLM profiles it: the model builds and the GPTQ first
    for i in $(seq 1 ${MODELS_WAIT_S:-200}); do models_built && \
      ! pgrep -f "gpu_models.py" >/dev/null && break; sleep 1; done
    pkill -9 -f "gpu_models.py" 2>/dev/null; grep '^{' $R/models.txt | cut -c1-200
    sel=(--group "${1:-eager}"); [ -n "${STARTUPS_ONLY:-}" ] && sel=(--only "$STARTUPS_ONLY")
    python3 benchmarks/vllm_plan/gpu_startups.py --models /tmp/vmodels --out $R/startups.json "${sel[@]}" \
      --time-limit-s ${STARTUPS_LIMIT_S:-500} 2>&1 | tee -a $R/startups.txt | grep -E "^s[0-9]+ |skipped" ;;
  serving)
    python3 benchmarks/vllm_plan/gpu_serving.py --models /tmp/vmodels --out $R --steps "${1:-bench,gate}" \
      --time-limit-s ${SERVING_LIMIT_S:-520} --gate-time-s ${GATE_TIME_S:-300} 2>&1 | tee -a $R/serving.txt | grep -E "^c=|^gate|ready|Error" ;;
  suite)
    start=$(date +%s)
    base=(); [ -f /tmp/vsite2/.done ] && base=(--baseline-vllm-python /tmp/python-vllm2)
    timeout ${SUITE_LIMIT_S:-480} python3 -m pytest suites/serving --vllm-python "$(command -v python3)" "${base[@]}" \
      -p no:cacheprovider -q -rA --report-dir $R/suite > $R/suite.txt 2>&1
    echo "pytest suites/serving: exit $?, wall $(( $(date +%s) - start )) s" | tee -a $R/suite.txt
    grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|passed|failed" $R/suite.txt | tail -40 ;;
  pack) ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
rc=$?
pack
exit $rc
