"""Fused residual add + RMSNorm for decode rows: r = residual + x (bf16), y = rmsnorm(r) · w.

Follows DESIGN §1 (pre-norm residual stream) and §4 (rounding points); it must match
`reference.residual_add` then `reference.rms_norm`: the sum is rounded once to bf16 (the new
residual), the norm computes in fp32 from that bf16 value and rounds once. Returns both, so the
next block's norm and the residual stream come out of one pass over the row.

Design: one warp per row (B ≤ 8 rows of H ≤ a few thousand values: 4 KB per row at H = 2048),
each lane holds H/256 16-byte chunks of x, residual and w in registers, so every load is in
flight at once and nothing round-trips through shared memory; the sum of squares is a
butterfly shuffle. The weight w is loaded before `griddepcontrol.wait` (it is constant for the
whole step); x and residual are written by predecessors and read only after it
(`dsl_util.griddepcontrol_wait_after_loads` keeps ptxas from hoisting the wait above w's loads).

Tolerance (GPU test): y within rel. 1e-2 of the reference (bf16 output rounding 2^-9 plus a
different fp32 summation order and the hardware rsqrt, ~1e-6); the residual output is an exact
bf16 sum of two bf16 values rounded once, so it must be bit-equal.
"""


import math

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import BUCKETS, KernelDef, Launch, ScalarArg, Spec, TensorArg

VEC = 8  # bf16 values per 16-byte load


def _args(spec: Spec):
    b, h = spec["B"], spec["H"]
    return (TensorArg("x", "bf16", (b, h), "input"),
            TensorArg("residual", "bf16", (b, h), "input"),
            TensorArg("w", "bf16", (h,), "weight"),
            TensorArg("residual_out", "bf16", (b, h), "output"),
            TensorArg("y", "bf16", (b, h), "output"),
            ScalarArg("eps", "f32"))


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(spec["B"], 1, 1), block=(32, 1, 1))


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    if cfg.hidden_size % VEC:
        raise ValueError(f"rmsnorm: hidden_size {cfg.hidden_size} must be a multiple of {VEC}")
    return [KERNEL.spec(B=b, H=cfg.hidden_size) for b in buckets]


def _reference(spec: Spec, x, residual, w, eps: float):
    """(residual_out, y), both bf16 [B, H]."""
    r = reference.residual_add(residual, x)
    return r, reference.rms_norm(r, w, eps)


def _build(spec: Spec):
    return build_norm(spec["H"], residual=True)


