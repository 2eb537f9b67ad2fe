#!/usr/bin/env bash
# flint-nano's accuracy suite on the H200, one device call (issue 11): the reference engine,
# then the graph engine in BF16 (twice: the rerun must be bit-identical) and NVFP4 held to it
# (--compare), then each planted bug on the graph engine, a reference rerun (bit-identical) and
# each planted bug on the reference engine. Reports land in $OUT (eval-*.json, eval.log,
# plants.json: each plant's and rerun's verdicts; plant-reports.tgz: those reports in full).
# Needs the kernel cache in .kcache (`tools/build_gpu_cache.py --preset nano`, 104 compiles)
# and the gguf wheel in .whl; N (default 50) cases per suite, PLANT_N per plant run; CK a
# checkpoint directory (default: the embedded flint-nano); DEADLINE (epoch seconds) cuts each
# step's time so the call ends by then; T (150 s) limits each run, REF_T (400 s) the reference
# engine's (its clean runs and rerun), which took up to 172 s on the H200 for N = 30 (2026-12-03)
# with the default suites, and 389 s of decoding on an H100 for N = 30 with
# SUITES=tools,arith,recall,chain,chat,phrasing,result (2026-12-07: REF_T=300 cut it; give
# it REF_T=560 and the call to itself, then hold the graph engine to it with REF=). REF=REPORT skips
# the reference engine's clean runs and holds the graph engine's and the plants to that report
# (SKIP_CLEAN=1: the plants only); GRAPH_PLANTS / PLANTS
# list the plants to run on each engine (empty: none); SUITES the suites (default: eval's own);
# SKIP_RERUN=1 skips the reruns (the graph engine's BF16 and the reference engine's).
set -uo pipefail
. tools/device_setup.sh
N=${N:-50}
PN=${PLANT_N:-30}
CTX=${CONTEXTS:-1024,4096,16384}
log=$OUT/eval.log
ev() {
  local t=${T:-150}
  if [ -n "${DEADLINE:-}" ]; then
    local left=$(( DEADLINE - $(date +%s) - 5 ))
    [ "$left" -lt 20 ] && { echo "skipped (deadline): $*" | tee -a "$log"; return; }
    [ "$left" -lt "$t" ] && t=$left
  fi
  local suites=(); [ -n "${SUITES:-}" ] && suites=(--suite "$SUITES")
  timeout "$t" flint-graph eval --quiet --n "$N" --contexts "$CTX" "${suites[@]}" "$@" 2>&1 \
    | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  # --quiet prints nothing until the end, so a run cut by its time limit must say so itself
  [ "$rc" = 124 ] && echo "timed out after ${t} s (T): $*" | tee -a "$log"
  return 0; }
ck=${CK:-$(python3 -c "from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint as e
print(e(progress=False))")}
mkdir -p /tmp/plants
if [ -n "${REF:-}" ]; then
  cp "$REF" "$OUT/eval-ref.json"
else
  echo "== reference engine (BF16) $ck" | tee -a "$log"
  T=${REF_T:-400} ev "$ck" --engine reference --json "$OUT/eval-ref.json"
fi
if [ -z "${SKIP_CLEAN:-}" ]; then
  echo "== graph engine, BF16" | tee -a "$log"
  ev "$ck" --engine graph --compare "$OUT/eval-ref.json" --json "$OUT/eval-graph-bf16.json"
  if [ -z "${SKIP_RERUN:-}" ]; then
    echo "== graph engine, BF16, again (same setup: must be bit-identical)" | tee -a "$log"
    ev "$ck" --engine graph --compare "$OUT/eval-graph-bf16.json" --json /tmp/plants/rerun-graph.json
  fi
  echo "== graph engine, NVFP4 GGUF" | tee -a "$log"
  ev "$ck/model-nvfp4.gguf" --engine graph --compare "$OUT/eval-ref.json" \
    --json "$OUT/eval-graph-nvfp4.json"
fi
for bug in ${GRAPH_PLANTS-no-sink router-bias-bf16 window-1 rope-on-nope}; do
  echo "== plant $bug (graph engine)" | tee -a "$log"
  N=$PN ev "$ck" --engine graph --plant "$bug" --compare "$OUT/eval-ref.json" \
    --json "/tmp/plants/graph-$bug.json"
done
if [ -z "${REF:-}" ] && [ -z "${SKIP_RERUN:-}" ]; then
  echo "== reference engine again (same setup: must be bit-identical)" | tee -a "$log"
  T=${REF_T:-400} ev "$ck" --engine reference --compare "$OUT/eval-ref.json" --json /tmp/plants/rerun-ref.json
fi
for bug in ${PLANTS-window-1 no-sink rope-on-nope router-bias-bf16}; do
  echo "== plant $bug (reference engine)" | tee -a "$log"
  N=$PN ev "$ck" --engine reference --plant "$bug" --compare "$OUT/eval-ref.json" \
    --json "/tmp/plants/ref-$bug.json"
done
tar czf "$OUT/plant-reports.tgz" -C /tmp/plants .
ls /tmp/plants/*.json > /dev/null 2>&1 && python3 - "$OUT/plants.json" /tmp/plants/*.json <<'PY'
import json, sys
out = {p.split("/")[-1][:-5]: json.load(open(p)) for p in sys.argv[2:]}
for r in out.values():
    r.pop("cases", None)
json.dump(out, open(sys.argv[1], "w"), indent=1)
PY
echo "done" | tee -a "$log"
