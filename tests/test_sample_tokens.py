"""CPU tests of sample_tokens (kernels/decode/sample_tokens.py): declarations and specs, the reference's
properties (greedy, top-k, top-p, VLIM, NaN, determinism, agreement with flint_graph.runtime.sampling), a
plain-Python model of the kernel's histogram algorithm against the reference, a dry run of the GPU
test's builders and checks, and the sm_90a compile of every model spec (where the DSL is installed).
"""

import math

import pytest
import torch

import test_sample_tokens_gpu as g
from flint_graph.runtime import sampling
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels.decode import sample_tokens as st
from flint_graph.kernels.toolchain.cache import dsl_version
from flint_graph.kernels.toolchain.spec import BUCKETS, TensorArg, check_spec
from flint_graph.runtime.sampling import counter_uniform, filtered_probs, sample

PRESETS = ("tiny", "full")
DTYPE = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32, "i64": torch.int64}


def _row(logits, temperature=1.0, top_k=0, top_p=1.0, seed=0, pos=0):
    u = float(counter_uniform(torch.tensor([seed]), torch.tensor([pos]))[0])
    return st.reference_row(logits.float(), temperature, top_k, top_p, u)


@pytest.mark.parametrize("preset", PRESETS)
def test_specs_cover_every_bucket(preset):
    cfg = FlintConfig.preset(preset)
    specs = st.KERNEL.specs(cfg, BUCKETS)
    assert [s["B"] for s in specs] == list(BUCKETS)
    for s in specs:
        assert s["V"] == s["VLIM"] == cfg.vocab_size
        args, launch = check_spec(st.KERNEL, s)
        assert [a.name for a in args] == ["logits", "temperature", "top_k", "top_p", "seeds",
                                          "draw_index", "ids", "ctl", "bitmap", "total", "part",
                                          "cand"]
        assert launch.grid == (st.split(s["VLIM"])[0], s["B"], 1)
        assert launch.smem + 2048 <= 227 * 1024  # plus the DSL's static shared memory
    short = [s for s in st.bench_specs(cfg, BUCKETS) if s not in specs]
    assert [(s["B"], s["VLIM"]) for s in short] == [(1, cfg.vocab_size - 229),
                                                     (8, cfg.vocab_size - 229)]


def test_split_of_the_row():
    assert st.split(151552) == (16, 9472, 1184, 3, 8)  # ids per CTA fit the u16 counts
    assert st.split(1024) == (1, 1024, 128, 1, 1)
    ctas, per_cta, _, _, _ = st.split(151323)
    assert (ctas - 1) * per_cta < 151323 <= ctas * per_cta
    with pytest.raises(ValueError, match="too large"):
        st.split(17 * 65536)


@pytest.mark.parametrize("preset", PRESETS)
def test_make_args_follow_the_declaration(preset):
    for spec in st.bench_specs(FlintConfig.preset(preset), (1, 8)):
        args = st.make_args(spec, gen=torch.Generator().manual_seed(0), device="cpu")
        decls = st.KERNEL.args(spec)
        assert len(args) == len(decls)
        for a, v in zip(decls, args):
            assert isinstance(a, TensorArg) and tuple(v.shape) == a.shape, a.name
            assert v.dtype == DTYPE[a.dtype], a.name
            if a.role == "output":
                assert (v == -7).all()
            elif a.role == "workspace":
                assert not v.any(), a.name
        assert args[0].float().std() > 2.0 and (args[1] == 1.0).all()


def test_bytes_moved_full_b1():
    (spec,) = st.KERNEL.specs(FlintConfig.preset("full"), (1,))
    assert st.bytes_moved(spec, None) == 2 * 151552 + 4 + 4 + 4 + 8 + 8 + 8


# -- the reference's semantics -------------------------------------------------------------------


def test_weights_follow_exp_within_the_stated_error():
    gen = torch.Generator().manual_seed(1)
    for t in (0.3, 1.0, 2.5):
        l = (3 * torch.randn(4096, generator=gen)).bfloat16().float()
        q = st.weights(l, l.max(), t)
        exact = torch.exp((l.double() - l.max().double()) / t) * 2.0**40
        assert q.max() == st.Q_ONE and (q >= 0).all()
        big = exact > 2**20  # where floor's own error is below 1e-6
        assert ((q[big].double() - exact[big]).abs() / exact[big]).max() < 3e-6
        assert (q[exact < 0.5] == 0).all()


