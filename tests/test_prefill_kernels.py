"""CPU checks of the prefill's elementwise kernels' declarations and references (moe_combine,
qk_norm_rope in kernels/prefill/) and of the prefill steps that feed them (capture/prefill.py):
the MoE with the kernel's combine and the three-part bf16 router equals `reference.moe` plus
the residual add; the split router sums back to the fp32 router. (The kernels themselves run
in tests/test_prefill_kernels_gpu.py on the H200.)

Tolerances: moe_grouped with the combine's reference is held to `reference.moe` within 1e-2
(‖Δ‖/‖ref‖, as tests/test_prefill.py: the same bf16 roundings, fp32 summation order apart)
with every routing pick the same; the split router's logits to the fp32 product within 1e-6
relative (each part product is exact; only the fp32 summation order differs).
"""

import pytest
import torch

from flint_graph import reference
from flint_graph.capture.kv_cache import KVCache
from flint_graph.capture.prefill import Prefill, moe_grouped, split_router
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import moe_combine as mc
from flint_graph.kernels.prefill import qk_norm_rope as qr
from flint_graph.kernels.prefill import rmsnorm_rows as nr
from flint_graph.kernels.prefill import swiglu as sw
from flint_graph.kernels.toolchain.spec import check_spec
from flint_graph.checkpoints.synthetic import make_weights

CFG = FlintConfig.preset("tiny")


@pytest.mark.parametrize("preset", ["tiny", "nano", "full"])
def test_specs_declare_every_kind_the_model_needs(preset):
    cfg = FlintConfig.preset(preset)
    combines = mc.KERNEL.specs(cfg, ())
    for combine in combines:
        check_spec(mc.KERNEL, combine)
        assert (combine["H"], combine["K"], combine["SHARED"]) == (
            cfg.hidden_size, cfg.num_experts_per_tok, 1)
    # NORM = 1 where H is whole warps of 8 columns (nano, full), never alone
    norms = [mc.norm_of(c) for c in combines]
    assert norms == ([0, 1] if cfg.hidden_size % mc.NORM_ALIGN == 0 else [0])
    ropes = {s["ROPE"] for s in qr.KERNEL.specs(cfg, ())}
    assert ropes == {int(cfg.uses_rope(i)) for i in range(cfg.num_hidden_layers)}
    for spec in qr.KERNEL.specs(cfg, ()):
        check_spec(qr.KERNEL, spec)
        assert len(qr.make_args(spec, gen=torch.Generator().manual_seed(0), device="cpu")) \
            == len(qr.KERNEL.args(spec))


@pytest.mark.parametrize("preset", ["tiny", "nano", "full"])
def test_rmsnorm_rows_declares_both_norms_of_a_layer(preset):
    cfg = FlintConfig.preset(preset)
    specs = nr.KERNEL.specs(cfg, ())
    assert sorted((s["H"], s["RES"]) for s in specs) == [(cfg.hidden_size, 0),
                                                         (cfg.hidden_size, 1)]
    for spec in specs:
        check_spec(nr.KERNEL, spec)
        args = nr.make_args(spec, gen=torch.Generator().manual_seed(0), rows=5, device="cpu")
        assert len(args) == len(nr.KERNEL.args(spec))
        assert all(a.isnan().all() for a, d in zip(args, nr.KERNEL.args(spec))
                   if getattr(d, "role", "") == "output"), "outputs must start poisoned"


def test_rmsnorm_rows_reference_and_the_prefills_torch_path_are_the_reference_ops():
    """RES 1 is `reference.residual_add` then `reference.rms_norm`, RES 0 the norm alone; the
    prefill's own fallback off the kernel path (`Prefill._add_norm`, `_norm`) gives the same
    bits, so the kernel path and the torch path are held to one definition."""
    cfg = FlintConfig.preset("tiny")
    gen = torch.Generator().manual_seed(3)
    one, res = sorted(nr.KERNEL.specs(cfg, ()), key=lambda s: s["RES"])
    x, residual, w, _, _, eps = nr.make_args(res, gen=gen, rows=9, eps=cfg.rms_norm_eps,
                                            device="cpu")
    r, y = nr._reference(res, x, residual, w, eps)
    assert torch.equal(r, reference.residual_add(residual, x))
    assert torch.equal(y, reference.rms_norm(r, w, eps))
    (y0,) = nr._reference(one, x, w, eps)
    assert torch.equal(y0, reference.rms_norm(x, w, eps))
    pre = Prefill(cfg, make_weights(cfg, 0, "cpu"), KVCache(cfg, 1, 16, device="cpu"),
                  attention="reference")
    assert pre.norm_rows == {}
    got_r, got_y = pre._add_norm(residual, x, w)
    assert torch.equal(got_r, r) and torch.equal(got_y, y)
    assert torch.equal(pre._norm(x, w), y0)


