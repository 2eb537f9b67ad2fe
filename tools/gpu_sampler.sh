#!/usr/bin/env bash
# The sampler's top-k path (issue 24 item 2): its GPU tests (every id equal to the reference's,
# workspaces left zero, PDL), its time per launch beside the histogram path
# (tools/probe_sampler.py), the graph runner's tests (the sampler inside the decode graph) and,
# with BENCH=1, the full NVFP4 step at 1K (sampled row: top-k 20, top-p 0.95).
# Device run: carry [".whl", ".kcache"], command: bash tools/gpu_sampler.sh.
set -uo pipefail
OUT=${OUT:-/tmp/flint-out}
. tools/device_setup.sh
nvidia-smi --query-gpu=name --format=csv,noheader
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -q -m gpu -p no:cacheprovider \
  tests/test_sample_tokens_gpu.py 2>&1 | tee "$OUT/sampler-tests.log" | tail -15
timeout 120 python3 tools/probe_sampler.py --out "$OUT" 2>&1 | tail -18
if [ -z "${SKIP_RUNNER:-}" ]; then
  timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_graph_runner_gpu.py \
    2>&1 | tee "$OUT/runner-tests.log" | tail -6
fi
if [ -n "${BENCH:-}" ]; then
  timeout 240 flint-graph bench --preset full --formats nvfp4 --contexts 1024 --buckets 1 \
    --baseline-steps 1 --json "$OUT/bench.json" 2>&1 | tail -15
fi
