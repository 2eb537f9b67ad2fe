"""Test-only: a deliberately slow producer for the PDL ordering test (issue 7, DESIGN §3).

It lets its dependents launch at once (`launch_dependents` first), spins for `spin_ns`
nanoseconds on the global timer, and only then copies `src` into `dst`, the consumer's input.
A consumer that reads its input before `griddepcontrol.wait` (in any thread) sees the stale
bytes and its output differs from the run without PDL. Words are int32: any tensor whose byte
size is a multiple of 4 can be viewed as such.
"""

from flint_graph.kernels.toolchain.spec import KernelDef, Launch, ScalarArg, Spec, TensorArg

THREADS = 256


def _args(spec: Spec):
    return (TensorArg("src", "i32", ("N",), "input", align=4),
            TensorArg("dst", "i32", ("N",), "output", align=4),
            ScalarArg("spin_ns", "i64"))


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(("N", THREADS), 1, 1), block=(THREADS, 1, 1))


def _specs(cfg, buckets=()) -> list[Spec]:
    return [KERNEL.spec()]


def _reference(spec: Spec, src, dst, spin_ns: int):
    return src.clone()


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    @cute.kernel
    def slow_producer_kernel(src: cute.Tensor, dst: cute.Tensor, spin_ns: cutlass.Int64):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()  # dependents start now, before our writes
        start = cute.arch.globaltimer()
        now = start
        while now - start < spin_ns:
            now = cute.arch.globaltimer()
        i = bidx * THREADS + tidx
        if i < src.shape[0]:
            dst[i] = src[i]

    launch = _launch(spec)

    @cute.jit
    def slow_producer(src: cute.Tensor, dst: cute.Tensor, spin_ns: cutlass.Int64,
                      stream: cuda.CUstream):
        n = src.shape[0]
        slow_producer_kernel(src, dst, spin_ns).launch(
            grid=((n + THREADS - 1) // THREADS, 1, 1), block=launch.block, stream=stream,
            use_pdl=True)

    return slow_producer


KERNEL = KernelDef(name="slow_producer", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference)