def test_swiglu_reference_is_the_reference_activation():
    (spec,) = sw.KERNEL.specs(CFG, ())
    g, u, a = sw.make_args(spec, gen=torch.Generator().manual_seed(6), device="cpu")
    x = torch.randn(4, CFG.hidden_size, generator=torch.Generator().manual_seed(7)).bfloat16()
    gate = torch.randn(8, CFG.hidden_size).bfloat16()
    up = torch.randn(8, CFG.hidden_size).bfloat16()
    down = torch.eye(8, dtype=torch.bfloat16)
    want = reference.swiglu(x, gate, up, down)
    (got,) = sw._reference(spec, reference.linear(x, gate), reference.linear(x, up))
    assert torch.equal(reference.linear(got, down), want)
    assert sw._reference(spec, g, u)[0].shape == g.shape


def test_combine_reference_adds_in_order_and_keeps_padding_rows():
    (spec,) = mc.KERNEL.specs(CFG, ())
    args = mc.make_args(spec, gen=torch.Generator().manual_seed(1), tokens=9, valid=6,
                        device="cpu")
    y, pos, w, shared, x, valid, out = args
    (got,) = mc._reference(spec, *args)
    assert torch.equal(got[6:], x[6:]), "padding rows must be x unchanged"
    assert not got[:6].isnan().any(), "a padding pair's NaN row reached a real row"
    acc = torch.zeros(6, spec["H"])
    for j in range(spec["K"]):  # one term at a time, as reference.moe adds experts
        acc = acc + y[pos[:6, j].long()].float() * w[:6, j, None]
    want = reference.residual_add(x[:6], (acc + shared[:6].float()).bfloat16())
    assert torch.equal(got[:6], want)


def test_combine_norm_reference_is_the_combine_then_the_layer_norm():
    """NORM = 1 gives the plain combine's out and `reference.rms_norm` of it (padding rows
    too: the next layer normed them before)."""
    cfg = FlintConfig.preset("nano")
    plain, norm = mc.KERNEL.specs(cfg, ())
    args = mc.make_args(norm, gen=torch.Generator().manual_seed(3), tokens=9, valid=6,
                        eps=cfg.rms_norm_eps, device="cpu")
    assert len(args) == len(mc.KERNEL.args(norm))
    *inputs, norm_w, out, h_out, eps = args
    assert out.isnan().all() and h_out.isnan().all() and out is not h_out
    got_out, got_h = mc._reference(norm, *args)
    (want,) = mc._reference(plain, *inputs, out)
    assert torch.equal(got_out, want)
    assert torch.equal(got_h, reference.rms_norm(want, norm_w, cfg.rms_norm_eps))


@pytest.mark.parametrize("bad, match", [(dict(NORM=2), "NORM = 2"),
                                        (dict(H=64, NORM=1), "multiple of 256")])
def test_combine_norm_is_refused_where_it_cannot_run(bad, match):
    with pytest.raises(ValueError, match=match):
        check_spec(mc.KERNEL, mc.KERNEL.spec(**{**dict(H=2048, K=6, SHARED=1), **bad}))


def test_qk_norm_rope_reference_is_the_decode_kernels():
    spec = qr.KERNEL.specs(CFG, ())[-1]
    args = qr.make_args(spec, gen=torch.Generator().manual_seed(2), tokens=5, start=600,
                        theta=CFG.rope_theta, device="cpu")
    q, k, v = qr._reference(spec, *args)
    hq, hkv, d = spec["HQ"], spec["HKV"], spec["D"]
    qkv = args[0].view(5, hq + 2 * hkv, d)
    want = reference.rms_norm(qkv[:, :hq], args[2], 1e-5)
    if spec["ROPE"]:
        want = reference.apply_rope(want, torch.arange(600, 605), CFG.rope_theta)
    assert torch.equal(q, want)
    assert torch.equal(v, qkv[:, hq + hkv:])


