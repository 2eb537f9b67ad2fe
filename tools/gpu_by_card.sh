#!/usr/bin/env bash
# One device call whose work depends on the card that came (docs/device-queue.md item 0): the
# H200 figures of issues 21, 22 and 24 need an H200 (`PARTS` of tools/gpu_session35.sh,
# default "bench long reuse pd"), while flint-nano's training (issue 25) runs as well on an
# H100, so an H100 trains: tools/gpu_train_nano.sh with the environment given (INIT,
# FIRST_STEP, MINUTES, TRAIN_ARGS, SKIP_BASE, SKIP_EVAL). Carry the model-only kernel cache
# and the training's INIT directory: [".whl", ".nano-run/kmodel", ".nano-run/ck12061"], with
# FLINT_GRAPH_CACHE=$PWD/.nano-run/kmodel. Writes card.txt under $OUT saying which ran.
set -uo pipefail
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
mkdir -p "$OUT"
if [[ $card == *H200* ]]; then
  echo "$card: the H200 parts (${PARTS:-gaps bench long reuse pd})" | tee "$OUT/card.txt"
  exec bash tools/gpu_session35.sh
fi
echo "$card: flint-nano training" | tee "$OUT/card.txt"
exec bash tools/gpu_train_nano.sh
