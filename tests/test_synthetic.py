"""flint_graph/checkpoints/synthetic.py: seeded determinism, shapes and dtypes, NVFP4-friendly values, O(1)
activations through every layer and router spread, on the tiny preset (CPU); the full 40B
config is built and run once on the GPU (marked `gpu`).
"""

import dataclasses

import pytest
import torch

import flint_graph.reference as R
from flint_graph.checkpoints import nvfp4
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.synthetic import make_layer_weights, make_weights
from flint_graph.checkpoints.weights import MLPWeights, MoEWeights, NVFP4Weight

SEED = 7
# Residual-stream RMS after every residual add. Embeddings start at RMS 1 and each of the 2L
# branches adds variance <= 1/L (synthetic.py docstring), so the stream must stay in
# [1, sqrt(3)]; the band leaves room for sampling noise on both sides.
RESIDUAL_RMS_BAND = (0.7, 2.5)
# Every residual branch must contribute visibly (else layers are dead) but stay below the stream.
BRANCH_RMS_BAND = (0.02, 1.0)
# Share of all top-k picks one expert may take: uniform is 1/E; 2.5x leaves room for sampling
# noise at ~40 expected picks per expert while catching a router that collapses onto a few.
MAX_SHARE_OVER_UNIFORM = 2.5


