"""CPU checks of kernels/decode/moe_gate_up.py without the DSL: its declarations, make_args, its
reference against an independent float64 formulation, and bytes_moved (the kernel itself is
tested on the GPU in test_moe_gate_up_gpu.py)."""

import math

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import moe_gate_up as mgu
from flint_graph.kernels.toolchain.spec import BUCKETS, check_spec

TINY = FlintConfig.preset("tiny")


def _spec(b=2, topk=True, fmt=1):
    return next(s for s in mgu.KERNEL.specs(TINY, BUCKETS) if s["B"] == b and s["FMT"] == fmt
                and (s["TOPK"] > 0) == topk)


def test_argument_order_follows_docs_decode_kernels():
    nv = [f"{p}_{w}" for p in ("gate", "up") for w in ("codes", "scales", "scale2")]
    assert [a.name for a in mgu.KERNEL.args(_spec(fmt=1))] == \
        ["h", "experts", *nv, *(f"shared_{n}" for n in nv), "down_codes", "down_scales",
         "act", "act_sh"]
    assert [a.name for a in mgu.KERNEL.args(_spec(topk=False, fmt=0))] == \
        ["h", "shared_gate", "shared_up", "act_sh"]
    assert [a.role for a in mgu.KERNEL.args(_spec(fmt=0))] == \
        ["input", "input"] + ["weight"] * 5 + ["output"] * 2


def _inputs(spec, args):
    return [t for a, t in zip(mgu.KERNEL.args(spec), args) if a.role != "output"]


@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_specs_cover_buckets_formats_and_both_layer_kinds(preset):
    cfg = FlintConfig.preset(preset)
    specs = mgu.KERNEL.specs(cfg, BUCKETS)
    assert len(specs) == len(BUCKETS) * 2 * 2
    for s in specs:
        args, launch = check_spec(mgu.KERNEL, s)  # declarations are valid
        if s["TOPK"]:
            assert (s["E"], s["M"], s["MS"]) == (cfg.n_routed_experts, cfg.moe_intermediate_size,
                                                cfg.n_shared_experts * cfg.moe_intermediate_size)
            assert mgu.slots(s) == min(cfg.n_routed_experts, s["B"] * cfg.num_experts_per_tok)
            assert [a.name for a in args][:2] == ["h", "experts"]
            assert args[-2].name == "act" and args[-2].shape == (mgu.slots(s), s["B"], s["M"])
        else:
            assert (s["E"], s["M"], s["MS"]) == (0, 0, cfg.intermediate_size)
            assert "experts" not in [a.name for a in args] and "act" not in [a.name for a in args]
        per = 3 if s["FMT"] == 1 else 1  # tensors per weight matrix
        down = 2 if s["FMT"] == 1 else 1  # moe_down's routed weights, for PD's prefetch
        assert len(args) == 2 + 2 * per + (s["TOPK"] > 0) * (2 + 2 * per + down)
        assert launch.grid[0] == s["MS"] // 16 + mgu.slots(s) * s["M"] // 16


@pytest.mark.parametrize("fmt", [0, 1])
@pytest.mark.parametrize("topk", [True, False])
def test_make_args_matches_declarations_and_poisons_outputs(fmt, topk):
    spec = _spec(b=4, topk=topk, fmt=fmt)
    args = mgu.make_args(spec, gen=torch.Generator().manual_seed(0), device="cpu")
    for a, t in zip(mgu.KERNEL.args(spec), args, strict=True):
        assert tuple(t.shape) == a.shape and t.is_contiguous(), a.name
        if a.role == "output":
            assert t.isnan().all(), a.name
        elif t.is_floating_point():
            assert t.isfinite().all() and (t.numel() == 1 or t.float().std() > 0), a.name
    if topk:
        ids = args[1].tolist()
        assert ids == sorted(set(ids)) and len(ids) == mgu.slots(spec)  # every slot used
    if fmt == 1:
        for t in [t for a, t in zip(mgu.KERNEL.args(spec), args) if a.name.endswith("scale2")]:
            assert (t > 0).all() and (t.log2() != t.log2().round()).all()  # not powers of 2
        if topk:
            assert not torch.equal(args[4], args[7])  # gate and up scale2 differ per expert


def test_make_args_tail_slots_and_poisoned_unpicked_experts():
    spec = _spec(b=2, fmt=0)
    args = mgu.make_args(spec, gen=torch.Generator().manual_seed(1), device="cpu",
                         experts=[5], poison_unpicked=True)
    assert args[1].tolist() == [5] + [-1] * (mgu.slots(spec) - 1)
    for w in args[2:4]:
        assert w[5].isfinite().all() and w[torch.arange(8) != 5].isnan().all()
    act, act_sh = mgu.KERNEL.reference(spec, *_inputs(spec, args))
    assert act[0].isfinite().all() and act[1:].isnan().all() and act_sh.isfinite().all()
    with pytest.raises(ValueError):
        mgu.make_args(spec, gen=torch.Generator(), device="cpu", experts=[1, 2, 3, 4, 5])


