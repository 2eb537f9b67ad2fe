"""NVFP4 W4A16 GEMV for decode: y[B, N] = x[B, K] · dq(W)[N, K]ᵀ, bf16 in/out, fp32 accumulate.

Weights in the repacked NVIDIA layout (DESIGN §2, flint_graph/checkpoints/nvfp4.py): codes u8 [N, K/2]
(element 2i in the low nibble of byte i), unsigned-E4M3 scale bytes u8 [N, K/16] (bit 7
ignored, the bytes 0x00 and 0x7F decode to 0, 0xFF to 480), scale2 f32 [1]. Must match
`reference.linear(x, NVFP4Weight(codes, scales, scale2[0]))` (DESIGN §4): every e2m1·e4m3
product is exact here, so only the fp32 summation order differs from the reference, plus one
fp32 rounding of the final ·scale2. Tolerance: ‖y − ref‖/‖ref‖ ≤ 1e-2 (tests/test_kernels_gpu.py);
expected ~2e-3, the bf16 output rounding (≤ 2^-9 per element).

Variants (Spec value V; the same args and launch grid for all):
  V=1/2 (tensor cores; 4 / 8 warps per CTA; the model runs V=2): one CTA owns 16 rows; its
    warps and the 4 lanes of each lane quad split K, each lane taking 32-k chunks (one 16-byte
    code load and one 2-byte scale load per row, rows g and g+8 of the m16 tile). Codes are
    dequantised with integer ops into bf16x2 pairs (k, k+4) worth e2m1·2^-126 (magnitude at
    bf16 bits 6..8, sign at 15; the 0.5 code is a bf16 *subnormal*), multiplied
    (mul.rn.bf16x2, subnormals kept) by the block scale as bf16(e4m3·2^119), which gives
    e2m1·e4m3·2^-7 exactly, and fed to mma.sync m16n8k16 as A (16 rows x 16 k) against x as
    B (n = batch row; columns >= B repeat row B-1 and are never stored); x gets the same
    (k, k+4) pairing with one prmt per register. Warps' 16x8 fp32 tiles are summed in shared
    memory (split-K), times 2^7·scale2, rounded once. SASS per 64 weights of a lane: 48 LOP3,
    8 SHF, ~34 IMAD, 36 HMUL2, 20 PRMT, 8 HMMA, 4 loads + 4 x loads: ~2.8 instructions per
    weight at every B (the tensor cores do the batch).
  V=0 (conservative, CUDA cores; 8 warps x 2 rows): lanes split K in 32-k chunks; codes ->
    fp16 e2m1·2^-14 with integer ops (exact), fp16 -> fp32 (SASS HADD2.F32), one fp32 FMA per
    weight and batch row, block scale applied to fp32 partial sums: the technique of the
    H200-verified sketch ../shared/cute-dsl-examples/gemv_w4a16.py, written anew.
  V=3/4/5 (gemv_mma.kernel_pw, same fragment math; PW gives warps, tiles, pre, depth):
    V=3 = V=2 with the first 2 steps dequantised BEFORE griddepcontrol.wait (weights only),
    4 HMMA chains, and a conflict-free STS + LDS.128 split-K epilogue; V=4 = V=3 with 16
    warps (K=4096: every step pre-dequantised); V=5 (B=8 throughput): 4 warps, 32 rows per
    CTA (two m16 tiles share each x load and x PRMT), no pre-wait dequantisation.
PDL: codes, scales and scale2 are loaded (inline-asm ld.global.nc, kept in program order)
before griddepcontrol.wait, which dsl_util pins below them in SASS too; x only after it.
Shape legend: B batch bucket, K input width (multiple of 64), N output rows (dynamic).

Fused QKV flags (V=1/2 only; absent from every other spec, which keep their names and code):
  ROWSCALE=1: scale2 is f32 [N], one value per output row (the stacked [q; k; v] weight keeps
    each tensor's own scale2), applied once in the epilogue (the scalar's 2^7·scale2 becomes
    2^7·scale2[n], loaded per storing thread before the wait).
    Reference: the weight dequantised as codes·scales, row n times scale2[n] (fp32).
  NORM=1: the attention RMSNorm folded into the prologue. Arguments: x bf16 [B, K] (input: the
    residual stream), codes, scales, scale2 (as above), norm_w bf16 [K] (weight), y bf16
    [B, N] (output), eps (f32 scalar). After griddepcontrol.wait each CTA reads all B rows of
    x (L2) for its own rstd (fp32 sum of squares, gemv_mma.row_rstd) and every x fragment
    becomes h = bf16((x·rstd)·norm_w) before the MMAs, the rounding of `reference.rms_norm`;
    y = linear(rms_norm(x, norm_w, eps)). `fused_qkv_spec(b, cfg)` is the model's spec
    (ROWSCALE=1, NORM=1, spec_for's variant of the qkv shape).
"""

