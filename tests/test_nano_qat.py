"""QAT of flint-nano (nano/qat.py) on the tiny config: the fake-quantised forward is the
exported NVFP4 checkpoint's forward, and through the training forward (nano/batched.py)
gradients reach every master weight and a few steps on one episode lower its loss."""

from __future__ import annotations

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.make_checkpoint import ensure_tiny_checkpoint
from flint_graph.nano.curriculum import episodes, supervised
from flint_graph.nano import batched
from flint_graph.nano.qat import export, fake_quant, parameters, trainable
from flint_graph.reference import ReferenceModel
from flint_graph.chat.tokenizer import FlintTokenizer
from flint_graph.checkpoints.weights import NVFP4Weight


@pytest.fixture(scope="module")
def setup():
    cfg = FlintConfig.preset("tiny")
    tok = FlintTokenizer.from_dir(ensure_tiny_checkpoint(progress=False))
    ep = episodes(0, 1, "train", recall_pairs=4, recall_questions=1,
                  mix=(("arith", 1),))[0]
    return cfg, tok, supervised(ep, tok)


def test_fake_quant_is_what_export_stores(setup):
    cfg, _, (ids, _) = setup
    w = trainable(cfg, 0)
    fq, ex = fake_quant(w), export(w)
    assert isinstance(ex.layers[2].ffn.gate, NVFP4Weight)
    assert torch.equal(fq.layers[2].ffn.gate.detach(), ex.layers[2].ffn.gate.dequantize(
        torch.float32))
    x = [torch.tensor(ids[:40])]
    m = ReferenceModel(cfg, fq, act_dtype=torch.float32)
    a = m.forward([m.new_sequence()], x)[0]
    m = ReferenceModel(cfg, ex, act_dtype=torch.float32)
    b = m.forward([m.new_sequence()], x)[0]
    # the same weights; only the norms/embedding's bf16 rounding in the export differs
    assert torch.allclose(a.detach(), b, rtol=0.05, atol=0.05)


def test_training_steps_lower_the_loss_and_reach_every_weight(setup):
    cfg, _, (ids, mask) = setup
    torch.manual_seed(0)
    w = trainable(cfg, 0)
    params = parameters(w)
    opt = torch.optim.AdamW(params, lr=3e-3)
    losses = []
    x, target = torch.tensor([ids[:-1]]), torch.tensor(ids[1:])
    keep = torch.tensor(mask[1:])
    for step in range(6):
        fq = fake_quant(w)
        lg = batched.logits(fq, batched.forward(cfg, fq, x)[0])
        loss = torch.nn.functional.cross_entropy(lg[keep], target[keep])
        opt.zero_grad()
        loss.backward()
        if step == 0:
            dead = [i for i, p in enumerate(params) if p.grad is None or not p.grad.any()]
            # the router bias only picks experts (no gradient by design); nothing else is dead
            assert len(dead) <= cfg.num_hidden_layers - cfg.first_k_dense_replace
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
