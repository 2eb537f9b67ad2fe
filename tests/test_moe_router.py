"""CPU tests of the moe_router declarations (kernels/decode/moe_router.py): specialisations, make_args,
the reference against an independent slow formulation, bytes_moved, and a dry run of the GPU
test's input builders and checks with reference outputs in place of the kernel's. No DSL, no GPU.
"""

import dataclasses
import math

import pytest
import torch

import test_moe_router_gpu as g
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode.moe_router import KERNEL, bytes_moved, make_args
from flint_graph.kernels.toolchain.spec import BUCKETS, TensorArg, check_spec

PRESETS = ("tiny", "full")
DTYPE = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32}


@pytest.mark.parametrize("preset", PRESETS)
def test_specs_cover_every_bucket(preset):
    cfg = FlintConfig.preset(preset)
    specs = KERNEL.specs(cfg, BUCKETS)
    assert [s["B"] for s in specs] == list(BUCKETS)
    for s in specs:
        assert (s["H"], s["E"], s["TOPK"], s["NORM"]) == (
            cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok,
            int(cfg.norm_topk_prob))
        args, launch = check_spec(KERNEL, s)  # alignment of every static row stride
        assert [a.name for a in args] == [
            "x", "residual", "row_mask", "norm_w", "router", "bias", "residual_out", "h", "ids",
            "weights", "experts", "slot_w", "scores", "counter", "eps", "scaling"]
        assert launch.grid[0] * (2 if s["B"] <= 2 else 4) == s["E"]


def test_grouped_routing_is_refused():
    cfg = dataclasses.replace(FlintConfig.preset("tiny"), n_group=2)
    with pytest.raises(ValueError, match="n_group"):
        KERNEL.specs(cfg, BUCKETS)


def test_no_moe_layers_no_specs():
    cfg = FlintConfig.preset("tiny")
    cfg = dataclasses.replace(cfg, first_k_dense_replace=cfg.num_hidden_layers)
    assert KERNEL.specs(cfg, BUCKETS) == []


@pytest.mark.parametrize("preset", PRESETS)
def test_make_args_follow_the_declaration(preset):
    for spec in KERNEL.specs(FlintConfig.preset(preset), BUCKETS):
        args = make_args(spec, gen=torch.Generator().manual_seed(0), device="cpu",
                         row_mask=[1] * spec["B"])
        decls = KERNEL.args(spec)
        assert len(args) == len(decls)
        for a, v in zip(decls, args):
            if not isinstance(a, TensorArg):
                assert isinstance(v, float)
                continue
            assert tuple(v.shape) == a.shape, a.name
            assert v.dtype == DTYPE[a.dtype], a.name
            if a.role == "output" or a.name == "scores":
                assert (v.isnan() if v.is_floating_point() else v == -1).all(), a.name
            elif a.name == "counter":
                assert v.tolist() == [0]
            elif a.name != "row_mask":
                assert (v != 0).all() and v.isfinite().all(), a.name


def _slow_route(spec, x, residual, row_mask, norm_w, router, bias, eps, scaling):
    """Row by row in float64 except the bf16 rounding points; top-k by sorting (−key, id)."""
    b_rows, h = x.shape
    topk, norm = spec["TOPK"], spec["NORM"]
    ids = torch.full((b_rows, topk), -1, dtype=torch.int32)
    wts = torch.zeros(b_rows, topk)
    slots: dict[int, dict[int, float]] = {}
    for b in range(b_rows):
        r = (residual[b].double() + x[b].double()).bfloat16()
        rf = r.double()
        hb = (rf / math.sqrt((rf * rf).sum().item() / h + eps) * norm_w.double()).bfloat16()
        s = [1 / (1 + math.exp(-(hb.double() @ router[e].double()).item()))
             for e in range(router.shape[0])]
        if not row_mask[b]:
            continue
        order = sorted(range(len(s)), key=lambda e: (-(s[e] + bias[e].item()), e))[:topk]
        tot = sum(s[e] for e in order) if norm else 1.0
        for k, e in enumerate(order):
            ids[b, k] = e
            wts[b, k] = s[e] / tot * scaling
            slots.setdefault(e, {})[b] = wts[b, k].item()
    n_slots = min(router.shape[0], b_rows * topk)
    experts = torch.full((n_slots,), -1, dtype=torch.int32)
    slot_w = torch.full((n_slots, b_rows), -1.0)
    for i, e in enumerate(sorted(slots)):
        experts[i] = e
        for b, w in slots[e].items():
            slot_w[i, b] = w
    return ids, wts, experts, slot_w