def test_split_router_sums_back_to_the_fp32_router():
    r = torch.randn(64, 96, generator=torch.Generator().manual_seed(3)) * 0.02
    parts = split_router(r).float().view(3, 64, 96)
    assert ((parts.sum(0) - r).abs() <= r.abs() * 2.0 ** -23).all()
    x = torch.randn(17, 96, generator=torch.Generator().manual_seed(4)).bfloat16()
    p = (x.float() @ split_router(r).float().t()).view(17, 3, 64)
    got = (p[:, 2] + p[:, 1]) + p[:, 0]
    want = x.float() @ r.t()
    assert ((got - want).norm() / want.norm()).item() <= 1e-6


def test_moe_with_the_combine_and_split_router_is_the_reference_moe_plus_residual():
    w = make_weights(CFG, 4, "cpu")
    lw = w.layers[CFG.first_k_dense_replace]
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(33, CFG.hidden_size, generator=gen).bfloat16()
    h = reference.rms_norm(x, lw.ffn_norm, CFG.rms_norm_eps)
    valid = torch.arange(33) < 30  # three padding rows
    (spec,) = mc.KERNEL.specs(CFG, ())
    nvalid = torch.tensor([30], dtype=torch.int32)

    def combine(y_sorted, pos, weights, shared):
        assert pos.dtype == torch.int32 and weights.dtype == torch.float32
        return mc._reference(spec, y_sorted, pos, weights, shared, x, nvalid, None)[0]

    pre = Prefill(CFG, w, KVCache(CFG, 1, 64, device="cpu"), attention="reference")
    got = moe_grouped(h, lw.ffn, CFG, lambda c: pre._experts(lw.ffn, c), pre._shared(lw.ffn),
                      valid, router_split=split_router(lw.ffn.router), combine=combine)
    want = reference.residual_add(x[:30], reference.moe(
        h[:30], lw.ffn, CFG.num_experts_per_tok, CFG.routed_scaling_factor, CFG.norm_topk_prob))
    rel = ((got[:30].float() - want.float()).norm() / want.float().norm()).item()
    assert rel <= 1e-2
    assert torch.equal(got[30:], x[30:])


def test_the_combines_norm_is_refused_off_the_kernel_path():
    """`set_combine_norm(True)` needs the NORM = 1 kernel (the kernel path, H a multiple of
    256); off it the norm stays its own step, and turning it off is always allowed."""
    w = make_weights(CFG, 4, "cpu")
    pre = Prefill(CFG, w, KVCache(CFG, 1, 64, device="cpu"), attention="reference")
    assert pre.combine_norm is None
    pre.set_combine_norm(False)
    with pytest.raises(ValueError, match="moe_combine NORM = 1"):
        pre.set_combine_norm(True)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("layer,same,used", [(3, True, True), (4, True, False),
                                             (3, False, False)])
def test_a_layer_takes_the_norm_its_predecessor_left_only_for_itself(layer, same, used):
    """moe_combine NORM = 1 leaves (layer i + 1, its output, that output normed) for the next
    layer; `_layer_body` uses it only when it is that layer and gets that very tensor (a
    caller feeding layers its own inputs, or out of order, gets its own norm)."""
    w = make_weights(CFG, 4, "cpu")
    pre = Prefill(CFG, w, KVCache(CFG, 1, 64, device="cpu"), attention="reference")
    x = torch.randn(5, CFG.hidden_size, generator=torch.Generator().manual_seed(9)).bfloat16()
    stashed = torch.full_like(x, 7.0)
    pre._h_ahead = (3, x if same else x.clone(), stashed)
    seen = []

    def qkv(i, h):
        seen.append(h)
        raise _Stop

    pre._qkv = qkv
    with pytest.raises(_Stop):
        pre._layer_body(layer, w.layers[layer], x, torch.arange(5))
    assert (seen[0] is stashed) == used
    if not used:
        assert torch.equal(seen[0], pre._norm(x, w.layers[layer].attn_norm))
    assert pre._h_ahead is None  # taken once, whatever it was