def _ue4m3(b: int) -> float:
    e, m = (b >> 3) & 0xF, b & 7
    if b == 0x7F:  # 0xFF is 480: bit 7 is ignored only after this test (nvfp4.py)
        return 0.0
    return m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)


def _slow_dense(codes, scales, scale2):
    """Independent NVFP4 decode in float64 (bit 7 of a scale byte ignored)."""
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    n, half = codes.shape
    w = torch.zeros(n, 2 * half, dtype=torch.float64)
    for i in range(n):
        for j in range(2 * half):
            c = (int(codes[i, j // 2]) >> (4 * (j % 2))) & 0xF
            v = grid[c & 7] * (-1 if c & 8 else 1)
            w[i, j] = v * _ue4m3(int(scales[i, j // 16])) * float(scale2)
    return w


def _slow_act(x, wg, wu):
    g = (x.double() @ wg.T).to(torch.bfloat16).double()
    u = (x.double() @ wu.T).to(torch.bfloat16).double()
    return (g / (1 + torch.exp(-g)) * u).to(torch.bfloat16)


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("fmt", [0, 1])
def test_reference_matches_a_slow_float64_formulation(fmt):
    spec = _spec(b=2, fmt=fmt)
    args = mgu.make_args(spec, gen=torch.Generator().manual_seed(2), device="cpu",
                         experts=[3, 6])
    act, act_sh = mgu.KERNEL.reference(spec, *_inputs(spec, args))
    x = args[0]
    if fmt == 0:
        gate, up, sh_gate, sh_up = (t.double() for t in args[2:6])
        want = [_slow_act(x, gate[e], up[e]) for e in (3, 6)]
        want_sh = _slow_act(x, sh_gate, sh_up)
    else:
        gc, gs, g2, uc, us, u2, sgc, sgs, sg2, suc, sus, su2 = args[2:14]
        want = [_slow_act(x, _slow_dense(gc[e], gs[e], g2[e]), _slow_dense(uc[e], us[e], u2[e]))
                for e in (3, 6)]
        want_sh = _slow_act(x, _slow_dense(sgc, sgs, sg2[0]), _slow_dense(suc, sus, su2[0]))
    # fp32 vs float64 sums may flip a bf16 rounding of g or u: not bit-equal, ≤ 2^-8 apart
    for s in range(2):
        assert _rel(act[s], want[s]) < 4e-3
    assert act[2:].isnan().all()
    assert _rel(act_sh, want_sh) < 4e-3


def test_bytes_moved_counts_picked_experts_once():
    spec = _spec(b=1, fmt=1)  # tiny: H 64, M = MS = 64, S = 2
    args = mgu.make_args(spec, gen=torch.Generator().manual_seed(3), device="cpu", experts=[4])
    per_matrix = 64 * (32 + 4) + 4  # codes + scale bytes + scale2
    want = 2 * 64 + 4 * 2 + 2 * per_matrix * 2 + 64 * 2 + 64 * 2  # h, ids, e + sh, act, act_sh
    assert mgu.bytes_moved(spec, args) == want
    bf = _spec(b=2, topk=False, fmt=0)  # dense: MS 192
    args = mgu.make_args(bf, gen=torch.Generator().manual_seed(3), device="cpu")
    assert mgu.bytes_moved(bf, args) == 2 * 2 * 64 + 2 * 192 * 64 * 2 + 2 * 2 * 192
    assert math.isclose(mgu.SMEM, 8 * 32 * mgu.WARPS * 4)


@pytest.mark.parametrize("preset", ["tiny", "nano", "full"])
def test_pd_is_on_at_small_buckets_and_every_other_pd_is_a_bench_spec(preset):
    """PD_MODEL's PD (prefetch moe_down's weights) at its buckets in the model specs, 0 at the
    others; bench_specs holds each MoE spec with the other PD values, all with moe_down's down
    declarations."""
    from flint_graph.kernels.decode import moe_down

    cfg = FlintConfig.preset(preset)
    model = [s for s in mgu.KERNEL.specs(cfg, BUCKETS) if s["TOPK"]]
    assert [s["PD"] for s in model] == [mgu.PD_MODEL.get(s["B"], 0) for s in model]
    assert {s["B"]: s["PD"] for s in model} == {1: 2, 2: 2, 4: 0, 8: 0}
    bench = mgu.bench_specs(cfg, BUCKETS)
    assert sorted(s.id for s in bench) == sorted(
        mgu.KERNEL.spec(**{**s.as_dict(), "PD": pd}).id for s in model
        for pd in mgu.PD_VALUES if pd != s["PD"])
    for s in model + bench:
        check_spec(mgu.KERNEL, s)
        down = {a.name: a for a in moe_down.KERNEL.args(
            next(d for d in moe_down.KERNEL.specs(cfg, (s["B"],))
                 if d["FMT"] == s["FMT"] and d["TOPK"]))}
        for a in mgu.KERNEL.args(s):
            if a.name.startswith("down"):
                assert (a.dtype, a.shape, a.align) == (down[a.name].dtype, down[a.name].shape,
                                                        down[a.name].align), a.name
