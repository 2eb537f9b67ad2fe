#!/usr/bin/env bash
# The BF16 tool loop's first request (issue 22; docs/device-queue.md item 1): where its decode
# turns non-finite (tools/probe_first_nan.py in three processes: reuse on as the bench, reuse
# off, no start-up warm-up), then the graph engine's GPU tests (the deferred-abort change).
# Device run: carry [".whl", ".kcache"], command: bash tools/gpu_first_nan.sh. Logs under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
. tools/device_setup.sh
for mode in ${MODES:-on off no-warm}; do
  t=$([ "$mode" = on ] && echo 200 || echo 100)
  timeout "${PROBE_TIMEOUT:-$t}" python3 tools/probe_first_nan.py --mode "$mode" \
    > "$OUT/probe-$mode.log" 2>&1
  echo "probe $mode: exit $?"; cut -c1-1500 "$OUT/probe-$mode.log" | tail -12
done
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_graph_engine_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
fi
