"""GPU tests of grouped_w4a16 (kernels/prefill/grouped_w4a16.py), the prefill's W4A16 expert
GEMMs: gate/up with SwiGLU (KIND 0, rows of x gathered through tok) and down (KIND 1), every
tile size NT, routed (E experts), shared (E = 1) and the shared folded in as expert E (SH = 1),
the WS = 1 variant (weights through shared memory) and the BF16 experts (WB = 16), against `_reference` (reference.linear on the exactly dequantised weights);
and of its wgmma form grouped_w4a16_wg (kernels/prefill/grouped_w4a16_wg.py: the same
arguments and reference, NT = 64 and 128, routed only, SUB 0 and 1, which must also agree
bit for bit, and RS = 1 with its input in pair order), with two larger chunks for it.

Cases: chunks of 1, 7, 77 and 1,000 tokens (6 picks each) over few or all experts, one expert
holding half the pairs (many tiles of one expert), both the full and the flint-nano shapes.
Fresh random inputs every case; outputs NaN-poisoned, so a row no tile covers stays NaN and a
covered row left unwritten shows. Tolerance ‖out − ref‖/‖ref‖ ≤ 1e-2 (expected ~2e-3: the
bf16 output rounding; see the module docstring). PDL: behind a slow producer, each input (x or
act, tok, the schedule) replaced by stale but valid values must not change the output.
"""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.prefill import grouped_w4a16 as gw
from flint_graph.kernels.prefill import grouped_w4a16_wg as gwg

pytestmark = pytest.mark.gpu
KERNELS = ("grouped_w4a16", "grouped_w4a16_wg")


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet(kernels=registry((*KERNELS, "slow_producer")))


def _specs(preset, kernel="grouped_w4a16"):
    """The model's specs of `kernel` and its benchmark variants: for grouped_w4a16 the
    weights-through-shared-memory ones (WS = 1), for grouped_w4a16_wg the half-width last
    tiles (SUB = 1) and the other RS."""
    cfg = FlintConfig.preset(preset)
    if kernel == "grouped_w4a16_wg":
        return gwg.KERNEL.specs(cfg, ()) + gwg.bench_specs(cfg)
    return gw.KERNEL.specs(cfg, ()) + [s for s in gw.bench_specs(cfg)
                                       if s.as_dict().get("WS")]


CASES = [(1, 1, False), (7, 3, False), (77, 20, False), (77, 256, True), (1000, 256, False),
         (1000, 8, True)]
LARGE = [(4000, 256, False), (2000, 16, True)]  # many full tiles per expert (the wgmma sizes)


@pytest.mark.parametrize("preset", ["full", "nano"])
@pytest.mark.parametrize("kernel,tokens,experts,skew",
                         [("grouped_w4a16", *c) for c in CASES]
                         + [("grouped_w4a16_wg", *c) for c in CASES + LARGE])
def test_grouped_w4a16_matches_reference(kset, preset, kernel, tokens, experts, skew):
    mod = gwg if kernel == "grouped_w4a16_wg" else gw  # gwg: RS = 1's pair order
    for spec in _specs(preset, kernel):
        gen = torch.Generator(device="cuda").manual_seed(tokens * 31 + experts + spec["NT"])
        args = mod.make_args(spec, gen=gen, tokens=tokens, experts_used=experts, skew=skew)
        out = args[-1]
        (want,) = mod._reference(spec, *[a.clone() for a in args])
        kset.get(kernel, **spec.as_dict()).launch(*args)
        torch.cuda.synchronize()
        what = f"{spec.id} T={tokens} experts={experts} skew={skew}"
        assert not out.isnan().any(), f"{what}: {int(out.isnan().any(1).sum())} rows unwritten"
        rel = ((out.float() - want.float()).norm() / want.float().norm()).item()
        assert rel <= 1e-2, f"{what}: rel err {rel:.2e} > 1e-2"


