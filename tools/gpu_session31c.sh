#!/usr/bin/env bash
# Thirty-first session's third call, on an H200 (issues 22 and 21):
#   reuse  tools/gpu_reuse_h200.sh: the KV reuse GPU tests, then 32K of history (NVFP4, the
#          <= 0.05 target), the 10-step tool loops (NVFP4, BF16);
#   tests  the prefill's large buckets against the reference in both formats, and the graph
#          engine's GPU tests.
# Device run: carry [".whl", ".kcache"], kind nvidia-h200, needs_h200 (BF16 at full size),
# command: bash tools/gpu_session31c.sh
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 540 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
DEADLINE=$(( start + 300 )) RUNS="tests nvfp4-32k nvfp4-tool bf16-tool" bash tools/gpu_reuse_h200.sh
# (-k applies to every file named: one pytest per filter)
timeout "$(left 120)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_gpu.py \
  -k "bucket_above" 2>&1 | tee "$OUT/gpu-tests-buckets.log" | tail -3
timeout "$(left 200)" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_graph_engine_gpu.py 2>&1 | tee "$OUT/gpu-tests-engine.log" | tail -3
rm -f "$OUT/install.log"
echo "done in $(( $(date +%s) - start )) s"
