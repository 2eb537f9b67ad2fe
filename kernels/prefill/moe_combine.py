"""The prefill MoE's combine and residual add, one pass: for each token t of a chunk,

    out[t] = bf16(x[t] + bf16(Σ_k weights[t, k] · y[pos[t, k]]  +  shared[t]))

where y bf16 [P, H] holds the expert down projections of the chunk's P = T·K (token, expert)
pairs in grouped (expert-sorted) order, as the grouped GEMMs leave them, and pos[t, k] is where
token t's k-th pair landed. A token's K terms come in ascending expert id (capture/prefill.py
sorts them so), each product and each sum rounded to fp32 on its own (mul.rn / add.rn, never
an FMA), then the shared expert's bf16 output: `reference.moe`'s order and rounding points,
followed by `reference.residual_add`. So, given the same y, shared and weights, the result is
the reference's bit for bit. Rows t ≥ valid[0] (a bucket's padding) are written as x
unchanged: their pairs are never read into the sum.

Replaces, in capture/prefill.py's `moe_grouped`, a scatter of y back to pair order, an fp32
copy of it, a batched [1, K] x [K, H] product, the shared add, two roundings and the residual
add: at 8K tokens about 2.5 GB of traffic per MoE layer against this kernel's ~0.25 GB.

Design: one CTA per token, H / 8 threads, each owning 8 consecutive columns (16-byte loads of
y, shared and x and one 16-byte store). Memory-bound; the K row reads of y are gathers of
whole 2H-byte rows, so every load is a full, aligned 16-byte access.

NORM = 1 (the model's spec where H is a multiple of 256, `_specs`): the same launch also writes
h = rmsnorm(out) · norm_w, the next layer's attention norm (`reference.rms_norm` of the new
residual row: fp32 from the rounded bf16 out, rounded once), so the prefill runs no separate
norm at the next layer's start (capture/prefill.py `_moe`, `_layer_body`). Why: that norm
(rmsnorm_rows RES 0) re-read the T·H·2 bytes this kernel has just written and was one more
launch a layer: at 8K tokens ~34 MB and ~25 µs a layer on the H100, at 512 tokens ~3.6 µs
and a launch boundary a layer (perf log, thirty-fifth session). The row's sum of squares runs
in the row's CTA: each thread's 8 squares in order, a warp butterfly, then the warps' sums in
warp order through shared memory, so a row's h depends on its own values only (the same
alone or in any chunk). norm_w is a weight, loaded before the wait. Padding rows get the norm
of the x they pass through, as the separate norm gave them.

PDL: every argument is written by a predecessor (y, shared, x by the GEMMs and the residual
stream, pos and weights by routing, valid by the chunk's description), so nothing is read
before `griddepcontrol.wait`, in every thread.

Shape legend: T chunk rows, P = T·K pairs, H hidden, K experts per token, SHARED 1 when the
model has a shared expert.

Tolerance (GPU test): out bitwise equal to `_reference` (the same operations in the same order;
the test feeds exact bf16 inputs and fp32 weights); NORM = 1's h as rmsnorm_rows' y (rel.
≤ 1e-2 of `reference.rms_norm` of the reference's out and at most 1% of its elements different
at all: fp32 summation order and the hardware rsqrt).
"""

import torch

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, ScalarArg, Spec, TensorArg

VEC = 8  # bf16 columns per thread (one 16-byte load)


NORM_ALIGN = 32 * VEC  # NORM = 1 needs whole warps (its butterfly has no partial-warp form)


def norm_of(spec: Spec) -> int:
    """The spec's NORM value (0 where it does not name it)."""
    return spec.as_dict().get("NORM", 0)


def _check(spec: Spec) -> None:
    h, k = spec["H"], spec["K"]
    if h % VEC or not VEC <= h <= 1024 * VEC:
        raise ValueError(f"moe_combine: H = {h}; expected a multiple of {VEC} up to "
                         f"{1024 * VEC}")
    if norm_of(spec) not in (0, 1):
        raise ValueError(f"moe_combine: NORM = {norm_of(spec)}; expected 0 or 1")
    if norm_of(spec) and h % NORM_ALIGN:
        raise ValueError(f"moe_combine: NORM = 1 needs H a multiple of {NORM_ALIGN} (whole "
                         f"warps), found H = {h}")
    if k < 1 or spec["SHARED"] not in (0, 1):
        raise ValueError(f"moe_combine: K = {k}, SHARED = {spec['SHARED']}; expected K ≥ 1 "
                         "and SHARED 0 or 1")


