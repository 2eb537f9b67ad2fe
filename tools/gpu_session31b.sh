#!/usr/bin/env bash
# Thirty-first session's second call, on an H200 (issues 21 and 22 in both formats):
#   bench  flint-graph bench, full size, BF16 and NVFP4: decode B = 1 at 1K, end to end, and
#          prefills of 25, 512 and 8,192 tokens through the engine;
#   reuse  tools/gpu_reuse_h200.sh's 8K-history chat turns, NVFP4 then BF16 (RUNS there).
# Device run: carry [".whl", ".kcache"], kind nvidia-h200, command: bash tools/gpu_session31b.sh
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 570 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "$(left 260)" flint-graph bench --preset full --formats bf16,nvfp4 --contexts 1024 \
  --buckets 1 --baseline-steps 1 --e2e-tokens 64 --prefill-tokens 25,512,8k --no-progress \
  --json "$OUT/bench.json" \
  > "$OUT/bench.txt" 2>&1
echo "bench: exit $?"; tail -45 "$OUT/bench.txt"
rm -f "$OUT/install.log"
DEADLINE=$deadline RUNS="nvfp4-new512 bf16-new512" bash tools/gpu_reuse_h200.sh
rm -f "$OUT/install.log"
echo "done in $(( $(date +%s) - start )) s"
