#!/usr/bin/env bash
# Twenty-second session's device work, in parts (PARTS, default "tests e2e ttft"):
#   tests    the sampler's GPU tests and probe, the graph engine's and KV reuse's (the
#            pipelined decode); GPU_TESTS="FILES [-k …]" runs those instead (no probe)
#   e2e      tools/probe_decode_e2e.py: end to end per token against the step, pipelined decode
#            on and off (issue 24 item 4)
#   ttft     why a process's first request is slower (item 1): tools/ttft_breakdown.py's
#            first_* phases in a plain process and with CUDA_MODULE_LOADING=EAGER
#   profile  the first and a later request under torch.profiler
#   profile8k the prefill's CUDA time by kernel at each of PROFILE_TOKENS (default 8192;
#            tools/bench_prefill.py --profile-tokens)
#   prefill  the NVFP4 8K prefill over fresh processes (item 2)
#   spread   the 8K spread inside one process: six fresh Prefill objects, side stream on for
#            three and off for three, each timed then profiled by kernel (device-queue item 0)
#   sidemax  where the side stream stops paying: --side-max-rows=-,4096,2048 at 512 … 8,192
#            tokens (Prefill.set_side_max_rows; SIDEMAX_TOKENS, SIDEMAX_VALUES), one process
#   bench    flint-graph bench, full preset, 1K context, buckets 1 and 8 (step, e2e, TTFT, 8K)
#   kvw      the prefill's KV write, kv_write kernel against the indexed assignment, A/B in
#            one process (tools/bench_prefill.py --kv-write 0,1; TOKENS_KVW, default 512,8192)
#   reuse    KV reuse on and off, GC pauses per request, REUSE_RUNS of: "tool" the tool loop
#            (item 1's 85 ms resumed step), "new512" chat turns of ~512 new tokens each on 8K
#            of history (issue 22's target); default both; BF16 needs the H200,
#            REUSE_FORMAT=nvfp4 runs anywhere
# Every part's time limit is cut to what is left before DEADLINE (default start + 570 s), and
# a part with less than 40 s left is skipped, so that the call returns its files.
# Device run: carry [".whl", ".kcache"], command: PARTS="..." bash tools/gpu_first_request.sh
# (FORMAT=bf16 needs the H200).
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
. tools/device_setup.sh
F=${FORMAT:-nvfp4}
deadline=${DEADLINE:-$(( $(date +%s) + 570 ))}
lim() {  # seconds for a command: at most $1, at most what is left, at least 1 (timeout 0 never stops)
  local left=$(( deadline - $(date +%s) )); left=$(( left < $1 ? left : $1 )); echo $(( left < 1 ? 1 : left )); }
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for part in ${PARTS:-tests e2e ttft}; do
  t0=$SECONDS
  if [ "$(lim 40)" -lt 40 ]; then echo "== $part: skipped, $(lim 999) s left"; continue; fi
  case $part in
  tests)
    # GPU_TESTS is parsed as shell words, so -k 'a or b' keeps its quotes
    eval "targs=(${GPU_TESTS:-tests/test_sample_tokens_gpu.py tests/test_graph_engine_gpu.py \
      tests/test_kv_reuse_gpu.py})"
    timeout "$(lim "${TEST_TIMEOUT:-300}")" python3 -m pytest -q -m gpu -p no:cacheprovider \
      "${targs[@]}" 2>&1 | tee "$OUT/gpu-tests.log" | tail -6
    [ -z "${GPU_TESTS:-}" ] && timeout "$(lim 90)" python3 tools/probe_sampler.py --presets full \
      --out "$OUT" 2>&1 | tail -6 ;;
  e2e)
    timeout "$(lim 240)" python3 tools/probe_decode_e2e.py --preset full --formats "$F" --buckets 1,8 \
      --tokens 128 --reps "${E2E_REPS:-3}" --phases --json "$OUT/decode-e2e-$F.json" 2>&1 | grep -v Warning | tail -4 ;;
  ttft)
    for mode in ${TTFT_MODES:-plain eager}; do
      env=(); [ "$mode" = eager ] && env=(CUDA_MODULE_LOADING=EAGER)
      env "${env[@]}" timeout "$(lim 150)" python3 tools/ttft_breakdown.py --preset full --formats "$F" \
        --tokens "${TOKENS:-8570,25}" --reps 3 --json "$OUT/ttft-$F-$mode.json" \
        > "$OUT/ttft-$F-$mode.log" 2>&1
      echo "ttft $mode: exit $?"; grep -v Warning "$OUT/ttft-$F-$mode.log" | tail -3 | cut -c1-900
    done ;;
  profile)
    timeout "$(lim 150)" python3 tools/ttft_breakdown.py --preset full --formats "$F" --tokens 8570 \
      --reps 2 --profile-first 25 > "$OUT/ttft-$F-profile.log" 2>&1
    echo "profile: exit $?" ;;
  reuse)
    for run in ${REUSE_RUNS:-tool new512}; do
      args=(--tool-loop --turns 6); [ "$run" = new512 ] && args=(--new-tokens 512 --turns 4)
      eval "extra=(${REUSE_EXTRA:-})"  # e.g. REUSE_EXTRA="--profile-turns 2 --log-reuse"
      timeout "$(lim 170)" python3 tools/bench_reuse.py --preset full \
        --format "${REUSE_FORMAT:-bf16}" --history 8192 "${args[@]}" --max-tokens 16 \
        --out "$OUT/reuse" "${extra[@]}" > "$OUT/reuse-$run.log" 2>&1
      echo "reuse $run: exit $?"; grep "^{" "$OUT/reuse-$run.log" | cut -c1-300 | tail -16
    done ;;
  bench)
    timeout "$(lim 300)" flint-graph bench --preset full --formats "$F" --contexts 1024 --buckets 1,8 \
      --baseline-steps 1 --e2e-tokens 64 --prefill-tokens 25,8k --json "$OUT/bench.json" 2>&1 \
      | tail -30 ;;
  kvw)
    timeout "$(lim "${PREFILL_TIMEOUT:-240}")" python3 tools/bench_prefill.py --formats "$F" --paths graph \
      --tokens "${TOKENS_KVW:-512,8192}" --reps 7 --profile-tokens 0 --kernel-tokens= --kv-write 1,0,1 \
      --out "$OUT/prefill-kvw" > "$OUT/prefill-kvw.log" 2>&1
    echo "kvw: exit $?"; grep '^{' "$OUT/prefill-kvw.log" | cut -c1-400 ;;
  profile8k)
    for n in ${PROFILE_TOKENS:-8192}; do  # e.g. PROFILE_TOKENS="8192 512"
      timeout "$(lim 200)" python3 tools/bench_prefill.py --formats "$F" --paths graph --tokens "$n" \
        --reps 3 --profile-tokens "$n" --kernel-tokens= --out "$OUT/prefill-profile-$n" \
        > "$OUT/prefill-profile-$n.log" 2>&1
      echo "profile $n: exit $?"; grep '^{' "$OUT/prefill-profile-$n.log" | cut -c1-300
    done ;;
  spread)
    timeout "$(lim "${PREFILL_TIMEOUT:-300}")" python3 tools/bench_prefill.py --formats "$F" --paths graph \
      --tokens 8192 --reps 7 --profile-tokens 8192 --kernel-tokens= --overlap 1,1,1,0,0,0 \
      --out "$OUT/spread" > "$OUT/spread.log" 2>&1
    echo "spread: exit $?"; grep '^{' "$OUT/spread.log" | cut -c1-400 ;;
  sidemax)
    timeout "$(lim "${PREFILL_TIMEOUT:-300}")" python3 tools/bench_prefill.py --formats "$F" --paths graph \
      --tokens "${SIDEMAX_TOKENS:-512,2048,4096,8192}" --reps 7 --profile-tokens 0 --kernel-tokens= \
      --side-max-rows="${SIDEMAX_VALUES:--,4096,2048}" --out "$OUT/sidemax" > "$OUT/sidemax.log" 2>&1
    echo "sidemax: exit $?"; grep '^{' "$OUT/sidemax.log" | cut -c1-260 ;;
  prefill)
    timeout "$(lim "${PREFILL_TIMEOUT:-240}")" python3 tools/bench_prefill.py --formats "$F" --paths graph \
      --tokens 8192 --reps 5 --profile-tokens 0 --kernel-tokens= --processes "${PROCESSES:-4}" \
      --out "$OUT/prefill" > "$OUT/prefill-8k-processes.log" 2>&1
    echo "prefill: exit $?"; tail -8 "$OUT/prefill-8k-processes.log" | cut -c1-300 ;;
  esac
  echo "== $part: $((SECONDS - t0)) s"
done
