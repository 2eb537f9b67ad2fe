#!/usr/bin/env python3
"""Write a seeded synthetic Flint checkpoint (BF16 safetensors and/or NVFP4 GGUF, with config,
tokenizer and generation_config) — DESIGN §2 "Synthetic checkpoints".

    python tools/make_checkpoint.py --preset tiny --out /tmp/flint-tiny
    python tools/make_checkpoint.py --preset full --format gguf --device cuda --out /data/flint

The same flags as `flint-graph make-checkpoint` (both call flint_graph.checkpoints.make_checkpoint).
"""

import sys
from pathlib import Path

# Runnable from a source checkout without `pip install -e .`: the package sits one level up.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flint_graph.checkpoints.make_checkpoint import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
