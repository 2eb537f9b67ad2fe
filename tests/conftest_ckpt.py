"""A tiny synthetic checkpoint shared by the API and CLI tests (built once per session, CPU)."""

from __future__ import annotations

from pathlib import Path

import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.make_checkpoint import write_checkpoint


def build_tiny(root: Path) -> Path:
    out = root / "tiny"
    write_checkpoint(FlintConfig.preset("tiny"), out, formats=("bf16", "gguf"), seed=0,
                     device="cpu", progress=False)
    return out


def scripted_sampler(script: list[int]):
    """A stand-in for `sampling.sample` that returns script[position] for each row, so a test
    can drive the whole pipeline (detokenizer → stop → parser) with a chosen output."""

    def sample(logits, temperature, top_k, top_p, seeds, positions):
        return torch.tensor([script[min(p, len(script) - 1)] for p in positions.tolist()])

    return sample
