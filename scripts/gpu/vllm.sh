#!/usr/bin/env bash
# The real (CUDA) vLLM on a lent GPU machine that has no package registry, and what the harness
# measures with it (docs/gpu.md, "The GPU vLLM"). Run HERE, from the repo root:
#   scripts/gpu/vllm.sh parts [VERSION [SECOND]]  build .vp/part.* (vLLM VERSION + deps-VERSION.txt, cut to
#                                         what the tree leaves of a call's 64 MiB), .vx/ (pytest-html/-metadata, llm-compressor 0.14 wheels,
#                                         tree.tgz) and, with SECOND, .vp2/: the upgrade rehearsal's
#                                         baseline beside VERSION (only the wheels VERSION lacks)
#   scripts/gpu/vllm.sh calls             print the device calls to make, back to back, one per line:
#                                         carry=<paths> | command (FAMILIES_SET: the first call's families
#                                         job set, default reserve; PIPELINE_ENV: variables for the
#                                         install call's steps, e.g. "GPTQ=0 PIPELINE_STARTUPS= GATE_TIME_S=380")
# VERSION: 0.26.0 (default; the newest that pins the machine's torch 2.11.0); SECOND: 0.25.1 (the
# rehearsal's baseline: deps-0.25.1.txt, resolved by vllm_resolve_deps.sh).
# .vp/, .vp2/ and .vx/ must be ignored (.git/info/exclude): what is not ignored travels with every call.
# On a GPU machine WITH a registry none of this is needed: pip install vllm==VERSION into a venv
# whose torch it pins, then run the steps of scripts/gpu/vllm_steps.sh (skip carry/install).
set -euo pipefail
cmd=${1:?parts|calls}; ver=${2:-0.26.0}; second=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
CALL_BYTES=$((64 * 1024 * 1024))  # what one device call takes: the working tree plus what it carries
tree_bytes() {  # what travels with every call: tracked files and untracked ones git does not ignore
  { git ls-files -z; git ls-files -z --others --exclude-standard; } | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1
}
size() { du -cb "$@" | tail -1 | cut -f1; }
case $cmd in
  parts)
    for d in .vp .vp2 .vx; do git check-ignore -q "$d/x" || { echo "$d is not ignored: echo /$d/ >> .git/info/exclude"; exit 2; }; done
    # a part and the tree travel together: the parts are cut to what the tree leaves, less 2 MiB
    # for the tree to grow before the hold (the third hold's 58 MiB parts no longer fit beside 6.7 MB)
    export PART_SIZE=${PART_SIZE:-$(( CALL_BYTES - $(tree_bytes) - 2 * 1024 * 1024 ))}
    bash "$here/vllm_make_parts.sh" .vp "$ver"
    if [ -n "$second" ]; then
      BASE_VERSION=$ver REUSE="xgrammar- nvidia_cutlass_dsl_libs" bash "$here/vllm_make_parts.sh" .vp2 "$second"
    else rm -rf .vp2; fi
    plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
    dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" -d "$@"; }
    mkdir -p .vx/wheels .vx/lc
    dl .vx/wheels pytest-html==4.2.0 pytest-metadata==3.1.1
    # llm-compressor needs compressed-tensors 0.19 (vLLM 0.26 pins 0.17): its own --target dir there
    dl .vx/lc llmcompressor==0.14.0.1 compressed-tensors==0.19.0 auto-round==0.15.1 datasets==5.2.0 multiprocess==0.70.19
    # the tree every step runs from there (/tmp/snap): HEAD, so helpers' half-made edits never travel into a run
    git archive --format=tar.gz -o .vx/tree.tgz HEAD
    du -sh .vp .vx ;;
  calls)
    n=$(ls .vp/part.* 2>/dev/null | wc -l); [ "$n" -gt 0 ] || { echo "no .vp/part.*: run '$0 parts' first"; exit 2; }
    c="cd /tmp/snap &&"; s="bash scripts/gpu/vllm_steps.sh"; d="bash /tmp/snap/scripts/gpu/vllm_on_device.sh"
    two=(); [ -d .vp2 ] && two=(.vp2/part.*)
    last=$(ls .vp/part.* | tail -1)
    # the second version's last (small) part rides with the first call, or else with the first
    # version's last part, wherever it fits beside the tree (a call over 64 MiB is refused whole)
    first=".vx,.whl"; pre=""; with_last=""; pre_last=""; tree=$(tree_bytes)
    if [ ${#two[@]} -gt 0 ]; then
      if [ $(( tree + $(size .vx .whl "${two[-1]}") )) -le $CALL_BYTES ]; then first="$first,${two[-1]}"; pre="$d .vp2 && "
      elif [ $(( tree + $(size "$last" "${two[-1]}") )) -le $CALL_BYTES ]; then with_last=",${two[-1]}"; pre_last="$d .vp2 && "
      else echo "carry=${two[-1]} | $d .vp2   (the second version's last part: it fits with no other)"; fi
    fi
    # the families run of the first call (docs/vram.md): FAMILIES_SET here picks its job set
    fam="FAMILIES_SET=${FAMILIES_SET:-reserve}"; env=${PIPELINE_ENV:+$PIPELINE_ENV }
    echo "carry=$first | mkdir -p /tmp/snap && tar xzf .vx/tree.tgz -C /tmp/snap && cp -r .vx .whl /tmp/snap/ && $pre$c $fam $s begin"
    for p in .vp/part.*; do
      if [ "$p" = "$last" ]; then
        echo "carry=$p,.vp/payload.sha$with_last | $pre_last$d .vp install && $c $env$s after-install && $env$s pipeline"
      else echo "carry=$p | $d .vp"; fi
    done
    if [ ${#two[@]} -gt 1 ]; then
      rest=("${two[@]:0:${#two[@]}-1}")
      for p in "${rest[@]}"; do
        if [ "$p" = "${rest[-1]}" ]; then echo "carry=$p,.vp2/payload.sha | $d .vp2 && $c $s second && $s poll 1"
        else echo "carry=$p | $d .vp2"; fi
      done
    fi
    echo "carry= | $c $s poll 540   (again until it prints 'pipeline done': startups, bench, gate, suite)"
    echo "then: give the machine back; unpack the last call's vres.tgz; gpu_collect.py -> measurements/vllm_plan/" ;;
  *) echo "usage: $0 parts|calls [VERSION [SECOND]]"; exit 2 ;;
esac
