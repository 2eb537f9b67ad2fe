"""CPU checks of the moe_down declarations, argument builder, reference and byte count (no DSL).

The reference is compared with an independent per-row formulation (each row alone, its experts
dequantised with flint_graph/checkpoints/nvfp4.py and summed in ascending id order); the builder's routing
inputs (experts, slot_w) are checked against the picks they encode, and `row_alone` against the
batch it comes from. The GPU tests (test_moe_down_gpu.py) use these same builders.
"""

import pytest
import torch

from flint_graph.checkpoints import nvfp4
from flint_graph.capture.launcher import check_args
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import moe_down as md
from flint_graph.kernels.toolchain.spec import check_spec

REL_TOL = 1e-2  # the per-row formulation rounds like the reference; only fp32 order differs


def _spec(preset: str, b: int, fmt: int, routed: bool):
    for s in md.KERNEL.specs(FlintConfig.preset(preset), (b,)):
        if s["FMT"] == fmt and (s["TOPK"] > 0) == routed:
            return s
    raise AssertionError("no such spec")


def _by_name(spec, args):
    return {a.name: v for a, v in zip(md.KERNEL.args(spec), args)}


def _slow(spec, args):
    """residual_out row by row, from the formula in docs/decode-kernels.md (kernel 8)."""
    t = _by_name(spec, args)
    b = spec["B"]

    def dense(prefix, e=None):
        if spec["FMT"] == 0:
            w = t["down"][e] if e is not None else t["shared_down"]
            return w.float()
        codes, scales, s2 = (t[f"{prefix}_codes"], t[f"{prefix}_scales"], t[f"{prefix}_scale2"])
        if e is not None:
            return nvfp4.dequantize(codes[e], scales[e], s2[e], torch.float32)
        return nvfp4.dequantize(codes, scales, s2[0], torch.float32)

    out = torch.empty_like(t["residual"])
    for r in range(b):
        acc = torch.zeros(spec["H"], dtype=torch.float32)
        if spec["TOPK"]:
            picked = [(int(t["experts"][s]), s) for s in range(md.slots(spec))
                      if t["experts"][s] >= 0 and t["slot_w"][s, r] >= 0]
            for e, s in sorted(picked):
                y = (dense("down", e) @ t["act"][s, r].float()).to(torch.bfloat16)
                acc = acc + t["slot_w"][s, r] * y.float()
        acc = acc + (dense("shared") @ t["act_sh"][r].float()).to(torch.bfloat16).float()
        out[r] = (t["residual"][r].float() + acc.to(torch.bfloat16).float()).to(torch.bfloat16)
    return out