def test_greedy_is_the_lowest_id_of_the_max():
    l = torch.randn(1000, generator=torch.Generator().manual_seed(2)).bfloat16()
    l[[17, 400, 999]] = 9.0
    l[5] = float("nan")
    for t in (0.0, -1.0, float("nan")):
        assert _row(l, temperature=t, seed=3) == 17
    assert _row(l, temperature=1.0, top_k=1, seed=4) == 17  # top-1 keeps the first rank only
    assert _row(l, temperature=1.0, top_p=1e-6, seed=5) == 17  # so does a tiny top-p


def test_nan_and_inf_rows():
    l = torch.full((64,), float("nan"))
    assert _row(l) == 0 and _row(l, temperature=0.0) == 0
    l = torch.full((64,), -float("inf"))
    l[9] = float("nan")
    assert _row(l, seed=1) == 0
    l[30] = -3.0
    assert all(_row(l, seed=s) == 30 for s in range(20))
    l[[40, 50]] = float("inf")
    assert {_row(l, seed=s) for s in range(40)} == {40, 50}
    assert _row(l, temperature=0.0) == 40


def test_ids_at_or_above_vlim_are_never_chosen():
    spec = st.bench_specs(FlintConfig.preset("tiny"), (8,))[-1]
    args = g.short_args(spec, 3, "cpu")
    ids = st.KERNEL.reference(spec, *args[:g.IDS])
    assert (ids < spec["VLIM"]).all() and (args[g.LOGITS][:, spec["VLIM"]:] == 30).all()


def test_seeded_draws_are_deterministic_and_move_with_the_position():
    l = torch.randn(512, generator=torch.Generator().manual_seed(6)).bfloat16()
    assert _row(l, seed=11, pos=3) == _row(l, seed=11, pos=3)
    assert len({_row(l, temperature=2.0, seed=11, pos=p) for p in range(30)}) > 10


def test_distribution_matches_filtered_probs():
    """Draws over 6000 positions against sampling.filtered_probs: total variation < 0.03."""
    gen = torch.Generator().manual_seed(7)
    l = (2 * torch.randn(1, 48, generator=gen)).bfloat16().float()
    for t, k, p in ((1.0, 0, 1.0), (0.8, 10, 0.9), (1.5, 0, 0.7)):
        n = 6000
        u = counter_uniform(torch.full((n,), 99), torch.arange(n))
        drawn = torch.tensor([st.reference_row(l[0], t, k, p, float(x)) for x in u])
        freq = torch.bincount(drawn, minlength=48).double() / n
        want = filtered_probs(l, torch.tensor([t]), torch.tensor([k]), torch.tensor([p]))[0]
        assert (freq[want == 0] == 0).all()
        assert 0.5 * (freq - want).abs().sum() < 0.03


def _f64_cuts(l, t, k, p):
    """sampling's float64 CDF of a row in rank order and its kept count."""
    _, _, cdf, kept = sampling._filter_sorted(l[None], torch.tensor([t]), torch.tensor([k]),
                                              torch.tensor([p]))
    return cdf[0], int(kept[0])


def test_agrees_with_sampling_sample():
    """Many random rows: the same token as sampling.sample, except where u * mass or top-p's
    threshold lies within 1e-5 relative of a step of sample's float64 CDF (the fp32 weights)."""
    gen = torch.Generator().manual_seed(8)
    b, v = 64, 2048
    logits = (3 * torch.randn(b, v, generator=gen)).bfloat16().float()
    pick = torch.randint(0, len(g.PARAMS), (b,), generator=gen)
    temp = torch.tensor([g.PARAMS[i][0] for i in pick], dtype=torch.float32)
    top_k = torch.tensor([g.PARAMS[i][1] for i in pick])
    top_p = torch.tensor([g.PARAMS[i][2] for i in pick], dtype=torch.float32)
    for draw in range(4):
        seeds, pos = torch.arange(b) + 1000 * draw, torch.full((b,), draw)
        want = sample(logits, temp, top_k, top_p, seeds, pos)
        u = counter_uniform(seeds, pos)
        for i in range(b):
            got = st.reference_row(logits[i], float(temp[i]), int(top_k[i]), float(top_p[i]),
                                   float(u[i]))
            if got == int(want[i]):
                continue
            cdf, kept = _f64_cuts(logits[i], float(temp[i]), int(top_k[i]), float(top_p[i]))
            mass = float(cdf[kept - 1])
            near_draw = ((cdf - float(u[i]) * mass).abs() <= 1e-5 * mass).any()
            near_p = ((cdf - float(top_p[i]) * float(cdf[-1])).abs() <= 1e-5 * mass).any()
            assert near_draw or near_p, f"row {i} draw {draw}: {got} vs sample's {int(want[i])}"


