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
    base = [{**s.as_dict(), "ST": wg.STAGES, "FC": 1} for s in ap._specs(cfg)]
    full = [b for b in base if not b["RING"]]
    assert base + [{**b, "SPLITS": n} for b in full for n in wg.SPLIT_CHOICES] == \
        [s.as_dict() for s in specs]
    plain = [s for s in wg.bench_specs(cfg) if s["ST"] != wg.STAGES]
    assert {s["ST"] for s in plain} == set(wg.STAGE_CHOICES) - {wg.STAGES}
    assert all(wg._fc(s) for s in plain)
    for s in specs + plain:
        args, launch = check_spec(wg.KERNEL, s)
        n = s.as_dict().get("SPLITS", 1)
        names = [a.name for a in ap.KERNEL.args(s)]
        assert [a.name for a in args] == names + (["o_part", "lse_part", "counters"] if n > 1
                                                  else [])
        assert launch.block == (256, 1, 1)  # two warpgroups
        assert launch.grid[2] == n
        # Q and the K/V stages (and the combine's 16-byte flag), plus the 1024 bytes the
        # in-kernel alignment may skip
        d = s["D"]
        flag = 16 if n > 1 else 0
        want = 128 * d * 2 + s["ST"] * 2 * wg.BN * d * 2 + flag + 1024
        assert launch.smem == want <= 227 * 1024
        g = cfg.num_attention_heads // cfg.num_key_value_heads
        assert wg.tokens_per_cta(s) * g == 128


@pytest.mark.parametrize("preset", ["nano", "full"])
def test_the_warp_specialized_form_per_layer_kind(preset):
    """WS = 1 (bench variant): one spec per layer kind, the same arguments, 12 warps (two
    consumer warpgroups, one producer), Q and two stages each of K and V in 128-key tiles, one
    CTA per SM; its setmaxnreg split fits the SM's registers, its named barriers the 16 ids."""
    cfg = FlintConfig.preset(preset)
    ws = [s for s in wg.bench_specs(cfg) if wg._ws(s)]
    assert [{k: v for k, v in s.as_dict().items() if k != "WS"} for s in ws] == \
        [{k: v for k, v in s.as_dict().items() if k != "FC"} for s in wg._specs(cfg)
         if "SPLITS" not in s.as_dict()]
    for s in ws:
        args, launch = check_spec(wg.KERNEL, s)
        assert [a.name for a in args] == [a.name for a in ap.KERNEL.args(s)]
        assert launch.block == (32 * wg.WS_WARPS, 1, 1) == (384, 1, 1)
        d = s["D"]
        want = 128 * d * 2 + 2 * s["ST"] * wg.WS_BN * d * 2 + 1024
        assert launch.smem == want <= 227 * 1024
        assert launch.smem > 227 * 1024 // 2  # one CTA per SM, as the register split assumes
    assert 128 * wg.WS_PRODUCER_REGS + 256 * wg.WS_CONSUMER_REGS <= 65536
    assert wg.WS_PRODUCER_REGS % 8 == wg.WS_CONSUMER_REGS % 8 == 0
    ids = [0, wg.WS_Q_BAR, wg.WS_TURN_BAR, wg.WS_TURN_BAR + 1] + [
        b + s for b in (wg.WS_FULL_K, wg.WS_FULL_V, wg.WS_EMPTY_K, wg.WS_EMPTY_V)
        for s in range(wg.STAGES)]
    assert len(set(ids)) == len(ids) and max(ids) < 16


@pytest.mark.parametrize("preset", ["nano", "full"])
def test_every_model_spec_has_run_copies_and_its_form_before_them(preset):
    """FC = 1 (the module doc's "Fewer instructions a key tile") in every model spec, split
    ones included, and each again without it (FC = 0, bench variant) with the same arguments
    and launch; a pass of the CTA's copies covers a multiple of 8 key rows, so a row's swizzle
    is the same in every pass (what the run copies rely on)."""
    cfg = FlintConfig.preset(preset)
    model = wg._specs(cfg)
    assert all(wg._fc(s) == 1 for s in model)
    before = [s for s in wg.bench_specs(cfg) if not wg._fc(s) and not wg._ws(s)
              and s["ST"] == wg.STAGES]
    assert [{**s.as_dict(), "FC": 1} for s in before] == [s.as_dict() for s in model]
    for s in before:
        assert check_spec(wg.KERNEL, s) == check_spec(wg.KERNEL, wg.variant(s, FC=1))
        assert wg.variant(wg.variant(s, FC=1), FC=0) == s
        assert (32 * wg.WARPS // (s["D"] // 8)) % 8 == 0
    assert not wg._fc(wg.variant(model[0], WS=1))  # the WS form has its own copies


def test_short_chunks_split_their_keys_until_the_gpu_is_full():
    """splits_for: 1 once a chunk's own CTAs reach SPLIT_CTAS, else the smallest choice that
    reaches it (the largest when none does); split_rows bounds the partials of every split."""
    cfg = FlintConfig.preset("full")  # G = 8: 16 tokens per CTA, 4 KV heads
    assert [wg.splits_for(cfg, t) for t in (1, 25, 48, 112, 113, 128, 496, 497, 8192)] == \
        [16, 16, 16, 16, 4, 4, 4, 1, 1]
    rows, most = wg.split_rows(cfg)
    assert most == 496 and rows == max(wg.splits_for(cfg, t) * t for t in range(1, 497))


def test_the_tiny_config_keeps_attn_prefill():
    cfg = FlintConfig.preset("tiny")  # head dim 32: wgmma's O tile takes 64 or 128
    assert not wg.fits(cfg) and wg._specs(cfg) == []


@pytest.mark.parametrize("bad, match", [(dict(D=96), "head dim D = 96"),
                                        (dict(ST=4), "ST = 4 stages"),
                                        (dict(SPLITS=8), "SPLITS = 8"),
                                        (dict(WS=2), "WS = 2"),
                                        (dict(WS=1, ST=3), "WS = 1 takes ST = 2"),
                                        (dict(WS=1, SPLITS=4), "WS = 1 takes ST = 2"),
                                        (dict(FC=2), "FC = 2"),
                                        (dict(FC=1, WS=1), "not with WS = 1")])
def test_unsupported_specialisations_are_refused(bad, match):
    values = dict(HQ=32, HKV=4, D=128, P=64, RING=0, W=0, ST=2) | bad
    with pytest.raises(ValueError, match=match):
        check_spec(wg.KERNEL, wg.KERNEL.spec(**values))


def test_the_prefill_knows_both_kernels():
    from flint_graph.capture import prefill

    assert prefill.ATTN_KERNEL in prefill.ATTN_KERNELS
    assert set(prefill.ATTN_KERNELS) == {"attn_prefill", "attn_prefill_wg"}
