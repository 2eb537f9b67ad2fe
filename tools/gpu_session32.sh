#!/usr/bin/env bash
# Thirty-second session's device calls (one script, files under $OUT; issues 21, 22 and 24):
#   run 1 (PARTS="split reuse-split split-tests", the default; issue 22, NVFP4):
#     split         tools/probe_attn_speed.py: attn_prefill_wg's full layers alone for chunks
#                   of 256-1,024 queries after 2K-32K cached keys, SPLITS 1 / 2 / 4, WS = 1;
#     reuse-split   tools/bench_reuse.py, 8K of history + ~470 new tokens a turn, NVFP4, with
#                   splits as today (SPLIT_CTAS 128), and with SPLIT_CTAS 256 picking from
#                   (2, 4, 16) and from (4, 16);
#     split-tests   tests/test_attn_prefill_gpu.py (every SPLITS spec, 2 new) and the reuse
#                   GPU tests;
#   run 2 (PARTS="pd pacing trace512 ncu"):
#     pd            moe_gate_up's GPU tests (PD 0, 1, 2) and tools/probe_moe_pd.py --pd 0,1,2;
#     pacing        tools/probe_pacing.py: the pacer's budget swept, 8K and 32K arriving;
#     trace512      flint-graph trace --prefill 512 (NVFP4): a 512-token prefill per kernel;
#     ncu           Nsight Compute on an 8K full layer's attention (and 512 queries after 8K)
#                   and on grouped_w4a16_wg gate/up at 8K: stall reasons, pipe use;
#   run 3 (PARTS="prefill-tests"): the prefill's GPU tests (whole prefills and kernels).
# Device run: carry [".whl", ".kcache"], command: PARTS="..." bash tools/gpu_session32.sh
set -uo pipefail
. tools/device_setup.sh  # also start, deadline (570 s) and left
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
parts=" ${PARTS:-split reuse-split split-tests} "
has() { [[ $parts == *" $1 "* ]]; }
if has split-tests-first; then  # SPLIT_K: a -k filter (e.g. "attn_prefill_wg-full")
  gpu_tests gpu-tests-split.log 150 tests/test_attn_prefill_gpu.py ${SPLIT_K:+-k "$SPLIT_K"}
fi
if has split; then
  v=attn_prefill_wg  # SPLIT_VARIANTS, SPLIT_CASES: a shorter probe when time is short
  timeout "$(left 120)" python3 tools/probe_attn_speed.py --kinds full \
    --variants "${SPLIT_VARIANTS:-$v,$v:SPLITS=2,$v:SPLITS=4,$v:WS=1,$v:ST=3}" \
    --cases "${SPLIT_CASES:-256+8192,512+8192,768+8192,1024+8192,512+2048,512+32768}" \
    --out "$OUT" > "$OUT/split.log" 2>&1
  echo "split: exit $?"; cat "$OUT/split.log" | tail -20
fi
reuse() {  # reuse NAME ARGS...: 4 chat turns of ~470 new tokens on 8K of history, NVFP4
  local name=$1; shift
  if [ "$(left 999)" -lt 70 ]; then echo "$name: skipped, $(left 999) s left"; return 0; fi
  local t0=$SECONDS
  timeout "$(left 150)" python3 tools/bench_reuse.py --preset full --max-tokens 16 \
    --format nvfp4 --history 8192 --new-tokens 512 --turns 4 "$@" --out "/tmp/reuse/$name" \
    > "/tmp/reuse-$name.log" 2>&1
  echo "$name: exit $? in $(( SECONDS - t0 )) s"
  python3 tools/reuse_table.py "$name" < "/tmp/reuse-$name.log" | tee -a "$OUT/reuse-split.txt"
}
if has reuse-split; then
  reuse today
  reuse ctas256-2 --split-ctas 256 --split-picks 2,4,16
  reuse ctas256-4 --split-ctas 256 --split-picks 4,16
  reuse today-again
fi
if has split-tests; then  # SPLIT_K: a -k filter (e.g. "attn_prefill_wg-full" for the splits)
  gpu_tests gpu-tests-split.log 200 tests/test_attn_prefill_gpu.py ${SPLIT_K:+-k "$SPLIT_K"}
fi
if has pd; then
  gpu_tests gpu-tests-pd.log 120 tests/test_moe_gate_up_gpu.py
  timeout "$(left 150)" python3 tools/probe_moe_pd.py --preset full --format nvfp4 \
    --buckets 1,2,4 --contexts 1024 --pd 0,1,2 > "$OUT/pd.log" 2>&1
  echo "pd: exit $?"; tail -6 "$OUT/pd.log"
fi
if has pacing; then
  timeout "$(left 200)" python3 tools/probe_pacing.py --preset full --format nvfp4 \
    --step-ms 25,50,100,200,none --prompts 8k,32k --json "$OUT/pacing.json" \
    > "$OUT/pacing.log" 2>&1
  echo "pacing: exit $?"; tail -8 "$OUT/pacing.log"
fi
if has trace512; then
  timeout "$(left 120)" flint-graph trace --preset full --prefill 512 --no-progress --top 40 \
    --out /tmp/trace512.json > "$OUT/trace512.txt" 2>&1
  echo "trace512: exit $?"; grep -v '^ *[0-9]\+ ' "$OUT/trace512.txt" | tail -50
fi
if has ncu && [ -x /usr/local/cuda/bin/ncu ]; then  # one file back: ncu.log
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats
            --section SchedulerStats --section Occupancy --section InstructionStats)
  timeout "$(left 120)" /usr/local/cuda/bin/ncu --clock-control none -k regex:attn_prefill_wg \
    -c 2 "${sections[@]}" python3 tools/probe_attn_speed.py --ncu --variants attn_prefill_wg \
    --kinds full --cases 8192+0,512+8192 > "$OUT/ncu.log" 2>&1
  echo "ncu attention: exit $?"
  timeout "$(left 120)" /usr/local/cuda/bin/ncu --clock-control none -k regex:grouped_w4a16_wg \
    -c 1 "${sections[@]}" python3 tools/probe_grouped_w4a16.py --kernel grouped_w4a16_wg \
    --tokens 8192 --kinds 0 --layers 1 --reps 1 >> "$OUT/ncu.log" 2>&1
  echo "ncu experts: exit $?"; grep -E "Duration|Throughput|Issue Slots Busy|Stall|Pipe|Warp Cycles" \
    "$OUT/ncu.log" | head -60
fi
if has prefill-tests; then
  gpu_tests gpu-tests-prefill.log 560 tests/test_prefill_gpu.py tests/test_prefill_kernels_gpu.py
fi
[ -d /tmp/reuse ] && tar czf "$OUT/reuse-json.tgz" -C /tmp/reuse . /tmp/reuse-*.log 2>/dev/null
rm -f "$OUT/install.log"  # the install succeeded (device_setup.sh stops otherwise)
echo "done in $(( $(date +%s) - start )) s"