# -- a model of the kernel's algorithm -----------------------------------------------------------


def _key_of(bits):
    a = bits & 0x7FFF
    h = torch.where(a > 0x7F80, 0xFF80, torch.where(a == 0, 0, bits))
    return h ^ torch.where(h >> 15 == 1, 0xFFFF, 0x8000)


def _l_of(keys):
    b = torch.where(keys >= 0x8000, keys ^ 0x8000, keys ^ 0xFFFF)
    return (b << 16).to(torch.int32).view(torch.float32)  # int64 -> int32 keeps the low bits


def _q_of(keys, kmax, lmax, c):
    """The kernel's q_of: fp32 ops, then floor(p * 2^(40 + n)) by shifting p's mantissa."""
    f32 = torch.float32
    z = (_l_of(keys) - lmax) * c
    tt = z + torch.tensor(st.MAGIC, dtype=f32)
    f = z - (tt - torch.tensor(st.MAGIC, dtype=f32))
    p = torch.full_like(f, st.COEF[7])
    for ck in reversed(st.COEF[:7]):
        p = p * f + torch.tensor(ck, dtype=f32)
    pb = p.view(torch.int32).long() & 0xFFFFFFFF
    magic = torch.tensor(st.MAGIC, dtype=f32).view(torch.int32).long()
    s = (tt.view(torch.int32).long() - magic) + (pb >> 23) - 110
    m = (pb & 0x7FFFFF) | 0x800000
    q = torch.where(s >= 0, m << s.clamp(0, 40), m >> (-s).clamp(0, 63))
    q = torch.where(z >= st.LIVE_Z, q, 0)
    return torch.where(keys == kmax, st.Q_ONE, torch.where(keys > kmax, 0, q))


def _find(cnt, mass, target, by_mass):
    """The kernel's find over 256 entries walked from 255 down: (index, counts before, mass
    before, total count, total mass)."""
    order = torch.arange(255, -1, -1)
    cc, mm = cnt[order].cumsum(0), mass[order].cumsum(0)
    hit = ((mm if by_mass else cc) >= target).nonzero()
    assert hit.numel(), "every find of the kernel reaches its target"
    i = int(hit[0, 0])
    idx = int(order[i])
    return idx, int(cc[i] - cnt[idx]), int(mm[i] - mass[idx]), int(cc[-1]), int(mm[-1])


def topk_model(keys, kmax, ctas, per_cta, k, temperature, top_p, u) -> int:
    """The kernel's top-k path for one row (0 < k <= KFAST): each CTA's cut key from its bin
    and key counts, its candidates (every id above the cut, then the cut key's ids in id order
    up to k), the last CTA's sort of all candidates, the weights of the first k, top-p, draw."""
    cands = []
    for r in range(ctas):
        kr = keys[r * per_cta:(r + 1) * per_cta]
        ids = torch.arange(kr.numel()) + r * per_cta
        cnt = torch.bincount(kr, minlength=st.KEYS)
        bc = cnt.view(256, 256).sum(1)
        if int(bc.sum()) < k:
            chosen = ids
        else:
            hb, nb, _, _, _ = _find(bc, torch.zeros_like(bc), k, False)
            kc = cnt[hb * 256:hb * 256 + 256]
            x, nk, _, _, _ = _find(kc, torch.zeros_like(kc), k - nb, False)
            cut, above = hb * 256 + x, nb + nk
            assert int((kr > cut).sum()) == above < k <= above + int(kc[x])
            chosen = torch.cat([ids[kr > cut], ids[kr == cut][:k - above]])
        assert len(chosen) <= st.KFAST
        cands += [(int(keys[i]) << 32) | (0xFFFFFFFF - int(i)) for i in chosen]
    top = sorted(cands, reverse=True)[:k]
    lmax = _l_of(torch.tensor(kmax))
    c = torch.tensor(st.LOG2E, dtype=torch.float32) / temperature.float()
    q = _q_of(torch.tensor([v >> 32 for v in top]), kmax, lmax, c).tolist()
    cum = [sum(q[:r + 1]) for r in range(k)]
    kp = k
    if top_p < 1:
        thr = int(max(float(top_p), 0.0) * float(cum[-1]))
        kp = max(1, sum(1 for r in range(k) if cum[r] - q[r] < thr))
    m = cum[kp - 1]
    t = min(int(u * float(m)), m - 1)
    return 0xFFFFFFFF - (top[next(r for r in range(kp) if cum[r] > t)] & 0xFFFFFFFF)


