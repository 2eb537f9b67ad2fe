"""CPU checks of grouped_w4a16's host side (kernels/prefill/grouped_w4a16.py): the tile schedule
covers every sorted pair exactly once within the `max_tiles` bound, and the reference computes
what `reference.moe`'s expert half computes for those pairs."""

import pytest
import torch

from flint_graph import reference
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.checkpoints.weights import NVFP4Weight
from flint_graph.kernels.prefill import grouped_w4a16 as gw


@pytest.mark.parametrize("nt", gw.NTS)
@pytest.mark.parametrize("counts", [[0, 0, 5], [1] * 256, [64, 0, 65, 1, 0, 127], [0] * 7 + [3],
                                    [600] + [0] * 255, [0, 0, 0]])
def test_schedule_covers_every_pair_once(nt, counts):
    c = torch.tensor(counts, dtype=torch.int32)
    pairs = int(c.sum())
    ntiles = gw.max_tiles(max(pairs, 1), c.numel(), nt)
    tiles = gw.tile_schedule(c, nt, ntiles)
    assert tiles.shape == (ntiles, 4) and tiles.dtype == torch.int32
    owner = torch.full((pairs,), -1)
    first = torch.cumsum(c, 0) - c
    for ex, p0, rows, _ in tiles.tolist():
        if ex < 0:
            assert rows == 0
            continue
        assert 1 <= rows <= nt
        assert first[ex] <= p0 and p0 + rows <= first[ex] + c[ex], "a tile crosses experts"
        assert (owner[p0:p0 + rows] == -1).all(), "a pair in two tiles"
        owner[p0:p0 + rows] = ex
    assert (owner >= 0).all(), "a pair in no tile"
    used = [row for row in tiles.tolist() if row[0] >= 0]
    assert tiles.tolist()[:len(used)] == used, "unused tiles must form the tail"


