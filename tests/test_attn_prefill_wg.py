"""CPU checks of attn_prefill_wg's declaration (kernels/prefill/attn_prefill_wg.py): the same
specialisations and arguments as attn_prefill where it fits, none where it does not, and a
shared-memory block the wgmma layout needs. The kernel runs in tests/test_attn_prefill_gpu.py
and compiles for both archs in tests/test_kernel_cache.py (the full config's shapes)."""

import pytest

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import attn_prefill as ap
from flint_graph.kernels.prefill import attn_prefill_wg as wg
from flint_graph.kernels.toolchain.spec import check_spec


@pytest.mark.parametrize("preset", ["nano", "full"])
def test_specialisations_mirror_attn_prefill(preset):
    cfg = FlintConfig.preset(preset)
    assert wg.fits(cfg)
    specs = wg._specs(cfg)
    assert [s.values for s in specs] == [s.values for s in ap._specs(cfg)]
    for s in specs:
        args, launch = check_spec(wg.KERNEL, s)
        assert [a.name for a in args] == [a.name for a in ap.KERNEL.args(s)]
        assert launch.block == (256, 1, 1)  # two warpgroups
        # Q and three K/V stages, plus the 1024 bytes the in-kernel alignment may skip
        d = s["D"]
        assert launch.smem == 128 * d * 2 + wg.STAGES * 2 * wg.BN * d * 2 + 1024 <= 227 * 1024
        g = cfg.num_attention_heads // cfg.num_key_value_heads
        assert wg.tokens_per_cta(s) * g == 128


def test_the_tiny_config_keeps_attn_prefill():
    cfg = FlintConfig.preset("tiny")  # head dim 32: wgmma's O tile takes 64 or 128
    assert not wg.fits(cfg) and wg._specs(cfg) == []


def test_unsupported_head_dims_are_refused():
    with pytest.raises(ValueError, match="head dim D = 96"):
        check_spec(wg.KERNEL, wg.KERNEL.spec(HQ=32, HKV=4, D=96, P=64, RING=0, W=0))


def test_the_prefill_knows_both_kernels():
    from flint_graph.capture import prefill

    assert prefill.ATTN_KERNEL in prefill.ATTN_KERNELS
    assert set(prefill.ATTN_KERNELS) == {"attn_prefill", "attn_prefill_wg"}
