"""GPU tests of moe_route (kernels/prefill/moe_route.py), the prefill's routing and pair grouping.

pick against `reference.route` on the same three-part logits: ids equal except near ties (the
reference's s + bias of the differing picks within 1e-6 relative), weights rel. ≤ 1e-5, counts
exact, every expert's ranks a permutation of 0 … count − 1 (the atomics' order is free);
padding rows (≥ valid) pick nothing. Logits with exact ties (pairs of experts equal) check
that a tie goes to the lower id (the higher one is picked only together with it). place exact: counts reset to zero, the tile schedule equal to
`grouped_w4a16.tile_schedule`, offs the running counts, and tok/pos equal to the reference's
grouping given the kernel's inputs. Then the two chained on the full config's shapes at 1 to
8,192 tokens. PDL: behind a slow producer, every input replaced by stale (but valid) values
gives the output without PDL. Outputs are poisoned (−7 / NaN) before each launch.
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.prefill import grouped_w4a16
from flint_graph.kernels.prefill import moe_route as mr

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet(kernels=registry(("moe_route", "slow_producer")))


def _specs(preset, kind):
    return [s for s in mr.KERNEL.specs(FlintConfig.preset(preset), ()) if s["KIND"] == kind]


def _check_pick(spec, args, got_ids, got_w, got_counts, got_rank, what):
    parts, bias, valid = args[0], args[1], int(args[2][0])
    want_ids, want_w = mr.pick_reference(spec, parts, bias, args[2], args[-1])
    t, e = parts.shape[0], spec["E"]
    p = parts.view(t, 3, e)
    s = torch.sigmoid((p[:, 2] + p[:, 1]) + p[:, 0]) + bias
    diff = (got_ids != want_ids).any(1)
    for row in diff.nonzero().flatten().tolist():
        assert row < valid, f"{what}: padding row {row} picked something"
        a = set(got_ids[row].tolist()) ^ set(want_ids[row].tolist())
        vals = s[row, sorted(a)]
        assert (vals.max() - vals.min()) <= 1e-6 * vals.abs().max(), \
            f"{what}: row {row} picks {sorted(a)} that are no near-tie ({vals.tolist()})"
    same = ~diff
    rel = ((got_w[same] - want_w[same]).norm() / want_w[same].norm().clamp_min(1e-30)).item()
    assert rel <= 1e-5, f"{what}: weights rel err {rel:.2e}"
    live = got_ids < e
    assert torch.equal(got_counts.long(), torch.bincount(got_ids[live].long(), minlength=e)), \
        f"{what}: counts"
    for ex in got_ids[live].unique().tolist():
        ranks = sorted(got_rank[got_ids == ex].tolist())
        assert ranks == list(range(len(ranks))), f"{what}: expert {ex} ranks {ranks[:8]}…"


@pytest.mark.parametrize("preset", ["tiny", "nano", "full"])
@pytest.mark.parametrize("tokens,valid,ties", [(1, 1, False), (77, 77, False), (77, 40, False),
                                               (16, 0, False), (1000, 999, False),
                                               (300, 300, True)])
def test_pick_matches_reference_route(kset, preset, tokens, valid, ties):
    (spec,) = _specs(preset, 0)
    args = mr.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(tokens + valid),
                        tokens=tokens, valid=valid, ties=ties)
    kset.get("moe_route", **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    what = f"{spec.id} T={tokens} valid={valid} ties={ties}"
    _check_pick(spec, args, args[4], args[5], args[3], args[6], what)
    if ties:  # experts 2m and 2m + 1 tie exactly: 2m + 1 only ever comes with 2m
        for row in args[4][:valid].tolist():
            odd = [ex for ex in row if ex % 2]
            assert all(ex - 1 in row for ex in odd), \
                f"{what}: a tie went to the higher expert id ({row})"


@pytest.mark.parametrize("preset", ["tiny", "nano", "full"])
@pytest.mark.parametrize("tokens,valid", [(1, 1), (300, 300), (300, 211), (2048, 2048)])
def test_place_groups_as_the_reference(kset, preset, tokens, valid):
    for spec in _specs(preset, 1):
        args = mr.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(tokens),
                            tokens=tokens, valid=valid)
        want = mr._reference(spec, *[a.clone() for a in args])
        kset.get("moe_route", **spec.as_dict()).launch(*args)
        torch.cuda.synchronize()
        for name, got, w in zip(("counts", "tiles", "offs", "tok", "pos"),
                                (args[3], *args[4:]), want):
            assert torch.equal(got, w), f"{spec.id} T={tokens} valid={valid}: {name} differs"


@pytest.mark.parametrize("tokens", [1, 25, 256, 257, 512, 8192, 8193])
def test_pick_then_place_on_the_full_config(kset, tokens):
    """The prefill's chain: counts from pick, consumed and zeroed by place; every live pair on
    its own row of its expert's block, each tile inside one expert."""
    (pick,) = _specs("full", 0)
    args = mr.make_args(pick, gen=torch.Generator(device="cuda").manual_seed(tokens),
                        tokens=tokens)
    # pick's counts, then place's CTA counter (zero), as the prefill holds them
    counts = torch.zeros(pick["E"] + 1, dtype=torch.int32, device="cuda")
    args[3] = counts[:pick["E"]]
    kset.get("moe_route", **pick.as_dict()).launch(*args)
    ids, rank = args[4], args[6]
    nt = 16 if tokens <= 512 else 32
    place = next(s for s in _specs("full", 1) if s["NT"] == nt)
    k = pick["K"]
    tiles = torch.full((grouped_w4a16.max_tiles(tokens * k, pick["E"], nt), 4), -7,
                       dtype=torch.int32, device="cuda")
    offs = torch.full((pick["E"],), -7, dtype=torch.int32, device="cuda")
    tok = torch.full((tokens * k,), -7, dtype=torch.int32, device="cuda")
    pos = torch.full((tokens, k), -7, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    want_counts = counts.clone()
    kset.get("moe_route", **place.as_dict()).launch(ids, rank, args[2], counts, tiles, offs, tok,
                                                   pos)
    torch.cuda.synchronize()
    assert (counts == 0).all(), "place left counts behind"
    want_counts = want_counts[:pick["E"]]
    assert torch.equal(tiles, grouped_w4a16.tile_schedule(want_counts, nt, tiles.shape[0]))
    assert sorted(pos.reshape(-1).tolist()) == list(range(tokens * k))
    rows = torch.arange(tokens, device="cuda")[:, None].expand_as(pos)
    assert torch.equal(tok[pos.reshape(-1).long()], rows.reshape(-1).int())
    start = (offs - want_counts)[ids.long()]
    assert ((pos >= start) & (pos < offs[ids.long()])).all(), "a pair outside its expert's rows"


def _stale(name, t):
    """Stale values that keep every index in bounds: zeros for the integer inputs (no live row,
    every pick expert 0 rank 0, no counts), random logits."""
    if t.dtype == torch.int32:
        return torch.zeros_like(t)
    return torch.randn_like(t)


@pytest.mark.parametrize("kind", [0, 1])
def test_pdl_inputs_are_read_after_the_wait(kset, kind):
    """Each input (and place's counts) behind a slow producer: with PDL the result equals the
    run without it, every replay. pick's ranks depend on the atomics' order, so pick is held to
    counts, ids and weights bitwise and its ranks to being a valid numbering."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    spec = _specs("full", kind)[0]
    consumer = kset.get("moe_route", **spec.as_dict())
    decl = mr.KERNEL.args(spec)
    fresh = mr.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(3), tokens=300)
    written = [i for i, a in enumerate(decl) if getattr(a, "role", "") in ("output",
                                                                          "workspace")]
    for target, a in enumerate(decl):
        if getattr(a, "role", "") not in ("input", "workspace"):
            continue
        args = [x.clone() if isinstance(x, torch.Tensor) else x for x in fresh]

        def prepare():  # every replay starts from the fresh state (pick's counts at zero)
            for i in written:
                args[i].copy_(fresh[i])

        run = dict(stale=_stale(a.name, args[target]), prepare=prepare)
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1, **run)
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS,
                                  **run):
            if kind == 0:
                counts, ids, w, rank = got
                assert torch.equal(counts, want[0]) and torch.equal(ids, want[1]) and \
                    torch.equal(w.view(torch.int32), want[2].view(torch.int32)), \
                    f"{spec.id}: read {a.name} before griddepcontrol.wait"
                _check_pick(spec, fresh, ids, w, counts, rank, f"{spec.id} PDL {a.name}")
            else:
                for g, w in zip(got, want):
                    assert torch.equal(g, w), \
                        f"{spec.id}: read {a.name} before griddepcontrol.wait"
