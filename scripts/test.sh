#!/usr/bin/env bash
# Set up a virtual environment from nothing (CPU PyTorch) and run the CPU test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -x .venv/bin/python ]; then
  echo "checking the packages in .venv ..." >&2
else
  echo "setting up .venv (one to two minutes on a fresh machine) ..." >&2
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# Pinned CPU build first: an unpinned torch would pull a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
# Quiet setuptools' generic editable-install notice (kernels/ maps to flint_graph.kernels).
PYTHONWARNINGS=ignore::UserWarning python -m pip install -q -e ".[test,kernels]"
# Two workers, one test file each at a time (a file's session fixtures, such as the kernel
# compile of tests/test_kernel_cache.py, are built once); the slowest tests are listed: CI must
# stay well under 30 min. `-n 0` after other arguments runs in this one process.
echo "running the CPU tests: one worker compiles every kernel once (~6 min on 2 idle cores, more" \
  "on a busy machine), so the progress dots slow down for a while; ~10 min in all on idle" \
  "cores, several times that when other work shares them" >&2
python -m pytest -q -n 2 --dist loadfile --durations=15 "$@"
