"""mbarrier helpers for warp-specialized kernels (a producer warpgroup handing shared-memory
stages to consumer warpgroups): single PTX instructions as inline asm on 32-bit shared-window
addresses, as `dsl_util` (whose style they follow). A module of their own so that a kernel
lists it in its `source_files` only when it uses them: every kernel's cache entry hashes
dsl_util.py. PTX ISA: "Parallel Synchronization and Communication Instructions: mbarrier".
"""

from __future__ import annotations

from cutlass.cutlass_dsl import dsl_user_op

from flint_graph.kernels.toolchain.dsl_util import _asm, _u32


@dsl_user_op
def mbar_init(addr, count: int, *, loc=None, ip=None) -> None:
    """mbarrier.init of the 8-byte barrier at shared-window address `addr` (u32, 8-aligned):
    each phase completes after `count` arrivals. Make it visible with `mbar_init_fence` and a
    CTA barrier before any other thread uses it."""
    _asm(None, [_u32(addr, loc, ip)], f"mbarrier.init.shared::cta.b64 [$0], {count};",
         "r,~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def mbar_init_fence(*, loc=None, ip=None) -> None:
    """fence.mbarrier_init: this thread's mbarrier.init become visible (with the CTA barrier
    that follows) to the threads that arrive on or wait for the barriers."""
    _asm(None, [], "fence.mbarrier_init.release.cluster;", "~{memory}", loc, ip,
         side_effects=True)


@dsl_user_op
def mbar_arrive(addr, *, loc=None, ip=None) -> None:
    """One arrival on the mbarrier at `addr` (release at CTA scope: this thread's earlier
    shared-memory reads and writes happen before a waiter of the completed phase proceeds)."""
    _asm(None, [_u32(addr, loc, ip)],
         "{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared::cta.b64 st, [$0];\n\t}",
         "r,~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def mbar_wait(addr, parity, *, loc=None, ip=None) -> None:
    """Wait (acquire at CTA scope) until the phase of parity `parity` (0 or 1: the k-th
    completion has parity k mod 2) of the mbarrier at `addr` has completed; try_wait
    suspends the thread for a while between polls."""
    _asm(None, [_u32(addr, loc, ip), _u32(parity, loc, ip)],
         "{\n\t.reg .pred p;\n\tLAB_WAIT:\n\t"
         "mbarrier.try_wait.parity.shared::cta.b64 p, [$0], $1;\n\t"
         "@p bra DONE;\n\tbra LAB_WAIT;\n\tDONE:\n\t}",
         "r,r,~{memory}", loc, ip, side_effects=True)
