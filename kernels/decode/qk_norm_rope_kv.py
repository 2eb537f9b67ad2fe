"""Per-head Q/K RMSNorm, RoPE and the KV-cache write of one decode step (kernel 3 of
docs/decode-kernels.md).

Input: the fused QKV projection's output qkv bf16 [B, (HQ + 2·HKV)·D], per row the HQ query
heads, then the HKV key heads, then the HKV value heads (D elements each).
For each batch row b (one new token at position p = positions[b]): every query and key head is
RMS-normed over D (fp32, rounded once to bf16: `reference.rms_norm` per head), then, when
ROPE = 1, rotated by `reference.apply_rope` (HF rotate-half, out = x·cos + cat(−x₂, x₁)·sin in
fp32 from that bf16 value, rounded once). Queries go to q_out [B, HQ, D]; the key and the
unchanged value go into the caches at the entry of position p: page table[b, 0] (RING = 1, a
sliding layer's ring of P = W entries) or table[b, p // P] (paged full layer), entry p % P, for
every KV head. Nothing else in the caches changes, so `_reference` returns q_out and the
written key and value entries [B, HKV, D] (`cache_entry` says where they go).

Angles follow `reference.rope_cos_sin`: p · inv_freq[i] in fp64 (the same product, bit for
bit: inv_freq is the fp64 table the reference builds), cos/sin rounded to fp32. An fp32 angle
would be off by ~0.016 rad at p = 262,143. The kernel reduces the fp64 angle by k·π/2
(k = rint(angle·2/π); π/2 in three parts of ≤ 33 bits, so each k·part is exact for
k < 2^20, i.e. any position below ~1.6M) and evaluates sin/cos of the remainder (|r| ≤ π/4)
with fp64 Taylor polynomials (truncation < 1e-16), then picks and signs them by k mod 4: the
fp32 cos/sin equal the reference's except where the fp64 value sits within ~1e-16 of an fp32
rounding boundary. No libdevice sin/cos (their huge-argument path uses local memory).

Design: one warp per head: grid (HQ + 2·HKV, B), 32 threads. Block x < HQ is query head x,
then the HKV key heads, then the HKV value heads (a plain copy): block x reads head x of
qkv. RoPE pairs element i with
i + D/2, so lane l owns the E consecutive elements l·E … of each half (E = max(2, D/64);
D = 32 uses 8 lanes, D = 128 all 32 with 4-byte loads) and rotates its pairs without a
shuffle; the sum of squares is a butterfly shuffle.
PDL: q_norm, k_norm and inv_freq (weights) are loaded with volatile ld.global.nc before
griddepcontrol.wait (`dsl_util.griddepcontrol_wait_after_loads` keeps them above it in SASS);
qkv, positions and table are read only after it, in every thread.
Shape legend: B batch bucket, HQ query heads, HKV KV heads, D head dim, P page size (full
layers) or ring length W (sliding layers), NB pages (or ring slots), T pages per row.

Tolerance (GPU test): q_out and the written key within rel. 1e-2 of the reference, and at
most 1% of their elements different at all. Both sides round at the same points (the bf16
norm output, the bf16 rotated output) and use the same fp32 cos/sin, so they differ only where
the fp32 sum-of-squares order, the hardware rsqrt (~2 ulp fp32) or fma contraction in the
rotation flips a bf16 rounding (~1e-4 of the elements); an fp32 angle would change ~10% of
them. The value entry is a copy: bit-exact. Every other cache entry must be untouched.
"""

import math

import torch

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import (BUCKETS, KV_PAGE, KernelDef, Launch, ScalarArg, Spec,
                                      TensorArg, unique_specs)

# π/2 as three parts of ≤ 33 significant bits (fdlibm's split; their sum is π/2 − 8.5e-32):
# k·part is exact in fp64 for k < 2^20, so the reduction rounds only its last two subtractions.
PIO2 = (float.fromhex("0x1.921fb544p+0"), float.fromhex("0x1.0b4611a6p-34"),
        float.fromhex("0x1.3198a2ep-69"))
TWO_OVER_PI = 2.0 / math.pi
# The prefill build's warps per CTA, one head each (a CTA per head and row, as decode has it,
# made an 8K chunk 327K one-warp CTAs: 395 µs per layer on the H200, latency-bound)
PREFILL_WARPS = 8


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
# Taylor coefficients on |r| ≤ π/4: sin r = r + r³·Σ SIN[n]·r^(2n) (to r^15),
# cos r = 1 + r²·Σ COS[n]·r^(2n) (to r^16); truncation below 5e-17.
SIN_COEFS = tuple((-1) ** n / math.factorial(2 * n + 1) for n in range(1, 8))
COS_COEFS = tuple((-1) ** n / math.factorial(2 * n) for n in range(1, 9))


