"""CPU checks of attn_prefill's declaration, its reference and its test arguments
(kernels/prefill/attn_prefill.py); the kernel itself runs in tests/test_attn_prefill_gpu.py and
compiles for both archs in tests/test_kernel_cache.py."""

import pytest
import torch

from flint_graph import reference
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.prefill import attn_prefill as ap
from flint_graph.kernels.toolchain.spec import check_spec


@pytest.mark.parametrize("preset", ["tiny", "nano", "full"])
def test_every_layer_kind_has_a_valid_specialisation(preset):
    cfg = FlintConfig.preset(preset)
    specs = ap._specs(cfg)
    assert {s["RING"] for s in specs} == {0, 1}
    for s in specs:
        check_spec(ap.KERNEL, s)
    assert ap.tokens_per_cta(specs[0]) * (cfg.num_attention_heads // cfg.num_key_value_heads) \
        == 128  # 4 warps × 32 MMA rows


@pytest.mark.parametrize("bad, match", [
    (dict(HQ=12, HKV=4), "HQ / HKV = 12 / 4"),
    (dict(D=48), "multiple of 32"),
    (dict(RING=1, W=17, P=64), "a ring needs W = P"),
    (dict(RING=0, W=0, P=32), "P = 64"),
])
def test_unsupported_shapes_are_refused(bad, match):
    values = dict(HQ=32, HKV=4, D=128, P=64, RING=0, W=0) | bad
    with pytest.raises(ValueError, match=match):
        check_spec(ap.KERNEL, ap.KERNEL.spec(**values))


@pytest.mark.parametrize("ring", [0, 1])
@pytest.mark.parametrize("tokens, start", [(1, 0), (30, 0), (30, 5), (9, 100)])
def test_reference_sees_the_cached_prefix_and_the_chunk(ring, tokens, start):
    """The reference reads keys < start from the ring or pages and the rest from the chunk:
    the same as attention over one contiguous key list built from those positions."""
    w = 17
    spec = ap.KERNEL.spec(HQ=4, HKV=2, D=32, P=w if ring else 64, RING=ring, W=w if ring else 0)
    args = ap.make_args(spec, gen=torch.Generator().manual_seed(tokens + start), tokens=tokens,
                        start=start, device="cpu")
    q, kn, vn, kc, vc, table = args[:6]
    (got,) = ap._reference(spec, *args)
    assert not got.isnan().any(), "a poisoned (unseen) cache entry reached the output"
    lo = max(0, start - w + 1) if ring else 0
    pos = torch.arange(lo, start)
    page = table[0].long().expand_as(pos) if ring else table.long()[pos // 64]
    k = torch.cat([kc[page, :, pos % spec["P"]], kn])
    v = torch.cat([vc[page, :, pos % spec["P"]], vn])
    kpos = torch.cat([pos, torch.arange(start, start + tokens)])
    want = reference.attention(q, k, v, torch.arange(start, start + tokens), kpos, args[7],
                               w if ring else None)
    assert torch.equal(got, want.reshape(tokens, -1))


def test_no_sink_is_minus_infinity():
    spec = ap._specs(FlintConfig.preset("tiny"))[0]
    args = ap.make_args(spec, gen=torch.Generator().manual_seed(0), tokens=5, start=0,
                        device="cpu", sinks="none")
    assert torch.isneginf(args[7]).all()
    (got,) = ap._reference(spec, *args)
    q_pos = torch.arange(5)
    want = reference.attention(args[0], args[1], args[2], q_pos, q_pos, None, spec["W"])
    assert torch.equal(got, want.reshape(5, -1))


def test_flops_count_visible_pairs():
    spec = ap.KERNEL.spec(HQ=4, HKV=2, D=32, P=17, RING=1, W=17)
    # queries at 0..19 see min(p + 1, 17) keys each
    pairs = sum(min(p + 1, 17) for p in range(20))
    assert ap.flops(spec, 20, 0) == 4 * 32 * 4 * pairs
    cfg = FlintConfig.preset("full")
    assert abs(cfg.prefill_flops(8192)["linear"] / 8192 - 4.24e9) < 0.01e9  # DESIGN §3
