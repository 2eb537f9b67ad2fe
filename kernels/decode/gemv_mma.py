"""Tensor-core building blocks of the NVFP4 GEMV (gemv_nvfp4.py), and its V>=3 kernel.

Imports the DSL only inside functions (the GPU box reads gemv_nvfp4.py's declarations without
it). `frag_ops` is the fragment math of every mma variant (V=1/2 and V>=3 alike); the module
docstring of gemv_nvfp4.py explains the bit tricks.

`kernel_pw` (V>=3) generalises V=1/2 in three ways:
  * pre-wait dequantisation: the first `pre` weight steps of a lane are loaded AND dequantised
    (codes -> bf16x2 A fragments, times the block scale) before griddepcontrol.wait; it is
    weight-only math, x is still read only after the wait. After the wait a pre-dequantised
    step costs its x loads, 16 PRMT and 8 HMMA per lane; later steps stream as before;
  * `tiles` m16 tiles per CTA (16 * tiles rows) share each x load and x PRMT (B fragments);
  * split-K epilogue: each warp stores its fp32 16x8 tile(s) once, at a slot rotated per lane
    (conflict-free STS); each output (row, batch column) then has its `warps` partials
    contiguous, and one thread loads them with warps/4 LDS.128, undoes the rotation (selects)
    and sums them in warp order. The order matters: the rotation depends on the batch column,
    so summing in slot order gave a row other roundings in other batch positions (found by the
    batch-invariance test on the full NVFP4 config: one o-projection output off by an ulp).
The HMMA chain of a step is split over 4 accumulator sets (2 per tile when tiles = 2).

`row_rstd` and `normed` are the NORM=1 prologue of the fused QKV GEMVs (gemv_nvfp4 and
gemv_bf16 V=1/2): the attention RMSNorm of x folded into the x loads.
"""

import math


def frag_ops():
    """(dequant, xpairs, scales): the per-register fragment math, as DSL functions."""
    from cutlass import Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    mask_out = 0x81C081C0  # bf16x2: sign 15 and magnitude bits 6..8, both halves
    two120, two119 = 0x7B807B80, 0x7B007B00  # bf16x2 (2^120, 2^120), (2^119, 2^119)

    def dequant(w):
        """u32 of 8 codes (k = 0..7) -> 4 bf16x2 e2m1·2^-126 pairs (k, k+4), k = 0..3."""
        e = du.select_bits(w, w << 6, 0x00770077)  # mags of k 0,1 at 0-2,4-6; signs at 9,13
        f = du.select_bits(w >> 6, w, 0x01DC01DC)  # mags of k 2,3 at 2-4,6-8; signs 11,15
        return ((e << 6) & mask_out, (e << 2) & mask_out, (f << 4) & mask_out, f & mask_out)

    def xpairs(x4):
        """4 u32 of x (k 0..7, natural pairs) -> 4 bf16x2 pairs (k, k+4), k = 0..3."""
        return (du.prmt(x4[0], x4[2], 0x5410), du.prmt(x4[0], x4[2], 0x7632),
                du.prmt(x4[1], x4[3], 0x5410), du.prmt(x4[1], x4[3], 0x7632))

    def scales(sw):
        """u32 [s0, s1] of row g then row g+8 -> per row a bf16x2 (sc0, sc1), sc = e4m3·2^119."""
        top = du.and_not((sw & 0x7F7F7F7F) + 0x01010101, sw, 0x80808080)  # bit 7: byte is 0x7F
        sw = du.and_not(sw, du.prmt(top, sw, 0xBA98), 0x7F7F7F7F)  # 0x7F -> 0; bit 7 ignored
        out = []
        for sel in (0x4140, 0x4342):  # bytes (0, 1) for row g, (2, 3) for row g+8
            d = du.prmt(sw, Uint32(0), sel) << 4  # bf16x2 e4m3·2^-120 (exact, subnormals too)
            out.append(du.mul_bf16x2(du.mul_bf16x2(d, Uint32(two120)), Uint32(two119)))
        return out

    return dequant, xpairs, scales


