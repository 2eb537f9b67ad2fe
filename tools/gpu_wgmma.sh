#!/usr/bin/env bash
# The first device calls of the wgmma prefill kernels (issue 21; run on the H200 2026-12-02):
# attn_prefill_wg and grouped_w4a16_wg. Probes first (tools/probe_attn_prefill.py: q = 0 isolates
# P·V, one-hot values isolate S), then their GPU tests, then the prefill with each, then the
# bench beside the mma.sync kernels. Each step has its own time limit; logs under $OUT.
# Build the kernel cache here first: python tools/build_gpu_cache.py; carry [".whl", ".kcache"].
# Two device calls (a call may run 600 s): PHASE=tests (probes and tests, ≤ ~460 s), then
# PHASE=bench (≤ ~270 s); BENCH_ARGS replace the bench's arguments.
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
. tools/device_setup.sh
step() {  # step NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, print its tail
  local name=$1 t=$2
  shift 2
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  [ "$rc" = 124 ] && echo "$name: timed out after $t s" >> "$OUT/$name.log"
  echo "== $name: exit $rc"
  tail -${TAIL:-15} "$OUT/$name.log"
}
PHASE=${PHASE:-tests}
if [ "$PHASE" = tests ]; then
  step probe 60 python3 tools/probe_attn_prefill.py --out "$OUT"
  step tests-attn 120 python3 -m pytest -q -m gpu -p no:cacheprovider --maxfail=3 --tb=short \
    tests/test_attn_prefill_gpu.py
  step tests-w4a16 100 python3 -m pytest -q -m gpu -p no:cacheprovider --maxfail=3 --tb=short \
    tests/test_grouped_w4a16_gpu.py -k "wg"
  step tests-prefill 150 python3 -m pytest -q -m gpu -p no:cacheprovider --tb=short \
    tests/test_prefill_gpu.py -k "wgmma"
fi
if [ "$PHASE" = bench ]; then
  step bench 240 python3 tools/bench_prefill.py --out "$OUT" --formats nvfp4 --paths graph \
    ${BENCH_ARGS:---tokens 2048,8192 --kernel-tokens 32768 --reps 3 --profile-tokens 8192 \
      --attn-kernel attn_prefill,attn_prefill_wg,attn_prefill_wg:ST=3 --w4a16-wg=-,0}
fi
