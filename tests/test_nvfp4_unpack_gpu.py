"""GPU test of nvfp4_unpack (kernels/prefill/nvfp4_unpack.py): every code and scale byte (0x7F, bit 7
and subnormal scales included) and scale2 that is not a power of two decode bitwise as the
reference (fp32 product, one bf16 rounding); the NaN-poisoned output is written everywhere."""

import pytest
import torch

from flint_graph.config import FlintConfig
from flint_graph.kernels.prefill import nvfp4_unpack as nu
from flint_graph.kernels import registry

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_unpack_is_bitwise_the_reference(preset):
    from flint_graph.capture.launcher import KernelSet

    kset = KernelSet(kernels=registry(("nvfp4_unpack",)))
    for spec in nu.KERNEL.specs(FlintConfig.preset(preset), ()):
        for experts in sorted({1, min(3, spec["E"]), spec["E"]}):
            args = nu.make_args(spec, gen=torch.Generator(device="cuda").manual_seed(experts),
                                experts=experts)
            kset.get("nvfp4_unpack", **spec.as_dict()).launch(*args)
            torch.cuda.synchronize()
            (want,) = nu._reference(spec, *args)
            assert not args[3].isnan().any(), f"{spec.id}: outputs left unwritten"
            assert torch.equal(args[3].view(torch.int16), want.view(torch.int16)), spec.id
