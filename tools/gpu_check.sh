#!/usr/bin/env bash
# Everything the H200 runs in one device call. Build the kernel cache HERE first (the GPU box has
# no CuTe DSL and never compiles, ../shared/device.md), then carry it with the gguf wheel:
#   FLINT_GRAPH_CACHE=$PWD/.kcache flint-graph build-kernels --preset full --arch sm_90a
#   flint-graph build-kernels --preset tiny --arch sm_90a --out .kcache/kernels
#   device run: carry [".whl", ".kcache"], command: bash tools/gpu_check.sh
# Steps: install the carried wheels, the GPU tests (kernels against their references, the PDL
# ordering test, the reference model on CUDA), the kernel microbenchmark, the decode-kernel and
# layer benchmark (tools/bench_layer.py; SKIP_LAYER_BENCH=1 skips it), the whole decode step
# captured per bucket at full size with the reference beside it (`flint-graph bench`) and a
# traced step (`flint-graph trace`) (SKIP_STEP_BENCH=1 skips both), and (unless
# SKIP_FULL=1) the CLI at full 40B size (with --stats: the start-up phases) plus the eager
# baseline, and flint-nano's accuracy suite on every engine with the planted bugs
# (tools/gpu_eval_nano.sh; SKIP_NANO_EVAL=1 skips it). Logs land in $OUT (all of them also in $OUT/run.tgz); a short summary is printed
# last.
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
WORK=${WORK:-/tmp/flint-full}
. tools/device_setup.sh
export FLINT_TEST_REPORT=${FLINT_TEST_REPORT:-$OUT/test-report.jsonl}  # per-test JSON lines
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
timeout "${TEST_TIMEOUT:-480}" python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 \
  ${GPU_TESTS:-tests} 2>&1 \
  | tee "$OUT/gpu-tests.log" | tail -25
status=${PIPESTATUS[0]}  # GPU test failures decide the exit code, whatever runs after

if [ -z "${SKIP_BENCH:-}" ]; then
  timeout "${BENCH_TIMEOUT:-330}" python3 tools/bench_kernels.py --out "$OUT" ${BENCH_ARGS:-} \
    > "$OUT/bench-kernels.log" 2>&1
  echo "kernel bench: exit $? (log: bench-kernels.log)"
fi

if [ -z "${SKIP_LAYER_BENCH:-}" ]; then
  timeout "${LAYER_BENCH_TIMEOUT:-300}" python3 tools/bench_layer.py --out "$OUT" \
    ${LAYER_BENCH_ARGS:-} > "$OUT/bench-layer.log" 2>&1
  echo "decode-kernel / layer bench: exit $? (log: bench-layer.log, table: bench_layer.md)"
fi