def build_norm(h: int, *, residual: bool):
    """The `@cute.jit` launcher of the norm over rows of width h, one warp a row, as many rows
    as x has (grid = x.shape[0], static for a decode bucket, dynamic for a prefill chunk:
    kernels/prefill/rmsnorm_rows.py). residual True: args (x, residual, w, residual_out, y,
    eps), the add then the norm; False: (x, w, y, eps), the norm of x alone."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    from flint_graph.kernels.toolchain import dsl_util as du

    chunks = h // VEC
    per_lane = math.ceil(chunks / 32)
    ragged = chunks % 32 != 0  # some lanes own fewer chunks: predicate them
    bf16, f32 = cutlass.BFloat16, cutlass.Float32

    @cute.jit
    def body(mx: cute.Tensor, mr: cute.Tensor, mw: cute.Tensor, mro: cute.Tensor,
             my: cute.Tensor, eps: cutlass.Float32):  # inlined into the kernels below
        lane, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        gx = cute.flat_divide(mx, (1, VEC))  # (1, VEC, rows, chunks)
        gr = cute.flat_divide(mr, (1, VEC))
        gro = cute.flat_divide(mro, (1, VEC))
        gy = cute.flat_divide(my, (1, VEC))
        gw = cute.flat_divide(mw, (VEC,))  # (VEC, chunks)
        ld_w = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), bf16, num_bits_per_copy=128,
                                   invariant=True)
        ld = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), bf16, num_bits_per_copy=128)
        st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), bf16, num_bits_per_copy=128)
        rw = cute.make_rmem_tensor((VEC, per_lane), bf16)
        rx = cute.make_rmem_tensor((VEC, per_lane), bf16)
        rr = cute.make_rmem_tensor((VEC, per_lane), bf16)
        for j in cutlass.range_constexpr(per_lane):
            c = lane + 32 * j
            if cutlass.const_expr(not ragged) or c < chunks:
                cute.copy(ld_w, gw[None, c], rw[None, j])
        du.griddepcontrol_wait_after_loads()  # a bare wait would be hoisted above w's loads
        cute.arch.griddepcontrol_launch_dependents()
        rx.fill(0.0)
        rr.fill(0.0)
        for j in cutlass.range_constexpr(per_lane):
            c = lane + 32 * j
            if cutlass.const_expr(not ragged) or c < chunks:
                cute.copy(ld, gx[0, None, row, c], rx[None, j])
                if cutlass.const_expr(residual):
                    cute.copy(ld, gr[0, None, row, c], rr[None, j])
        ss = f32(0.0)
        for j in cutlass.range_constexpr(per_lane):
            if cutlass.const_expr(residual):
                s = (rx[None, j].load().to(f32) + rr[None, j].load().to(f32)).to(bf16)
                rr[None, j].store(s)  # the new residual, rounded once (zero on idle lanes)
            else:
                rr[None, j].store(rx[None, j].load())  # the row itself (zero on idle lanes)
            sf = rr[None, j].load().to(f32)
            ss = ss + (sf * sf).reduce(cute.ReductionOp.ADD, f32(0.0), 0)
        for k in cutlass.range_constexpr(5):
            ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=16 >> k)
        rstd = cute.math.rsqrt(ss / f32(h) + eps)
        for j in cutlass.range_constexpr(per_lane):
            c = lane + 32 * j
            if cutlass.const_expr(not ragged) or c < chunks:
                y = (rr[None, j].load().to(f32) * rstd) * rw[None, j].load().to(f32)
                rx[None, j].store(y.to(bf16))
                if cutlass.const_expr(residual):
                    cute.copy(st, rr[None, j], gro[0, None, row, c])
                cute.copy(st, rx[None, j], gy[0, None, row, c])

    # the cubin's parameters are the kernel's, so each form has its own signature
    if residual:
        @cute.kernel
        def rmsnorm_kernel(mx: cute.Tensor, mr: cute.Tensor, mw: cute.Tensor, mro: cute.Tensor,
                           my: cute.Tensor, eps: cutlass.Float32):
            body(mx, mr, mw, mro, my, eps)

        @cute.jit
        def rmsnorm(mx: cute.Tensor, mr: cute.Tensor, mw: cute.Tensor, mro: cute.Tensor,
                    my: cute.Tensor, eps: cutlass.Float32, stream: cuda.CUstream):
            rmsnorm_kernel(mx, mr, mw, mro, my, eps).launch(
                grid=(mx.shape[0], 1, 1), block=[32, 1, 1], stream=stream, use_pdl=True)
    else:
        @cute.kernel
        def rmsnorm_kernel(mx: cute.Tensor, mw: cute.Tensor, my: cute.Tensor,
                           eps: cutlass.Float32):
            body(mx, mx, mw, my, my, eps)  # stand-ins: the residual is never read nor written

        @cute.jit
        def rmsnorm(mx: cute.Tensor, mw: cute.Tensor, my: cute.Tensor, eps: cutlass.Float32,
                    stream: cuda.CUstream):
            rmsnorm_kernel(mx, mw, my, eps).launch(
                grid=(mx.shape[0], 1, 1), block=[32, 1, 1], stream=stream, use_pdl=True)

    return rmsnorm


KERNEL = KernelDef(name="rmsnorm", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",))
