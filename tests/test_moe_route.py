"""CPU checks of moe_route's host side (kernels/prefill/moe_route.py): its pick reference is
`reference.route` on the prefill's three-part logits, in ascending id per token with padding
rows picking nothing; its place reference groups every live pair exactly once, expert by expert,
with the schedule of `grouped_w4a16.tile_schedule`."""

import pytest
import torch

from flint_graph import reference
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import grouped_w4a16
from flint_graph.kernels.prefill import moe_route as mr


def _spec(kind, preset="full", nt=16):
    specs = mr.KERNEL.specs(FlintConfig.preset(preset), ())
    return next(s for s in specs if s["KIND"] == kind and (kind == 0 or s["NT"] == nt))


@pytest.mark.parametrize("tokens,valid", [(1, 1), (77, 77), (77, 40), (16, 0)])
def test_pick_reference_is_reference_route(tokens, valid):
    spec = _spec(0)
    args = mr.make_args(spec, gen=torch.Generator().manual_seed(tokens), tokens=tokens,
                        valid=valid, device="cpu")
    counts, ids, w, rank = mr._reference(spec, *args)
    parts, bias = args[0], args[1]
    p = parts.view(tokens, 3, -1)
    want_ids, want_w = reference.route(None, None, bias, 6, 2.5, True,
                                       logits=(p[:, 2] + p[:, 1]) + p[:, 0])
    for t in range(tokens):
        if t < valid:
            assert ids[t].tolist() == sorted(want_ids[t].tolist())
            assert torch.allclose(w[t].sum(), want_w[t].sum())
        else:
            assert (ids[t] == spec["E"]).all() and (w[t] == 0).all()
    assert int(counts.sum()) == valid * 6
    for ex in range(spec["E"]):
        ranks = sorted(rank[ids == ex].tolist())
        assert ranks == list(range(len(ranks)))


@pytest.mark.parametrize("nt", grouped_w4a16.NTS)
@pytest.mark.parametrize("tokens,valid", [(1, 1), (300, 300), (300, 211)])
def test_place_reference_groups_every_live_pair_once(nt, tokens, valid):
    spec = _spec(1, nt=nt)
    args = mr.make_args(spec, gen=torch.Generator().manual_seed(nt + tokens), tokens=tokens,
                        valid=valid, device="cpu")
    ids, rank, v, counts = args[:4]
    assert counts[-1] == 0  # place's CTA counter
    counts = counts[:-1]
    zero, tiles, offs, tok, pos = mr._reference(spec, *args)
    assert (zero == 0).all()
    assert torch.equal(tiles, grouped_w4a16.tile_schedule(counts, nt, tiles.shape[0]))
    assert torch.equal(offs, counts.cumsum(0).int())
    live = valid * 6
    seen = sorted(pos[:valid].reshape(-1).tolist())
    assert seen == list(range(live)), "every live pair lands on its own row"
    for t in range(valid):
        for r in range(6):
            row = int(pos[t, r])
            assert int(tok[row]) == t
            ex = int(ids[t, r])
            assert int(offs[ex] - counts[ex]) <= row < int(offs[ex])
    assert (tok[live:] == 0).all()


def test_specs_cover_every_preset():
    for preset in ("tiny", "nano", "full"):
        kinds = {s["KIND"] for s in mr.KERNEL.specs(FlintConfig.preset(preset), ())}
        assert kinds == {0, 1}, preset