def kernel_model(spec, logits, temperature, top_k, top_p, seeds, draw_index, *workspaces):
    """ids int64 [B] by the kernel's algorithm: each CTA's key counts and best, the last CTA's
    live bins, its walk over bins and keys, the owning CTA and the j-th token of the key."""
    vlim = spec["VLIM"]
    ctas, per_cta = st.split(vlim)[:2]
    u = counter_uniform(seeds, draw_index)
    out = []
    for b in range(logits.shape[0]):
        keys = _key_of(logits[b, :vlim].view(torch.int16).long() & 0xFFFF)
        gbest, local = 0, []
        for r in range(ctas):
            kr = keys[r * per_cta:(r + 1) * per_cta]
            local.append(torch.bincount(kr, minlength=st.KEYS))
            if kr.numel():
                best = int(((kr << 16) | (0xFFFF - torch.arange(kr.numel()))).max())
                gid = r * per_cta + 0xFFFF - (best & 0xFFFF)
                gbest = max(gbest, ((best >> 16) << 32) | (~gid & 0xFFFFFFFF))
        kmax = gbest >> 32
        if not float(temperature[b]) > 0 or kmax == st.KEY_NEG_INF:
            out.append(0xFFFFFFFF - (gbest & 0xFFFFFFFF))
            continue
        if 0 < int(top_k[b]) <= st.KFAST and int(top_k[b]) < vlim:
            out.append(topk_model(keys, kmax, ctas, per_cta, int(top_k[b]), temperature[b],
                                  top_p[b], float(u[b])))
            continue
        total = sum(local)
        lmax = _l_of(torch.tensor(kmax))
        c = torch.tensor(st.LOG2E, dtype=torch.float32) / temperature[b].float()
        q = _q_of(torch.arange(st.KEYS), kmax, lmax, c)
        h = torch.arange(st.BINS)
        ztop = (_l_of(h * 256 + 255) - lmax) * c
        live = (total.view(256, 256).sum(1) > 0) & ((h == kmax >> 8)
                                                     | ((h < kmax >> 8) & (ztop >= st.LIVE_Z)))
        bc = torch.where(live, total.view(256, 256).sum(1), 0)
        bm = torch.where(live, (total * q).view(256, 256).sum(1), 0)

        def locate(target, by_mass, bc=bc, bm=bm, total=total, q=q):
            hh, nb, mb, _, _ = _find(bc, bm, target, by_mass)
            kc, kq = total[hh * 256:hh * 256 + 256], q[hh * 256:hh * 256 + 256]
            x, nk, mk, _, _ = _find(kc, kc * kq, target - (mb if by_mass else nb), by_mass)
            return hh * 256 + x, nb + nk, mb + mk, int(kq[x])

        _, _, _, n_live, mass_k = _find(bc, bm, 1, False)
        k = int(top_k[b])
        kk = k if 0 < k < vlim else vlim
        if kk < n_live:
            _, nb, mb, qk = locate(kk, False)
            mass_k = mb + (kk - nb) * qk
        kp, mass = kk, mass_k
        p = float(top_p[b])
        if p < 1:
            thr = int(max(p, 0.0) * float(mass_k))
            kp = 1
            if thr > 0:
                _, nb, mb, qk = locate(thr, True)
                kp = nb + (thr - mb + qk - 1) // qk
            if kp != kk:
                _, nb, mb, qk = locate(kp, False)
                mass = mb + (kp - nb) * qk
        t = min(int(float(u[b]) * float(mass)), mass - 1)
        kstar, nb, mb, qk = locate(t + 1, True)
        j = (t - mb) // qk
        for r in range(ctas):  # the owner, from part[kstar][r]
            n = int(local[r][kstar])
            if j < n:
                ids = (keys[r * per_cta:(r + 1) * per_cta] == kstar).nonzero()[:, 0]
                out.append(r * per_cta + int(ids[j]))
                break
            j -= n
    return torch.tensor(out, dtype=torch.int64)


