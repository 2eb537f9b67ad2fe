#!/usr/bin/env bash
# The thirty-eighth session's device calls (docs/device-queue.md item 0; files under $OUT, at
# most eight). PARTS, run in the order given:
#   fc-tests   attn_prefill_wg FC (written 2026-12-07, the model's since): the FC = 0 variant's
#              GPU tests against the reference at full and flint-nano shapes, FC = 1 bit for
#              bit against it, and the slow-producer PDL test (fc-tests.log);
#   ptests     whole prefills at the full config, both formats, eager and on graphs, against
#              the reference model (ptests.log);
#   qk-tests   qk_norm_rope's shared (cos, sin) table: the prefill kernel's GPU tests
#              (reference, bitwise against the decode kernel, PDL) and the decode kernel's,
#              whose source it shares (qk-tests.log);
#   prefill    tools/bench_prefill.py, both formats, 512 and 8K tokens (prefill.txt);
#   long       one 32,768-token NVFP4 chunk and 100,000 tokens (long.txt);
#   fc-probe   the attention kernel alone, FC = 0 and 1 alternated twice (fc-probe.txt);
#   fc-prefill whole NVFP4 prefills of 8K and 32K tokens, FC = 0 / 1 alternated;
#   trace8k    flint-graph trace of an 8K NVFP4 prefill with its JSON (trace8k.txt, .json);
#   h200       tools/gpu_session35.sh's parts (PARTS35, default "bench long reuse pd");
#   w0-tests   grouped_w4a16_wg W0 = 1 (thirty-ninth session): every wgmma spec against the
#              reference (the W0 = 1 bench specs among them), W0 = 1 bit for bit against
#              RS = 1, the slow-producer PDL tests (w0-tests.log);
#   w0-probe   the kernel alone at 8K (NT 128) and 2K (NT 64) tokens, the model's spec and
#              RS = 1 W0 = 1 alternated twice (w0-probe.txt);
#   w0-prefill whole NVFP4 prefills of 2K and 8K tokens, --wg-values -,RS=1:W0=1 alternated
#              twice (w0-prefill.txt);
#   cn-tests   moe_combine NORM = 1 (thirty-ninth session): its GPU tests (cn-tests.log);
#   cn-prefill whole NVFP4 prefills of 512 and 8K tokens, --combine-norm 1,0 alternated twice
#              (cn-prefill.txt);
#   fold-tests attn_decode QKN = 1 (fortieth session: Q/K norm, RoPE and the KV write folded
#              into decode attention): the kernel's folded GPU tests, the folded layer and
#              decode step against the reference (fold-tests.log);
#   fold-probe the whole decode step at full size, NVFP4, B = 1 and 8, 1K and 100K context,
#              fold off / on alternated twice (fold-probe.txt);
#   fold-trace flint-graph trace at full size, NVFP4, B = 1, 1K context, --attn-fold on: the
#              per-kind table with the fold (fold-trace.txt, .json).
# fold-* need the cache exported with --with-bench attn_decode too.
# Carry [".whl", ".nano-run/kmodel"] with FLINT_GRAPH_CACHE=$PWD/.nano-run/kmodel exported by
# `tools/build_gpu_cache.py --export .nano-run/kmodel --with-bench moe_gate_up --with-bench
# attn_prefill_wg`. Default PARTS="qk-tests prefill long ptests fc-tests".
set -uo pipefail
. tools/device_setup.sh  # also start, deadline (CALL_SECONDS, default 570 s) and left
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader | tee "$OUT/gpu.txt"
for part in ${PARTS:-qk-tests prefill long ptests fc-tests}; do
  case $part in
    fc-tests) gpu_tests fc-tests.log 200 tests/test_attn_prefill_gpu.py -k "FC or run_copies" ;;
    ptests) gpu_tests ptests.log 240 tests/test_prefill_gpu.py \
              -k "prefill_matches_reference and full" ;;
    qk-tests) gpu_tests qk-tests.log 150 tests/test_prefill_kernels_gpu.py \
                tests/test_qk_norm_rope_kv_gpu.py -k "qk_norm_rope" ;;
    prefill)
      timeout "$(left 180)" python3 tools/bench_prefill.py --formats "${PREFILL_FORMATS:-nvfp4,bf16}" --paths graph \
        --tokens "${PREFILL_TOKENS:-512,8192}" --reps 5 --kernel-tokens= --profile-tokens 0 \
        > "$OUT/prefill.txt" 2>&1
      echo "prefill: exit $?"; tail -8 "$OUT/prefill.txt" ;;
    long)
      timeout "$(left 200)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
        --tokens 32768 --kernel-tokens 100000 --reps 2 --profile-tokens 0 > "$OUT/long.txt" 2>&1
      echo "long: exit $?"; tail -8 "$OUT/long.txt" ;;
    fc-probe)
      timeout "$(left 150)" python3 tools/probe_attn_speed.py --variants \
        attn_prefill_wg:FC=0,attn_prefill_wg,attn_prefill_wg:FC=0,attn_prefill_wg \
        --cases 8192+0,32768+0,512+8192 > "$OUT/fc-probe.txt" 2>&1
      echo "fc-probe: exit $?"; tail -14 "$OUT/fc-probe.txt" ;;
    fc-prefill)
      timeout "$(left 200)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
        --tokens 8192,32768 --reps 3 --kernel-tokens= --profile-tokens 0 --attn-kernel \
        attn_prefill_wg:FC=0,attn_prefill_wg,attn_prefill_wg:FC=0,attn_prefill_wg \
        > "$OUT/fc-prefill.txt" 2>&1
      echo "fc-prefill: exit $?"; tail -14 "$OUT/fc-prefill.txt" ;;
    trace8k)
      timeout "$(left 200)" flint-graph trace --preset full --prefill 8192 --no-progress \
        --top 8 --out "$OUT/trace8k.json" > "$OUT/trace8k.txt" 2>&1
      echo "trace8k: exit $?"; grep -A12 "step by kind" "$OUT/trace8k.txt" ;;
    h200) PARTS="${PARTS35:-bench long reuse pd}" bash tools/gpu_session35.sh ;;
    cn-tests) gpu_tests cn-tests.log 120 tests/test_prefill_kernels_gpu.py -k "moe_combine" ;;
    fold-tests) gpu_tests fold-tests.log 300 tests/test_attn_decode_gpu.py \
                  tests/test_decode_layer_gpu.py tests/test_decode_step_gpu.py -k "folded or QKN" ;;
    fold-probe)
      timeout "$(left 240)" python3 tools/probe_moe_pd.py --axis fold --pd 0,1 --buckets 1,8 \
        --contexts 1024,100000 --rounds 2 --steps 100 > "$OUT/fold-probe.txt" 2>&1
      echo "fold-probe: exit $?"; grep -v Warning "$OUT/fold-probe.txt" | tail -6 ;;
    fold-trace)
      timeout "$(left 200)" flint-graph trace --preset full --format nvfp4 --context 1024 \
        --attn-fold on --no-progress --out "$OUT/fold-trace.json" > "$OUT/fold-trace.txt" 2>&1
      echo "fold-trace: exit $?"; grep -A12 "step by kind" "$OUT/fold-trace.txt" ;;
    cn-prefill)
      timeout "$(left 200)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
        --tokens 512,8192 --reps 5 --kernel-tokens= --profile-tokens 0 \
        --combine-norm 1,0,1,0 > "$OUT/cn-prefill.txt" 2>&1
      echo "cn-prefill: exit $?"; tail -10 "$OUT/cn-prefill.txt" ;;
    w0-tests) gpu_tests w0-tests.log 200 tests/test_grouped_w4a16_gpu.py \
                -k "grouped_w4a16_wg or w0" ;;
    w0-probe)
      for pass in 1 2; do
        for v in "" "RS=1,W0=1"; do
          for tok in 8192 2048; do
            echo "== pass $pass tokens $tok values ${v:-model}" >> "$OUT/w0-probe.txt"
            timeout "$(left 60)" python3 tools/probe_grouped_w4a16.py --kernel grouped_w4a16_wg \
              --tokens "$tok" --layers 4 --reps 8 --values "$v" 2>&1 | grep -v Warning \
              >> "$OUT/w0-probe.txt"
          done
        done
      done
      echo "w0-probe: exit $?"; grep -v "^copy" "$OUT/w0-probe.txt" | tail -24 ;;
    w0-prefill)
      timeout "$(left 200)" python3 tools/bench_prefill.py --formats nvfp4 --paths graph \
        --tokens 2048,8192 --reps 3 --kernel-tokens= --profile-tokens 0 \
        --wg-values=-,RS=1:W0=1,-,RS=1:W0=1 > "$OUT/w0-prefill.txt" 2>&1
      echo "w0-prefill: exit $?"; tail -14 "$OUT/w0-prefill.txt" ;;
    *) echo "unknown part $part" ;;
  esac
done
echo "done: $(( $(date +%s) - start )) s"
