#!/usr/bin/env bash
# Twenty-sixth session's device calls (one script, files under $OUT), issue 21's routed experts
# on grouped_w4a16_wg. PART=sub (run 3): SUB = 1, an expert's last tile of at most NT / 2 rows
# on a half-width loop. PART=nt256 (run 4): tiles of 256 pairs above 2,048 rows, measured
# slower and removed; that part needs commit 3eb4b3f (git checkout 3eb4b3f), where it was written.
# PART=wa (run 6): WA = 1, the codes through shared memory, measured slower and removed; that
# part needs commit 3263ab1. PART=rs (written at the session's end, for the next device call):
# RS = 1, the decoded weights as wgmma's A from registers, x in pair order (run in the
# twenty-seventh session). PART=pf (twenty-seventh session): PF = 4 / 8, L2 prefetches of the
# code lines PF steps ahead, with and without RS; the probe at each variant's own NT. Measured
# no faster and removed; that part needs commit 3e62901. PART=ws (twenty-eighth session): WS = 1,
# the warp-specialized form (a producer warpgroup decodes and copies, two consumers issue wgmma),
# and WP = 2. Measured slower and removed; that part needs commit dabc55c.
#   1. GPU tests: the kernel against the reference (full and flint-nano shapes), SUB 0 and 1
#      bit for bit, the slow-producer PDL test; nt256 adds moe_route's place at NT = 256 and
#      whole prefills with NT = 256 against the reference model;
#   2. the kernel alone (tools/probe_grouped_w4a16.py, copy bandwidth beside it), variants
#      alternated twice;
#   3. whole NVFP4 prefills, variants alternated twice in one process.
# Device run: carry [".whl", ".kcache"], command: bash tools/gpu_session26.sh
set -uo pipefail
start=$(date +%s)
deadline=${DEADLINE:-$(( start + 560 ))}
left() { local l=$(( deadline - $(date +%s) )); echo $(( l < $1 ? (l < 1 ? 1 : l) : $1 )); }
. tools/device_setup.sh
part=${PART:-sub}
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
probe_tokens=()
# PART=ws ran in the twenty-eighth session and needs commit dabc55c (WS = 1 and WP = 2 removed)
if [ "$part" = pf ]; then
  tests=(tests/test_grouped_w4a16_gpu.py -k wg)
  probes=("--nt 128" "--nt 128 --values PF=4" "--nt 128 --values PF=8"
          "--nt 128 --values RS=1,PF=8" "--nt 64" "--nt 64 --values PF=8"
          "--nt 64 --values RS=1" "--nt 64 --values RS=1,PF=8")
  probe_tokens=(8192 8192 8192 8192 2048 2048 2048 2048)
  ptok=8192; tokens=2048,8192; wgv=-,PF=4,PF=8,RS=1:PF=8,-,PF=8
elif [ "$part" = rs ]; then
  tests=(tests/test_grouped_w4a16_gpu.py tests/test_prefill_gpu.py
         -k "w4a16_wg or wg_half or wgmma_w4a16")
  probes=("--nt 64" "--nt 64 --values RS=1" "--nt 128" "--nt 128 --values RS=1"); ptok=8192,2048
  tokens=2048,8192; wgv=-,RS=1,-,RS=1
elif [ "$part" = wa ]; then
  tests=(tests/test_grouped_w4a16_gpu.py tests/test_prefill_gpu.py
         -k "w4a16_wg or wg_variants or wgmma_w4a16")
  probes=("--nt 0" "--nt 0 --values WA=1"); ptok=8192,2048
  tokens=2048,8192; wgv=-,WA=1,-,WA=1
elif [ "$part" = sub ]; then
  tests=(tests/test_grouped_w4a16_gpu.py -k wg)
  # SUB = 1 is now the default at NT = 128 (run 3 timed "-" against SUB=1 before it was)
  probes=("--nt 0 --values SUB=0" "--nt 0 --values SUB=1"); ptok=8192,2048
  tokens=2048,4096,8192; wgv=SUB=0,SUB=1,SUB=0,SUB=1
else
  tests=(tests/test_grouped_w4a16_gpu.py tests/test_moe_route_gpu.py
         tests/test_prefill_gpu.py -k "w4a16_wg or wg_half or wgmma_w4a16 or place")
  probes=("--nt 128" "--nt 256" "--nt 256 --values SUB=0"); ptok=8192,4096
  tokens=4096,8192; wgv=-,NT=256,-,NT=256
fi
timeout "$(left 240)" python3 -m pytest -q -m gpu -p no:cacheprovider "${tests[@]}" 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -8
for pass in 1 2; do
  for i in "${!probes[@]}"; do
    v=${probes[$i]}
    # shellcheck disable=SC2086  # $v holds several options
    timeout "$(left 60)" python3 tools/probe_grouped_w4a16.py --kernel grouped_w4a16_wg \
      --tokens "${probe_tokens[$i]:-$ptok}" --layers 4 --reps 8 $v 2>&1 | grep -v Warning \
      | tee -a "$OUT/probe.log" | grep -v "^copy"
  done
done
timeout "$(left 240)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
  --tokens "$tokens" --reps 5 --profile-tokens 0 --kernel-tokens= \
  --wg-values="$wgv" --out "$OUT/prefill" > "$OUT/prefill.log" 2>&1
echo "prefill: exit $?"
grep '^{' "$OUT/prefill.log" | python3 -c "
import json, sys
for l in sys.stdin:
    d = json.loads(l)
    print(d['tokens'], d['row_moe_max'].split('/wg')[1], round(d['ms'], 2), round(d.get('gpu_ms', 0), 2))"
echo "done in $(( $(date +%s) - start )) s"