def _rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_specs_cover_both_presets_formats_and_layer_kinds():
    for preset in ("tiny", "full"):
        cfg = FlintConfig.preset(preset)
        specs = md.KERNEL.specs(cfg, (1, 2, 4, 8))
        assert len(specs) == 16  # 4 buckets x 2 formats x (MoE, dense)
        for s in specs:
            check_spec(md.KERNEL, s)  # alignment of every row, extents
            if s["TOPK"]:
                assert (s["E"], s["M"], s["MS"]) == (cfg.n_routed_experts,
                                                     cfg.moe_intermediate_size,
                                                     cfg.n_shared_experts
                                                     * cfg.moe_intermediate_size)
                assert md.slots(s) == min(cfg.n_routed_experts,
                                          s["B"] * cfg.num_experts_per_tok)
            else:
                assert (s["E"], s["M"], s["MS"]) == (0, 0, cfg.intermediate_size)
                assert "act" not in [a.name for a in md.KERNEL.args(s)]
            launch = md.KERNEL.launch(s)
            assert launch.grid == (cfg.hidden_size // md.ROWS, 1, 1)


@pytest.mark.parametrize("fmt", [0, 1])
@pytest.mark.parametrize("routed", [True, False])
@pytest.mark.parametrize("b", [1, 2, 4, 8])
def test_reference_matches_a_per_row_formulation(fmt, routed, b):
    spec = _spec("tiny", b, fmt, routed)
    gen = torch.Generator().manual_seed(10 * b + fmt)
    args = md.make_args(spec, gen=gen, device="cpu")
    check_args("moe_down", md.KERNEL.args(spec), args, device_type="cpu")
    assert args[-1].isnan().all()  # the output is poisoned
    (ref,) = md.KERNEL.reference(spec, *args[:-1])
    slow = _slow(spec, args)
    assert _rel(ref, slow) <= REL_TOL
    tiny = md.make_args(spec, gen=gen, device="cpu", residual_scale=1e-4)  # MoE term dominates
    assert (_by_name(spec, tiny)["residual"] != 0).all()
    (ref,) = md.KERNEL.reference(spec, *tiny[:-1])
    assert _rel(ref, _slow(spec, tiny)) <= REL_TOL


def test_routing_inputs_encode_the_picks_and_padding_rows():
    spec = _spec("tiny", 4, 1, True)
    picks = [[5, 1], [1, 5], [0, 7], []]  # rows 0 and 1 share experts, row 2 disjoint, row 3 pads
    args = md.make_args(spec, gen=torch.Generator().manual_seed(3), device="cpu", picks=picks,
                        pad_rows=(3,))
    t = _by_name(spec, args)
    assert t["experts"].tolist() == [0, 1, 5, 7, -1, -1, -1, -1]
    picked = t["slot_w"] >= 0
    assert picked[:, 3].sum() == 0 and (t["slot_w"][4:] == -1).all()
    assert [sorted(t["experts"][picked[:, r]].tolist()) for r in range(3)] == \
        [[1, 5], [1, 5], [0, 7]]
    assert ((t["slot_w"][picked] >= 0.1) & (t["slot_w"][picked] < 1)).all()
    assert not t["act"][:, 3].isfinite().all() and not t["act_sh"][3].isfinite().all()
    (ref,) = md.KERNEL.reference(spec, *args[:-1])
    assert ref[:3].isfinite().all()  # the padding row's garbage reaches no other row
    assert _rel(ref[:3], _slow(spec, args)[:3]) <= REL_TOL


@pytest.mark.parametrize("routed", [True, False])
def test_row_alone_rebuilds_one_row_of_a_batch(routed):
    spec = _spec("tiny", 8, 0, routed)
    args = md.make_args(spec, gen=torch.Generator().manual_seed(4), device="cpu")
    (ref,) = md.KERNEL.reference(spec, *args[:-1])
    for r in range(8):
        one, alone = md.row_alone(spec, args, r)
        assert one["B"] == 1 and one.kernel == "moe_down"
        check_args("moe_down", md.KERNEL.args(one), alone, device_type="cpu")
        (ref1,) = md.KERNEL.reference(one, *alone[:-1])
        assert _rel(ref1[0], ref[r]) <= REL_TOL
        if routed:
            t1, t = _by_name(one, alone), _by_name(spec, args)
            assert t1["experts"][t1["experts"] >= 0].tolist() == \
                t["experts"][t["slot_w"][:, r] >= 0].tolist()


def test_bytes_moved_counts_picked_experts_once():
    spec = _spec("full", 2, 1, True)  # NVFP4, H 2048, M 512, MS 512
    picks = [[3, 9, 10, 11, 12, 13], [3, 9, 20, 21, 22, 23]]  # 10 distinct experts
    args = md.make_args(spec, gen=torch.Generator().manual_seed(5), device="cpu", picks=picks)
    h, m, s = 2048, 512, md.slots(spec)
    expert = h * (m // 2 + m // 16) + 4
    want = (10 * expert + (h * (m // 2 + m // 16) + 4)  # routed + shared weights
            + 12 * m * 2 + 2 * m * 2  # act where picked, act_sh
            + s * 4 + s * 2 * 4  # experts, slot_w
            + 2 * 2 * h * 2)  # residual in, residual_out
    assert md.bytes_moved(spec, args) == want
    dense = _spec("full", 1, 0, False)
    dargs = md.make_args(dense, gen=torch.Generator().manual_seed(6), device="cpu")
    assert md.bytes_moved(dense, dargs) == 2048 * 10944 * 2 + 10944 * 2 + 2 * 2048 * 2
