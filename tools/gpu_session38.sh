#!/usr/bin/env bash
# The thirty-eighth session's device calls (docs/device-queue.md item 0; files under $OUT, at
# most eight). PARTS picks, in order:
#   fc-tests   attn_prefill_wg FC (written 2026-12-07, the model's since): the FC = 0 variant's
#              GPU tests against the reference at full and flint-nano shapes, FC = 1 bit for
#              bit against it, and the slow-producer PDL test (fc-tests.log);
#   ptests     whole prefills at the full config, both formats, on graphs, against the
#              reference model (ptests.log);
#   fc-probe   the kernel alone, FC = 0 and 1 alternated twice, full and sliding layers, cold
#              8K and 32K chunks and a 512-token chunk after 8K (fc-probe.txt);
#   fc-prefill whole NVFP4 prefills of 8K and 32K tokens with FC = 0 / 1 alternated
#              (fc-prefill.txt);
#   qk-tests   qk_norm_rope's shared (cos, sin) table (2026-12-07): the prefill kernel's GPU
#              tests (reference, bitwise against the decode kernel, PDL) and the decode
#              kernel's, whose source it shares (qk-tests.log);
#   trace8k    flint-graph trace of an 8K NVFP4 prefill with its JSON (every kernel: the
#              sliding and full layers' qk_norm_rope apart; trace8k.txt, trace8k.json);
#   h200       tools/gpu_session35.sh's H200 parts (PARTS35, default "bench long reuse pd").
# Carry [".whl", ".nano-run/kmodel"] with FLINT_GRAPH_CACHE=$PWD/.nano-run/kmodel exported by
# `tools/build_gpu_cache.py --export .nano-run/kmodel --with-bench moe_gate_up --with-bench
# attn_prefill_wg`. Default PARTS="fc-tests qk-tests fc-probe fc-prefill trace8k" (~6 min).
set -uo pipefail
. tools/device_setup.sh  # also start, deadline (570 s) and left
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
parts=" ${PARTS:-fc-tests qk-tests fc-probe fc-prefill trace8k} "
has() { [[ $parts == *" $1 "* ]]; }
if has fc-tests; then
  gpu_tests fc-tests.log 200 tests/test_attn_prefill_gpu.py -k "FC or run_copies"
fi
if has ptests; then
  gpu_tests ptests.log 200 tests/test_prefill_gpu.py -k "prefill_matches_reference and full"
fi
if has qk-tests; then
  gpu_tests qk-tests.log 150 tests/test_prefill_kernels_gpu.py tests/test_qk_norm_rope_kv_gpu.py \
    -k "qk_norm_rope"
fi
if has fc-probe; then
  timeout "$(left 150)" python3 tools/probe_attn_speed.py --variants \
    attn_prefill_wg,attn_prefill_wg:FC=1,attn_prefill_wg,attn_prefill_wg:FC=1 \
    --cases 8192+0,32768+0,512+8192 > "$OUT/fc-probe.txt" 2>&1
  echo "fc-probe: exit $?"; tail -14 "$OUT/fc-probe.txt"
fi
if has fc-prefill; then
  timeout "$(left 200)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
    --tokens 8192,32768 --reps 3 --kernel-tokens= --profile-tokens 0 \
    --attn-kernel attn_prefill_wg,attn_prefill_wg:FC=1,attn_prefill_wg,attn_prefill_wg:FC=1 \
    > "$OUT/fc-prefill.txt" 2>&1
  echo "fc-prefill: exit $?"; tail -14 "$OUT/fc-prefill.txt"
fi
if has trace8k; then
  timeout "$(left 200)" flint-graph trace --preset full --prefill 8192 --no-progress --top 8 \
    --out "$OUT/trace8k.json" > "$OUT/trace8k.txt" 2>&1
  echo "trace8k: exit $?"; grep -A12 "step by kind" "$OUT/trace8k.txt"
fi
if has h200; then
  PARTS="${PARTS35:-bench long reuse pd}" bash tools/gpu_session35.sh
fi
echo "done: $(( $(date +%s) - start )) s"
