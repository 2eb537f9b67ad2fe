#!/usr/bin/env bash
# Twenty-sixth session's device call (one script, files under $OUT): grouped_w4a16_wg SUB = 1
# (an expert's last tile of at most NT / 2 rows on a half-width loop; issue 21):
#   1. its GPU tests: against the reference (full and flint-nano shapes), bit for bit against
#      SUB = 0, the slow-producer PDL test;
#   2. the kernel alone at 8K and 2K tokens, SUB = 0 and 1 alternated twice
#      (tools/probe_grouped_w4a16.py, copy bandwidth measured beside it);
#   3. whole NVFP4 prefills at 2K, 4K and 8K, SUB = 0 and 1 alternated twice (one process).
# Device run: carry [".whl", ".kcache"], command: bash tools/gpu_session26.sh
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 560 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "$(left 200)" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_grouped_w4a16_gpu.py -k "wg" 2>&1 | tee "$OUT/gpu-tests.log" | tail -8
for pass in 1 2; do
  for v in "" SUB=1; do
    timeout "$(left 60)" python3 tools/probe_grouped_w4a16.py --kernel grouped_w4a16_wg \
      --tokens 8192,2048 --layers 4 --reps 8 ${v:+--values $v} 2>&1 | grep -v Warning \
      | tee -a "$OUT/probe.log" | grep -v "^copy"
  done
done
timeout "$(left 240)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
  --tokens 2048,4096,8192 --reps 5 --profile-tokens 0 --kernel-tokens= \
  --wg-values=-,SUB=1,-,SUB=1 --out "$OUT/prefill" > "$OUT/prefill.log" 2>&1
echo "prefill: exit $?"
grep '^{' "$OUT/prefill.log" | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print(d['tokens'], d['row_moe_max'].split('/wg')[1], round(d['ms'], 2), round(d.get('gpu_ms', 0), 2))"
echo "done in $(( $(date +%s) - start )) s"
