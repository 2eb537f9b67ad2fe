#!/usr/bin/env bash
# The BF16 tool loop's first request (issue 22; docs/device-queue.md item 1): where its decode
# turns non-finite (tools/probe_first_nan.py, one process per mode: the prefill cut at the
# preamble as before, reuse on, reuse off), the GPU tests of the snapshot inside a chunk and of
# reuse, then the tool-loop bench in BF16 (a cold step with reuse on now costs what it does
# with reuse off?). Device run: carry [".whl", ".kcache"], command: bash tools/gpu_first_nan.sh.
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
. tools/device_setup.sh
for mode in ${MODES-split on off}; do
  timeout "${PROBE_TIMEOUT:-110}" python3 tools/probe_first_nan.py --mode "$mode" \
    > "$OUT/probe-$mode.log" 2>&1
  echo "probe $mode: exit $?"; cut -c1-1500 "$OUT/probe-$mode.log" | grep -v "^reuse:" | tail -8
done
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_prefill_gpu.py::test_a_snapshot_inside_a_chunk_is_the_ring_of_a_prefill_stopped_there \
    tests/test_kv_reuse_gpu.py tests/test_graph_engine_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-100}" python3 tools/bench_reuse.py --preset full --format "${FORMAT:-bf16}" \
    --history 8192 --turns 6 --tool-loop --max-tokens 16 --log-reuse --out "$OUT/${FORMAT:-bf16}-tool" \
    > "$OUT/reuse-${FORMAT:-bf16}-tool.log" 2>&1
  echo "bench_reuse ${FORMAT:-bf16}-tool: exit $?"; grep "^{" "$OUT/reuse-${FORMAT:-bf16}-tool.log" | cut -c1-200
fi