@pytest.mark.parametrize("preset", ["full", "nano"])
def test_wg_half_width_tiles_change_no_bit(kset, preset):
    """grouped_w4a16_wg SUB = 1 (a tile of at most NT / 2 rows on an NT / 2 wide loop) gives
    the SUB = 0 output bit for bit, at every NT: a column of a wgmma's product depends only on
    its own x row, whatever N is. 4,000 tokens over all experts: ~94 pairs an expert, so at
    NT = 128 some last tiles take the narrow loop and some the full one."""
    specs = _specs(preset, "grouped_w4a16_wg")
    built = {s.id for s in specs}
    for spec in specs:
        twin = gwg.KERNEL.spec(**{**spec.as_dict(), "SUB": 1})
        if spec["SUB"] or twin.id not in built:  # each SUB = 0 spec whose twin is built
            continue
        args = gwg.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(5),
                             tokens=4000, experts_used=256)
        outs = []
        for sub in (0, 1):
            a = [t.clone() for t in args]
            kset.get("grouped_w4a16_wg", **{**spec.as_dict(), "SUB": sub}).launch(*a)
            outs.append(a[-1])
        torch.cuda.synchronize()
        assert not outs[1].isnan().any(), f"{spec.id} SUB=1: rows unwritten"
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), \
            f"{spec.id}: SUB=1 changed bits"


@pytest.mark.parametrize("preset", ["full", "nano"])
def test_wg_w0_changes_no_bit(kset, preset):
    """grouped_w4a16_wg W0 = 1 (each step waits for its own wgmmas) issues the same products in
    the same order as RS = 1 with W0 = 0, so its output is bit for bit the same, at every NT.
    4,000 tokens over all experts: full tiles and the narrow last tiles of SUB = 1."""
    specs = _specs(preset, "grouped_w4a16_wg")
    built = {s.id for s in specs}
    pairs = [(s, gwg.KERNEL.spec(**{**s.as_dict(), "W0": 1})) for s in specs
             if s.as_dict().get("RS", 0) and "W0" not in s.as_dict()]
    pairs = [(s, w0) for s, w0 in pairs if w0.id in built]
    assert pairs, "no RS = 1 spec has a W0 = 1 twin"
    for spec, w0 in pairs:
        args = gwg.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(9),
                             tokens=4000, experts_used=256)
        outs = []
        for s in (spec, w0):
            a = [t.clone() for t in args]
            kset.get("grouped_w4a16_wg", **s.as_dict()).launch(*a)
            outs.append(a[-1])
        torch.cuda.synchronize()
        assert not outs[1].isnan().any(), f"{w0.id}: rows unwritten"
        assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), \
            f"{w0.id}: W0 = 1 changed bits"