def row_rstd(alloc, mx, eps, b_rows: int, k: int, warps: int, bx):
    """The NORM=1 prologue (after griddepcontrol.wait): every thread of the CTA returns
    rstd = rsqrt(Σ_k x[bx, k]² / K + eps) of its batch row bx (fp32, as `reference.rms_norm`;
    only the summation order differs). The CTA reads all B rows of x (L2) once: each thread
    takes 8-k vectors tidx, tidx + 32·warps, ... of every row, a butterfly shuffle sums each
    warp and shared memory (B x warps fp32 from `alloc`) the warps. Every lane of a warp
    stores the same partial (no branch), then one barrier."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32

    threads = 32 * warps
    nvec = k // 8
    per = math.ceil(nvec / threads)
    tidx, _, _ = cute.arch.thread_idx()
    warp = tidx // 32
    gx = cute.flat_divide(mx, (1, 8))  # (1, 8, B, K/8)
    ld = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16, num_bits_per_copy=128)
    rv = cute.make_rmem_tensor((8, per, b_rows), BFloat16)
    for b in range(b_rows):  # every load first: one L2 round trip
        for i in range(per):
            c = tidx + threads * i
            if (i + 1) * threads > nvec:
                c = cutlass.min(c, nvec - 1)
            cute.copy(ld, gx[0, None, b, c], rv[None, i, b])
    red = alloc.allocate_tensor(Float32, cute.make_layout((warps, b_rows)), byte_alignment=16)
    for b in range(b_rows):
        ss = Float32(0.0)
        for i in range(per):
            part = Float32(0.0)
            for e in range(8):
                v = rv[e, i, b].to(Float32)
                part = part + v * v
            if (i + 1) * threads > nvec:  # ragged: clamped vectors count once
                part = cutlass.select_(tidx + threads * i < nvec, part, Float32(0.0))
            ss = ss + part
        for sh in range(5):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=16 >> sh)
        red[warp, b] = ss
    cute.arch.sync_threads()
    total = _tree_sum([red[w, bx] for w in range(warps)])
    return cute.math.rsqrt(total / Float32(k) + eps)


def normed(xw, ww, rstd):
    """4 u32 of x (8 bf16) and the 4 u32 of the norm weight at the same k -> 4 u32 of
    h = bf16((x·rstd)·w), rounded as `reference.rms_norm` rounds (fp32, once)."""
    import cutlass.cute as cute
    from cutlass import BFloat16, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    rh = cute.make_rmem_tensor((8,), BFloat16)
    for i in range(4):
        for half in range(2):
            x = du.as_f32(xw[i] << 16) if half == 0 else du.as_f32(xw[i] & 0xFFFF0000)
            w = du.as_f32(ww[i] << 16) if half == 0 else du.as_f32(ww[i] & 0xFFFF0000)
            rh[2 * i + half] = ((x * rstd) * w).to(BFloat16)
    rh32 = cute.recast_tensor(rh, Uint32)
    return [rh32[i] for i in range(4)]


def _tree_sum(vals):
    """Pairwise sum (plain Python: the DSL traces the adds, not the loop)."""
    while len(vals) > 1:
        vals = [vals[i] + vals[i + 1] for i in range(0, len(vals), 2)]
    return vals[0]


def _rotate(cutlass, vals, r):
    """[vals[(j + r) % n] for j], r a dynamic int in [0, n), n a power of two: log2(n) rounds
    of selects (a dynamic register index would spill to local memory)."""
    n, bit = len(vals), 1
    while bit < n:
        take = (r & bit) != 0
        vals = [cutlass.select_(take, vals[(j + bit) % n], vals[j]) for j in range(n)]
        bit *= 2
    return vals


def kernel_pw(b_rows: int, k: int, warps: int, tiles: int, pre: int, depth: int):
    """The V>=3 kernel (see the module docstring): `warps` warps split K, `tiles` m16 tiles per
    CTA, `pre` steps dequantised before the wait, `depth` raw weight steps in flight."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    dequant, xpairs, scales = frag_ops()
    rows_cta = 16 * tiles
    nch = k // 32  # 32-k lane chunks per row
    steps = math.ceil(nch / (4 * warps))  # lane chunk = t + 4 * (warp + warps * step)
    full = nch // (4 * warps)  # steps in which every lane's chunk exists
    pre = min(pre, steps)
    depth = min(steps, max(depth, pre, 1))  # raw weight slots
    xdepth = min(steps, 2)  # x slots
    chains = 4 // tiles  # accumulator sets per tile
    q = 32 // warps  # epilogue: lanes whose outputs share a bank group (see `slot`)
    assert warps in (4, 8, 16) and tiles in (1, 2)

    class Lane:
        """Per-thread indices, global views and register buffers of one CTA's rows."""

        def __init__(self, mx, mc, ms):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            self.tidx, self.warp = tidx, tidx // 32
            self.g, self.t = tidx % 32 // 4, tidx % 4
            self.n, self.n0 = mc.shape[0], bidx * rows_cta
            self.rows = [cutlass.min(self.n0 + 16 * u + self.g + 8 * r, self.n - 1)
                         for u in range(tiles) for r in range(2)]  # [2u + r]; clamped: reads
            self.codes, self.scales = mc.iterator.toint(), ms.iterator.toint()  # byte addresses
            self.gx = cute.flat_divide(mx, (1, 8))  # (1, 8, B, K/8)
            self.ld_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16,
                                            num_bits_per_copy=128)
            self.rc = cute.make_rmem_tensor((4, 2 * tiles, depth), Uint32)  # [word, row, slot]
            self.rs = cute.make_rmem_tensor((2 * tiles, depth), Uint32)  # 2 scale bytes
            self.rx = cute.make_rmem_tensor((8, 4, xdepth), BFloat16)  # x [k, word, slot]
            self.rx32 = cute.recast_tensor(self.rx, Uint32)  # (4, 4, xdepth)

        def chunk(self, s):
            c = self.t + 4 * (self.warp + warps * s)
            return c if s < full else cutlass.min(c, nch - 1)

        def load_w(self, s):
            # full steps: a constant offset from the lane's first chunk (folds into the LDG)
            c, off = (self.chunk(0), 4 * warps * s) if s < full else (self.chunk(s), 0)
            for r in range(2 * tiles):
                row = Int64(self.rows[r])
                words = du.ld_weight_v4(self.codes + row * (k // 2) + Int64(c) * 16 + 16 * off)
                for i in range(4):
                    self.rc[i, r, s % depth] = words[i]
                self.rs[r, s % depth] = du.ld_weight_u16(
                    self.scales + row * (k // 16) + Int64(c) * 2 + 2 * off)

        def dequant_step(self, s):
            """A fragments of step s: [tile][row half][16 bf16x2], scaled, k pairs (k, k+4)."""
            slot, out = s % depth, []
            for u in range(tiles):
                sc = scales(du.prmt(self.rs[2 * u, slot], self.rs[2 * u + 1, slot], 0x5410))
                a = [[], []]
                for r in range(2):
                    for j in range(4):
                        w = self.rc[j, 2 * u + r, slot]
                        if s >= full:  # lanes past the end of K: zero weights
                            c = self.t + 4 * (self.warp + warps * s)
                            w = cutlass.select_(c < nch, w, Uint32(0))
                        a[r] += [du.mul_bf16x2_by_half(p, sc[r], j // 2) for p in dequant(w)]
                out.append(a)
            return out

        def load_x(self, s):
            bx = cutlass.min(self.g, b_rows - 1)  # batch columns >= B repeat the last row
            for j in range(4):
                cute.copy(self.ld_x, self.gx[0, None, bx, 4 * self.chunk(s) + j],
                          self.rx[None, j, s % xdepth])

        def mma_step(self, s, a, acc):
            """acc + this lane's share of the 16x8 tile(s) for its chunk of step s."""
            xp = []
            for j in range(4):
                xp += xpairs([self.rx32[i, j, s % xdepth] for i in range(4)])
            if cutlass.const_expr(s + xdepth < steps):  # x slot free again: refill it
                self.load_x(s + xdepth)
            for u in range(tiles):
                for m in range(8):
                    ch = m % chains
                    acc[u][ch] = du.mma_bf16_m16n8k16(
                        [a[u][0][2 * m], a[u][1][2 * m], a[u][0][2 * m + 1], a[u][1][2 * m + 1]],
                        [xp[2 * m], xp[2 * m + 1]], acc[u][ch])
            return acc

    @cute.kernel
    def gemv_nvfp4_pw(mx: cute.Tensor, mc: cute.Tensor, ms: cute.Tensor, ms2: cute.Tensor,
                      my: cute.Tensor):
        ln = Lane(mx, mc, ms)
        # PDL prologue, weights only: load `depth` steps, dequantise the first `pre`, refill
        for s in cutlass.range_constexpr(depth):
            ln.load_w(s)
        ready = []
        for s in cutlass.range_constexpr(pre):
            ready.append(ln.dequant_step(s))
            if cutlass.const_expr(s + depth < steps):
                ln.load_w(s + depth)
        alpha = du.ld_weight_f32(ms2) * Float32(128.0)  # 2^7 left by the bf16 scale trick
        if cutlass.const_expr(pre > 0):  # keeps the dequantisation above ACQBULK in SASS
            du.griddepcontrol_wait_after_values(
                [v for st in ready for tl in st for half in tl for v in half])
        else:
            du.griddepcontrol_wait_after_loads()
        cute.arch.griddepcontrol_launch_dependents()
        for s in cutlass.range_constexpr(xdepth):
            ln.load_x(s)
        acc = [[[Float32(0.0)] * 4 for _ in range(chains)] for _ in range(tiles)]
        for s in cutlass.range_constexpr(steps):
            if cutlass.const_expr(s < pre):
                a = ready[s]
            else:
                a = ln.dequant_step(s)
                if cutlass.const_expr(s + depth < steps):
                    ln.load_w(s + depth)
            acc = ln.mma_step(s, a, acc)
        # split-K over the warps: partials of output o = (batch column, tile, row) at
        # sp[o * warps + slot]; the slot rotation by lane makes each STS conflict-free
        sp = cutlass.memory.SmemAllocator().allocate_tensor(
            Float32, cute.make_layout((warps, 8 * rows_cta)), byte_alignment=16)
        slot = (ln.warp + ln.g // q + (8 // q) * ln.t) % warps
        for u in cutlass.range_constexpr(tiles):
            tile = acc[u][0]
            for ch in cutlass.range_constexpr(1, chains):
                tile = [tile[i] + acc[u][ch][i] for i in range(4)]
            for i in cutlass.range_constexpr(4):  # C fragment: rows g, g+8; columns 2t, 2t+1
                o = (2 * ln.t + i % 2) * rows_cta + 16 * u + ln.g + 8 * (i // 2)
                sp[slot, o] = tile[i]
        cute.arch.sync_threads()
        # rows_cta * b_rows outputs may exceed the CTA's threads (2 tiles at B = 8): stride
        for base in cutlass.range_constexpr(0, rows_cta * b_rows, 32 * warps):
            o = ln.tidx + base
            if o < rows_cta * b_rows:
                part = sp[None, o].load()
                # Warp w's partial of o sits at slot (w + r) % warps, r from the lane (g, t)
                # that held o: sum in warp order, so o's summation order is the same for
                # every batch column (a row's output must not depend on its place in the
                # batch: batch invariance).
                r = ((o % rows_cta) % 8 // q + (8 // q) * (o // rows_cta // 2)) % warps
                total = _tree_sum(_rotate(cutlass, [part[w] for w in range(warps)], r))
                n = ln.n0 + o % rows_cta
                if n < ln.n:
                    my[o // rows_cta, n] = (total * alpha).to(BFloat16)

    return gemv_nvfp4_pw
