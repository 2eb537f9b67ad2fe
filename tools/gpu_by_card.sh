#!/usr/bin/env bash
# One device call whose work depends on the card that came (docs/device-queue.md item 0).
# With TRAIN=1: the H200 figures of issues 21, 22 and 24 need an H200 (PARTS of
# tools/gpu_session38.sh, default DEFAULT_PARTS below), while flint-nano's
# training (issue 25) runs as well on an H100, so an H100 trains: tools/gpu_train_nano.sh with
# the environment given (INIT, FIRST_STEP, MINUTES, TRAIN_ARGS, SKIP_BASE, SKIP_EVAL; carry
# INIT's directory too). Without TRAIN: gpu_session38.sh's PARTS on either card, the H200
# parts only on an H200. Carry [".whl", ".nano-run/kmodel"] with
# FLINT_GRAPH_CACHE=$PWD/.nano-run/kmodel. Writes card.txt under $OUT saying which ran.
set -uo pipefail
# the next call (docs/device-queue.md item 0): the combine's norm in whole prefills, then
# issue 21's figures with every default (the tests of those defaults passed on an H100 in the
# thirty-ninth session)
DEFAULT_PARTS="cn-prefill prefill long"
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
mkdir -p "$OUT"
if [[ $card == *H200* ]]; then
  export PARTS="${PARTS:-$DEFAULT_PARTS}"
  echo "$card: $PARTS" | tee "$OUT/card.txt"
  exec bash tools/gpu_session38.sh
fi
if [ -n "${TRAIN:-}" ]; then
  echo "$card: flint-nano training" | tee "$OUT/card.txt"
  exec bash tools/gpu_train_nano.sh
fi
parts=${PARTS:-$DEFAULT_PARTS}
export PARTS="${parts//h200/}"
echo "$card: $PARTS (no H200 parts on this card)" | tee "$OUT/card.txt"
exec bash tools/gpu_session38.sh
