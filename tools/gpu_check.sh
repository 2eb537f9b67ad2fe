#!/usr/bin/env bash
# Everything the H200 runs in one device call: install the carried wheels, the GPU tests, then
# the full-size eager baseline. Logs and the report land in $OUT (see docs/perf-log.md).
#   device run: carry [".whl"], command: bash tools/gpu_check.sh
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$OUT/install.log" 2>&1 \
  || { cat "$OUT/install.log"; exit 1; }
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -m pytest -q -m gpu -p no:cacheprovider ${GPU_TESTS:-tests} 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
python3 tools/baseline.py --out "$OUT" "$@" 2>&1 | tee "$OUT/baseline.log" | tail -20
