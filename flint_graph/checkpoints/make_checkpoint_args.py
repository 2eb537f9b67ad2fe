"""The `make-checkpoint` flags and their defaults, kept apart from `make_checkpoint` (which
imports torch) so that `flint-graph --help` and `make-checkpoint --help` answer at once."""

from __future__ import annotations

import argparse

from flint_graph.checkpoints.config import PRESETS

FORMATS = ("bf16", "gguf")
DEFAULT_FORMATS = FORMATS
DEFAULT_SEED = 0
DEFAULT_PRESET = "tiny"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the make-checkpoint flags (shared by tools/make_checkpoint.py and the CLI)."""
    # here: cli_args imports this module at its top
    from flint_graph.cli_args import _nonempty_path, seed_int

    src = parser.add_mutually_exclusive_group()
    src.add_argument("--preset", choices=PRESETS, default=None,
                     help=f"packaged config: tiny (seconds on a CPU), nano (flint-nano's shapes, "
                          f"random weights) or full (the 40B shapes; needs a GPU) (default: "
                          f"{DEFAULT_PRESET})")
    src.add_argument("--config", dest="config_path", type=_nonempty_path, metavar="CONFIG.json",
                     help="an HF-style config.json to use instead of a preset")
    parser.add_argument("--out", dest="out_dir", type=_nonempty_path, required=True, metavar="DIR",
                        help="output directory (must not exist or be empty, unless --overwrite)")
    parser.add_argument("--format", dest="formats", default=",".join(DEFAULT_FORMATS),
                        help="comma-separated formats to write: bf16 (sharded safetensors), "
                             "gguf (one NVFP4 GGUF) (default: %(default)s)")
    parser.add_argument("--seed", type=seed_int, default=DEFAULT_SEED,
                        help="seed of the synthetic weights and tokenizer (default: %(default)s)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="where weights are generated and quantised (default: cuda when "
                             "available, else cpu)")
    parser.add_argument("--quantize-embeddings", action="store_true",
                        help="store the embedding and LM head as NVFP4 too (default: BF16)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace DIR if it already holds files")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="hide the progress bars")
