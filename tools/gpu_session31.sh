#!/usr/bin/env bash
# Thirty-first session's device calls (one script, files under $OUT; issues 21, 22 and 24),
# run as four calls on an H200 (perf log, thirty-first session):
#   run 1 (PARTS="tests pd long trace", the default):
#     tests         moe_gate_up against its reference at PD = 0 and 1 (with the PDL
#                   slow-producer test), the decode layers and step against the reference;
#     pd            tools/probe_moe_pd.py: the NVFP4 decode step at B = 1, 2, 4, 1K context,
#                   moe_gate_up at PD = 0 and PD = 1 alternated (logits bit for bit equal);
#     long          32K and 100K prefills (issue 21's 0.6 s and 3.5 s targets), NVFP4;
#     trace         flint-graph trace --preset full --context 1024 (NVFP4, B = 1);
#   run 2 (PARTS="bench reuse-8k", needs_h200: BF16 at full size):
#     bench         flint-graph bench, BF16 and NVFP4: decode B = 1 at 1K, end to end, and
#                   prefills of 25, 512 and 8,192 tokens through the engine;
#     reuse-8k      tools/gpu_reuse_h200.sh's 8K-history chat turns, NVFP4 then BF16;
#   run 3 (PARTS="reuse-rest buckets engine", needs_h200):
#     reuse-rest    the KV reuse GPU tests, 32K of history (NVFP4), the tool loops (both);
#     buckets       the prefill's buckets above 4,096 rows against the reference, both formats;
#     engine        the graph engine's GPU tests;
#   run 4 (PARTS="prefill-tests interleave"):
#     prefill-tests the prefill's GPU tests (whole prefills and its kernels);
#     interleave    a running stream's time per token while an 8K and a 32K prompt arrive.
# Device run: carry [".whl", ".kcache"], command: PARTS="..." bash tools/gpu_session31.sh
set -uo pipefail
. tools/device_setup.sh  # also start, deadline (570 s) and left
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
parts=" ${PARTS:-tests pd long trace} "
has() { [[ $parts == *" $1 "* ]]; }
if has tests; then
  gpu_tests gpu-tests.log 150 tests/test_moe_gate_up_gpu.py tests/test_decode_layer_gpu.py \
    tests/test_decode_step_gpu.py
fi
if has pd; then
  timeout "$(left 150)" python3 tools/probe_moe_pd.py --preset full --format nvfp4 \
    --buckets 1,2,4 --contexts 1024 > "$OUT/pd.log" 2>&1
  echo "pd: exit $?"; tail -4 "$OUT/pd.log"
fi
if has long; then
  timeout "$(left 260)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
    --tokens 32768 --kernel-tokens 100000 --reps 2 --profile-tokens 0 --out "$OUT/long" \
    > "$OUT/long.log" 2>&1
  echo "long: exit $?"; tail -25 "$OUT/long.log"
  rm -f "$OUT/long/prefill.md"  # at most 8 files come back: its JSON has the table
fi
if has trace; then
  timeout "$(left 120)" flint-graph trace --preset full --context 1024 --no-progress --top 30 \
    --out "$OUT/trace1k.json" > "$OUT/trace1k.txt" 2>&1
  echo "trace: exit $?"; grep -v '^ *[0-9]\+ ' "$OUT/trace1k.txt" | tail -40
fi
if has bench; then
  timeout "$(left 260)" flint-graph bench --preset full --formats bf16,nvfp4 --contexts 1024 \
    --buckets 1 --baseline-steps 1 --e2e-tokens 64 --prefill-tokens 25,512,8k --no-progress \
    --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1
  echo "bench: exit $?"; tail -45 "$OUT/bench.txt"
fi
if has reuse-8k; then
  DEADLINE=$deadline RUNS="nvfp4-new512 bf16-new512" bash tools/gpu_reuse_h200.sh
fi
if has reuse-rest; then
  DEADLINE=$(( $(date +%s) + $(left 300) )) RUNS="tests nvfp4-32k nvfp4-tool bf16-tool" \
    bash tools/gpu_reuse_h200.sh
fi
if has buckets; then
  gpu_tests gpu-tests-buckets.log 120 tests/test_prefill_gpu.py -k "bucket_above"
fi
if has engine; then
  gpu_tests gpu-tests-engine.log 200 tests/test_graph_engine_gpu.py
fi
if has prefill-tests; then
  gpu_tests gpu-tests-prefill.log 260 tests/test_prefill_gpu.py tests/test_prefill_kernels_gpu.py
fi
if has interleave; then
  timeout "$(left 300)" flint-graph bench --preset full --formats nvfp4 --contexts 1024 \
    --buckets 1,4 --baseline-steps 1 --e2e-tokens 16 --prefill-tokens 25 --interleave 8k,32k \
    --no-progress --json "$OUT/bench-interleave.json" > "$OUT/bench-interleave.txt" 2>&1
  echo "interleave: exit $?"; grep -i -A3 "interleave\|while" "$OUT/bench-interleave.txt" | tail -20
fi
rm -f "$OUT/install.log"  # the install succeeded (device_setup.sh stops otherwise)
echo "done in $(( $(date +%s) - start )) s"
