"""CPU checks of attn_decode's declarations, argument builder, reference and split heuristic
(kernels/decode/attn_decode.py; no GPU, no DSL). The kernel itself runs in test_attn_decode_gpu.py."""

import math

import pytest
import torch

from flint_graph.capture.launcher import check_args
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import attn_decode as ad
from flint_graph.kernels.toolchain.spec import check_spec

PRESETS = ("tiny", "full")


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _spec(preset, b, ring, splits=None):
    s = next(s for s in ad._specs(FlintConfig.preset(preset), (b,)) if s["RING"] == ring)
    return s if splits is None else ad.KERNEL.spec(**{**s.as_dict(), "SPLITS": splits})


def _slow_attention(spec, q, k_cache, v_cache, table, positions, sinks):
    """Float64 loops straight from the formula: out = Σ e^(s_j−m) v_j / (Σ e^(s_j−m) +
    e^(sink−m)), s_j = q·k_j / sqrt(D), over the keys the layout and window make visible."""
    hq, hkv, d, size, w = (spec[k] for k in ("HQ", "HKV", "D", "P", "W"))
    g = hq // hkv
    out = torch.zeros(q.shape[0], hq, d, dtype=torch.float64)
    for b in range(q.shape[0]):
        p = int(positions[b])
        keys = range(max(0, p - w + 1) if w else 0, p + 1)
        for h in range(hq):
            logits, values = [], []
            for t in keys:
                page = int(table[b, 0]) if spec["RING"] else int(table[b, t // size])
                k = k_cache[page, h // g, t % size].double()
                logits.append(float(q[b, h].double() @ k) / math.sqrt(d))
                values.append(v_cache[page, h // g, t % size].double())
            m = max(max(logits), float(sinks[h]))
            e = [math.exp(x - m) for x in logits]
            den = sum(e) + math.exp(float(sinks[h]) - m)
            out[b, h] = sum(ei * vi for ei, vi in zip(e, values)) / den
    return out.view(q.shape[0], -1)


@pytest.mark.parametrize("ring", [0, 1])
def test_reference_matches_the_formula(ring):
    """Positions below, at and past the window (ring wrap-around) and across pages."""
    spec = _spec("tiny", 4, ring)
    args = ad.make_args(spec, gen=_gen(1), device="cpu", positions=[0, 16, 17, 150])
    (ref,) = ad._reference(spec, *[a for i, a in enumerate(args) if i != 6])
    slow = _slow_attention(spec, *args[:6])
    rel = ((ref.double() - slow).norm() / slow.norm()).item()
    assert ref.dtype == torch.bfloat16 and rel < 4e-3  # bf16 output rounding only


def test_sink_is_one_extra_logit():
    """out_with_sink = out_without · sigmoid(lse − sink) (DESIGN §1), per head."""
    spec = _spec("tiny", 1, 0)
    args = ad.make_args(spec, gen=_gen(2), device="cpu", positions=[90])
    q, kc, vc, table, pos, sinks = args[:6]
    with_sink = _slow_attention(spec, q, kc, vc, table, pos, sinks)
    without = _slow_attention(spec, q, kc, vc, table, pos, torch.full_like(sinks, -1e30))
    k, _, _ = ad.gather_kv(spec, kc, vc, table, 90, 0)
    g = spec["HQ"] // spec["HKV"]
    for h in range(spec["HQ"]):
        s = (k[:, h // g].double() @ q[0, h].double()) / math.sqrt(spec["D"])
        factor = torch.sigmoid(torch.logsumexp(s, 0) - float(sinks[h]))
        d = spec["D"]
        torch.testing.assert_close(with_sink[0, h * d:(h + 1) * d],
                                   without[0, h * d:(h + 1) * d] * factor)


@pytest.mark.parametrize("preset", PRESETS)
def test_make_args_follow_the_declaration(preset):
    for spec in ad.bench_specs(FlintConfig.preset(preset), (1, 2, 4, 8)):
        check_spec(ad.KERNEL, spec)
        pos = [3 * spec["P"] + 5 * i for i in range(spec["B"])]
        args = ad.make_args(spec, gen=_gen(3), device="cpu", positions=pos)
        extents = check_args(spec.id, ad.KERNEL.args(spec), args, device_type="cpu")
        assert extents["T"] == (1 if spec["RING"] else max(pos) // spec["P"] + 1)
        assert args[4].tolist() == pos
        assert torch.equal(args[9], torch.zeros_like(args[9]))  # counters start at zero
        assert all(a.isnan().all() for a in args[6:9])  # out, o_part, lse_part poisoned
        new = 1 if ad.folded(spec) else 0  # folded: key p is NaN, the kernel writes it
        for b, p in enumerate(pos):  # every other key a row sees is real data
            k, v, _ = ad.gather_kv(spec, args[1], args[2], args[3], p, b)
            assert not k[:len(k) - new].isnan().any() and not v[:len(v) - new].isnan().any()
            assert k[len(k) - new:].isnan().all() and v[len(v) - new:].isnan().all()
        assert args[1].isnan().any()  # ... and the unseen entries are NaN


def test_pages_are_shuffled_and_distinct():
    spec = _spec("full", 4, 0)
    pos = [0, 200, 700, 1500]
    args = ad.make_args(spec, gen=_gen(4), device="cpu", positions=pos)
    used = [args[3][b, :p // spec["P"] + 1].tolist() for b, p in enumerate(pos)]
    flat = [x for row in used for x in row]
    assert len(set(flat)) == len(flat)  # no page shared between rows
    assert flat != sorted(flat)  # not in allocation order


def _model_splits():
    """(SPLITS, window) of every spec the model and the bench compile, both presets."""
    return sorted({(s["SPLITS"], s["W"]) for p in PRESETS for s in ad.bench_specs(
        FlintConfig.preset(p), (1, 2, 4, 8))})


def test_row_splits_cover_the_range():
    """Every row's chunks tile its range exactly, none empty, at most SPLITS of them; long
    rows use them all."""
    for splits, window in _model_splits():
        mt = ad.min_tiles(window)
        for tiles in range(1, 3000):
            n, chunk = ad.row_splits(tiles, splits, window)
            spans = [(i * chunk, min((i + 1) * chunk, tiles)) for i in range(n)]
            assert 1 <= n <= splits and spans[0][0] == 0 and max(hi for _, hi in spans) == tiles
            assert all(a[1] == b[0] or b[0] >= tiles for a, b in zip(spans, spans[1:]))
            assert chunk >= mt
            if n < splits:  # short rows: min_tiles per split (the last one less), none empty
                assert chunk == mt and all(lo < hi for lo, hi in spans)
            if tiles >= mt * splits:
                assert n == splits


def test_min_tiles_is_at_most_a_warp_each():
    """A short row's split never holds more tiles than the CTA has warps (one load round trip
    per CTA), and the heuristic is per layer kind."""
    for window in (0, 17, 513):
        assert 1 <= ad.min_tiles(window) <= ad.WARPS
    assert ad.min_tiles(0) == ad.MIN_TILES_FULL and ad.min_tiles(513) == ad.MIN_TILES_SLIDING


def test_splits_fill_the_gpu_and_do_not_depend_on_the_bucket():
    """Full layers: ~128 CTAs per row (132 SMs on the H200); 100K keys get 32 splits per KV
    head, 1K keys ceil(32 / MIN_TILES_FULL). Sliding (W = 513): a window's 17 tiles in runs of
    MIN_TILES_SLIDING, every split used by a full window. SPLITS is the same at every bucket,
    so a row is split alike in any batch (batch invariance)."""
    cfg = FlintConfig.preset("full")
    for spec in ad._specs(cfg, (1, 2, 4, 8)):
        hkv, w = spec["HKV"], spec["W"]
        if spec["RING"]:
            want = min(ad.CTA_TARGET // hkv, -(-17 // ad.MIN_TILES_SLIDING))
            assert spec["SPLITS"] == want
            for p in (10_000, 10_015, 10_016):  # every alignment of the window: 17 tiles
                lo, hi = ad.visible_range(p, w)
                tiles = hi // ad.TILE - lo // ad.TILE + 1
                assert tiles == 17 and ad.row_splits(tiles, want, w)[0] == want
        else:
            assert spec["SPLITS"] * hkv == ad.CTA_TARGET
    full_b1 = _spec("full", 1, 0)
    assert ad.row_splits(-(-100_000 // ad.TILE), full_b1["SPLITS"])[0] == 32
    assert ad.row_splits(1024 // ad.TILE, full_b1["SPLITS"])[0] == -(-32 // ad.MIN_TILES_FULL)


def test_bytes_moved_counts_the_visible_kv():
    spec = _spec("full", 1, 0)
    args = ad.make_args(spec, gen=_gen(5), device="cpu", positions=[99_999], poison_unseen=False)
    kv = 100_000 * 4 * 128 * 2 * 2  # 205 MB: K and V of 4 KV heads
    assert ad.bytes_moved(spec, args) == kv + 2 * 2 * 32 * 128 + 4 * 32 + 4 * 1563 + 4
    ring = _spec("full", 2, 1)
    args = ad.make_args(ring, gen=_gen(5), device="cpu", positions=[3, 5000])
    assert ad.bytes_moved(ring, args) == (4 + 513) * 4 * 128 * 4 + 2 * 2 * 2 * 32 * 128 \
        + 4 * 32 + 2 * 8


def test_declarations_reject_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 32"):
        ad._args(ad.KERNEL.spec(B=1, HQ=4, HKV=2, D=48, P=64, RING=0, W=0, SPLITS=1))
    with pytest.raises(ValueError, match="W = P"):
        ad._args(ad.KERNEL.spec(B=1, HQ=4, HKV=2, D=32, P=64, RING=1, W=17, SPLITS=1))


def _folded(preset, b, ring):
    return next(s for s in ad.folded_specs(FlintConfig.preset(preset), (b,))
                if s["RING"] == ring)


@pytest.mark.parametrize("preset", ["tiny", "full", "nano"])
def test_folded_specs_follow_the_layers(preset):
    """One QKN = 1 spec per bucket and (RING, ROPE) kind of the config's layers, with the
    plain form's SPLITS; bench_specs holds them beside the model's form, and a config whose
    full layers differ in RoPE gets both."""
    from flint_graph.nano.plants import planted_config

    cfg = FlintConfig.preset(preset)
    kinds = {(int(cfg.is_sliding(i)), int(cfg.uses_rope(i)))
             for i in range(cfg.num_hidden_layers)}
    fs = ad.folded_specs(cfg, (1, 8))
    assert {(s["RING"], s["ROPE"]) for s in fs} == kinds and len(fs) == 2 * len(kinds)
    for s in fs:
        plain = ad.KERNEL.spec(**{k: v for k, v in s.as_dict().items()
                                  if k not in ("QKN", "ROPE")})
        assert plain in ad.specs_for(cfg, (s["B"],), False)
        assert s in ad.bench_specs(cfg, (1, 8)) and ad.folded(s) and not ad.folded(plain)
        check_spec(ad.KERNEL, s)
    odd = planted_config(cfg, "rope-on-nope")
    assert len({(s["RING"], s["ROPE"]) for s in ad.folded_specs(odd, (1,))}) == 3


def test_fold_needs_rope_pairs_in_a_lane():
    """RoPE pairs d, d + D/2 must sit in one lane (D a multiple of 64) or lanes t, t ^ 2
    (D = 32): D = 96 is refused with RoPE (a config, and a spec), allowed without it."""
    assert [d for d in range(32, 513, 32) if not ad.rope_pairs_in_lane(d)] == \
        [96, 160, 224, 288, 352, 416, 480]
    cfg = FlintConfig.preset("tiny")
    odd = cfg.__class__(**{**cfg.__dict__, "head_dim": 96})
    assert not ad.fold_possible(odd)
    with pytest.raises(ValueError, match="multiple of 64"):
        ad._args(ad.KERNEL.spec(B=1, HQ=4, HKV=2, D=96, P=17, RING=1, W=17, SPLITS=1, QKN=1,
                                ROPE=1))
    ad._args(ad.KERNEL.spec(B=1, HQ=4, HKV=2, D=96, P=64, RING=0, W=0, SPLITS=1, QKN=1, ROPE=0))


def test_fold_needs_the_qk_norm():
    cfg = FlintConfig.preset("tiny")
    cfg = cfg.__class__(**{**cfg.__dict__, "qk_norm": False})
    assert not ad.fold_possible(cfg) and not ad.uses_fold(cfg)
    with pytest.raises(ValueError, match="qk_norm"):
        ad.specs_for(cfg, (1,), True)
    assert not any(ad.folded(s) for s in ad.bench_specs(cfg, (1, 8)))  # nor built for it


@pytest.mark.parametrize("ring", [0, 1])
def test_folded_reference_is_the_two_kernel_reference(ring):
    """The folded form's reference = qk_norm_rope_kv's reference (q, the new entries written at
    each row's position), then the plain attention reference on those caches; nothing else
    in the caches changes, and the caller's caches are left as they were."""
    from flint_graph.kernels.decode import qk_norm_rope_kv as qk

    spec = _folded("tiny", 4, ring)
    pos = [0, 16, 17, 150]
    args = ad.make_args(spec, gen=_gen(6), device="cpu", positions=pos)
    k0 = args[1].clone()
    q, kc, vc, k_new, v_new = ad.folded_inputs(spec, args[0], args[1], args[2], args[3],
                                               args[4], *args[10:])
    assert torch.equal(args[1].isnan(), k0.isnan())  # inputs untouched
    qq, kk, vv = qk._reference(spec, args[0], args[4], args[3], *args[10:])
    assert torch.equal(q, qq) and torch.equal(k_new, kk) and torch.equal(v_new, vv)
    page, entry = qk.cache_entry(spec, args[4], args[3])
    changed = (kc.isnan() != k0.isnan()) | ((kc != k0) & ~k0.isnan())
    for b in range(4):
        assert torch.equal(kc[page[b], :, entry[b]], k_new[b])
        changed[page[b], :, entry[b]] = False
    assert not changed.any()
    (out,) = ad._reference(spec, *[a for i, a in enumerate(args) if i != 6])
    plain = ad.KERNEL.spec(**{k: v for k, v in spec.as_dict().items() if k not in ("QKN", "ROPE")})
    (want,) = ad._reference(plain, q, kc, vc, args[3], args[4], args[5])
    assert torch.equal(out, want) and not out.isnan().any()


def test_folded_declaration_and_bytes():
    """qkv in place of q, the fold's weights and eps after the counters (the plain form's
    argument positions unchanged); the (cos, sin) table in shared memory with RoPE; bytes add
    qkv's k and v heads, the new entries and the weights."""
    spec, plain = _folded("full", 1, 1), _spec("full", 1, 1)
    names = [a.name for a in ad.KERNEL.args(spec)]
    assert names[:10] == ["qkv"] + [a.name for a in ad.KERNEL.args(plain)][1:]
    assert names[10:] == ["q_norm", "k_norm", "inv_freq", "eps"]
    assert ad._launch(spec).smem == ad._launch(plain).smem + 4 * spec["D"]
    nope = _folded("full", 1, 0)
    assert ad._launch(nope).smem == ad._launch(_spec("full", 1, 0)).smem
    args = ad.make_args(spec, gen=_gen(5), device="cpu", positions=[5000])
    pargs = ad.make_args(plain, gen=_gen(5), device="cpu", positions=[5000])
    d, hkv = spec["D"], spec["HKV"]
    assert ad.bytes_moved(spec, args) - ad.bytes_moved(plain, pargs) == \
        2 * 2 * hkv * d * 2 + 2 * d * 2 + d // 2 * 8
