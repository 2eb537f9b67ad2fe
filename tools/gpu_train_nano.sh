#!/usr/bin/env bash
# Continue flint-nano's training on the H200 from a checkpoint and score the result, in one
# device call (issue 11; the training state is not in git, so a run starts from the shipped
# checkpoint with `train_nano.py --init`).
#   1. the reference engine on INIT's own chat suite (eval-base-chat.json), for comparison;
#   2. MINUTES of training from INIT (TRAIN_ARGS passed on), loss in loss.jsonl, log in
#      train.log;
#   3. the export's NVFP4 GGUF (model-nvfp4.gguf: its side files are INIT's);
#   4. the reference engine on the export, SUITES at N cases each (eval-ref.json);
#   5. with GRAPH=1, the graph engine (BF16) on the export held to it (--compare,
#      eval-graph-bf16.json), if the call's time allows (DEADLINE, default start + 570 s).
# SKIP_BASE=1 skips step 1 (one call then fits steps 2-5 with MINUTES up to ~4.5); SKIP_EVAL=1
# stops after step 3 (MINUTES up to ~8.5; score the export on the CPU, docs/nano.md). Otherwise
# hold the graph engine to eval-ref.json afterwards with tools/gpu_eval_nano.sh (CK=...).
# Needs the gguf wheel in .whl (../shared/device.md); INIT (default: the embedded flint-nano),
# FIRST_STEP (default 6518: past flint-nano's 6517 steps, so the batches are new), MINUTES
# (default 4), N (default 30), SUITES (default tools,arith,recall,chain,chat), DEVICE (default
# cuda; cpu for a smoke test).
set -uo pipefail
. tools/device_setup.sh
base=$(python3 -c "from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint as e
print(e(progress=False))")
init=${INIT:-$base}
log=$OUT/eval.log
deadline=${DEADLINE:-$(( $(date +%s) + 570 ))}
if [ -z "${SKIP_BASE:-}" ]; then
  echo "== chat suite, reference engine, $init" | tee -a "$log"
  flint-graph eval "$init" --quiet --engine reference --suite chat --n "${N:-30}" \
    --json "$OUT/eval-base-chat.json" 2>&1 | tee -a "$log"
fi
echo "== training from $init" | tee -a "$log"
python3 tools/train_nano.py --state /tmp/state --device "${DEVICE:-cuda}" --init "$init" \
  --first-step "${FIRST_STEP:-6518}" --recall-pairs 1300 --minutes "${MINUTES:-4}" \
  ${TRAIN_ARGS:-} > "$OUT/train.log" 2>&1 || { tail -20 "$OUT/train.log"; exit 1; }
tail -3 "$OUT/train.log" | tee -a "$log"
cp /tmp/state/loss.jsonl "$OUT/loss.jsonl"
python3 tools/train_nano.py --state /tmp/state --export /tmp/ck | tee -a "$log"
cp /tmp/ck/model-nvfp4.gguf "$OUT/"
[ -n "${SKIP_EVAL:-}" ] && { echo "done (SKIP_EVAL: no eval)" | tee -a "$log"; exit 0; }
echo "== reference engine, the export" | tee -a "$log"
flint-graph eval /tmp/ck --quiet --engine reference --n "${N:-30}" \
  --suite "${SUITES:-tools,arith,recall,chain,chat}" --json "$OUT/eval-ref.json" 2>&1 \
  | tee -a "$log"
left=$(( deadline - $(date +%s) ))
if [ -n "${GRAPH:-}" ] && [ "$left" -gt 30 ]; then
  echo "== graph engine (BF16), the export, held to the reference report ($left s left)" \
    | tee -a "$log"
  timeout "$left" flint-graph eval /tmp/ck --quiet --engine graph --n "${N:-30}" \
    --suite "${SUITES:-tools,arith,recall,chain,chat}" --compare "$OUT/eval-ref.json" \
    --json "$OUT/eval-graph-bf16.json" 2>&1 | tee -a "$log"
elif [ -n "${GRAPH:-}" ]; then
  echo "graph engine eval skipped: $left s left" | tee -a "$log"
fi
echo done | tee -a "$log"
