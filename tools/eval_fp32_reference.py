#!/usr/bin/env python3
"""`flint-graph eval` with the reference model summing in fp32 instead of fp64 on the CPU: a
second "engine" whose rounding differs from the fp64 reference engine by rare bf16 flips, as a
GPU engine's does, so that `--compare`'s statistics can be tried against rounding and the
planted bugs without a GPU (docs/nano.md, "Top log-probabilities").

    python tools/eval_fp32_reference.py eval --n 10 --contexts 1024 --device cpu \\
        [--plant BUG] [--batch B] --json OUT.json

The arguments are `flint-graph`'s; the reports say engine "reference" like the fp64 runs, so hold
them to an fp64 report with `flint_graph.nano.evals.compare` directly (`--compare` would take
them for the same setup and allow no difference at all).
"""

import sys

import torch

import flint_graph.reference as reference
from flint_graph.cli import main

if __name__ == "__main__":
    reference.acc_dtype = lambda t: torch.float32  # the CUDA choice, here on the CPU
    sys.exit(main(sys.argv[1:]))