def test_bound_holds_for_the_worst_spread():
    """Every expert holding one pair more than a multiple of NT is the worst case."""
    for nt in gw.NTS:
        c = torch.full((256,), nt + 1, dtype=torch.int32)
        need = int(((c + nt - 1) // nt).sum())
        assert gw.max_tiles(int(c.sum()), 256, nt) >= need


def test_reference_is_the_expert_half_of_reference_moe():
    """KIND 0 then KIND 1 on one expert's rows give reference.swiglu's expert output."""
    cfg = FlintConfig.preset("nano")
    specs = {(s["KIND"], s["NT"]): s for s in gw.KERNEL.specs(cfg, ())
             if s["E"] > 1 and not s.as_dict().get("SH")}
    gen = torch.Generator().manual_seed(0)
    args0 = gw.make_args(specs[0, 16], gen=gen, tokens=9, experts_used=3, device="cpu")
    x, tok, tiles, gc, gs, g2, uc, us, u2, act = args0
    (act,) = gw._reference(specs[0, 16], *args0)
    dc = torch.randint(0, 256, (cfg.n_routed_experts, cfg.hidden_size,
                                cfg.moe_intermediate_size // 2), generator=gen).to(torch.uint8)
    ds = torch.full((cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size // 16),
                    0x38, dtype=torch.uint8)
    d2 = torch.rand(cfg.n_routed_experts, generator=gen)
    out = torch.full((act.shape[0], cfg.hidden_size), float("nan"), dtype=torch.bfloat16)
    (y,) = gw._reference(specs[1, 16], act, tiles, dc, ds, d2, out)
    ex, p0, rows, _ = tiles.tolist()[0]
    w = {name: NVFP4Weight(c[ex], s[ex], two[ex]) for name, c, s, two in
         (("gate", gc, gs, g2), ("up", uc, us, u2), ("down", dc, ds, d2))}
    want = reference.swiglu(x[tok[p0:p0 + rows].long()], w["gate"], w["up"], w["down"])
    assert torch.equal(y[p0:p0 + rows], want)


def test_specs_skip_configs_the_kernel_does_not_fit():
    assert gw.KERNEL.specs(FlintConfig.preset("tiny"), ()) == []
    specs = gw.KERNEL.specs(FlintConfig.preset("full"), ())
    # routed, shared (E = 1) and routed with the shared folded in (SH), gate/up and down; and
    # the BF16 experts (WB = 16, folded only)
    assert len(specs) == 6 * len(gw.NTS) + 2 * len(gw.WB_NT)
    assert {s.as_dict().get("WB", 4) for s in specs} == {4, 16}
    assert {s["E"] for s in specs} == {1, 256} and {s["D"] for s in specs} == {gw.DEPTH}


@pytest.mark.parametrize("tokens,nt", [(1, 16), (16, 16), (25, 16), (77, 32), (512, 16),
                                       (130, 64)])
def test_shared_tiles_hold_every_token_once(tokens, nt):
    """SH: the shared expert's tiles (expert E) cover the pairs P … P + T − 1 once, NT at most
    per tile, so with tok's tail 0 … T − 1 every token passes through it once."""
    pairs, e = tokens * 6, 256
    tiles = gw.shared_tiles(tokens, pairs, e, nt)
    assert tiles.dtype == torch.int32 and tiles.shape == (-(-tokens // nt), 4)
    covered = []
    for ex, p0, rows, _ in tiles.tolist():
        assert ex == e and 1 <= rows <= nt
        covered += range(p0, p0 + rows)
    assert covered == list(range(pairs, pairs + tokens))


@pytest.mark.parametrize("kind", [0, 1])
def test_folded_reference_is_the_shared_expert_on_its_rows(kind):
    """The SH reference runs routed tiles through their experts and the shared expert's tiles
    (expert E, the pairs after the routed ones) through the shared weights: each part equals
    the unfolded reference of that part (the routed spec on the routed tiles, the E = 1 spec
    on the shared rows)."""
    cfg = FlintConfig.preset("nano")
    (spec,) = [s for s in gw.KERNEL.specs(cfg, ()) if s.as_dict().get("SH")
               and s["KIND"] == kind and s["NT"] == 16 and "WB" not in s.as_dict()]
    tokens = 21
    args = gw.make_args(spec, gen=torch.Generator().manual_seed(5), tokens=tokens,
                        experts_used=9, device="cpu")
    (got,) = gw._reference(spec, *[a.clone() for a in args])
    pairs = tokens * 6
    n_sh = 6 if kind == 0 else 3
    routed = {**spec.as_dict()}
    del routed["SH"]
    tiles_at = 2 if kind == 0 else 1
    tiles = args[tiles_at]
    mine = tiles[:, 0] == spec["E"]
    plain = list(args)
    del plain[-1 - n_sh:-1]  # the shared weights
    plain[tiles_at] = tiles[~mine]
    (want_routed,) = gw._reference(gw.KERNEL.spec(**routed), *[a.clone() for a in plain])
    assert torch.equal(got[:pairs], want_routed[:pairs])
    shared_spec = gw.KERNEL.spec(**{**routed, "E": 1})
    one = [w[None] if w.dim() > 1 else w for w in args[-1 - n_sh:-1]]
    t_sh = tiles[mine].clone()
    t_sh[:, 0] = 0
    if kind == 0:
        x, tok = args[0], args[1]
        sh_args = [x, tok, t_sh, *one, args[-1]]
    else:
        sh_args = [args[0], t_sh, *one, args[-1]]
    (want_shared,) = gw._reference(shared_spec, *[a.clone() for a in sh_args])
    assert torch.equal(got[pairs:], want_shared[pairs:])
    assert not got.isnan().any()


def test_bf16_reference_is_reference_swiglu_with_the_shared_expert_folded_in():
    """WB = 16: KIND 0 then KIND 1 give reference.swiglu on the BF16 experts, and the pairs
    after the routed ones (expert E) the shared expert's output."""
    cfg = FlintConfig.preset("nano")
    specs = {s["KIND"]: s for s in gw.KERNEL.specs(cfg, ()) if s.as_dict().get("WB") == 16}
    tokens, gen = 11, torch.Generator().manual_seed(4)
    args0 = gw.make_args(specs[0], gen=gen, tokens=tokens, experts_used=5, device="cpu")
    x, tok, tiles, g, u, sg, su, _ = args0
    (act,) = gw._reference(specs[0], *args0)
    d = (torch.randn(cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size,
                     generator=gen) / 16).bfloat16()
    sd = (torch.randn(cfg.hidden_size, cfg.moe_intermediate_size, generator=gen) / 16).bfloat16()
    out = torch.full((act.shape[0], cfg.hidden_size), float("nan"), dtype=torch.bfloat16)
    (y,) = gw._reference(specs[1], act, tiles, d, sd, out)
    assert not y.isnan().any()
    for ex, p0, rows, _ in tiles.tolist():
        if ex < 0:
            continue
        gate, up, down = (g[ex], u[ex], d[ex]) if ex < cfg.n_routed_experts else (sg, su, sd)
        want = reference.swiglu(x[tok[p0:p0 + rows].long()], gate, up, down)
        assert torch.equal(y[p0:p0 + rows], want), ex


@pytest.mark.parametrize("values,message", [
    (dict(SH=0), "WB = 16 .*expected 4, or 16 with SH = 1"),
    (dict(NT=32), "WB = 16 .*NT in"),
    (dict(D=3), "WB = 16 .*D = 2"),
    (dict(WB=8), "WB = 8"),
])
def test_bf16_specs_the_kernel_cannot_take_are_refused(values, message):
    base = dict(KIND=0, H=256, M=128, E=16, NT=16, D=gw.DEPTH, SH=1, WB=16)
    with pytest.raises(ValueError, match=message):
        gw.KERNEL.args(gw.KERNEL.spec(**{**base, **values}))


@pytest.mark.parametrize("values,message", [
    (dict(PF=3), "PF = 3"),
    (dict(PF=4, WS=1), "PF = 4 .*WS = 0"),
    (dict(PF=4, SH=1, WB=16), "PF = 4 .*WB = 4"),
])
def test_prefetch_specs_the_kernel_cannot_take_are_refused(values, message):
    base = dict(KIND=0, H=256, M=128, E=16, NT=16, D=gw.DEPTH)
    with pytest.raises(ValueError, match=message):
        gw.KERNEL.args(gw.KERNEL.spec(**{**base, **values}))


def test_prefetch_variants_cover_what_the_prefill_can_swap_in():
    """Each PF has a twin of every NVFP4 routed and SH spec at PF_NTS, so
    Prefill.set_w4a16_variant(PF=…) keeps the shared expert folded in."""
    from flint_graph.checkpoints.config import FlintConfig

    cfg = FlintConfig.preset("full")
    built = {s.id for s in gw.bench_specs(cfg)}
    model = [s for s in gw.KERNEL.specs(cfg, ()) if s["NT"] in gw.PF_NTS
             and s.as_dict().get("WB", 4) == 4 and (s["E"] > 1 or s.as_dict().get("SH"))]
    assert len(model) == 8
    for spec in model:
        assert spec.as_dict().get("PF", 0) == gw.PF_MODEL.get((spec["KIND"], spec["NT"]), 0)
        for pf in gw.PFS:
            twin = gw.KERNEL.spec(**gw.without_pf(spec), **({"PF": pf} if pf else {}))
            assert twin.id in built or twin.id == spec.id


def test_variants_of_other_forms_name_no_prefetch():
    """D and WS variants are built from the model's specs without PF (PF with WS is refused),
    and the shared expert's own one-expert launches never take PF_MODEL."""
    from flint_graph.checkpoints.config import FlintConfig

    cfg = FlintConfig.preset("full")
    for spec in gw.bench_specs(cfg):
        d = spec.as_dict()
        if d.get("WS") or d["D"] != gw.DEPTH:
            assert "PF" not in d, spec.id
    assert all("PF" not in s.as_dict() for s in gw.KERNEL.specs(cfg, ()) if s["E"] == 1)
