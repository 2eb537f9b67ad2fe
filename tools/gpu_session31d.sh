#!/usr/bin/env bash
# Thirty-first session's fourth call, on an H200 (issue 21):
#   tests       the prefill's GPU tests (whole prefills against the reference, both formats) and
#               its kernels' (attention, grouped W4A16, routing, KV write, ...);
#   interleave  a running stream's time per token while an 8K and a 32K prompt arrive (NVFP4).
# Device run: carry [".whl", ".kcache"], kind nvidia-h200, command: bash tools/gpu_session31d.sh
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 480 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
timeout "$(left 260)" python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_gpu.py \
  tests/test_prefill_kernels_gpu.py 2>&1 | tee "$OUT/gpu-tests-prefill.log" | tail -4
timeout "$(left 300)" flint-graph bench --preset full --formats nvfp4 --contexts 1024 \
  --buckets 1,4 --baseline-steps 1 --e2e-tokens 16 --prefill-tokens 25 --interleave 8k,32k \
  --no-progress --json "$OUT/bench-interleave.json" > "$OUT/bench-interleave.txt" 2>&1
echo "interleave: exit $?"; grep -i -A3 "interleave\|while" "$OUT/bench-interleave.txt" | tail -20
rm -f "$OUT/install.log"
echo "done in $(( $(date +%s) - start )) s"
