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
    specs = {(s["KIND"], s["NT"]): s for s in gw.KERNEL.specs(cfg, ()) if s["E"] > 1}
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
    assert len(specs) == 4 * len(gw.NTS)  # routed and shared (E = 1), gate/up and down
    assert {s["E"] for s in specs} == {1, 256} and {s["D"] for s in specs} == {gw.DEPTH}
