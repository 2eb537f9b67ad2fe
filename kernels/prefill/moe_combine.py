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

PDL: every argument is written by a predecessor (y, shared, x by the GEMMs and the residual
stream, pos and weights by routing, valid by the chunk's description), so nothing is read
before `griddepcontrol.wait`, in every thread.

Shape legend: T chunk rows, P = T·K pairs, H hidden, K experts per token, SHARED 1 when the
model has a shared expert.

Tolerance (GPU test): bitwise equal to `_reference` (the same operations in the same order;
the test feeds exact bf16 inputs and fp32 weights).
"""

import torch

from flint_graph.kernels.toolchain.spec import KernelDef, Launch, Spec, TensorArg

VEC = 8  # bf16 columns per thread (one 16-byte load)


def _check(spec: Spec) -> None:
    h, k = spec["H"], spec["K"]
    if h % VEC or not VEC <= h <= 1024 * VEC:
        raise ValueError(f"moe_combine: H = {h}; expected a multiple of {VEC} up to "
                         f"{1024 * VEC}")
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
    return (*args, TensorArg("x", "bf16", ("T", h), "input"),
            TensorArg("valid", "i32", (1,), "input", align=4),
            TensorArg("out", "bf16", ("T", h), "output"))


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(("T", 1), 1, 1), block=(spec["H"] // VEC, 1, 1))


def _specs(cfg, buckets=()) -> list[Spec]:
    """One specialisation per model with routed experts; prefill has no batch bucket."""
    if not cfg.n_routed_experts:
        return []
    return [KERNEL.spec(H=cfg.hidden_size, K=cfg.num_experts_per_tok,
                        SHARED=int(cfg.n_shared_experts > 0))]


def _reference(spec: Spec, y, pos, weights, *rest):
    """(out,): `reference.moe`'s weighted sum (terms in the given k order, fp32, then the
    shared output) rounded to bf16, then `reference.residual_add`; rows ≥ valid are x."""
    shared = rest[0] if spec["SHARED"] else None
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
              device: str = "cuda") -> list:
    """One fresh argument list for `tokens` rows (default 77: no multiple of a tile), `valid`
    of them real (default all): y, shared ~ N(0, 1) bf16 with some rows NaN where no real
    token points (a padding pair's unwritten row must never reach a real row), pos a random
    permutation of the T·K pairs, weights positive fp32 summing to ~2.5 per row, x ~ N(0, 4)
    bf16, out NaN."""
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
    args += [x, torch.tensor([valid], dtype=torch.int32, device=on), out]
    return [a.to(device) for a in args]


def bytes_moved(spec: Spec, tokens: int) -> int:
    """Least DRAM bytes of one launch over `tokens` rows: K rows of y, shared and x in, out,
    plus pos and weights."""
    h, k = spec["H"], spec["K"]
    return tokens * (h * 2 * (k + spec["SHARED"] + 2) + k * 8)


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    h, k, shared = spec["H"], spec["K"], bool(spec["SHARED"])
    threads = h // VEC
    row_bytes = 2 * h

    def widen(words):
        """4 u32 of bf16 pairs -> 8 fp32 (element 2i in the low half of word i)."""
        out = []
        for w in words:
            out += [du.as_f32(w << 16), du.as_f32(w & Uint32(0xFFFF0000))]
        return out

    def combine_row(my, mpos, mw, msh, mx, mvalid, mo):
        col, _, _ = cute.arch.thread_idx()
        row, _, _ = cute.arch.block_idx()
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

    launch = _launch(spec)

    if shared:
        @cute.kernel
        def moe_combine_kernel(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor,
                               msh: cute.Tensor, mx: cute.Tensor, mvalid: cute.Tensor,
                               mo: cute.Tensor):
            combine_row(my, mpos, mw, msh, mx, mvalid, mo)

        @cute.jit
        def moe_combine(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor, msh: cute.Tensor,
                        mx: cute.Tensor, mvalid: cute.Tensor, mo: cute.Tensor,
                        stream: cuda.CUstream):
            moe_combine_kernel(my, mpos, mw, msh, mx, mvalid, mo).launch(
                grid=(mx.shape[0], 1, 1), block=[threads, 1, 1], stream=stream, use_pdl=True)
    else:
        @cute.kernel
        def moe_combine_kernel(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor,
                               mx: cute.Tensor, mvalid: cute.Tensor, mo: cute.Tensor):
            combine_row(my, mpos, mw, None, mx, mvalid, mo)

        @cute.jit
        def moe_combine(my: cute.Tensor, mpos: cute.Tensor, mw: cute.Tensor, mx: cute.Tensor,
                        mvalid: cute.Tensor, mo: cute.Tensor, stream: cuda.CUstream):
            moe_combine_kernel(my, mpos, mw, mx, mvalid, mo).launch(
                grid=(mx.shape[0], 1, 1), block=[threads, 1, 1], stream=stream, use_pdl=True)

    assert launch.block[0] == threads
    return moe_combine


KERNEL = KernelDef(name="moe_combine", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",))