def lane_split(d: int) -> tuple[int, int]:
    """(E, lanes) for head dim d: each of `lanes` lanes owns E elements of each half of D.

    Raises ValueError for a head dim the lane mapping cannot cover with aligned loads."""
    half = d // 2
    if d % 4 or not (half <= 64 or half in (128, 256)):
        raise ValueError(f"qk_norm_rope_kv: head_dim {d}; expected a multiple of 4 up to 128, "
                         f"or 256 or 512")
    e = max(2, half // 32)
    return e, half // e


def rope_inv_freq(head_dim: int, theta: float, device="cpu") -> torch.Tensor:
    """inv_freq f64 [D/2] = θ^(−2i/D), exactly as `reference.rope_cos_sin` computes it (the
    engine's weight for this kernel, so the kernel's fp64 angles equal the reference's)."""
    i = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)
    return theta ** (-i / head_dim)


def _args(spec: Spec):
    b, hq, hkv, d, p = spec["B"], spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    return (TensorArg("qkv", "bf16", (b, (hq + 2 * hkv) * d), "input"),
            TensorArg("positions", "i32", (b,), "input", align=4),
            TensorArg("table", "i32", (b, "T"), "input", align=4),
            TensorArg("q_norm", "bf16", (d,), "weight"),
            TensorArg("k_norm", "bf16", (d,), "weight"),
            TensorArg("inv_freq", "f64", (d // 2,), "weight"),
            TensorArg("q_out", "bf16", (b, hq, d), "output"),
            TensorArg("k_cache", "bf16", ("NB", hkv, p, d), "output"),
            TensorArg("v_cache", "bf16", ("NB", hkv, p, d), "output"),
            ScalarArg("eps", "f32"))


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(spec["HQ"] + 2 * spec["HKV"], spec["B"], 1), block=(32, 1, 1))


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """Per bucket: the sliding-layer kind (RING = 1, P = window) and the full-layer kind
    (RING = 0, P = KV_PAGE), each as the config's layers of that kind have them."""
    if not cfg.qk_norm:
        raise ValueError("qk_norm_rope_kv: the config has qk_norm = False; this kernel "
                         "applies the per-head Q/K RMSNorm (expected qk_norm = True)")
    lane_split(cfg.head_dim)
    kinds: list[tuple[int, int, int]] = []  # (RING, P, ROPE), sliding first
    for ring in (1, 0):
        for i in range(cfg.num_hidden_layers):
            if cfg.is_sliding(i) == bool(ring):
                kind = (ring, cfg.sliding_window if ring else KV_PAGE, int(cfg.uses_rope(i)))
                if kind not in kinds:
                    kinds.append(kind)
    return unique_specs([KERNEL.spec(B=b, HQ=cfg.num_attention_heads,
                                     HKV=cfg.num_key_value_heads, D=cfg.head_dim, P=p,
                                     RING=ring, ROPE=rope)
                         for b in buckets for ring, p, rope in kinds])


def _theta(inv_freq: torch.Tensor, d: int) -> float:
    """The θ whose `rope_inv_freq` table is `inv_freq` (the reference ops take θ). An integer
    θ is recovered exactly; raises ValueError when no θ gives the table."""
    want = inv_freq.detach().double()  # compared on its own device: pow may differ by an ulp
    guess = float(want[1]) ** (-d / 2)
    for theta in (float(round(guess)), guess):
        if torch.equal(rope_inv_freq(d, theta, want.device), want):
            return theta
    if torch.allclose(rope_inv_freq(d, guess, want.device), want, rtol=1e-12, atol=0):
        return guess
    raise ValueError("qk_norm_rope_kv: inv_freq is not θ^(−2i/D) for any θ")


def _reference(spec: Spec, qkv, positions, table, q_norm, k_norm, inv_freq, eps: float):
    """qkv [B, (HQ + 2·HKV)·D] holds the q heads, then the k heads, then the v heads. (q_out bf16 [B, HQ, D], the written key entries bf16 [B, HKV, D], the written value
    entries bf16 [B, HKV, D]). The caches are updated in place, so the reference gives the
    entries row b writes at (`cache_entry`); every other cache entry must be unchanged."""
    b, hq, hkv, d = spec["B"], spec["HQ"], spec["HKV"], spec["D"]
    q, k, v = qkv.view(b, hq + 2 * hkv, d).split((hq, hkv, hkv), dim=1)
    qn = reference.rms_norm(q.view(b, hq, d), q_norm, eps)
    kn = reference.rms_norm(k.view(b, hkv, d), k_norm, eps)
    if spec["ROPE"]:
        theta, pos = _theta(inv_freq, d), positions.long()
        qn, kn = reference.apply_rope(qn, pos, theta), reference.apply_rope(kn, pos, theta)
    return qn, kn, v.clone()


def cache_entry(spec: Spec, positions: torch.Tensor,
                table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(page int64 [B], entry int64 [B]): where row b's new key and value go."""
    pos = positions.long()
    rows = torch.arange(pos.shape[0], device=pos.device)
    col = torch.zeros_like(pos) if spec["RING"] else pos // spec["P"]
    return table.long()[rows, col], pos % spec["P"]


def make_args(spec: Spec, *, gen: torch.Generator, device="cuda", positions=None,
              max_position: int = 4096, spare_pages: int = 3, theta: float = 10000.0,
              eps: float = 1e-5) -> list:
    """One fresh argument list in declared order. positions: a list of B ints (default:
    random in [0, max_position)). Paged (RING = 0): T = the most pages a row needs, every
    table entry a distinct page of NB = B·T + spare_pages, shuffled; ring: NB = B +
    spare_pages slots, each row its own. qkv ~ N(0, 1) (the fused projection's output); q_norm,
    k_norm like the synthetic checkpoints (√2·(1 + 0.05·N(0, 1))); inv_freq for `theta`;
    q_out and both caches NaN."""
    b, hq, hkv, d, p = spec["B"], spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    on = gen.device
    if positions is None:
        pos = torch.randint(0, max_position, (b,), generator=gen, device=on)
    else:
        pos = torch.tensor(list(positions), dtype=torch.int64, device=on)
        if pos.shape != (b,) or int(pos.min()) < 0:
            raise ValueError(f"positions {list(positions)}: expected {b} values ≥ 0")
    t = 1 if spec["RING"] else int(pos.max()) // p + 1
    nb = b * t + spare_pages
    table = torch.randperm(nb, generator=gen, device=on)[:b * t].view(b, t)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=on).to(torch.bfloat16).to(device)

    def norm_w():
        w = math.sqrt(2.0) * (1.0 + 0.05 * torch.randn(d, generator=gen, device=on))
        return w.to(torch.bfloat16).to(device)

    def nan(*shape):
        return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)

    return [randn(b, (hq + 2 * hkv) * d),
            pos.to(torch.int32).to(device), table.to(torch.int32).to(device),
            norm_w(), norm_w(), rope_inv_freq(d, theta, device),
            nan(b, hq, d), nan(nb, hkv, p, d), nan(nb, hkv, p, d), eps]