@pytest.mark.parametrize("kernel,tokens", [("grouped_w4a16", 50), ("grouped_w4a16_wg", 200)])
def test_unused_tiles_write_nothing(kset, kernel, tokens):
    """A schedule whose tiles cover only some pairs leaves the other rows as they were (the
    model's first spec: grouped_w4a16_wg's is RS = 1, so its module makes the arguments)."""
    spec = _specs("full", kernel)[1 if kernel == "grouped_w4a16" else 0]
    mod = gwg if kernel == "grouped_w4a16_wg" else gw
    args = mod.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(3), tokens=tokens,
                         experts_used=10)
    tiles = args[2]
    tiles[1::2] = torch.tensor([-1, 0, 0, 0], dtype=torch.int32, device="cuda")
    (want,) = mod._reference(spec, *[a.clone() for a in args])
    kset.get(kernel, **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    out = args[-1]
    assert torch.equal(out.isnan(), want.isnan()), "rows of dropped tiles were written"
    keep = ~want.isnan().any(1)
    rel = ((out[keep].float() - want[keep].float()).norm() / want[keep].float().norm()).item()
    assert rel <= 1e-2


def _stale(name, t, tokens):
    """Valid values other than the true ones: every tile unused, tok shifted by one token,
    x/act random."""
    if name == "tiles":
        out = torch.zeros_like(t)
        out[:, 0] = -1
        return out
    if name == "tok":
        return (t + 1) % tokens
    return torch.randn_like(t.float()).to(t.dtype)


@pytest.mark.parametrize("kernel,nt,sh,wb,sub,rs,w0", [("grouped_w4a16", 32, 0, 4, 0, 0, 0),
                                                       ("grouped_w4a16", 16, 1, 4, 0, 0, 0),
                                                       ("grouped_w4a16", 16, 1, 16, 0, 0, 0),
                                                       ("grouped_w4a16_wg", 128, 0, 4, 0, 0, 0),
                                                       ("grouped_w4a16_wg", 128, 0, 4, 1, 0, 0),
                                                       ("grouped_w4a16_wg", 64, 0, 4, 0, 1, 0),
                                                       ("grouped_w4a16_wg", 128, 0, 4, 1, 1, 1)])
@pytest.mark.parametrize("kind", [0, 1])
def test_pdl_inputs_are_read_after_the_wait(kset, kind, kernel, nt, sh, wb, sub, rs, w0):
    spec = [s for s in _specs("full", kernel) if s["KIND"] == kind and s["NT"] == nt
            and s.as_dict().get("SH", 0) == sh and s.as_dict().get("WB", 4) == wb
            and s.as_dict().get("SUB", 0) == sub and s.as_dict().get("RS", 0) == rs
            and s.as_dict().get("W0", 0) == w0 and not s.as_dict().get("WS")][0]
    _check_pdl(kset, kernel, spec, seed=11)


def _check_pdl(kset, kernel, spec, seed):
    """Behind a slow producer, each input replaced by stale but valid values (`_stale`) must
    not change `spec`'s output: every input is read after griddepcontrol.wait."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    mod = gwg if kernel == "grouped_w4a16_wg" else gw
    consumer = kset.get(kernel, **spec.as_dict())
    tokens = 300
    args = mod.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(seed),
                         tokens=tokens, experts_used=64)
    for target, a in enumerate(mod.KERNEL.args(spec)):
        if a.role != "input":
            continue
        stale = _stale(a.name, args[target], tokens)
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1,
                                 stale=stale)
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS,
                                  stale=stale):
            assert torch.equal(got[0].view(torch.int16), want[0].view(torch.int16)), \
                f"{spec.id}: read {a.name} before griddepcontrol.wait"


@pytest.mark.parametrize("preset", ["full", "nano"])
def test_prefetch_changes_no_bit(kset, preset):
    """grouped_w4a16 PF = 2, 4, 8 (L2 prefetches of the weight code lines PF steps ahead) give
    the PF = 0 output bit for bit: a prefetch only moves lines into L2. Every model spec that
    has PF twins (routed and SH, NT in PF_NTS), 300 and 1,000 tokens over all experts."""
    cfg = FlintConfig.preset(preset)
    built = {s.id for s in gw.bench_specs(cfg)}
    model = {s.id for s in gw.KERNEL.specs(cfg, ())}
    checked = 0
    for spec in gw.KERNEL.specs(cfg, ()):
        if spec["NT"] not in gw.PF_NTS or spec.as_dict().get("WB", 4) != 4 or (
                spec["E"] == 1 and not spec.as_dict().get("SH")):
            continue
        spec = gw.KERNEL.spec(**gw.without_pf(spec))  # PF = 0: the model's may name one
        twins = [gw.KERNEL.spec(**spec.as_dict(), PF=pf) for pf in gw.PFS if pf]
        assert all(t.id in built or t.id in model for t in twins) and (
            spec.id in built or spec.id in model)
        for tokens in (300, 1000):
            args = gw.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(tokens),
                                tokens=tokens, experts_used=256)
            outs = []
            for s in (spec, *twins):
                a = [t.clone() for t in args]
                kset.get("grouped_w4a16", **s.as_dict()).launch(*a)
                outs.append(a[-1])
            torch.cuda.synchronize()
            assert not outs[0].isnan().any(), f"{spec.id} T={tokens}: rows unwritten"
            for twin, out in zip(twins, outs[1:]):
                assert torch.equal(outs[0].view(torch.int16), out.view(torch.int16)), \
                    f"{twin.id} T={tokens}: PF changed bits"
            checked += 1
    assert checked == 16  # 8 specs (KIND, NT 16 / 32, routed / SH) × 2 chunk sizes


@pytest.mark.parametrize("kind", [0, 1])
@pytest.mark.parametrize("sh", [0, 1])
def test_prefetch_pdl_inputs_are_read_after_the_wait(kset, kind, sh):
    """PF = 8 behind a slow producer: the prefetched lines are the schedule's expert's, so they
    too follow griddepcontrol.wait; stale inputs must not change the output."""
    cfg = FlintConfig.preset("full")
    spec = gw.KERNEL.spec(KIND=kind, H=cfg.hidden_size, M=cfg.moe_intermediate_size,
                          E=cfg.n_routed_experts, NT=16, D=gw.DEPTH, **({"SH": 1} if sh else {}),
                          PF=8)
    _check_pdl(kset, "grouped_w4a16", spec, seed=13)
