"""BF16 GEMV for decode: y[B, N] = x[B, K] · W[N, K]ᵀ, bf16 in/out, fp32 accumulate.

Follows DESIGN §4: fp32 products and sums, one rounding to bf16 at the output; it must match
`reference.linear(x, w)`. Only the fp32 summation order differs (tensor-core sums in V=1/2),
so the error is the bf16 output rounding: ‖y − ref‖/‖ref‖ ≤ 1e-2 in the GPU test
(tests/test_kernels_gpu.py), expected ~2e-3 (≤ 2^-9 per element).

Variants (Spec value V; the same args and launch grid for all):
  V=1/2 (tensor cores; 4 / 8 warps per CTA; the model runs V=2): one CTA owns 16 rows; its
    warps and the 4 lanes of each lane quad split K in 8-k chunks. A lane's 16-byte loads of
    rows g and g+8 are the A fragments of two mma.sync m16n8k16 (W as A: 16 rows x 16 k), the
    matching 16 bytes of x row min(g, B-1) their B fragments (n = batch row; columns >= B are
    never stored): nothing is converted or permuted, ~1 instruction per weight at any B.
    Warps' 16x8 fp32 tiles are summed in shared memory (split-K), then rounded once.
  V=0 (conservative, CUDA cores; 4 warps x 4 rows): lanes split K in 8-k chunks, fp32 FMAs,
    butterfly shuffle sum: the technique of the H200-verified sketch
    ../shared/cute-dsl-examples/gemv_bf16.py, written anew.
PDL: W is loaded (inline-asm ld.global.nc, up to PREFETCH steps per lane) before
griddepcontrol.wait, which dsl_util pins below those loads in SASS too; x only after it.
Shape legend: B batch bucket, K input width (multiple of 64), N output rows (dynamic).

NORM=1 (V=1/2; the fused, normed QKV projection, `fused_qkv_spec(b, cfg)`; absent from every
other spec): the attention RMSNorm folded into the prologue. Arguments: x bf16 [B, K] (input:
the residual stream), w bf16 [N, K] (weight: the stacked [q; k; v]), norm_w bf16 [K]
(weight), y bf16 [B, N] (output), eps (f32 scalar). After griddepcontrol.wait each CTA reads
all B rows of x (L2) for its own rstd (fp32 sum of squares, gemv_mma.row_rstd) and every x
fragment becomes h = bf16((x·rstd)·norm_w), the rounding of `reference.rms_norm`, before the
MMAs: y = linear(rms_norm(x, norm_w, eps)).
"""

import math

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import (BUCKETS, KernelDef, Launch, ScalarArg, Spec, TensorArg,
                                      unique_specs)

ROWS = 16  # output rows per CTA (one m16 tile), every variant
WARPS = {0: 4, 1: 4, 2: 8}  # V -> warps per CTA
VARIANTS = tuple(WARPS)
DEFAULT_V = 2
PREFETCH = {1: 8, 2: 8}  # V -> weight steps in flight per lane (16 B per row each)
V0_RPW = ROWS // WARPS[0]  # V=0: rows per warp
VEC = 8  # bf16 per 16-byte load


def is_norm(spec: Spec) -> bool:
    """NORM=1: the fused QKV spec (absent in every other spec)."""
    return bool(spec.as_dict().get("NORM", 0))


def _args(spec: Spec):
    b, k = spec["B"], spec["K"]
    if is_norm(spec):
        return (TensorArg("x", "bf16", (b, k), "input"),
                TensorArg("w", "bf16", ("N", k), "weight"),
                TensorArg("norm_w", "bf16", (k,), "weight"),
                TensorArg("y", "bf16", (b, "N"), "output"),
                ScalarArg("eps", "f32"))
    return (TensorArg("x", "bf16", (b, k), "input"),
            TensorArg("w", "bf16", ("N", k), "weight"),
            TensorArg("y", "bf16", (b, "N"), "output"))