def bytes_moved(spec: Spec, args) -> int:
    """Least DRAM bytes of one launch: qkv, positions, one table entry per row and the
    weights read; q_out and one key and one value entry per row and KV head written."""
    b, hq, hkv, d = spec["B"], spec["HQ"], spec["HKV"], spec["D"]
    acts = b * (hq + 2 * hkv) * d * 2  # qkv in
    outs = b * (hq + 2 * hkv) * d * 2  # q_out, key and value entries out
    weights = 2 * d * 2 + (d // 2 * 8 if spec["ROPE"] else 0)
    return acts + outs + weights + b * 4 * 2


def cos_sin_f64(pos, freq):
    """DSL (trace-time) helper: fp32 (cos, sin) of the fp64 angle pos·freq (pos an Int32,
    freq a Float64; the module docstring gives the reduction and its error). Shared with
    attn_decode's folded form (QKN = 1), so the decode and prefill angles are one routine."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Float64, Int32

    a = Float64(pos) * freq
    k = cute.math.roundeven(a * Float64(TWO_OVER_PI))
    r = a - k * Float64(PIO2[0])
    r = r - k * Float64(PIO2[1])
    r = r - k * Float64(PIO2[2])
    r2 = r * r
    sp = Float64(SIN_COEFS[-1])
    for c in reversed(SIN_COEFS[:-1]):
        sp = sp * r2 + Float64(c)
    cp = Float64(COS_COEFS[-1])
    for c in reversed(COS_COEFS[:-1]):
        cp = cp * r2 + Float64(c)
    s = r + r * r2 * sp
    c = Float64(1.0) + r2 * cp
    quad = Int32(k) & 3
    odd = (quad & 1) != 0
    sn = cutlass.select_(odd, c, s)
    cs = cutlass.select_(odd, s, c)
    sn = cutlass.select_((quad & 2) != 0, -sn, sn)
    cs = cutlass.select_(((quad + 1) & 2) != 0, -cs, cs)
    return Float32(cs), Float32(sn)


def _build(spec: Spec):
    return build(spec, prefill=False)


def build(spec: Spec, prefill: bool):
    """The jit function of the decode kernel (`spec` has B, P, RING), or with `prefill` of
    kernels/prefill/qk_norm_rope.py: rows from the qkv tensor's extent, no table, keys and
    values stored to contiguous k_out / v_out [T, HKV, D] (the prefill writes its cache after
    attention)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Float64, Int32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    hq, hkv, d = spec["HQ"], spec["HKV"], spec["D"]
    p = 1 if prefill else spec["P"]
    ring, rope = prefill or bool(spec["RING"]), bool(spec["ROPE"])
    e, lanes = lane_split(d)
    half = d // 2
    ragged = lanes < 32  # small heads: lanes ≥ `lanes` idle

    def load_norm_w(m, ln):
        """The lane's elements of a norm weight [D] as bf16 bits [[half 0], [half 1]]
        (volatile ld.global.nc: they stay where they are written, before the wait)."""
        base = m.iterator.toint() + Int64(ln) * (2 * e)
        return [[du.ld_weight_u16(base + 2 * (hf * half + i)) for i in range(e)]
                for hf in range(2)]

    page_elems = hkv * p * d
    page_align = min(16, page_elems * 2 & -(page_elems * 2))  # the caches are 16-byte aligned

    def page_chunks(m, page):
        """Page `page` of a cache [NB, HKV, P, D] in E-element chunks (1, 1, E, HKV, P, D/E).
        Its offset is taken in 64 bits: a layer's cache may exceed 2^31 elements, where the
        DSL's int32 index arithmetic (NB is an int32 extent) would wrap."""
        addr = m.iterator.toint() + Int64(page) * (2 * page_elems)
        ptr = cute.make_ptr(BFloat16, addr, cute.AddressSpace.gmem, assumed_align=page_align)
        t = cute.make_tensor(ptr, cute.make_layout((hkv, p, d), stride=(p * d, d, 1)))
        return cute.flat_divide(t, (1, 1, e))

    def widen(bits):
        return [[du.as_f32(w << 16) for w in row] for row in bits]  # bf16 bits -> fp32

    def norm_rope(rx, w, freqs, pos, lane, eps, cs=None):
        """bf16 registers (E, 2) -> fp32 [[half 0], [half 1]] of rope(bf16(rmsnorm(x))); `cs`:
        the lane's E (cos, sin) pairs already computed (the prefill's shared table), else
        computed here from `freqs`."""
        x = [[rx[i, hf].to(Float32) for i in range(e)] for hf in range(2)]
        ss = Float32(0.0)
        for hf in range(2):
            for i in range(e):
                ss = ss + x[hf][i] * x[hf][i]
        if cutlass.const_expr(ragged):
            ss = cutlass.select_(lane < lanes, ss, Float32(0.0))
        for sh in range(5):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=16 >> sh)
        rstd = cute.math.rsqrt(ss / Float32(d) + eps)
        y = [[((x[hf][i] * rstd) * w[hf][i]).to(BFloat16).to(Float32) for i in range(e)]
             for hf in range(2)]
        if cutlass.const_expr(not rope):
            return y
        out = [[None] * e, [None] * e]
        for i in range(e):
            c, s = cos_sin_f64(pos, freqs[i]) if cs is None else cs[i]
            out[0][i] = y[0][i] * c + (-y[1][i]) * s
            out[1][i] = y[1][i] * c + y[0][i] * s
        return out

    def kv_slot(m, page, entry, kv, c):
        """E-element chunk c of KV head kv's entry: of page `page`, entry `entry` of a cache
        (decode), or of row `page` of the contiguous k_out / v_out [T, HKV, D] (prefill)."""
        if cutlass.const_expr(prefill):
            return cute.flat_divide(m, (1, 1, e))[0, 0, None, page, kv, c]
        return page_chunks(m, page)[0, 0, None, kv, entry, c]

    # the prefill's rotations come from a table of the row's D/2 (cos, sin) that the CTA
    # computes once (thread i: frequency i), not from each head's warp: the fp64 angle
    # reduction is ~96 fp64 instructions a lane and head, and 36 rotated heads made a sliding
    # layer's qk_norm_rope fp64-bound (~58 µs of the H100's fp64 pipe at 8K tokens, against
    # ~55 µs of copying)
    shared_table = prefill and rope

    @cute.jit
    def body(mqkv: cute.Tensor, mpos: cute.Tensor, mtab: cute.Tensor, mqn: cute.Tensor,
             mkn: cute.Tensor, mfreq: cute.Tensor, mqo: cute.Tensor, mkc: cute.Tensor,
             mvc: cute.Tensor, eps: cutlass.Float32, head: Int32, row: Int32,
             sub: Int32, tab: Uint32):
        lane, _, _ = cute.arch.thread_idx()
        ln = cutlass.min(lane, lanes - 1) if cutlass.const_expr(ragged) else lane
        # PDL prologue: weights only
        wq_bits, wk_bits = load_norm_w(mqn, ln), load_norm_w(mkn, ln)
        rf = cute.make_rmem_tensor((2 * e,), Uint32)  # the lane's E fp64 inv_freq, as words
        tid = sub * 32 + lane
        if cutlass.const_expr(shared_table):  # this thread's frequency of the table
            fa = mfreq.iterator.toint() + Int64(cutlass.min(tid, half - 1)) * 8
            rf[0] = du.ld_weight_u32(fa)
            rf[1] = du.ld_weight_u32(fa + 4)
        elif cutlass.const_expr(rope):
            fbase = mfreq.iterator.toint() + Int64(ln) * (8 * e)
            for j in cutlass.range_constexpr(e // 2):
                words = du.ld_weight_v4(fbase + 16 * j)
                for i in cutlass.range_constexpr(4):
                    rf[4 * j + i] = words[i]
        du.griddepcontrol_wait_after_loads()  # a bare wait would be hoisted above the loads
        cute.arch.griddepcontrol_launch_dependents()

        freqs = [None] * e
        cs = None
        if cutlass.const_expr(shared_table):
            if tid < half:
                c0, s0 = cos_sin_f64(mpos[row], cute.recast_tensor(rf, Float64)[0])
                du.st_shared_u32(tab + Uint32(tid * 8), du.f32_bits(c0))
                du.st_shared_u32(tab + Uint32(tid * 8 + 4), du.f32_bits(s0))
            cute.arch.sync_threads()
            cs = [(du.as_f32(du.ld_shared_u32(tab + Uint32((ln * e + i) * 8))),
                   du.as_f32(du.ld_shared_u32(tab + Uint32((ln * e + i) * 8 + 4))))
                  for i in range(e)]
        elif cutlass.const_expr(rope):
            rf64 = cute.recast_tensor(rf, Float64)
            freqs = [rf64[i] for i in range(e)]
        ld = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16, num_bits_per_copy=16 * e)
        st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16,
                                 num_bits_per_copy=16 * e)
        rx = cute.make_rmem_tensor((e, 2), BFloat16)
        ro = cute.make_rmem_tensor((e, 2), BFloat16)
        live = lane < lanes
        pos = mpos[row]
        gqkv = cute.flat_divide(mqkv, (1, e))  # (1, E, B, (HQ + 2·HKV)·D/E); head x at x·D/E
        if head < hq:
            for hf in cutlass.range_constexpr(2):
                cute.copy(ld, gqkv[0, None, row, head * (d // e) + hf * lanes + ln],
                          rx[None, hf])
            y = norm_rope(rx, widen(wq_bits), freqs, pos, lane, eps, cs)
            for hf in cutlass.range_constexpr(2):
                for i in cutlass.range_constexpr(e):
                    ro[i, hf] = y[hf][i].to(BFloat16)
            gqo = cute.flat_divide(mqo, (1, 1, e))  # (1, 1, E, B, HQ, D/E)
            if cutlass.const_expr(not ragged) or live:
                for hf in cutlass.range_constexpr(2):
                    cute.copy(st, ro[None, hf], gqo[0, 0, None, row, head, hf * lanes + ln])
        else:
            page, entry = row, Int32(0)
            if cutlass.const_expr(not prefill):
                col = Int32(0) if cutlass.const_expr(ring) else pos // p
                page = mtab[row, col]
                entry = pos % p
            kv = head - hq
            if kv < hkv:
                for hf in cutlass.range_constexpr(2):
                    cute.copy(ld, gqkv[0, None, row, head * (d // e) + hf * lanes + ln],
                              rx[None, hf])
                y = norm_rope(rx, widen(wk_bits), freqs, pos, lane, eps, cs)
                for hf in cutlass.range_constexpr(2):
                    for i in cutlass.range_constexpr(e):
                        ro[i, hf] = y[hf][i].to(BFloat16)
                if cutlass.const_expr(not ragged) or live:
                    for hf in cutlass.range_constexpr(2):
                        cute.copy(st, ro[None, hf], kv_slot(mkc, page, entry, kv,
                                                            hf * lanes + ln))
            elif kv < 2 * hkv:  # (the prefill's last CTA may have warps past the heads)
                kv = kv - hkv
                for hf in cutlass.range_constexpr(2):
                    cute.copy(ld, gqkv[0, None, row, head * (d // e) + hf * lanes + ln],
                              rx[None, hf])
                if cutlass.const_expr(not ragged) or live:
                    for hf in cutlass.range_constexpr(2):
                        cute.copy(st, rx[None, hf], kv_slot(mvc, page, entry, kv,
                                                            hf * lanes + ln))

    if prefill:
        @cute.kernel
        def qk_norm_rope_kernel(mqkv: cute.Tensor, mpos: cute.Tensor, mqn: cute.Tensor,
                                mkn: cute.Tensor, mfreq: cute.Tensor, mqo: cute.Tensor,
                                mko: cute.Tensor, mvo: cute.Tensor, eps: cutlass.Float32):
            group, row, _ = cute.arch.block_idx()
            _, sub, _ = cute.arch.thread_idx()
            head = group * PREFILL_WARPS + sub
            tab = Uint32(0)
            if cutlass.const_expr(shared_table):
                tab = du.smem_addr(cutlass.memory.SmemAllocator().allocate_tensor(
                    Float32, cute.make_layout((d,)), byte_alignment=16))
            # every warp enters: with the table, all of them meet at its barrier; one past
            # the heads does nothing else
            body(mqkv, mpos, mpos, mqn, mkn, mfreq, mqo, mko, mvo, eps, head, row, sub, tab)

        @cute.jit
        def qk_norm_rope(mqkv: cute.Tensor, mpos: cute.Tensor, mqn: cute.Tensor,
                         mkn: cute.Tensor, mfreq: cute.Tensor, mqo: cute.Tensor,
                         mko: cute.Tensor, mvo: cute.Tensor, eps: cutlass.Float32,
                         stream: cuda.CUstream):
            qk_norm_rope_kernel(mqkv, mpos, mqn, mkn, mfreq, mqo, mko, mvo, eps).launch(
                grid=(ceil_div(hq + 2 * hkv, PREFILL_WARPS), mqkv.shape[0], 1),
                block=[32, PREFILL_WARPS, 1], smem=4 * d if shared_table else 0,
                stream=stream, use_pdl=True)

        return qk_norm_rope

    @cute.kernel
    def qk_norm_rope_kv_kernel(mqkv: cute.Tensor, mpos: cute.Tensor, mtab: cute.Tensor,
                               mqn: cute.Tensor, mkn: cute.Tensor, mfreq: cute.Tensor,
                               mqo: cute.Tensor, mkc: cute.Tensor, mvc: cute.Tensor,
                               eps: cutlass.Float32):
        head, row, _ = cute.arch.block_idx()
        body(mqkv, mpos, mtab, mqn, mkn, mfreq, mqo, mkc, mvc, eps, head, row,
             Int32(0), Uint32(0))

    launch = _launch(spec)

    @cute.jit
    def qk_norm_rope_kv(mqkv: cute.Tensor, mpos: cute.Tensor, mtab: cute.Tensor,
                        mqn: cute.Tensor, mkn: cute.Tensor, mfreq: cute.Tensor,
                        mqo: cute.Tensor, mkc: cute.Tensor, mvc: cute.Tensor,
                        eps: cutlass.Float32, stream: cuda.CUstream):
        qk_norm_rope_kv_kernel(mqkv, mpos, mtab, mqn, mkn, mfreq, mqo, mkc, mvc,
                               eps).launch(grid=launch.grid, block=launch.block,
                                           smem=launch.smem, stream=stream, use_pdl=True)

    return qk_norm_rope_kv


KERNEL = KernelDef(name="qk_norm_rope_kv", args=_args, launch=_launch, specs=_specs,
                   build=_build, reference=_reference, source_files=("toolchain/dsl_util.py",))
