"""The training forward (nano/batched.py) computes the reference model's function: on a padded
batch, with a short sliding window so the window and the sinks both matter, its logits equal
`ReferenceModel(act_dtype=float32)`'s for every row, and the sinks get gradients."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.nano import batched
from flint_graph.reference import ReferenceModel
from flint_graph.checkpoints.synthetic import make_weights
from flint_graph.checkpoints.weights import _map


@pytest.fixture(scope="module")
def model():
    # window 8 < the rows' lengths, so sliding layers drop keys the full layers still see
    cfg = dataclasses.replace(FlintConfig.preset("nano"), sliding_window=8)
    return cfg, _map(make_weights(cfg, 3, "cpu"), lambda t: t.float())


def test_batched_forward_equals_the_reference(model):
    cfg, w = model
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 24))
    lg = batched.logits(w, batched.forward(cfg, w, ids))
    ref = ReferenceModel(cfg, w, "cpu", act_dtype=torch.float32)
    for row, n in ((0, 24), (1, 17)):  # row 1: the last 7 positions are padding to it
        want = ref.forward([ref.new_sequence()], [ids[row, :n]])[0]
        # fp32 both ways; only summation order differs (observed ~6e-7 of max |logit|)
        assert (lg[row, :n] - want).abs().max() <= 1e-5 * want.abs().max()


@pytest.mark.parametrize("bug", ["no-sink", "window"])
def test_sinks_and_window_change_the_function(model, bug):
    cfg, w = model
    ids = torch.randint(0, cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1))
    base = batched.logits(w, batched.forward(cfg, w, ids))
    if bug == "window":
        cfg = dataclasses.replace(cfg, sliding_window=cfg.sliding_window - 1)
    else:
        w = dataclasses.replace(w, layers=[dataclasses.replace(lw, sinks=lw.sinks - 1e4)
                                           for lw in w.layers])
    other = batched.logits(w, batched.forward(cfg, w, ids))
    assert (other - base).abs().max() > 1e-3 * base.abs().max()


def test_gradients_reach_the_sinks_and_the_router(model):
    cfg, w = model
    w = _map(w, lambda t: t.detach().clone().requires_grad_(True))
    ids = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    batched.logits(w, batched.forward(cfg, w, ids)).logsumexp(-1).sum().backward()
    for i, lw in enumerate(w.layers):
        assert lw.sinks.grad is not None and lw.sinks.grad.abs().sum() > 0, i
        if cfg.is_moe(i):
            assert lw.ffn.router.grad.abs().sum() > 0, i
            assert lw.ffn.router_bias.grad is None  # it only picks experts