def _launch(spec: Spec) -> Launch:
    v = spec["V"]
    norm_smem = WARPS[v] * 8 * 4 if is_norm(spec) else 0  # NORM: fp32 [warp][batch row]
    return Launch(grid=(("N", ROWS), 1, 1), block=(32 * WARPS[v], 1, 1),
                  smem=0 if v == 0 else norm_smem + WARPS[v] * ROWS * 8 * 4)


def _k_dims(cfg) -> list[int]:
    return sorted({k for _, k in cfg.dense_linear_shapes().values()})


def spec_for(b: int, k: int, n: int) -> Spec:
    """The specialisation the model launches for one GEMV shape (variant chosen by shape)."""
    return KERNEL.spec(B=b, K=k, V=DEFAULT_V)


def fused_qkv_spec(b: int, cfg) -> Spec:
    """The specialisation the model launches for the fused, normed QKV projection at bucket b:
    x the residual stream, w the stacked [q; k; v] weight, the attention RMSNorm in the
    prologue (NORM=1); spec_for's variant for the qkv shape (V=1/2 carry the flag)."""
    n, k = cfg.dense_linear_shapes()["qkv_proj"]
    v = spec_for(b, k, n)["V"]
    return KERNEL.spec(B=b, K=k, V=v if v in (1, 2) else DEFAULT_V, NORM=1)


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """Every specialisation the model `cfg` runs: each dense (N, K) shape at each bucket, and
    the fused QKV projection."""
    return unique_specs([spec_for(b, k, n) for b in buckets
                         for n, k in cfg.dense_linear_shapes().values()]
                        + [fused_qkv_spec(b, cfg) for b in buckets])


def bench_specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """Every variant at every bucket and K of `cfg`, for the GPU tests and the benchmark."""
    return [KERNEL.spec(B=b, K=k, V=v) for v in VARIANTS for b in buckets for k in _k_dims(cfg)]


