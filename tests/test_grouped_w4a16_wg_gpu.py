"""GPU tests of grouped_w4a16_wg (kernels/prefill/grouped_w4a16_wg.py), the wgmma form of the
prefill's W4A16 expert GEMMs: gate/up with SwiGLU (KIND 0) and down (KIND 1) for NT = 64 and
128, full and flint-nano shapes, against grouped_w4a16's `_reference` (reference.linear on the
exactly dequantised weights), with the cases, NaN poisoning, tolerance (‖out − ref‖/‖ref‖ ≤
1e-2, expected ~2e-3) and slow-producer PDL check of tests/test_grouped_w4a16_gpu.py, plus
chunks large enough for many full tiles per expert (the sizes this kernel is for)."""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.prefill import grouped_w4a16_wg as gwg

from test_grouped_w4a16_gpu import CASES, _stale

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet(kernels=registry(("grouped_w4a16_wg", "slow_producer")))


@pytest.mark.parametrize("preset", ["full", "nano"])
@pytest.mark.parametrize("tokens,experts,skew", CASES + [(4000, 256, False), (2000, 16, True)])
def test_grouped_w4a16_wg_matches_reference(kset, preset, tokens, experts, skew):
    for spec in gwg.KERNEL.specs(FlintConfig.preset(preset), ()):
        gen = torch.Generator(device="cuda").manual_seed(tokens * 31 + experts + spec["NT"])
        args = gwg.make_args(spec, gen=gen, tokens=tokens, experts_used=experts, skew=skew)
        out = args[-1]
        (want,) = gwg._reference(spec, *[a.clone() for a in args])
        kset.get("grouped_w4a16_wg", **spec.as_dict()).launch(*args)
        torch.cuda.synchronize()
        what = f"{spec.id} T={tokens} experts={experts} skew={skew}"
        assert not out.isnan().any(), f"{what}: {int(out.isnan().any(1).sum())} rows unwritten"
        rel = ((out.float() - want.float()).norm() / want.float().norm()).item()
        assert rel <= 1e-2, f"{what}: rel err {rel:.2e} > 1e-2"


def test_unused_tiles_write_nothing(kset):
    """A schedule whose tiles cover only some pairs leaves the other rows as they were."""
    spec = gwg.KERNEL.specs(FlintConfig.preset("full"), ())[0]
    args = gwg.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(3), tokens=200,
                         experts_used=10)
    tiles = args[2]
    tiles[1::2] = torch.tensor([-1, 0, 0, 0], dtype=torch.int32, device="cuda")
    (want,) = gwg._reference(spec, *[a.clone() for a in args])
    kset.get("grouped_w4a16_wg", **spec.as_dict()).launch(*args)
    torch.cuda.synchronize()
    out = args[-1]
    assert torch.equal(out.isnan(), want.isnan()), "rows of dropped tiles were written"
    keep = ~want.isnan().any(1)
    rel = ((out[keep].float() - want[keep].float()).norm() / want[keep].float().norm()).item()
    assert rel <= 1e-2


@pytest.mark.parametrize("kind", [0, 1])
def test_pdl_inputs_are_read_after_the_wait(kset, kind):
    from test_kernels_gpu import REPLAYS, _graph_outputs

    spec = [s for s in gwg.KERNEL.specs(FlintConfig.preset("full"), ())
            if s["KIND"] == kind and s["NT"] == 128][0]
    consumer = kset.get("grouped_w4a16_wg", **spec.as_dict())
    decl = gwg.KERNEL.args(spec)
    tokens = 300
    args = gwg.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(11),
                         tokens=tokens, experts_used=64)
    for target, a in enumerate(decl):
        if a.role != "input":
            continue
        stale = _stale(a.name, args[target], tokens)
        (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1,
                                 stale=stale)
        for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS,
                                  stale=stale):
            assert torch.equal(got[0].view(torch.int16), want[0].view(torch.int16)), \
                f"{spec.id}: read {a.name} before griddepcontrol.wait"
