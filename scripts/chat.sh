#!/usr/bin/env bash
# Set up a virtual environment (CPU PyTorch) if needed, then chat with the embedded default
# checkpoint. Extra arguments go to `flint-graph chat` (e.g. a checkpoint path, --no-think);
# relative paths in them (--tools FILE, a checkpoint, /save FILE) are read from the directory
# you run this from, not the repository's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="$root/.venv"
if [ ! -x "$venv/bin/flint-graph" ]; then
  echo "setting up $venv (first run: one to two minutes) ..." >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # Pinned CPU build first: an unpinned torch would pull a multi-GB CUDA build.
  "$venv/bin/python" -m pip install -q "torch==2.13.0"
  # Quiet setuptools' generic editable-install notice (kernels/ maps to flint_graph.kernels).
  PYTHONWARNINGS=ignore::UserWarning "$venv/bin/python" -m pip install -q -e "$root"
fi
exec "$venv/bin/flint-graph" chat "$@"