def _reference(spec: Spec, x, w, *norm):
    """reference.linear; NORM=1 (norm = (norm_w, eps)): of reference.rms_norm(x) first."""
    if is_norm(spec):
        x = reference.rms_norm(x, norm[0], norm[1])
    return reference.linear(x, w)


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    from cutlass import Float32

    b_rows, k, v = spec["B"], spec["K"], spec["V"]
    if k % 64:
        raise ValueError(f"gemv_bf16: K = {k} must be a multiple of 64")
    launch = _launch(spec)
    if is_norm(spec):
        if v == 0:
            raise ValueError("gemv_bf16: NORM exists for V = 1 and 2, not V = 0")
        kernel = _kernel_mma(b_rows, k, WARPS[v], PREFETCH[v], True)

        @cute.jit
        def gemv_bf16_norm(mx: cute.Tensor, mw: cute.Tensor, mnw: cute.Tensor,
                           my: cute.Tensor, eps: Float32, stream: cuda.CUstream):
            n = mw.shape[0]
            kernel(mx, mw, mnw, my, eps).launch(
                grid=((n + ROWS - 1) // ROWS, 1, 1), block=launch.block, smem=launch.smem,
                stream=stream, use_pdl=True)

        return gemv_bf16_norm
    kernel = _kernel_fma(b_rows, k) if v == 0 else _kernel_mma(b_rows, k, WARPS[v],
                                                                PREFETCH[v])

    @cute.jit
    def gemv_bf16(mx: cute.Tensor, mw: cute.Tensor, my: cute.Tensor, stream: cuda.CUstream):
        n = mw.shape[0]
        kernel(mx, mw, my).launch(grid=((n + ROWS - 1) // ROWS, 1, 1), block=launch.block,
                                  smem=launch.smem, stream=stream, use_pdl=True)

    return gemv_bf16


def _kernel_mma(b_rows: int, k: int, warps: int, prefetch: int, norm: bool = False):
    """The V=1/2 kernel (tensor cores); see the module docstring. norm: x is the residual
    stream, normed in the prologue (the NORM=1 arguments)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du
    from flint_graph.kernels.decode.gemv_mma import normed, row_rstd

    nch = k // VEC  # 8-k lane chunks per row
    steps = math.ceil(nch / (4 * warps))  # lane chunk = t + 4 * (warp + warps * step)
    full = nch // (4 * warps)  # steps in which every lane's chunk exists (warp-uniform)
    depth = min(steps, prefetch)
    xdepth = min(steps, 4)

    class Lane:
        """Per-thread indices, global views and register buffers of one CTA's tile."""

        def __init__(self, mx, mw, mnw):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            self.tidx, self.warp = tidx, tidx // 32
            self.g, self.t = tidx % 32 // 4, tidx % 4
            self.n, self.n0 = mw.shape[0], bidx * ROWS
            self.rows = (cutlass.min(self.n0 + self.g, self.n - 1),  # clamped: reads only
                         cutlass.min(self.n0 + self.g + 8, self.n - 1))
            self.w = mw.iterator.toint()  # byte address
            self.gx = cute.flat_divide(mx, (1, VEC))  # (1, 8, B, nch)
            self.ld_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16,
                                            num_bits_per_copy=128)
            self.rw = cute.make_rmem_tensor((4, 2, depth), Uint32)  # W [k pair, row, slot]
            self.rx = cute.make_rmem_tensor((VEC, xdepth), BFloat16)  # x [k, slot]
            self.rx32 = cute.recast_tensor(self.rx, Uint32)  # (4, xdepth)
            if norm:  # the norm weight at the same k as rx
                self.gnw = cute.flat_divide(mnw, (VEC,))  # (8, nch)
                self.rnw = cute.make_rmem_tensor((VEC, xdepth), BFloat16)
                self.rnw32 = cute.recast_tensor(self.rnw, Uint32)

        def chunk(self, s):
            c = self.t + 4 * (self.warp + warps * s)
            return c if s < full else cutlass.min(c, nch - 1)

        def load_w(self, s):
            for r in range(2):
                row = self.w + Int64(self.rows[r]) * (2 * k)
                if s < full:  # constant offset from the lane's first chunk: folds into LDG
                    addr = row + Int64(self.chunk(0)) * 16 + 64 * warps * s
                else:
                    addr = row + Int64(self.chunk(s)) * 16
                v = du.ld_weight_v4(addr)
                for i in range(4):
                    self.rw[i, r, s % depth] = v[i]

        def load_x(self, s):
            bx = cutlass.min(self.g, b_rows - 1)  # batch columns >= B repeat the last row
            cute.copy(self.ld_x, self.gx[0, None, bx, self.chunk(s)], self.rx[None, s % xdepth])
            if norm:
                cute.copy(self.ld_x, self.gnw[None, self.chunk(s)], self.rnw[None, s % xdepth])

        def step(self, s, acc):
            slot, xs = s % depth, s % xdepth
            a = [[self.rw[i, r, slot] for i in range(4)] for r in range(2)]
            if s >= full:  # warps past the end of K: zero weights
                live = self.warp + warps * s < nch // 4
                a = [[cutlass.select_(live, v, Uint32(0)) for v in row] for row in a]
            xw = [self.rx32[i, xs] for i in range(4)]
            if norm:  # h = bf16((x·rstd)·w), as the reference
                xw = normed(xw, [self.rnw32[i, xs] for i in range(4)], self.rstd)
            for m in range(2):  # k 4m..4m+3 of the chunk: one mma's 4 k per lane and row
                acc[m] = du.mma_bf16_m16n8k16(  # two accumulator sets: two HMMA chains
                    [a[0][2 * m], a[1][2 * m], a[0][2 * m + 1], a[1][2 * m + 1]],
                    [xw[2 * m], xw[2 * m + 1]], acc[m])
            return acc

    @cute.jit
    def body(t):
        """The kernel on the declared arguments t (one list, see _args)."""
        mx, mw, my = t[0], t[1], t[-2 if norm else -1]
        ln = Lane(mx, mw, t[2] if norm else None)
        for s in cutlass.range_constexpr(depth):  # weights: before the wait (PDL prologue)
            ln.load_w(s)
        du.griddepcontrol_wait_after_loads()
        cute.arch.griddepcontrol_launch_dependents()
        for s in cutlass.range_constexpr(xdepth):
            ln.load_x(s)
        alloc = cutlass.memory.SmemAllocator()
        if cutlass.const_expr(norm):  # rstd of the lane's batch row, over all of x
            ln.rstd = row_rstd(alloc, mx, t[-1], b_rows, k, warps,
                               cutlass.min(ln.g, b_rows - 1))
        acc = [[Float32(0.0)] * 4, [Float32(0.0)] * 4]
        for s in cutlass.range_constexpr(steps):
            acc = ln.step(s, acc)
            if cutlass.const_expr(s + depth < steps):
                ln.load_w(s + depth)
            if cutlass.const_expr(s + xdepth < steps):
                ln.load_x(s + xdepth)
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
                my[b, ln.n0 + r] = total.to(BFloat16)

    if norm:
        @cute.kernel
        def gemv_bf16_mma_norm(mx: cute.Tensor, mw: cute.Tensor, mnw: cute.Tensor,
                               my: cute.Tensor, eps: Float32):
            body([mx, mw, mnw, my, eps])

        return gemv_bf16_mma_norm

    @cute.kernel
    def gemv_bf16_mma(mx: cute.Tensor, mw: cute.Tensor, my: cute.Tensor):
        body([mx, mw, my])

    return gemv_bf16_mma


def _kernel_fma(b_rows: int, k: int):
    """The V=0 kernel (CUDA cores, conservative); see the module docstring."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    rpw = V0_RPW
    nch = k // VEC
    steps = math.ceil(nch / 32)  # lane chunk = lane + 32 * step
    full = nch // 32
    depth = min(steps, 2)  # weight slots; the dynamic loop runs two full steps per trip
    pairs = max(0, (full - 2) // 2)  # its trips: it loads two steps ahead, all of them full

    class Lane:
        def __init__(self, mx, mw):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            self.lane = tidx % 32
            self.n, self.r0 = mw.shape[0], bidx * ROWS + tidx // 32 * rpw
            self.w = mw.iterator.toint()  # byte address
            self.gx = cute.flat_divide(mx, (1, VEC))
            self.ld_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16,
                                            num_bits_per_copy=128)
            self.rw = cute.make_rmem_tensor((4, rpw, depth), Uint32)  # W [k pair, row, slot]
            self.rx = cute.make_rmem_tensor((VEC, b_rows), BFloat16)

        def chunk(self, s, clamp):
            c = self.lane + 32 * s
            return cutlass.min(c, nch - 1) if clamp else c

        def load_w(self, s, slot, clamp):
            c = Int64(self.chunk(s, clamp))
            for r in range(rpw):
                row = Int64(cutlass.min(self.r0 + r, self.n - 1))
                v = du.ld_weight_v4(self.w + row * (2 * k) + c * 16)
                for i in range(4):
                    self.rw[i, r, slot] = v[i]

        def step(self, s, slot, tail, acc):
            """acc + the lane's 8-k chunk of step s (s may be dynamic; `tail`: it may not
            exist, then it counts as zero)."""
            for b in range(b_rows):
                cute.copy(self.ld_x, self.gx[0, None, b, self.chunk(s, tail)], self.rx[None, b])
            xv = [self.rx[None, b].load().to(Float32) for b in range(b_rows)]
            xf = [[xv[b][e] for e in range(VEC)] for b in range(b_rows)]
            if tail:  # lanes past the end of K contribute nothing
                live = self.lane + 32 * s < nch
                xf = [[cutlass.select_(live, v, Float32(0.0)) for v in row] for row in xf]
            for r in range(rpw):
                wf = cute.recast_tensor(self.rw[None, r, slot], BFloat16).load().to(Float32)
                for b in range(b_rows):
                    for e in range(VEC):
                        acc[r][b] = acc[r][b] + wf[e] * xf[b][e]
            return acc

    @cute.kernel
    def gemv_bf16_fma(mx: cute.Tensor, mw: cute.Tensor, my: cute.Tensor):
        ln = Lane(mx, mw)
        for s in cutlass.range_constexpr(depth):
            ln.load_w(s, s, s >= full)
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
                    my[b, ln.r0 + r] = v.to(BFloat16)

    return gemv_bf16_fma


KERNEL = KernelDef(name="gemv_bf16", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py", "decode/gemv_mma.py"))
