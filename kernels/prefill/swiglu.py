"""SwiGLU's activation for a prefill chunk: a = bf16(silu(g) · u) from the gate and up
projections g, u bf16 [R, M], in fp32 and rounded once, as `reference.swiglu` takes it between
its projections (the experts' grouped GEMMs, the shared expert, the dense MLP of layers 0-1).

Replaces five torch passes (two fp32 copies, the silu, the product, the rounding: ~1.1 GB per
MoE layer of an 8K chunk) with one read of g and u and one write of a (~0.15 GB).

Design: the tensors are taken flat (N = R·M values, M a multiple of 8): each thread owns 8
consecutive values (16-byte loads and store), 256 threads per CTA, the tail predicated.
silu(g) = g / (1 + e^(−g)) in fp32 with the hardware exp (≤ 2 ulp) and an IEEE division.

PDL: g and u are the preceding GEMMs' outputs: read only after griddepcontrol.wait, in every
thread; there are no weights.

Tolerance (GPU test): ‖a − ref‖/‖ref‖ ≤ 1e-2 and at most 1% of the elements different at all:
only the exp's last-ulp error separates the two before the one shared bf16 rounding, which it
flips in rare elements (expected ~1e-3 of them).
"""

import torch

from flint_graph.kernels.toolchain.spec import KernelDef, Launch, Spec, TensorArg

VEC = 8  # values per thread (16-byte accesses)
THREADS = 256


def _args(spec: Spec):
    return (TensorArg("g", "bf16", ("N",), "input"),
            TensorArg("u", "bf16", ("N",), "input"),
            TensorArg("a", "bf16", ("N",), "output"))


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(("N", THREADS * VEC), 1, 1), block=(THREADS, 1, 1))


def _specs(cfg, buckets=()) -> list[Spec]:
    """One specialisation (shapes are dynamic); the widths of `cfg`'s MLPs must be multiples of
    8 (raises ValueError otherwise)."""
    for name in ("intermediate_size", "moe_intermediate_size"):
        width = getattr(cfg, name)
        if width % VEC:
            raise ValueError(f"swiglu: {name} = {width}; expected a multiple of {VEC}")
    return [KERNEL.spec(VEC=VEC)]


def _reference(spec: Spec, g, u, a=None):
    """(a,): silu(g)·u in fp32, rounded once (`reference.swiglu`'s activation)."""
    return ((torch.nn.functional.silu(g.float()) * u.float()).to(torch.bfloat16),)


def make_args(spec: Spec, *, gen: torch.Generator, rows: int = 77, width: int = 512,
              device: str = "cuda") -> list:
    """g ~ N(0, 4) (through silu's curved part and both tails), u ~ N(0, 1), flat bf16 [rows ·
    width]; a NaN."""
    n = rows * width
    on = gen.device
    g = (2 * torch.randn(n, generator=gen, device=on)).to(torch.bfloat16)
    u = torch.randn(n, generator=gen, device=on).to(torch.bfloat16)
    a = torch.full((n,), float("nan"), dtype=torch.bfloat16, device=on)
    return [g.to(device), u.to(device), a.to(device)]


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    def widen(words):
        out = []
        for w in words:
            out += [du.as_f32(w << 16), du.as_f32(w & Uint32(0xFFFF0000))]
        return out

    @cute.kernel
    def swiglu_kernel(mg: cute.Tensor, mu: cute.Tensor, ma: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        cute.arch.griddepcontrol_wait()  # g and u are the GEMMs' outputs
        cute.arch.griddepcontrol_launch_dependents()
        chunk = Int64(bid) * THREADS + Int64(tid)
        if chunk * VEC < Int64(mg.shape[0]):
            off = chunk * (VEC * 2)
            g = widen(du.ld_v4(mg.iterator.toint() + off))
            u = widen(du.ld_v4(mu.iterator.toint() + off))
            act = [(x / (Float32(1.0) + cute.math.exp(-x))) * y for x, y in zip(g, u)]
            du.st_v4(ma.iterator.toint() + off,
                     [du.pack_bf16(act[2 * i], act[2 * i + 1]) for i in range(VEC // 2)])

    @cute.jit
    def swiglu(mg: cute.Tensor, mu: cute.Tensor, ma: cute.Tensor, stream: cuda.CUstream):
        swiglu_kernel(mg, mu, ma).launch(
            grid=(cute.ceil_div(mg.shape[0], THREADS * VEC), 1, 1), block=[THREADS, 1, 1],
            stream=stream, use_pdl=True)

    del cutlass
    return swiglu


KERNEL = KernelDef(name="swiglu", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",))
