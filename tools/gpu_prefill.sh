#!/usr/bin/env bash
# The prefill's device call (issue 21): its GPU tests (attention, the whole prefill, the grouped
# W4A16 experts, routing, the elementwise kernels), then tools/bench_prefill.py at full size.
# Build the kernel cache here first (the H200 never compiles, ../shared/device.md):
#   python tools/build_gpu_cache.py   (every preset, the bench variants and the test kernels)
#   device run: carry [".whl", ".kcache"], command: bash tools/gpu_prefill.sh
# SKIP_TESTS=1 / SKIP_BENCH=1 skip a half; BENCH_ARGS go to bench_prefill.py. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
. tools/device_setup.sh
status=0
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 \
    ${GPU_TESTS:-tests/test_attn_prefill_gpu.py tests/test_prefill_gpu.py \
      tests/test_grouped_w4a16_gpu.py tests/test_moe_route_gpu.py \
      tests/test_prefill_kernels_gpu.py} 2>&1 \
    | tee "$OUT/gpu-tests.log" | tail -30
  status=${PIPESTATUS[0]}
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-500}" python3 tools/bench_prefill.py --out "$OUT" ${BENCH_ARGS:-} \
    > "$OUT/bench-prefill.log" 2>&1
  echo "bench_prefill: exit $?"; tail -60 "$OUT/bench-prefill.log"
fi
exit $status