def test_kernel_weights_equal_the_reference_weights():
    gen = torch.Generator().manual_seed(9)
    for t in (0.05, 1.0, 7.0):
        l = (4 * torch.randn(20000, generator=gen)).bfloat16()
        keys = _key_of(l.view(torch.int16).long() & 0xFFFF)
        kmax = int(keys.max())
        c = torch.tensor(st.LOG2E, dtype=torch.float32) / torch.tensor(t, dtype=torch.float32)
        got = _q_of(keys, kmax, _l_of(torch.tensor(kmax)), c)
        assert torch.equal(got, st.weights(l.float(), l.float().max(), t))


def _model_cases():
    out = []
    for preset in PRESETS:
        for b in (1, 8):
            spec = g._spec(preset, b)
            for seed in range(3):
                out += [(spec, g.mixed_args(spec, seed, "cpu", shift=seed)),
                        (spec, g.tie_args(spec, 10 + seed, "cpu")),
                        (spec, g.special_args(spec, 20 + seed, "cpu"))]
                out.append((spec, g.topk_args(spec, 40 + seed, "cpu")))
            short = g._spec(preset, b, short=True)
            out.append((short, g.short_args(short, 30, "cpu")))
    return out


def test_kernel_model_matches_the_reference():
    """The kernel's algorithm (modelled in torch) picks the reference's id on every GPU test
    case: random rows with every parameter mix, ties, NaN / inf rows, wide rows, VLIM < V."""
    for spec, args in _model_cases():
        want = st.KERNEL.reference(spec, *args[:g.IDS])
        got = kernel_model(spec, *args[:g.IDS])
        assert torch.equal(got, want), f"{spec.id}: model {got.tolist()}, ref {want.tolist()}"


def test_wide_rows_exceed_the_staged_bins():
    """special_args' wide pattern has more live bins than the last CTA stages (its slow path)."""
    spec = g._spec("full", 8)
    args = g.special_args(spec, 1, "cpu")
    row = args[g.LOGITS][4]  # pattern (4 + 1) % 6 = 5: wide
    keys = _key_of(row.view(torch.int16).long() & 0xFFFF)
    assert len(torch.unique(keys >> 8)) > st.STAGED


# -- the GPU test's builders and checks, dry-run with reference outputs --------------------------


def _fake_kernel(spec, args):
    args[g.IDS].copy_(st.KERNEL.reference(spec, *args[:g.IDS]))


def test_gpu_checks_pass_on_reference_outputs():
    for spec, args in _model_cases()[:12]:
        _fake_kernel(spec, args)
        g.check_outputs(spec, args)


def test_gpu_checks_catch_wrong_outputs():
    spec = g._spec("tiny", 4)
    for corrupt in ("id", "unwritten", "workspace"):
        args = g.mixed_args(spec, 5, "cpu")
        _fake_kernel(spec, args)
        if corrupt == "id":
            args[g.IDS][1] = (args[g.IDS][1] + 1) % spec["VLIM"]
        elif corrupt == "unwritten":
            args[g.IDS][2] = -7
        else:
            args[g.WORKSPACES[-1]][0, 5] = 1
        with pytest.raises(AssertionError):
            g.check_outputs(spec, args)


# -- the compile ---------------------------------------------------------------------------------


@pytest.mark.skipif(dsl_version() is None, reason="needs nvidia-cutlass-dsl")
def test_compiles_for_sm90a():
    """B = 1 and 8 of the full config's specs and the short-vocab variant: one kernel, the
    declared parameter layout (compile_spec checks it), PDL wait with no load before it, no
    spills. (Every config's model specs compile in tests/test_kernel_cache.py.)"""
    from flint_graph.kernels.toolchain.build import compile_spec

    cfg = FlintConfig.preset("full")
    for spec in st.bench_specs(cfg, (1, 8)):
        meta, _ = compile_spec(st.KERNEL, spec, "sm_90a")
        assert meta["pdl_wait"] and meta["plain_loads_before_wait"] == 0, spec.id
        sass = meta["sass_load_order"]
        assert sass is None or sass["plain_loads_before_wait"] == 0, spec.id
        assert not meta["local_memory"], f"{spec.id} spills"
        assert meta["reqntid"] == [st.NT, 1, 1]
        assert meta["launch"]["smem"] + meta["static_smem"] <= 227 * 1024
    assert math.isfinite(meta["build_s"])
