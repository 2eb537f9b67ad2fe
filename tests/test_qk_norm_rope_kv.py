"""CPU tests of qk_norm_rope_kv's declarations, argument builder, reference and angle math
(kernels/decode/qk_norm_rope_kv.py); the kernel itself runs in tests/test_qk_norm_rope_kv_gpu.py.

`emulate` below is an independent formulation of what the kernel computes, step by step in
torch on the CPU (fp32 norm, the kernel's fp64 octant reduction and Taylor polynomials for
cos/sin, fp32 rotation, the cache write at table[b, ·], entry p % P). The reference must agree
with it, and the kernel's cos/sin must agree with fp64 cos/sin rounded to fp32.
"""

import dataclasses

import pytest
import torch

from flint_graph.checkpoints.config import FULL, FlintConfig
from flint_graph.kernels.decode import qk_norm_rope_kv as qk
from flint_graph.kernels.toolchain.spec import KV_PAGE, TensorArg

TINY = FlintConfig.preset("tiny")
FULL_CFG = FlintConfig.preset("full")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def kernel_cos_sin(angle: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (cos, sin) of fp64 angles the way the kernel computes them (without fma)."""
    k = torch.round(angle * qk.TWO_OVER_PI)  # round half to even, as cvt.rni
    r = angle - k * qk.PIO2[0]
    r = r - k * qk.PIO2[1]
    r = r - k * qk.PIO2[2]
    r2 = r * r
    sp = torch.full_like(r, qk.SIN_COEFS[-1])
    for c in reversed(qk.SIN_COEFS[:-1]):
        sp = sp * r2 + c
    cp = torch.full_like(r, qk.COS_COEFS[-1])
    for c in reversed(qk.COS_COEFS[:-1]):
        cp = cp * r2 + c
    s, c = r + r * r2 * sp, 1.0 + r2 * cp
    quad = k.long() % 4
    sin = torch.where(quad % 2 == 1, c, s) * torch.where(quad >= 2, -1.0, 1.0)
    cos = torch.where(quad % 2 == 1, s, c) * torch.where((quad == 1) | (quad == 2), -1.0, 1.0)
    return cos.float(), sin.float()


def emulate(spec, args) -> None:
    """Write q_out and the caches of `args` as the kernel does (independent of reference.py)."""
    qkv, positions, table, q_norm, k_norm, inv_freq, q_out, k_cache, v_cache, eps = args
    b, hq, hkv, d, p = spec["B"], spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    q, k, v = qkv[:, :hq * d], qkv[:, hq * d:(hq + hkv) * d], qkv[:, (hq + hkv) * d:]
    half = d // 2
    for row in range(b):
        pos = int(positions[row])
        cos, sin = kernel_cos_sin(pos * inv_freq.double())  # [D/2]
        page = int(table[row, 0 if spec["RING"] else pos // p])

        def norm_rope(x, w):
            xf = x.float()
            ss = (xf * xf).sum()
            y = (xf * torch.rsqrt(ss / d + torch.tensor(eps, dtype=torch.float32))
                 * w.float()).to(torch.bfloat16).float()
            if not spec["ROPE"]:
                return y.to(torch.bfloat16)
            lo, hi = y[:half], y[half:]
            return torch.cat([lo * cos - hi * sin, hi * cos + lo * sin]).to(torch.bfloat16)

        for h in range(hq):
            q_out[row, h] = norm_rope(q[row, h * d:(h + 1) * d], q_norm)
        for h in range(hkv):
            k_cache[page, h, pos % p] = norm_rope(k[row, h * d:(h + 1) * d], k_norm)
            v_cache[page, h, pos % p] = v[row, h * d:(h + 1) * d]


def test_specs_follow_the_config():
    for cfg in (TINY, FULL_CFG):
        specs = qk._specs(cfg, (1, 2, 4, 8))
        assert len(specs) == 8
        kinds = {(s["RING"], s["P"], s["ROPE"]) for s in specs}
        assert kinds == {(1, cfg.sliding_window, 1), (0, KV_PAGE, 0)}
        assert {(s["HQ"], s["HKV"], s["D"]) for s in specs} == {
            (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)}
        assert [s["B"] for s in specs] == [1, 1, 2, 2, 4, 4, 8, 8]
    # RoPE on the full layers instead: the flags follow the layers, not the layer kind
    swapped = qk._specs(dataclasses.replace(TINY, rope_layers=FULL), (1,))
    assert {(s["RING"], s["ROPE"]) for s in swapped} == {(1, 0), (0, 1)}


def test_specs_refuse_a_config_without_qk_norm():
    with pytest.raises(ValueError, match="qk_norm"):
        qk._specs(dataclasses.replace(TINY, qk_norm=False), (1,))


def test_lane_split():
    assert qk.lane_split(128) == (2, 32)
    assert qk.lane_split(32) == (2, 8)
    assert qk.lane_split(256) == (4, 32)
    for bad in (30, 160, 1024):
        with pytest.raises(ValueError, match="head_dim"):
            qk.lane_split(bad)


def test_make_args_are_valid():
    """Declared shapes and dtypes, distinct pages covering every position, NaN outputs."""
    for cfg in (TINY, FULL_CFG):
        for spec in qk._specs(cfg, (4,)):
            pos = [0, spec["P"] - 1, spec["P"], 5 * spec["P"] + 3]
            args = qk.make_args(spec, gen=_gen(0), device="cpu", positions=pos)
            dims = {}
            for a, v in zip(qk.KERNEL.args(spec), args):
                if not isinstance(a, TensorArg):
                    assert isinstance(v, float)
                    continue
                assert v.dtype == getattr(torch, {"bf16": "bfloat16", "i32": "int32",
                                                  "f64": "float64"}[a.dtype])
                for want, got in zip(a.shape, v.shape):
                    assert dims.setdefault(want, got) == got if isinstance(want, str) \
                        else want == got, (a.name, a.shape, v.shape)
                if a.role == "output":
                    assert v.isnan().all()
                else:
                    assert not v.double().isnan().any() and v.double().abs().sum() > 0
            assert args[0].shape == (4, (cfg.num_attention_heads
                                         + 2 * cfg.num_key_value_heads) * cfg.head_dim)
            table, nb = args[2], dims["NB"]
            assert table.unique().numel() == table.numel() and int(table.max()) < nb
            assert dims["T"] == (1 if spec["RING"] else 6)
            assert args[1].tolist() == pos
            assert torch.equal(args[5], qk.rope_inv_freq(cfg.head_dim, 10000.0))


def test_theta_is_recovered_from_the_table():
    for theta in (10000.0, 500000.0, 1e6, 12345.678):
        assert qk._theta(qk.rope_inv_freq(128, theta), 128) == pytest.approx(theta, rel=1e-13)
    assert qk._theta(qk.rope_inv_freq(32, 10000.0), 32) == 10000.0
    with pytest.raises(ValueError, match="inv_freq"):
        qk._theta(torch.rand(64, dtype=torch.float64), 128)


def test_kernel_cos_sin_match_fp64_rounded_to_fp32():
    """The kernel's angle reduction and polynomials against torch's fp64 cos/sin rounded to
    fp32 (what reference.rope_cos_sin does), over positions up to 262,143 and all D/2 = 64
    frequencies: within one fp32 ulp everywhere, and almost always equal."""
    pos = torch.cat([torch.arange(0, 4096), torch.arange(262_143 - 4096, 262_144),
                     torch.randint(0, 262_144, (8192,), generator=_gen(1))]).double()
    ang = pos[:, None] * qk.rope_inv_freq(128, 10000.0)[None, :]
    cos, sin = kernel_cos_sin(ang)
    for got, want in ((cos, ang.cos().float()), (sin, ang.sin().float())):
        ulp = torch.finfo(torch.float32).eps * want.abs().clamp_min(2.0 ** -126)
        assert ((got - want).abs() <= ulp).all()
        assert (got == want).double().mean() > 0.9999


@pytest.mark.parametrize("preset", ["tiny", "full"])
def test_reference_matches_the_emulated_kernel(preset):
    """Both layer kinds at B = 4 with rows at 0, a page edge and near 262,143: q_out and the
    written entries agree (bf16 rounding flips only), nothing else in the caches is written."""
    cfg = FlintConfig.preset(preset)
    for spec in qk._specs(cfg, (4,)):
        p = spec["P"]
        pos = [0, p - 1, p, 262_143] if spec["RING"] else [0, p - 1, p, 5 * p + 1]
        args = qk.make_args(spec, gen=_gen(2), device="cpu", positions=pos,
                            eps=cfg.rms_norm_eps, theta=cfg.rope_theta)
        emulate(spec, args)
        q_ref, k_ref, v_ref = qk._reference(spec, *args[:6], args[-1])
        pages, entries = qk.cache_entry(spec, args[1], args[2])
        k_got, v_got = args[7][pages, :, entries], args[8][pages, :, entries]
        for got, ref in ((args[6], q_ref), (k_got, k_ref)):
            rel = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
            assert rel < 2e-3, (spec.id, rel)
            assert (got != ref).double().mean() < 0.02  # a few rounding flips at most
        assert torch.equal(v_got, v_ref)
        written = torch.zeros(args[7].shape[:3], dtype=torch.bool)
        written[pages, :, entries] = True
        for cache in args[7:9]:
            assert (~cache.isnan().any(-1) == written).all()


def test_rope_changes_keys_and_positions_matter():
    """With ROPE = 1 the key at position p differs from the unrotated one except at p = 0."""
    spec = next(s for s in qk._specs(TINY, (2,)) if s["ROPE"])
    args = qk.make_args(spec, gen=_gen(3), device="cpu", positions=[0, 40])
    _, k_rope, _ = qk._reference(spec, *args[:6], args[-1])
    flat = qk.KERNEL.spec(**{**spec.as_dict(), "ROPE": 0})
    _, k_flat, _ = qk._reference(flat, *args[:6], args[-1])
    assert torch.equal(k_rope[0], k_flat[0]) and not torch.equal(k_rope[1], k_flat[1])


def test_cache_entry_ring_and_paged():
    ring = next(s for s in qk._specs(TINY, (2,)) if s["RING"])
    paged = next(s for s in qk._specs(TINY, (2,)) if not s["RING"])
    pos = torch.tensor([3, 40], dtype=torch.int32)
    pages, entries = qk.cache_entry(ring, pos, torch.tensor([[5], [2]], dtype=torch.int32))
    assert pages.tolist() == [5, 2] and entries.tolist() == [3, 40 % ring["P"]]
    pos = torch.tensor([3, 130], dtype=torch.int32)
    table = torch.tensor([[7, 1, 4], [9, 0, 6]], dtype=torch.int32)
    pages, entries = qk.cache_entry(paged, pos, table)
    assert pages.tolist() == [7, 6] and entries.tolist() == [3, 130 % KV_PAGE]


def test_bytes_moved():
    spec = next(s for s in qk._specs(FULL_CFG, (1,)) if s["ROPE"])
    args = qk.make_args(spec, gen=_gen(4), device="cpu", positions=[7])
    heads = 32 + 2 * 4
    assert qk.bytes_moved(spec, args) == 2 * heads * 128 * 2 + 2 * 128 * 2 + 64 * 8 + 8