if [ -z "${SKIP_STEP_BENCH:-}" ]; then
  # the decode-step matrix of the full config in both formats (synthetic weights in memory,
  # BF16 then snapped to NVFP4), with the eager reference on the same cells; then one traced
  # step per format at the longest context
  timeout "${STEP_BENCH_TIMEOUT:-420}" flint-graph bench --preset full --no-progress \
    --json "$OUT/bench.json" --markdown "$OUT/bench.md" ${STEP_BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
  echo "flint-graph bench: exit $? (log: bench.log, tables: bench.md, figures: bench.json)"
  for fmt in ${TRACE_FORMATS:-nvfp4}; do
    timeout "${TRACE_TIMEOUT:-200}" flint-graph trace --preset full --format "$fmt" \
      --context "${TRACE_CONTEXT:-100000}" --no-progress --out "$OUT/trace-$fmt.json" \
      --html "$OUT/trace-$fmt.html" ${TRACE_ARGS:-} > "$OUT/trace-$fmt.log" 2>&1
    echo "flint-graph trace ($fmt): exit $? (log: trace-$fmt.log, timeline: trace-$fmt.json)"
  done
fi

if [ -z "${SKIP_NANO_EVAL:-}" ]; then
  # flint-nano's accuracy suite on every engine, planted bugs included (tools/gpu_eval_nano.sh)
  mkdir -p "$OUT/nano"
  OUT="$OUT/nano" N=${NANO_N:-30} PLANT_N=${NANO_PLANT_N:-20} \
    DEADLINE=$(( $(date +%s) + ${NANO_EVAL_SECONDS:-300} )) bash tools/gpu_eval_nano.sh \
    > "$OUT/nano-eval.log" 2>&1
  grep -E "identical answers|^== " "$OUT/nano-eval.log" | head -20
fi

if [ -z "${SKIP_FULL:-}" ]; then
  rm -rf "$WORK"
  flint-graph make-checkpoint --preset full --format gguf --out "$WORK" --no-progress \
    2>&1 | tee "$OUT/make-checkpoint.log" | tail -4
  # the real cold start: process start to first token on the GGUF, phase by phase
  timeout "${GGUF_BENCH_TIMEOUT:-240}" flint-graph bench "$WORK/model-nvfp4.gguf" --buckets 1 \
    --contexts 1024 --steps 20 --baseline-steps 2 --prefill-tokens 2048 --no-progress \
    --json "$OUT/bench-gguf.json" > "$OUT/bench-gguf.log" 2>&1
  echo "flint-graph bench on the GGUF: exit $? (log: bench-gguf.log)"
  grep -A12 -i "cold start" "$OUT/bench-gguf.log" | head -14
  [ -n "${SKIP_GENERATE:-}" ] && SKIP_BASELINE=1
  [ -n "${SKIP_GENERATE:-}" ] || {
  PROMPT="Explain why a decode step is bound by memory bandwidth."
  # runs 1-2: the default engine (graph on this machine), seeded sampling, twice; run 3: greedy
  # on the graph engine, run 4: greedy on the reference engine (the oracle), compared after
  for i in 1 2 3 4; do
    case $i in 3) extra="--temperature 0";; 4) extra="--temperature 0 --engine reference";;
      *) extra="";; esac
    t0=$(date +%s)
    flint-graph generate "$WORK/model-nvfp4.gguf" --prompt "$PROMPT" --max-tokens ${TOKENS:-64} \
      --seed 0 --stats $extra --json > "$OUT/generate-$i.json" 2> "$OUT/generate-$i.err"
    echo "generate run $i ($extra): exit $?, process wall $(( $(date +%s) - t0 )) s"
    grep "start-up" "$OUT/generate-$i.err" | cut -c1-400; tail -1 "$OUT/generate-$i.err"
  done
  python3 - "$OUT" <<'PY'
import json, sys
a, b, g, r = (json.load(open(f"{sys.argv[1]}/generate-{i}.json")) for i in (1, 2, 3, 4))
for name, o in (("default", a), ("greedy", g), ("greedy reference", r)):
    print(f"full-size CLI generate ({name}, engine {o.get('engine')}): {len(o['token_ids'])} "
          f"tokens, finish {o['finish_reason']}, TTFT {o['ttft_ms']:.0f} ms, "
          f"{o['ms_per_token']:.2f} ms/token")
print(f"same seed -> same ids: {a['token_ids'] == b['token_ids']}")
same = next((i for i, (x, y) in enumerate(zip(g['token_ids'], r['token_ids'])) if x != y), None)
print("greedy graph vs reference: " + ("identical" if same is None else f"first differ at {same}"))
PY
  }
  [ -n "${SKIP_BASELINE:-}" ] || python3 tools/baseline.py --out "$OUT" --work "$WORK" --reuse \
    2>&1 | tee "$OUT/baseline.log" | tail -8
fi
# The device tool returns at most 8 files: everything goes into one archive, and the files read
# first stay beside it.
(cd "$OUT" && tar -czf /tmp/flint-run.tgz --exclude=run.tgz . && mv /tmp/flint-run.tgz run.tgz \
  && find . -type f ! -name run.tgz ! -name gpu-tests.log ! -name bench.md \
       ! -name bench.json ! -name test-report.jsonl ! -name trace-nvfp4.json \
       ! -name trace-nvfp4.html ! -name bench-gguf.json -delete)
echo "=== GPU tests: $(tail -1 "$OUT/gpu-tests.log")"
[ -f "$OUT/bench_kernels.md" ] && cat "$OUT/bench_kernels.md"
[ -f "$OUT/bench.md" ] && cat "$OUT/bench.md"  # the summary table, printed last
[ "$status" -eq 0 ] || echo "GPU TESTS FAILED (pytest exit $status)"
exit "$status"
