"""GPU tests of nvfp4_unpack (kernels/prefill/nvfp4_unpack.py): every code and scale byte (0x7F, bit 7
and subnormal scales included) and scale2 that is not a power of two decode bitwise as the
reference (fp32 product, one bf16 rounding); the NaN-poisoned output is written wherever an
expert is decoded and left alone where SKIP skips it; behind a slow producer the SKIP variant
reads its counts only after griddepcontrol.wait."""

import pytest
import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import nvfp4_unpack as nu
from flint_graph.kernels import registry

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def kset():
    from flint_graph.capture.launcher import KernelSet

    return KernelSet(kernels=registry(("nvfp4_unpack", "slow_producer", "early_reader")))


@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_unpack_is_bitwise_the_reference(kset, preset):
    for spec in nu.KERNEL.specs(FlintConfig.preset(preset), ()):
        for experts in sorted({1, min(3, spec["E"]), spec["E"]}):
            args = nu.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(experts),
                                experts=experts)
            out = args[-1]
            (want,) = nu._reference(spec, *[a.clone() for a in args])
            kset.get("nvfp4_unpack", **spec.as_dict()).launch(*args)
            torch.cuda.synchronize()
            if spec["SKIP"]:
                e = torch.arange(out.shape[0], device="cuda") // spec["SPE"]
                used = args[3][e] != 0
                assert not out[used].isnan().any(), f"{spec.id}: outputs left unwritten"
                assert out[~used].isnan().all(), f"{spec.id}: a skipped expert was written"
            else:
                assert not out.isnan().any(), f"{spec.id}: outputs left unwritten"
            assert torch.equal(out.view(torch.int16), want.view(torch.int16)), spec.id


def test_pdl_skip_reads_its_counts_after_the_wait(kset):
    """Behind a slow producer with PDL on, counts (the one input) overwritten by the producer
    gives the same output as without PDL."""
    from test_kernels_gpu import REPLAYS, _graph_outputs

    spec = nu.KERNEL.specs(FlintConfig.preset("full"), ())[1]
    consumer = kset.get("nvfp4_unpack", **spec.as_dict())
    target = [a.name for a in nu.KERNEL.args(spec)].index("counts")
    args = nu.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(9))
    (want,) = _graph_outputs(kset, consumer, args, target, pdl=False, replays=1)
    for got in _graph_outputs(kset, consumer, args, target, pdl=True, replays=REPLAYS):
        assert torch.equal(got[0].view(torch.int16), want[0].view(torch.int16)), \
            f"{spec.id}: read counts before griddepcontrol.wait"
