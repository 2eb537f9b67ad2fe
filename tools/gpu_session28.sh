#!/usr/bin/env bash
# Twenty-eighth session's device call (one script, files under $OUT), issue 21's short chunks:
# grouped_w4a16 PF (L2 prefetches of the weight code lines PF steps ahead), the kernel that
# runs the routed experts of chunks up to 1,536 rows (NT 16 up to 512 rows, 32 above).
#   1. GPU tests: PF bit for bit equal to PF = 0 (full and flint-nano shapes, routed and
#      folded), the slow-producer PDL test with PF;
#   2. the kernel alone (tools/probe_grouped_w4a16.py, 512 and 1,024 tokens, copy bandwidth
#      beside it), PF 0 / 2 / 4 / 8 alternated twice;
#   3. whole NVFP4 prefills of 512 and 1,024 tokens, PF 0 / 2 alternated twice in one process;
#   4. ncu (if time is left): issue and DRAM use of gate/up at 512 tokens, PF 0 (and NCU_PF).
# Device run: carry [".whl", ".kcache"], command: bash tools/gpu_session28.sh (SKIP_BENCH=1:
# steps 1-2 only; PROBE_ONLY=1: one pass of step 2 only, PROBE_PF its PF values;
# BENCH_PF: step 3's PF list; NCU_PF: step 4 for that PF too)
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 420 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
[ -n "${PROBE_ONLY:-}" ] || timeout "$(left 200)" python3 -m pytest -q -m gpu \
  -p no:cacheprovider tests/test_grouped_w4a16_gpu.py -k "prefetch" 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -6
passes=${PROBE_ONLY:+1}
for pass in ${passes:-1 2}; do
  for pf in 0 ${PROBE_PF:-2 4 8}; do
    v=(--values "PF=$pf")  # PF=0 named: the default is the model's (PF_MODEL)
    timeout "$(left 60)" python3 tools/probe_grouped_w4a16.py --kernel grouped_w4a16 \
      --tokens 512,1024 --layers 8 --reps 20 "${v[@]}" 2>&1 | grep -v Warning \
      | tee -a "$OUT/probe.log" | grep -v "^copy"
  done
done
grep "^copy" "$OUT/probe.log" | head -2
[ -n "${SKIP_BENCH:-}" ] && { echo "done (SKIP_BENCH) in $(( $(date +%s) - start )) s"; exit 0; }
timeout "$(left 240)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
  --tokens 512,1024 --reps 5 --profile-tokens 0 --kernel-tokens= --pf "${BENCH_PF:-0,2,0,2}" \
  --out "$OUT/prefill" > "$OUT/prefill.log" 2>&1
echo "prefill: exit $?"
grep '^{' "$OUT/prefill.log" | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print(d['tokens'], d['row_moe_max'], round(d['ms'], 2), round(d.get('gpu_ms', 0), 2))"
if [ "$(left 120)" -ge 60 ] && [ -x /usr/local/cuda/bin/ncu ]; then
  for pf in 0 ${NCU_PF:-}; do
    v=(--values "PF=$pf")  # PF=0 named: the default is the model's (PF_MODEL)
    timeout "$(left 60)" /usr/local/cuda/bin/ncu -k regex:grouped_w4a16 -c 2 \
      --section SchedulerStats --section WarpStateStats --section SpeedOfLight \
      --section Occupancy python3 tools/probe_grouped_w4a16.py --kernel grouped_w4a16 \
      --tokens 512 --layers 2 --reps 2 "${v[@]}" > "$OUT/ncu-pf$pf.log" 2>&1
  done
fi
echo "done in $(( $(date +%s) - start )) s"
