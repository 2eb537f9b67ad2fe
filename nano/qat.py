"""Quantisation-aware training of flint-nano (issue 11): the training forward (nano/batched.py,
the reference model's function) runs on weights whose every NVFP4 linear is fake-quantised:
snapped to its NVFP4 value in the forward pass, with the gradient passed straight through to
the float32 master weight (the straight-through estimator).

Because the fake-quantised value is exactly what `snap_to_nvfp4` exports, the exported NVFP4
checkpoint computes what was trained, and its BF16 twin is the exact dequantisation of it
(choose_scale2 keeps every NVFP4 value representable in BF16).
"""

from __future__ import annotations

import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.make_checkpoint import linear_slots, snap_to_nvfp4
from flint_graph.checkpoints.synthetic import make_weights
from flint_graph.checkpoints.weights import FlintWeights, _walk


def trainable(cfg: FlintConfig, seed: int, device="cpu") -> FlintWeights:
    """Seeded initial weights as float32 leaves that require grad (the master weights)."""
    w = make_weights(cfg, seed, device).to(device)
    return _as_leaves(w)


def _as_leaves(w: FlintWeights) -> FlintWeights:
    from flint_graph.checkpoints.weights import _map

    return _map(w, lambda t: t.detach().float().requires_grad_(True))


def parameters(w: FlintWeights) -> list[torch.Tensor]:
    """Every tensor of `w` (the optimiser's parameter list)."""
    return [t for t in _walk(w) if isinstance(t, torch.Tensor)]


def fake_quant(w: FlintWeights) -> FlintWeights:
    """A view of `w` whose linears are their NVFP4 values in the forward pass and pass the
    gradient straight through (float32). The other tensors are shared with `w`."""
    out = w.to(w.final_norm.device)  # a new structure over the same tensors
    for owner, name, per_expert in linear_slots(out):
        t = getattr(owner, name)
        q = snap_to_nvfp4(t.detach().bfloat16(), per_expert).dequantize(torch.float32)
        setattr(owner, name, t + (q - t).detach())
    return out


def export(w: FlintWeights) -> FlintWeights:
    """The checkpoint weights: NVFP4 linears (what `fake_quant` trained), everything else in
    its stored dtype (BF16; the router and its bias float32, sinks float32)."""
    from flint_graph.checkpoints.weights import _map

    out = _map(w, lambda t: t.detach().bfloat16())
    for lw, src in zip(out.layers, w.layers):
        lw.sinks = src.sinks.detach().float()
        if hasattr(lw.ffn, "router"):
            lw.ffn.router = src.ffn.router.detach().float()
            lw.ffn.router_bias = src.ffn.router_bias.detach().float()
    for owner, name, per_expert in linear_slots(out):
        setattr(owner, name, snap_to_nvfp4(getattr(owner, name), per_expert))
    return out
