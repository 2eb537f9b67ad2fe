#!/usr/bin/env bash
# Issue 22 on the H200 (twenty-ninth session), one call, files under $OUT:
#   1. tests/test_kv_reuse_gpu.py (the graph engine: reuse on equals a cold start, bit for bit);
#   2. tools/bench_reuse.py, full size, reuse on then off in one process each: 20 chat turns of
#      ~512 new tokens on 8K of history (NVFP4, then BF16: the target's case), a 10-step tool
#      loop (NVFP4), 32K of history with ~512 new tokens (the ≤ 0.05 target; NVFP4), the BF16
#      tool loop; in that order, each skipped when less than 60 s are left.
# Device run: carry [".whl", ".kcache"], needs_h200 (BF16 full size is ~80 GB of weights),
# command: bash tools/gpu_reuse_h200.sh (RUNS: the names below to run, default all)
set -uo pipefail
CALL_SECONDS=${CALL_SECONDS:-575}
. tools/device_setup.sh  # also start, deadline (DEADLINE, else CALL_SECONDS) and left
# at most 8 files come back from $OUT (install.log, gpu-tests.log, five logs, one archive)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
runs=" ${RUNS:-tests nvfp4-new512 bf16-new512 nvfp4-tool nvfp4-32k bf16-tool} "
reuse() {
  local name=$1; shift
  [[ $runs == *" $name "* ]] || return 0
  if [ "$(left 999)" -lt 60 ]; then echo "$name: skipped, $(left 999) s left"; return 0; fi
  local t0=$SECONDS
  timeout "$(left 240)" python3 tools/bench_reuse.py --preset full --max-tokens 16 "$@" \
    --out "/tmp/reuse/$name" > "$OUT/$name.log" 2>&1
  echo "$name: exit $? in $(( SECONDS - t0 )) s"
  python3 tools/reuse_table.py < "$OUT/$name.log"
}
if [[ $runs == *" tests "* ]]; then
  gpu_tests gpu-tests.log 150 tests/test_kv_reuse_gpu.py
fi
reuse nvfp4-new512 --format nvfp4 --history 8192 --new-tokens 512 --turns 20
reuse bf16-new512 --format bf16 --history 8192 --new-tokens 512 --turns 20
reuse nvfp4-tool --format nvfp4 --history 8192 --tool-loop --turns 10
reuse nvfp4-32k --format nvfp4 --history 32768 --new-tokens 512 --turns 3
reuse bf16-tool --format bf16 --history 8192 --tool-loop --turns 10
[ -d /tmp/reuse ] && tar czf "$OUT/reuse-json.tgz" -C /tmp/reuse .
echo "done in $(( $(date +%s) - start )) s"
