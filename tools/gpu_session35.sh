#!/usr/bin/env bash
# The thirty-fifth session's queue for the next device calls (docs/device-queue.md item 0; one
# script, files under $OUT, at most eight of them; issues 21, 22, 24). PARTS picks, in order:
#   start      the prefill's start without pageable copies (thirty-sixth session): its
#              full-preset NVFP4 graph test, then 512 tokens timed (start.txt);
#   gaps       flint-graph trace --prefill 512 (NVFP4): the "where the gap is" table, the
#              boundaries that leave the prefill's uncovered time (gaps.txt);
#   bench      flint-graph bench: TTFT of 25 tokens and the 512 / 8K prefills in both formats
#              and the 1K decode step, issue 21's figures with rmsnorm_rows (bench.txt);
#   long       tools/bench_prefill.py: one 32,768-token chunk and 100,000 tokens (long.txt);
#   reuse      tools/bench_reuse.py: 8K of history + ~470 new tokens a turn (issue 22's
#              ratio, reuse.txt);
#   pd         tools/probe_moe_pd.py at B = 1, 2, 4, 8 (issue 24, pd.txt);
#   tests      every prefill GPU test (tests-prefill.log; ~6 min on an H100), then the
#              decode norm's and the reuse tests (tests-other.log) with what time is left.
# Default PARTS="gaps bench long reuse pd" (~8 min); PARTS=tests in a call of its own.
# Device run: carry [".whl", ".nano-run/kmodel"] with FLINT_GRAPH_CACHE=$PWD/.nano-run/kmodel
# (the tree with .kcache is over 64 MiB), or [".whl", ".kcache"]; command:
# PARTS="..." bash tools/gpu_session35.sh
set -uo pipefail
. tools/device_setup.sh  # also start, deadline (570 s) and left
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
parts=" ${PARTS:-gaps bench long reuse pd} "
has() { [[ $parts == *" $1 "* ]]; }
if has start; then
  gpu_tests start-test.log 100 tests/test_prefill_gpu.py \
    -k "prefill_matches_reference and full and nvfp4 and graphs"
  timeout "$(left 120)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
    --tokens 512 --reps 15 --kernel-tokens= > "$OUT/start.txt" 2>&1
  echo "start: exit $?"; tail -8 "$OUT/start.txt"
fi
if has gaps; then
  timeout "$(left 120)" flint-graph trace --preset full --prefill 512 --no-progress --top 10 \
    > "$OUT/gaps.txt" 2>&1
  echo "gaps: exit $?"; grep -A12 "where the gap is" "$OUT/gaps.txt"
fi
if has bench; then
  timeout "$(left 240)" flint-graph bench --preset full --formats bf16,nvfp4 --contexts 1024 \
    --buckets 1 --baseline-steps 1 --e2e-tokens 64 --prefill-tokens 25,512,8k \
    > "$OUT/bench.txt" 2>&1
  echo "bench: exit $?"; tail -30 "$OUT/bench.txt"
fi
if has long; then
  timeout "$(left 200)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
    --tokens 32768 --kernel-tokens 100000 --reps 2 > "$OUT/long.txt" 2>&1
  echo "long: exit $?"; tail -12 "$OUT/long.txt"
fi
if has reuse; then
  timeout "$(left 150)" python3 tools/bench_reuse.py --preset full --max-tokens 16 \
    --format nvfp4 --history 8192 --new-tokens 512 --turns 4 > "$OUT/reuse.txt" 2>&1
  echo "reuse: exit $?"; tail -12 "$OUT/reuse.txt"
fi
if has pd; then
  timeout "$(left 150)" python3 tools/probe_moe_pd.py --preset full --format nvfp4 \
    --buckets 1,2,4,8 --contexts 1024 --pd 0,1,2 > "$OUT/pd.txt" 2>&1
  echo "pd: exit $?"; tail -6 "$OUT/pd.txt"
fi
if has tests; then
  gpu_tests tests-prefill.log 420 tests/test_prefill_gpu.py tests/test_prefill_kernels_gpu.py
  gpu_tests tests-other.log 120 tests/test_kernels_gpu.py tests/test_kv_reuse_gpu.py \
    -k "rmsnorm or reuse or graph_engine"
fi
echo "done: $(( $(date +%s) - start )) s"
