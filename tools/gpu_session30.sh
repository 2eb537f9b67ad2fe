#!/usr/bin/env bash
# The next session's first device call (docs/device-queue.md item 0), NVFP4 on an H100 or H200,
# files under $OUT (at most 8 come back):
#   1. GPU tests: a chunk on a bucket above 4,096 rows against the reference, the graph engine
#      and KV reuse with the buckets 5,120-8,192 and the kept BF16 dense weights (defaults since
#      the twenty-ninth session, measured only in tools/bench_prefill.py so far);
#   2. flint-graph bench through the engine at full size: start-up (prefill_buckets, memory
#      after the KV cache's share), the decode step at 1K, TTFT of 25 / 512 / 6,000 / 8K-token
#      prompts end to end (the 6K one ran eagerly before: 135 ms of prefill on the H100).
# Device run: carry [".whl", ".kcache"], command: bash tools/gpu_session30.sh (PARTS="1 2")
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 560 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
parts=" ${PARTS:-1 2} "
if [[ $parts == *" 1 "* ]]; then
  timeout "$(left 240)" python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_prefill_gpu.py -k "bucket_above and nvfp4" tests/test_graph_engine_gpu.py \
    tests/test_kv_reuse_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -4
fi
if [[ $parts == *" 2 "* ]]; then
  timeout "$(left 300)" flint-graph bench --preset full --formats nvfp4 --contexts 1024 \
    --buckets 1 --baseline-steps 1 --e2e-tokens 64 --prefill-tokens 25,512,6000,8k \
    --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
  echo "bench: exit $?"; tail -40 "$OUT/bench.log"
fi
echo "done in $(( $(date +%s) - start )) s"