def _leaves(obj, prefix=""):
    """(name, tensor) for every tensor in a weights dataclass tree."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, list):
        for i, x in enumerate(obj):
            yield from _leaves(x, f"{prefix}.{i}")
    elif dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            yield from _leaves(getattr(obj, f.name), f"{prefix}.{f.name}")


def test_same_seed_bit_identical_other_seed_differs():
    cfg = FlintConfig.preset("tiny")
    a, b, c = (dict(_leaves(make_weights(cfg, s))) for s in (SEED, SEED, SEED + 1))
    assert a.keys() == b.keys() == c.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
        assert not torch.equal(a[name], c[name]), name


def test_one_layer_alone_equals_that_layer_of_the_model():
    cfg = FlintConfig.preset("tiny")
    full = make_weights(cfg, SEED)
    for i in (0, cfg.num_hidden_layers - 1):
        alone = dict(_leaves(make_layer_weights(cfg, SEED, i)))
        for name, t in _leaves(full.layers[i]):
            assert torch.equal(alone[name], t), (i, name)


def test_shapes_and_dtypes():
    cfg = FlintConfig.preset("tiny")
    w = make_weights(cfg, SEED)
    h, v, e, m = cfg.hidden_size, cfg.vocab_size, cfg.n_routed_experts, cfg.moe_intermediate_size
    bf, f32 = torch.bfloat16, torch.float32
    assert (w.embed.shape, w.lm_head.shape, w.final_norm.shape) == ((v, h), (v, h), (h,))
    assert {w.embed.dtype, w.lm_head.dtype, w.final_norm.dtype} == {bf}
    for i, lw in enumerate(w.layers):
        assert lw.q_proj.shape == (cfg.q_dim, h) and lw.o_proj.shape == (h, cfg.q_dim)
        assert lw.k_proj.shape == lw.v_proj.shape == (cfg.kv_dim, h)
        assert lw.q_norm.shape == lw.k_norm.shape == (cfg.head_dim,)
        assert lw.sinks.shape == (cfg.num_attention_heads,) and lw.sinks.dtype == f32
        assert isinstance(lw.ffn, MoEWeights if cfg.is_moe(i) else MLPWeights)
        if cfg.is_moe(i):
            f = lw.ffn
            assert f.router.shape == (e, h) and f.router.dtype == f32
            assert f.router_bias.shape == (e,) and f.router_bias.dtype == f32
            assert f.gate.shape == f.up.shape == (e, m, h) and f.down.shape == (e, h, m)
            assert f.shared.gate.shape == (cfg.n_shared_experts * m, h)
            assert {f.gate.dtype, f.down.dtype, f.shared.down.dtype} == {bf}
        else:
            assert lw.ffn.gate.shape == (cfg.intermediate_size, h)
            assert lw.ffn.down.shape == (h, cfg.intermediate_size)
    norms = torch.cat([w.final_norm.float()] + [lw.attn_norm.float() for lw in w.layers])
    assert 0.8 < norms.min() and norms.max() < 1.2 and norms.std() > 0.01  # near 1, jittered


def test_every_nvfp4_block_scale_is_normal_e4m3():
    """No outliers: with the power-of-two scale2 the quantiser picks, every 16-value block's
    E4M3 scale is a normal number (exponent field >= 1), so blocks keep full resolution."""
    cfg = FlintConfig.preset("tiny")
    w = make_weights(cfg, SEED)
    for name, t in _leaves(w):
        if t.dtype != torch.bfloat16 or t.dim() < 2:
            continue
        s2 = nvfp4.choose_scale2(t, per_expert=t.dim() == 3)
        _, scales = nvfp4.quantize(t, s2)
        assert int(((scales >> 3) & 0xF).min()) >= 1, name


def _run_recording(cfg, weights, tokens, monkeypatch):
    """Forward `tokens`; return residual RMS after every add, each branch's RMS, and the
    router picks of every MoE layer."""
    stream, branch, picks = [], [], []
    add, route = R.residual_add, R.route

    def rec_add(x, y, **kwargs):
        out = add(x, y, **kwargs)
        stream.append(out.float().pow(2).mean().sqrt().item())
        branch.append(y.float().pow(2).mean().sqrt().item())
        return out

    def rec_route(*args):
        ids, wts = route(*args)
        picks.append(ids.cpu())
        return ids, wts

    monkeypatch.setattr(R, "residual_add", rec_add)
    monkeypatch.setattr(R, "route", rec_route)
    model = R.ReferenceModel(cfg, weights)
    logits = model.prefill(model.new_sequence(), tokens, chunk_tokens=len(tokens))
    return stream, branch, picks, logits


def _check_activations_and_routing(cfg, stream, branch, picks, logits):
    assert len(stream) == 2 * cfg.num_hidden_layers
    lo, hi = RESIDUAL_RMS_BAND
    assert all(lo <= r <= hi for r in stream), stream
    lo, hi = BRANCH_RMS_BAND
    assert all(lo <= r <= hi for r in branch), branch
    assert torch.isfinite(logits).all() and 0.5 < logits.std() < 5  # LOGIT_STD = 2
    assert len(picks) == cfg.num_hidden_layers - cfg.first_k_dense_replace
    for layer, ids in enumerate(picks):
        counts = torch.bincount(ids.flatten(), minlength=cfg.n_routed_experts)
        assert (counts > 0).all(), (layer, counts)
        share = counts.max().item() / counts.sum().item()
        assert share <= MAX_SHARE_OVER_UNIFORM / cfg.n_routed_experts, (layer, counts)


def test_activations_stay_order_one_and_routing_spreads(monkeypatch):
    cfg = FlintConfig.preset("tiny")
    # 320 tokens x top-2 over 8 experts: ~80 picks per expert expected
    tokens = torch.randint(0, cfg.vocab_size, (320,), generator=torch.Generator().manual_seed(1))
    out = _run_recording(cfg, make_weights(cfg, SEED), tokens, monkeypatch)
    _check_activations_and_routing(cfg, *out)


@pytest.mark.gpu
def test_full_config_builds_and_runs_on_gpu(monkeypatch):
    cfg = FlintConfig.preset("full")
    w = make_weights(cfg, SEED, device="cuda", progress=True)
    fp32_params = cfg.num_hidden_layers * cfg.num_attention_heads + cfg.param_counts()["router"]
    assert w.nbytes() == 2 * cfg.total_params + 2 * fp32_params  # BF16 but sinks and router
    assert not isinstance(w.layers[-1].ffn.gate, NVFP4Weight)
    # 1536 tokens x top-6 over 256 experts: 36 picks per expert expected
    tokens = torch.randint(0, cfg.vocab_size, (1536,), generator=torch.Generator().manual_seed(2))
    out = _run_recording(cfg, w, tokens, monkeypatch)
    _check_activations_and_routing(cfg, *out)