def test_reference_matches_a_slow_formulation():
    (spec,) = KERNEL.specs(FlintConfig.preset("tiny"), (4,))
    args = make_args(spec, gen=torch.Generator().manual_seed(3), device="cpu",
                     row_mask=[1, 0, 1, 1])
    args[0][1] = float("nan")  # a padding row's garbage
    x, res, mask, nw, router, bias = args[:6]
    ref = KERNEL.reference(spec, x, res, mask, nw, router, bias, args[12], args[13], *args[14:])
    r, h, ids, wts, experts, slot_w = ref
    live = mask != 0
    assert torch.equal(r[live], (res.float() + x.float()).bfloat16()[live])
    s_ids, s_wts, s_exp, s_slot = _slow_route(spec, x, res, mask, nw, router, bias, *args[14:])
    assert torch.equal(ids, s_ids)
    assert torch.allclose(wts, s_wts, rtol=1e-5, atol=0)
    assert torch.equal(experts, s_exp)
    assert torch.allclose(slot_w, s_slot, rtol=1e-5, atol=0)
    assert (ids[1] == -1).all() and (wts[1] == 0).all() and (slot_w[:, 1] == -1).all()


def test_bytes_moved_full_b1():
    (spec,) = KERNEL.specs(FlintConfig.preset("full"), (1,))
    h, e, k = 2048, 256, 6
    # reads x, residual, row_mask, norm_w, router, bias; writes residual_out, h, ids, weights,
    # experts [S = 6], slot_w [6, 1]
    want = (4 * h + 4 + 2 * h + 4 * e * h + 4 * e) + (4 * h + 8 * k + 4 * k + 4 * k)
    assert bytes_moved(spec, None) == want
    assert bytes_moved(spec, None) > 4 * e * h  # the fp32 router dominates


# -- the GPU test's builders and checks, dry-run with reference outputs ------------------------


def _fake_kernel(spec, args):
    """What a correct kernel leaves: reference outputs, the sigmoid scores, counter 0."""
    ins = [a for i, a in enumerate(args) if i not in range(g.R_OUT, g.SCORES)]
    for i, out in zip(range(g.R_OUT, g.SCORES), KERNEL.reference(spec, *ins)):
        args[i].copy_(out)
    s = torch.sigmoid(args[g.H_OUT].float() @ args[g.ROUTER].T)
    args[g.SCORES].copy_(s)
    args[g.COUNTER].zero_()


@pytest.mark.parametrize("preset", PRESETS)
def test_gpu_checks_pass_on_reference_outputs(preset):
    for b in BUCKETS:
        spec = g._spec(preset, b)
        cases = [g._args(spec, 1, "cpu"), g.padding_args(spec, 2, "cpu"),
                 g.biased_args(spec, 3, "cpu")[0]]
        if b == 8:
            cases.append(g.overlap_args(spec, 4, "cpu"))
        if b == 1:
            args, pair = g.bf16_bias_args(spec, 5, "cpu")
            _fake_kernel(spec, args)
            assert args[g.IDS][0, :2].tolist() == pair
            cases.append(args)
        for args in cases:
            _fake_kernel(spec, args)
            g.check_outputs(spec, args)


def test_padding_builder_puts_junk_in_padding_rows():
    spec = g._spec("full", 8)
    args = g.padding_args(spec, 2, "cpu")
    assert args[g.MASK].tolist() == [1, 0, 1, 0, 1, 0, 1, 0]
    assert args[g.X][1, 0].item() > 1e29 and args[g.X][3].isnan().all()
    assert args[g.X][5, 0].item() == float("inf") and args[g.RES][7, 0].item() == -float("inf")
    assert args[g.X][::2].isfinite().all()


def test_gpu_checks_catch_wrong_outputs():
    spec = g._spec("full", 4)
    for corrupt in ("swap", "slot", "counter", "padding"):
        args = g.padding_args(spec, 6, "cpu")
        _fake_kernel(spec, args)
        if corrupt == "swap":
            args[g.IDS][0, :2] = args[g.IDS][0, [1, 0]].clone()
        elif corrupt == "slot":
            args[g.SLOT_W][0, 0] += 1e-3
        elif corrupt == "counter":
            args[g.COUNTER][0] = 1
        else:
            args[g.IDS][1, 0] = 0
        with pytest.raises(AssertionError):
            g.check_outputs(spec, args)