def _args(spec: Spec):
    _check(spec)
    h, k = spec["H"], spec["K"]
    args = [TensorArg("y", "bf16", ("P", h), "input"),
            TensorArg("pos", "i32", ("T", k), "input", align=4),
            TensorArg("weights", "f32", ("T", k), "input", align=4)]
    if spec["SHARED"]:
        args.append(TensorArg("shared", "bf16", ("T", h), "input"))
    args += [TensorArg("x", "bf16", ("T", h), "input"),
             TensorArg("valid", "i32", (1,), "input", align=4)]
    if norm_of(spec):
        return (*args, TensorArg("norm_w", "bf16", (h,), "weight"),
                TensorArg("out", "bf16", ("T", h), "output"),
                TensorArg("h_out", "bf16", ("T", h), "output"), ScalarArg("eps", "f32"))
    return (*args, TensorArg("out", "bf16", ("T", h), "output"))


def _launch(spec: Spec) -> Launch:
    warps = spec["H"] // VEC // 32
    # NORM = 1: the warps' sums of squares (the DSL's allocator takes dynamic shared memory)
    return Launch(grid=(("T", 1), 1, 1), block=(spec["H"] // VEC, 1, 1),
                  smem=16 * -(-4 * warps // 16) + 16 if norm_of(spec) else 0)


def _specs(cfg, buckets=()) -> list[Spec]:
    """Per model with routed experts (prefill has no batch bucket): the plain combine (the
    last layer's, and every layer's where H is no multiple of 256) and, where H allows it,
    NORM = 1 (the layers before the last)."""
    if not cfg.n_routed_experts:
        return []
    base = dict(H=cfg.hidden_size, K=cfg.num_experts_per_tok,
                SHARED=int(cfg.n_shared_experts > 0))
    out = [KERNEL.spec(**base)]
    if cfg.hidden_size % NORM_ALIGN == 0:
        out.append(KERNEL.spec(**base, NORM=1))
    return out


def _reference(spec: Spec, y, pos, weights, *rest):
    """(out,): `reference.moe`'s weighted sum (terms in the given k order, fp32, then the
    shared output) rounded to bf16, then `reference.residual_add`; rows ≥ valid are x.
    NORM = 1: (out, h) with h = `reference.rms_norm(out, norm_w, eps)`."""
    shared = rest[0] if spec["SHARED"] else None
    if norm_of(spec):
        *rest, norm_w, _, _, eps = rest
        (out,) = _reference(KERNEL.spec(**{k: v for k, v in spec.as_dict().items()
                                           if k != "NORM"}), y, pos, weights, *rest, None)
        return out, reference.rms_norm(out, norm_w, eps)
    x, valid = rest[-3], rest[-2]
    t = x.shape[0]
    acc = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for j in range(spec["K"]):
        acc += y[pos[:, j].long()].float() * weights[:, j, None]
    if shared is not None:
        acc += shared.float()
    res = (x.float() + acc.to(torch.bfloat16).float()).to(torch.bfloat16)
    live = torch.arange(t, device=x.device) < valid.long()[0]
    return (torch.where(live[:, None], res, x),)


def make_args(spec: Spec, *, gen: torch.Generator, tokens: int = 77, valid: int | None = None,
              eps: float = 1e-6, device: str = "cuda") -> list:
    """One fresh argument list for `tokens` rows (default 77: no multiple of a tile), `valid`
    of them real (default all): y, shared ~ N(0, 1) bf16 with some rows NaN where no real
    token points (a padding pair's unwritten row must never reach a real row), pos a random
    permutation of the T·K pairs, weights positive fp32 summing to ~2.5 per row, x ~ N(0, 4)
    bf16, out NaN; NORM = 1 also norm_w ~ 1 + N(0, 0.1²) bf16, h_out NaN and eps."""
    h, k = spec["H"], spec["K"]
    on = gen.device
    valid = tokens if valid is None else valid
    if not 0 <= valid <= tokens:
        raise ValueError(f"valid = {valid}: expected 0 … tokens = {tokens}")
    p = tokens * k
    perm = torch.randperm(p, generator=gen, device=on)
    pos = perm.view(tokens, k).to(torch.int32)
    y = torch.randn(p, h, generator=gen, device=on).to(torch.bfloat16)
    y[pos[valid:].reshape(-1).long()] = float("nan")  # padding pairs: never read
    w = torch.rand(tokens, k, generator=gen, device=on) + 0.05
    w = w / w.sum(-1, keepdim=True) * 2.5
    args = [y, pos, w]
    if spec["SHARED"]:
        args.append(torch.randn(tokens, h, generator=gen, device=on).to(torch.bfloat16))
    x = (2 * torch.randn(tokens, h, generator=gen, device=on)).to(torch.bfloat16)
    out = torch.full((tokens, h), float("nan"), dtype=torch.bfloat16, device=on)
    args += [x, torch.tensor([valid], dtype=torch.int32, device=on)]
    if norm_of(spec):  # a trained norm's gain; h NaN-poisoned like out
        norm_w = (1 + 0.1 * torch.randn(h, generator=gen, device=on)).to(torch.bfloat16)
        args += [norm_w, out, out.clone()]
        return [a.to(device) for a in args] + [eps]
    args.append(out)
    return [a.to(device) for a in args]


def bytes_moved(spec: Spec, tokens: int) -> int:
    """Least DRAM bytes of one launch over `tokens` rows: K rows of y, shared and x in, out
    (and NORM = 1's h), plus pos and weights."""
    h, k = spec["H"], spec["K"]
    return tokens * (h * 2 * (k + spec["SHARED"] + 2 + norm_of(spec)) + k * 8)


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    h, k, shared, norm = spec["H"], spec["K"], bool(spec["SHARED"]), bool(norm_of(spec))
    threads = h // VEC
    warps = threads // 32
    row_bytes = 2 * h

    def widen(words):
        """4 u32 of bf16 pairs -> 8 fp32 (element 2i in the low half of word i)."""
        out = []
        for w in words:
            out += [du.as_f32(w << 16), du.as_f32(w & Uint32(0xFFFF0000))]
        return out

    def combine_row(my, mpos, mw, msh, mx, mvalid, mo, mnw=None, mh=None, eps=None):
        col, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
        if cutlass.const_expr(norm):  # the gain is a weight: loaded before the wait
            gain = widen(du.ld_weight_v4(mnw.iterator.toint() + Int64(col) * (VEC * 2)))
            du.griddepcontrol_wait_after_loads()  # a bare wait would be hoisted above them
        else:
            cute.arch.griddepcontrol_wait()  # every argument is a predecessor's output
        cute.arch.griddepcontrol_launch_dependents()
        off = Int64(row) * row_bytes + Int64(col) * (VEC * 2)
        xv = widen(du.ld_v4(mx.iterator.toint() + off))
        live = Int32(row) < Int32(du.ld_u32(mvalid.iterator.toint()))
        acc = [cutlass.Float32(0.0)] * VEC
        for j in range(k):  # unrolled: K is a spec constant
            at = (Int64(row) * k + j) * 4
            p = Int32(du.ld_u32(mpos.iterator.toint() + at))
            w = du.as_f32(du.ld_u32(mw.iterator.toint() + at))
            yv = widen(du.ld_v4(my.iterator.toint() + Int64(p) * row_bytes
                                + Int64(col) * (VEC * 2)))
            acc = [du.add_rn_f32(a, du.mul_rn_f32(w, v)) for a, v in zip(acc, yv)]
        if cutlass.const_expr(shared):
            sv = widen(du.ld_v4(msh.iterator.toint() + off))
            acc = [du.add_rn_f32(a, s) for a, s in zip(acc, sv)]
        words = []
        for i in range(VEC // 2):
            m = widen([du.pack_bf16(acc[2 * i], acc[2 * i + 1])])  # the MoE output, rounded
            lo = du.add_rn_f32(xv[2 * i], m[0])
            hi = du.add_rn_f32(xv[2 * i + 1], m[1])
            new = du.pack_bf16(lo, hi)
            old = du.pack_bf16(xv[2 * i], xv[2 * i + 1])  # exact: x is bf16
            words.append(cutlass.select_(live, new, old))
        du.st_v4(mo.iterator.toint() + off, words)
        if cutlass.const_expr(norm):
            norm_row(widen(words), gain, col, mh.iterator.toint() + off, eps)

    def norm_row(vals, gain, col, dst, eps):
        """h = rmsnorm(the row's out) · gain for this thread's VEC columns: squares summed in
        column order, a warp butterfly, the warps' sums in warp order (shared memory)."""
        ss = du.mul_rn_f32(vals[0], vals[0])
        for v in vals[1:]:
            ss = du.add_rn_f32(ss, du.mul_rn_f32(v, v))
        for i in range(5):
            ss = du.add_rn_f32(ss, cute.arch.shuffle_sync_bfly(ss, offset=16 >> i))
        alloc = cutlass.memory.SmemAllocator()
        sums = alloc.allocate_tensor(cutlass.Uint8, cute.make_layout((launch.smem,)),
                                     byte_alignment=16)
        base = du.smem_addr(sums)
        # after the butterfly every lane holds the warp's sum: all store the same word
        du.st_shared_u32(base + Uint32(4) * (Uint32(col) // Uint32(32)), du.f32_bits(ss))
        cute.arch.sync_threads()
        total = du.as_f32(du.ld_shared_u32(base))
        for w in range(1, warps):
            total = du.add_rn_f32(total, du.as_f32(du.ld_shared_u32(base + Uint32(4 * w))))
        rstd = cute.math.rsqrt(total / cutlass.Float32(h) + eps)
        hv = [du.mul_rn_f32(du.mul_rn_f32(v, rstd), g) for v, g in zip(vals, gain)]
        du.st_v4(dst, [du.pack_bf16(hv[2 * i], hv[2 * i + 1]) for i in range(VEC // 2)])

    launch = _launch(spec)

    def go(kernel, mx, stream):
        """Launch `kernel` (traced inside the jit function below): one CTA per row."""
        kernel.launch(grid=(mx.shape[0], 1, 1), block=[threads, 1, 1], smem=launch.smem,
                      stream=stream, use_pdl=True)

    # the cubin's parameters are the kernel's, so each form has its own signature
    if norm and shared:
        @cute.kernel
        def moe_combine_kernel(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor,
                               msh: cute.Tensor, mx: cute.Tensor, mvalid: cute.Tensor,
                               mnw: cute.Tensor, mo: cute.Tensor, mh: cute.Tensor,
                               eps: cutlass.Float32):
            combine_row(my, mpos, mw, msh, mx, mvalid, mo, mnw, mh, eps)

        @cute.jit
        def moe_combine(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor, msh: cute.Tensor,
                        mx: cute.Tensor, mvalid: cute.Tensor, mnw: cute.Tensor, mo: cute.Tensor,
                        mh: cute.Tensor, eps: cutlass.Float32, stream: cuda.CUstream):
            go(moe_combine_kernel(my, mpos, mw, msh, mx, mvalid, mnw, mo, mh, eps), mx, stream)
    elif norm:
        @cute.kernel
        def moe_combine_kernel(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor,
                               mx: cute.Tensor, mvalid: cute.Tensor, mnw: cute.Tensor,
                               mo: cute.Tensor, mh: cute.Tensor, eps: cutlass.Float32):
            combine_row(my, mpos, mw, None, mx, mvalid, mo, mnw, mh, eps)

        @cute.jit
        def moe_combine(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor, mx: cute.Tensor,
                        mvalid: cute.Tensor, mnw: cute.Tensor, mo: cute.Tensor, mh: cute.Tensor,
                        eps: cutlass.Float32, stream: cuda.CUstream):
            go(moe_combine_kernel(my, mpos, mw, mx, mvalid, mnw, mo, mh, eps), mx, stream)
    elif shared:
        @cute.kernel
        def moe_combine_kernel(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor,
                               msh: cute.Tensor, mx: cute.Tensor, mvalid: cute.Tensor,
                               mo: cute.Tensor):
            combine_row(my, mpos, mw, msh, mx, mvalid, mo)

        @cute.jit
        def moe_combine(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor, msh: cute.Tensor,
                        mx: cute.Tensor, mvalid: cute.Tensor, mo: cute.Tensor,
                        stream: cuda.CUstream):
            go(moe_combine_kernel(my, mpos, mw, msh, mx, mvalid, mo), mx, stream)
    else:
        @cute.kernel
        def moe_combine_kernel(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor,
                               mx: cute.Tensor, mvalid: cute.Tensor, mo: cute.Tensor):
            combine_row(my, mpos, mw, None, mx, mvalid, mo)

        @cute.jit
        def moe_combine(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor, mx: cute.Tensor,
                        mvalid: cute.Tensor, mo: cute.Tensor, stream: cuda.CUstream):
            go(moe_combine_kernel(my, mpos, mw, mx, mvalid, mo), mx, stream)

    assert launch.block[0] == threads
    return moe_combine


KERNEL = KernelDef(name="moe_combine", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",))
