"""CPU checks of nvfp4_unpack's declaration and reference (kernels/prefill/nvfp4_unpack.py)."""

import torch

from flint_graph.checkpoints import nvfp4
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import nvfp4_unpack as nu
from flint_graph.kernels.toolchain.spec import check_spec


def test_reference_is_the_formats_dequantisation_rounded_once():
    spec = nu.KERNEL.specs(FlintConfig.preset("tiny"), ())[1]
    args = nu.make_args(spec, gen=torch.Generator().manual_seed(0), device="cpu")
    codes, scales, scale2, counts, out = args
    counts.fill_(1)  # every expert decoded (SKIP's skipping: the next test)
    (got,) = nu._reference(spec, *args)
    e, n, k = spec["E"], FlintConfig.preset("tiny").moe_intermediate_size, \
        FlintConfig.preset("tiny").hidden_size
    want = nvfp4.dequantize(codes.view(e, n, k // 2), scales.view(e, n, k // 16), scale2,
                            torch.float32).to(torch.bfloat16)
    assert torch.equal(got.view(e, n, k), want)


def test_specs_cover_every_expert_shape():
    for preset in ("tiny", "nano", "full"):
        cfg = FlintConfig.preset(preset)
        dense, stack = nu.KERNEL.specs(cfg, ())
        for spec in (dense, stack):
            check_spec(nu.KERNEL, spec)
        assert dense["E"] == 1
        assert stack["SPE"] * 16 == cfg.moe_intermediate_size * cfg.hidden_size


def test_skip_keeps_the_rows_of_experts_without_pairs():
    spec = nu.KERNEL.specs(FlintConfig.preset("tiny"), ())[1]
    assert spec["SKIP"] == 1
    codes, scales, scale2, counts, out = nu.make_args(
        spec, gen=torch.Generator().manual_seed(1), device="cpu")
    counts.copy_(torch.arange(spec["E"]) % 2)  # odd experts decoded
    (got,) = nu._reference(spec, codes, scales, scale2, counts, out)
    e = torch.arange(got.shape[0]) // spec["SPE"]
    assert got[e % 2 == 0].isnan().all() and not got[e % 2 == 1].isnan().any()