import math

import torch

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import (BUCKETS, KernelDef, Launch, ScalarArg, Spec, TensorArg,
                                      unique_specs)
from flint_graph.checkpoints.weights import NVFP4Weight

ROWS = 16  # output rows per CTA (one m16 tile), V=0/1/2
WARPS = {0: 8, 1: 4, 2: 8}  # V -> warps per CTA
# V>=3 (gemv_mma.kernel_pw) -> (warps, m16 tiles per CTA, steps dequantised before the wait,
# raw weight steps in flight)
PW = {3: (8, 1, 2, 2), 4: (16, 1, 2, 2), 5: (4, 2, 0, 2)}
VARIANTS = (*WARPS, *PW)
DEFAULT_V = 2
PREFETCH = 4  # weight steps (32 k of two rows per lane) in flight per lane
V0_RPW = ROWS // WARPS[0]  # V=0: rows per warp


def flags(spec: Spec) -> tuple[int, int]:
    """(ROWSCALE, NORM) of a spec; absent values are 0 (every spec before the fused QKV)."""
    v = spec.as_dict()
    return v.get("ROWSCALE", 0), v.get("NORM", 0)


def _args(spec: Spec):
    b, k = spec["B"], spec["K"]
    rowscale, norm = flags(spec)
    args = [TensorArg("x", "bf16", (b, k), "input"),
            TensorArg("codes", "u8", ("N", k // 2), "weight"),
            TensorArg("scales", "u8", ("N", k // 16), "weight", align=4),  # row stride K/16 B
            TensorArg("scale2", "f32", ("N",) if rowscale else (1,), "weight", align=4)]
    if norm:
        args.append(TensorArg("norm_w", "bf16", (k,), "weight"))
    args.append(TensorArg("y", "bf16", (b, "N"), "output"))
    if norm:
        args.append(ScalarArg("eps", "f32"))
    return tuple(args)


def _shape(v: int) -> tuple[int, int]:
    """(warps, rows per CTA) of variant v."""
    return (WARPS[v], ROWS) if v in WARPS else (PW[v][0], ROWS * PW[v][1])


def _launch(spec: Spec) -> Launch:
    v = spec["V"]
    warps, rows = _shape(v)
    norm_smem = warps * 8 * 4 if flags(spec)[1] else 0  # NORM: fp32 [warp][batch row]
    return Launch(grid=(("N", rows), 1, 1), block=(32 * warps, 1, 1),
                  smem=0 if v == 0 else norm_smem + warps * rows * 8 * 4)  # + [warp][row][col]


def _k_dims(cfg) -> list[int]:
    return sorted({k for _, k in cfg.dense_linear_shapes().values()})


WIDE_N = 8192  # from this many output rows, a 4-warp CTA per 16 rows streams best


def spec_for(b: int, k: int, n: int) -> Spec:
    """The specialisation the model launches for one GEMV shape. The variant follows the
    H200 measurements in docs/perf-log.md (2026-11-30): 16 warps splitting K with the
    weights dequantised before the wait (V=4) for long rows (o, down: K ≥ 4096); for wide
    outputs (LM head, gate/up) two m16 tiles sharing each x load (V=5); 8 warps (V=2) for the
    rest (q, k, v, fused qkv). The variant depends on the shape only, never on b: each variant
    sums a row's products in an order that ignores the other rows, so a row's output is
    bitwise the same in every bucket (batch invariance). That costs ~5 µs at B = 1 on the LM
    head (V=1 measured 47.5 µs there, V=5 52.5; V=1 at B = 8: 69 µs against 59.6)."""
    if k >= 4096:
        return KERNEL.spec(B=b, K=k, V=4)
    if n >= WIDE_N:
        return KERNEL.spec(B=b, K=k, V=5)
    return KERNEL.spec(B=b, K=k, V=DEFAULT_V)


FUSED_V = (1, 2)  # the variants with the ROWSCALE / NORM flags


def fused_qkv_spec(b: int, cfg) -> Spec:
    """The specialisation the model launches for the fused, normed QKV projection at bucket b:
    x the residual stream, the stacked [q; k; v] weight with scale2 per row (ROWSCALE=1), the
    attention RMSNorm in the prologue (NORM=1); spec_for's variant for the qkv shape."""
    n, k = cfg.dense_linear_shapes()["qkv_proj"]
    v = spec_for(b, k, n)["V"]
    return KERNEL.spec(B=b, K=k, V=v if v in FUSED_V else DEFAULT_V, ROWSCALE=1, NORM=1)


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """Every specialisation the model `cfg` runs: each dense (N, K) shape at each bucket, and
    the fused QKV projection."""
    return unique_specs([spec_for(b, k, n) for b in buckets
                         for n, k in cfg.dense_linear_shapes().values()]
                        + [fused_qkv_spec(b, cfg) for b in buckets])


def bench_specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """Every variant at every bucket and K of `cfg`, for the GPU tests and the benchmark."""
    return [KERNEL.spec(B=b, K=k, V=v) for v in VARIANTS for b in buckets for k in _k_dims(cfg)]


def _reference(spec: Spec, x, codes, scales, scale2, *norm):
    """reference.linear; NORM=1 (norm = (norm_w, eps)): of reference.rms_norm(x) first;
    ROWSCALE=1: the weight row n dequantised as codes·scales·scale2[n] (in fp32)."""
    if flags(spec)[1]:
        x = reference.rms_norm(x, norm[0], norm[1])
    if not flags(spec)[0]:
        return reference.linear(x, NVFP4Weight(codes, scales, scale2[0]))
    one = torch.ones((), dtype=torch.float32, device=scale2.device)
    w = NVFP4Weight(codes, scales, one).dequantize(torch.float32) * scale2.float()[:, None]
    return reference.linear(x, w)


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    b_rows, k, v = spec["B"], spec["K"], spec["V"]
    if k % 64:
        raise ValueError(f"gemv_nvfp4: K = {k} must be a multiple of 64")
    launch = _launch(spec)
    rows = _shape(v)[1]
    rowscale, norm = flags(spec)
    if (rowscale or norm) and v not in FUSED_V:
        raise ValueError(f"gemv_nvfp4: ROWSCALE / NORM exist for V in {FUSED_V}, not V = {v}")
    if norm:
        return _build_norm(spec, _kernel_mma(b_rows, k, WARPS[v], bool(rowscale), True))
    if v in PW:
        from flint_graph.kernels.decode.gemv_mma import kernel_pw

        kernel = kernel_pw(b_rows, k, *PW[v])
    else:
        kernel = _kernel_fma(b_rows, k) if v == 0 else _kernel_mma(b_rows, k, WARPS[v],
                                                                    bool(rowscale))

    @cute.jit
    def gemv_nvfp4(mx: cute.Tensor, mc: cute.Tensor, ms: cute.Tensor, ms2: cute.Tensor,
                   my: cute.Tensor, stream: cuda.CUstream):
        n = mc.shape[0]
        kernel(mx, mc, ms, ms2, my).launch(
            grid=((n + rows - 1) // rows, 1, 1), block=launch.block, smem=launch.smem,
            stream=stream, use_pdl=True)

    return gemv_nvfp4


def _build_norm(spec: Spec, kernel):
    """The launch function of a NORM=1 spec: x, codes, scales, scale2, norm_w, y, eps."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    launch = _launch(spec)

    @cute.jit
    def gemv_nvfp4_norm(mx: cute.Tensor, mc: cute.Tensor, ms: cute.Tensor, ms2: cute.Tensor,
                        mw: cute.Tensor, my: cute.Tensor, eps: cutlass.Float32,
                        stream: cuda.CUstream):
        n = mc.shape[0]
        kernel(mx, mc, ms, ms2, mw, my, eps).launch(
            grid=((n + ROWS - 1) // ROWS, 1, 1), block=launch.block, smem=launch.smem,
            stream=stream, use_pdl=True)

    return gemv_nvfp4_norm


def _kernel_mma(b_rows: int, k: int, warps: int, rowscale: bool = False, norm: bool = False):
    """The V=1/2 kernel (tensor cores); see the module docstring. rowscale: scale2 per output
    row; norm: x is the residual stream, normed in the prologue (the NORM=1 arguments)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    nch = k // 32  # 32-k lane chunks per row
    steps = math.ceil(nch / (4 * warps))  # lane chunk = t + 4 * (warp + warps * step)
    full = nch // (4 * warps)  # steps in which every lane's chunk exists
    depth = min(steps, PREFETCH)
    from flint_graph.kernels.decode.gemv_mma import frag_ops, normed, row_rstd

    dequant, xpairs, scales = frag_ops()

    class Lane:
        """Per-thread indices, global views and register buffers of one CTA's tile."""

        def __init__(self, mx, mc, ms, mw):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            self.tidx, self.warp = tidx, tidx // 32
            self.g, self.t = tidx % 32 // 4, tidx % 4
            self.n, self.n0 = mc.shape[0], bidx * ROWS
            self.rows = (cutlass.min(self.n0 + self.g, self.n - 1),  # clamped: reads only
                         cutlass.min(self.n0 + self.g + 8, self.n - 1))
            self.codes, self.scales = mc.iterator.toint(), ms.iterator.toint()  # byte addresses
            self.gx = cute.flat_divide(mx, (1, 8))  # (1, 8, B, K/8)
            self.ld_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16,
                                            num_bits_per_copy=128)
            self.rc = cute.make_rmem_tensor((4, 2, depth), Uint32)  # codes [word, row, slot]
            self.rs = cute.make_rmem_tensor((2, depth), Uint32)  # 2 scale bytes [row, slot]
            self.rx = cute.make_rmem_tensor((8, 4, 2), BFloat16)  # x [k, word, slot]
            self.rx32 = cute.recast_tensor(self.rx, Uint32)  # (4, 4, 2)
            if norm:  # the norm weight at the same k as rx
                self.gw = cute.flat_divide(mw, (8,))  # (8, K/8)
                self.rw = cute.make_rmem_tensor((8, 4, 2), BFloat16)
                self.rw32 = cute.recast_tensor(self.rw, Uint32)

        def chunk(self, s):
            c = self.t + 4 * (self.warp + warps * s)
            return c if s < full else cutlass.min(c, nch - 1)

        def load_w(self, s):
            # full steps: a constant offset from the lane's first chunk (folds into the LDG)
            c, off = (self.chunk(0), 4 * warps * s) if s < full else (self.chunk(s), 0)
            for r in range(2):
                row = Int64(self.rows[r])
                at = self.codes + row * (k // 2) + Int64(c) * 16
                words = du.ld_weight_v4(at + 16 * off)
                for i in range(4):
                    self.rc[i, r, s % depth] = words[i]
                at = self.scales + row * (k // 16) + Int64(c) * 2
                self.rs[r, s % depth] = du.ld_weight_u16(at + 2 * off)

        def load_x(self, s):
            bx = cutlass.min(self.g, b_rows - 1)  # batch columns >= B repeat the last row
            for j in range(4):
                cute.copy(self.ld_x, self.gx[0, None, bx, 4 * self.chunk(s) + j],
                          self.rx[None, j, s % 2])
                if norm:
                    cute.copy(self.ld_x, self.gw[None, 4 * self.chunk(s) + j],
                              self.rw[None, j, s % 2])

        def step(self, s, acc):
            """acc + this lane's share of the 16x8 tile for its 32-k chunk of step s."""
            slot = s % depth
            sc = scales(du.prmt(self.rs[0, slot], self.rs[1, slot], 0x5410))
            a = [[], []]
            for r in range(2):
                for j in range(4):
                    w = self.rc[j, r, slot]
                    if s >= full:  # lanes past the end of K: zero weights
                        c = self.t + 4 * (self.warp + warps * s)
                        w = cutlass.select_(c < nch, w, Uint32(0))
                    a[r] += [du.mul_bf16x2_by_half(p, sc[r], j // 2) for p in dequant(w)]
            xp = []
            for j in range(4):
                xw = [self.rx32[i, j, s % 2] for i in range(4)]
                if norm:  # h = bf16((x·rstd)·w), as the reference
                    xw = normed(xw, [self.rw32[i, j, s % 2] for i in range(4)], self.rstd)
                xp += xpairs(xw)
            for m in range(8):  # two accumulator sets: two independent HMMA chains
                acc[m % 2] = du.mma_bf16_m16n8k16(
                    [a[0][2 * m], a[1][2 * m], a[0][2 * m + 1], a[1][2 * m + 1]],
                    [xp[2 * m], xp[2 * m + 1]], acc[m % 2])
            return acc

    @cute.jit
    def body(t):
        """The kernel on the declared arguments t (one list, see _args)."""
        mx, mc, ms, ms2, my = t[0], t[1], t[2], t[3], t[-2 if norm else -1]
        ln = Lane(mx, mc, ms, t[4] if norm else None)
        for s in cutlass.range_constexpr(depth):  # weights: before the wait (PDL prologue)
            ln.load_w(s)
        if cutlass.const_expr(rowscale):  # scale2 of the row this thread stores (epilogue)
            srow = cutlass.min(ln.n0 + ln.tidx % ROWS, ln.n - 1)
            ms2 = cute.make_tensor(ms2.iterator + srow, cute.make_layout(1))
        alpha = du.ld_weight_f32(ms2) * Float32(128.0)  # 2^7 left by the bf16 scale trick
        du.griddepcontrol_wait_after_loads()
        cute.arch.griddepcontrol_launch_dependents()
        ln.load_x(0)
        alloc = cutlass.memory.SmemAllocator()
        if cutlass.const_expr(norm):  # rstd of the lane's batch row, over all of x
            ln.rstd = row_rstd(alloc, mx, t[-1], b_rows, k, warps,
                               cutlass.min(ln.g, b_rows - 1))
        acc = [[Float32(0.0)] * 4, [Float32(0.0)] * 4]
        for s in cutlass.range_constexpr(steps):
            if cutlass.const_expr(s + 1 < steps):
                ln.load_x(s + 1)
            acc = ln.step(s, acc)
            if cutlass.const_expr(s + depth < steps):
                ln.load_w(s + depth)
        # split-K over the warps: sum the 16x8 fp32 tiles in shared memory
        sp = alloc.allocate_tensor(Float32, cute.make_layout((8, ROWS, warps)),
                                   byte_alignment=16)
        tile = [acc[0][i] + acc[1][i] for i in range(4)]  # C fragment: rows g, g+8
        sp[2 * ln.t, ln.g, ln.warp] = tile[0]
        sp[2 * ln.t + 1, ln.g, ln.warp] = tile[1]
        sp[2 * ln.t, ln.g + 8, ln.warp] = tile[2]
        sp[2 * ln.t + 1, ln.g + 8, ln.warp] = tile[3]
        cute.arch.sync_threads()
        if ln.tidx < ROWS * b_rows:
            b, r = ln.tidx // ROWS, ln.tidx % ROWS
            total = sp[b, r, 0]
            for w in cutlass.range_constexpr(1, warps):
                total = total + sp[b, r, w]
            if ln.n0 + r < ln.n:
                my[b, ln.n0 + r] = (total * alpha).to(BFloat16)

    if norm:
        @cute.kernel
        def gemv_nvfp4_mma_norm(mx: cute.Tensor, mc: cute.Tensor, ms: cute.Tensor,
                                ms2: cute.Tensor, mw: cute.Tensor, my: cute.Tensor,
                                eps: Float32):
            body([mx, mc, ms, ms2, mw, my, eps])

        return gemv_nvfp4_mma_norm

    @cute.kernel
    def gemv_nvfp4_mma(mx: cute.Tensor, mc: cute.Tensor, ms: cute.Tensor, ms2: cute.Tensor,
                       my: cute.Tensor):
        body([mx, mc, ms, ms2, my])

    return gemv_nvfp4_mma


def _kernel_fma(b_rows: int, k: int):
    """The V=0 kernel (CUDA cores, conservative); see the module docstring."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float16, Float32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    rpw = V0_RPW
    nch = k // 32
    steps = math.ceil(nch / 32)  # lane chunk = lane + 32 * step
    full = nch // 32
    depth = min(steps, 2)  # weight slots; the dynamic loop runs two full steps per trip
    pairs = max(0, (full - 2) // 2)  # its trips: it loads two steps ahead, all of them full

    def scale_f32(byte):
        """Unsigned E4M3 byte -> fp32 value: bit 7 ignored (0xFF is 480), the byte 0x7F -> 0,
        subnormals exact (as flint_graph/checkpoints/nvfp4.py decodes it)."""
        s = Uint32(byte)
        f = du.as_f32((s & 0x7F) << 20) * Float32(2.0**120)  # e4m3·2^-120: subnormal if e = 0
        return cutlass.select_(s == 0x7F, Float32(0.0), f)

    class Lane:
        def __init__(self, mx, mc, ms):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            self.lane = tidx % 32
            self.n, self.r0 = mc.shape[0], bidx * ROWS + tidx // 32 * rpw
            self.codes, self.scales = mc.iterator.toint(), ms.iterator.toint()  # byte addresses
            self.gx = cute.flat_divide(mx, (1, 8))
            self.ld_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16,
                                            num_bits_per_copy=128)
            self.rc = cute.make_rmem_tensor((4, rpw, depth), Uint32)  # codes [word, row, slot]
            self.rs = cute.make_rmem_tensor((rpw, depth), Uint32)  # 2 scale bytes [row, slot]
            self.rx = cute.make_rmem_tensor((8, b_rows), BFloat16)
            self.rh = cute.make_rmem_tensor((4,), Uint32)  # 8 fp16 codes, pairs (k, k+4)

        def chunk(self, s, clamp):
            c = self.lane + 32 * s
            return cutlass.min(c, nch - 1) if clamp else c

        def load_w(self, s, slot, clamp):
            c = Int64(self.chunk(s, clamp))
            for r in range(rpw):
                row = Int64(cutlass.min(self.r0 + r, self.n - 1))
                words = du.ld_weight_v4(self.codes + row * (k // 2) + c * 16)
                for i in range(4):
                    self.rc[i, r, slot] = words[i]
                self.rs[r, slot] = du.ld_weight_u16(self.scales + row * (k // 16) + c * 2)

        def step(self, s, slot, tail, acc):
            """acc + the lane's 32-k chunk of step s (s may be dynamic; `tail`: it may not
            exist, then its weights count as zero)."""
            for blk in range(2):  # two 16-k scale blocks per chunk
                part = [[Float32(0.0)] * b_rows for _ in range(rpw)]
                for j in (2 * blk, 2 * blk + 1):  # one code word = 8 k
                    for b in range(b_rows):
                        cute.copy(self.ld_x, self.gx[0, None, b, 4 * self.chunk(s, tail) + j],
                                  self.rx[None, b])
                    xf = [self.rx[None, b].load().to(Float32) for b in range(b_rows)]
                    for r in range(rpw):
                        w = self.rc[j, r, slot]
                        if tail:
                            w = cutlass.select_(self.lane + 32 * s < nch, w, Uint32(0))
                        for i in range(4):  # codes i, i+4 -> fp16 e2m1·2^-14 (exact)
                            c = (w >> (4 * i)) & 0x000F000F
                            self.rh[i] = ((c & 0x00080008) << 12) | ((c & 0x00070007) << 9)
                        wf = cute.recast_tensor(self.rh, Float16).load().to(Float32)
                        for b in range(b_rows):
                            for e in range(8):  # element e is k = e // 2 + 4 * (e % 2)
                                part[r][b] = part[r][b] + wf[e] * xf[b][e // 2 + 4 * (e % 2)]
                for r in range(rpw):
                    sf = scale_f32((self.rs[r, slot] >> (8 * blk)) & 0xFF)
                    for b in range(b_rows):
                        acc[r][b] = acc[r][b] + part[r][b] * sf
            return acc

    @cute.kernel
    def gemv_nvfp4_fma(mx: cute.Tensor, mc: cute.Tensor, ms: cute.Tensor, ms2: cute.Tensor,
                       my: cute.Tensor):
        ln = Lane(mx, mc, ms)
        for s in cutlass.range_constexpr(depth):
            ln.load_w(s, s, s >= full)
        alpha = du.ld_weight_f32(ms2) * Float32(16384.0)  # 2^14 left by the fp16 code trick
        du.griddepcontrol_wait_after_loads()
        cute.arch.griddepcontrol_launch_dependents()
        acc = [[Float32(0.0)] * b_rows for _ in range(rpw)]
        step, load_w = ln.step, ln.load_w  # (a dynamic loop may not carry the Lane object)
        for it in cutlass.range(pairs, unroll=1):  # two full steps per trip, slots 0 and 1
            acc = step(2 * it, 0, False, acc)
            load_w(2 * it + 2, 0, False)
            acc = step(2 * it + 1, 1, False, acc)
            load_w(2 * it + 3, 1, False)
        for s in cutlass.range_constexpr(2 * pairs, steps):  # the last steps (one may be ragged)
            acc = step(s, s % 2, s >= full, acc)
            if cutlass.const_expr(s + 2 < steps):
                load_w(s + 2, s % 2, s + 2 >= full)
        for r in cutlass.range_constexpr(rpw):
            for b in cutlass.range_constexpr(b_rows):
                v = acc[r][b]
                for sh in cutlass.range_constexpr(5):
                    v = v + cute.arch.shuffle_sync_bfly(v, offset=16 >> sh)
                if ln.lane == (r * b_rows + b) % 32 and ln.r0 + r < ln.n:
                    my[b, ln.r0 + r] = (v * alpha).to(BFloat16)

    return gemv_nvfp4_fma


KERNEL = KernelDef(name="gemv_nvfp4", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py", "decode/gemv_mma.py"))
