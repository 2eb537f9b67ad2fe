#!/usr/bin/env bash
# KV reuse's device call (issue 22; docs/device-queue.md item 1): the GPU tests of the first
# tool-loop request's shape on poisoned memory and of the start-up eager warm-up, the reuse
# tests, then tools/bench_reuse.py at full size (each request's finish reason, errors and
# reuse decisions logged). Build the kernel cache here first (python tools/build_gpu_cache.py);
# device run: carry [".whl", ".kcache"], command: bash tools/gpu_reuse.sh. Logs under $OUT.
# SKIP_TESTS=1 / SKIP_BENCH=1 skip a half; RUNS picks bench runs among bf16-tool nvfp4-tool
# bf16-chat (default: all three, ~2 min each at full size).
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
. tools/device_setup.sh
status=0
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 \
    tests/test_prefill_gpu.py::test_a_long_chunk_after_a_preamble_reads_nothing_unwritten \
    tests/test_graph_engine_gpu.py::test_start_up_runs_one_eager_chunk_and_leaves_no_trace \
    tests/test_kv_reuse_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -30
  status=${PIPESTATUS[0]}
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  for run in ${RUNS:-bf16-tool nvfp4-tool bf16-chat}; do
    fmt=${run%%-*}
    loop=$([ "${run#*-}" = tool ] && echo --tool-loop)
    timeout "${BENCH_TIMEOUT:-240}" python3 tools/bench_reuse.py --preset full --format "$fmt" \
      --history 8192 --turns 10 $loop --max-tokens 16 --log-reuse --out "$OUT/$run" \
      > "$OUT/reuse-$run.log" 2>&1
    echo "bench_reuse $run: exit $?"; grep -v '^reuse: evicted' "$OUT/reuse-$run.log" | tail -24
  done
fi
exit $status
