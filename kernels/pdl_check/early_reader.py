"""Test-only: a consumer that breaks the PDL rule on purpose (reads its input before
`griddepcontrol.wait`), so the ordering test can show it catches such a kernel: behind the
slow producer, with PDL on, it copies the stale input at least some of the time."""

from flint_graph.kernels.toolchain.spec import KernelDef, Launch, Spec, TensorArg

THREADS = 256


def _args(spec: Spec):
    return (TensorArg("src", "i32", ("N",), "input", align=4),
            TensorArg("dst", "i32", ("N",), "output", align=4))


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(("N", THREADS), 1, 1), block=(THREADS, 1, 1))


def _specs(cfg, buckets=()) -> list[Spec]:
    return [KERNEL.spec()]


def _reference(spec: Spec, src, dst):
    return src.clone()


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    @cute.kernel
    def early_reader_kernel(src: cute.Tensor, dst: cute.Tensor):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        i = bidx * THREADS + tidx
        v = cutlass.Int32(0)
        if i < src.shape[0]:
            v = src[i]  # the bug this kernel exists for: a predecessor's output read too early
        cute.arch.griddepcontrol_wait()
        if i < src.shape[0]:
            dst[i] = v

    launch = _launch(spec)

    @cute.jit
    def early_reader(src: cute.Tensor, dst: cute.Tensor, stream: cuda.CUstream):
        n = src.shape[0]
        early_reader_kernel(src, dst).launch(grid=((n + THREADS - 1) // THREADS, 1, 1),
                                             block=launch.block, stream=stream, use_pdl=True)

    return early_reader


KERNEL = KernelDef(name="early_reader", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference)
