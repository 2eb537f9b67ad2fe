"""Planted bugs for `flint-graph eval --plant` (issue 11): each builds one deliberate bug into a
loaded checkpoint, in its config or its weights, so it reaches every engine that reads them. The
accuracy suite (nano/evals.py) must fail on each one.

- window-1: the sliding window is one token short.
- no-sink: every sink logit is −10⁴, so its exp vanishes, as if the sink were dropped.
- rope-on-nope: the first full-attention layer rotates its q/k too.
- router-bias-bf16: the correction bias is rounded to BF16; it must stay FP32.
"""

from __future__ import annotations

import dataclasses

from flint_graph.errors import InvalidRequestError

PLANTS = ("window-1", "no-sink", "rope-on-nope", "router-bias-bf16")


def planted_config(cfg, bug: str):
    """`cfg` (a FlintConfig) with `bug`'s config change built in (window-1, rope-on-nope), or
    `cfg` itself for the plants that change weights. tools/build_gpu_cache.py compiles the
    graph engine's kernels for these configs too."""
    from flint_graph.checkpoints.config import FlintConfig

    if bug == "window-1":
        return dataclasses.replace(cfg, sliding_window=cfg.sliding_window - 1)
    if bug == "rope-on-nope":
        first_full = next(i for i in range(cfg.num_hidden_layers) if not cfg.uses_rope(i))

        class _RopeEverywhere(FlintConfig):
            def uses_rope(self, layer: int) -> bool:
                return layer == first_full or super().uses_rope(layer)

        return _RopeEverywhere(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)})
    return cfg


def plant(checkpoint, bug: str):
    """A copy of a LoadedCheckpoint with `bug` (one of PLANTS, module docstring) built in;
    raises InvalidRequestError naming --plant for an unknown name."""
    import torch

    from flint_graph.checkpoints.weights import MoEWeights

    if bug not in PLANTS:
        raise InvalidRequestError(f"--plant {bug!r}: expected one of {', '.join(PLANTS)}")
    cfg, w = planted_config(checkpoint.cfg, bug), checkpoint.weights
    if bug in ("no-sink", "router-bias-bf16"):
        w = dataclasses.replace(w, layers=[dataclasses.replace(lw) for lw in w.layers])
        for lw in w.layers:
            if bug == "no-sink":
                lw.sinks = torch.full_like(lw.sinks, -1e4)
            elif isinstance(lw.ffn, MoEWeights):
                lw.ffn = dataclasses.replace(
                    lw.ffn, router_bias=lw.ffn.router_bias.bfloat16().to(lw.ffn.router_bias.dtype))
    return dataclasses.replace(checkpoint, cfg=cfg, weights=w)
