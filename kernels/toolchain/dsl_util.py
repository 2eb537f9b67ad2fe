"""Small CuTe DSL helpers shared by the GEMV kernels: single PTX instructions as inline asm.

Imports the DSL at import time, so only kernel `build` functions import this module (the GPU
box, which has no DSL, never does). Each helper emits one PTX instruction (or one tiny block)
whose SASS is predictable: LOP3, PRMT, HMUL2, HMMA, LDG.

Why the weight loads and the wait are inline asm (read with nvdisasm, sm_90a and sm_100a): a
bare `griddepcontrol.wait` has no operands, and ptxas schedules it (SASS ACQBULK) at the top
of the kernel, above weight loads written before it in the PTX, so nothing is prefetched
under PDL (the H200-run sketches and rmsnorm.py show this). `griddepcontrol_wait_after_loads`
keeps the earlier loads above it. And LLVM may sink an ordinary read-only load below the wait
to its first use; `ld_weight_*` are volatile asm, which LLVM keeps in program order with it.
"""

from __future__ import annotations

import cutlass
from cutlass import Float32, Int32, Int64, Uint32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op


def _asm(ret, args, text: str, constraints: str, loc, ip, side_effects: bool = False):
    return llvm.inline_asm(ret, args, text, constraints, has_side_effects=side_effects,
                           is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT,
                           loc=loc, ip=ip)


def _u32(v, loc, ip):
    return Uint32(v).ir_value(loc=loc, ip=ip)


def lut3(f) -> int:
    """The 8-bit truth table of f(a, b, c) for lop3 (a = 0xF0, b = 0xCC, c = 0xAA)."""
    return f(0xF0, 0xCC, 0xAA) & 0xFF


# -- integer bit manipulation ------------------------------------------------------------------


@dsl_user_op
def select_bits(a, b, mask: int, *, loc=None, ip=None) -> Uint32:
    """(a & mask) | (b & ~mask): one LOP3 with an immediate mask."""
    lut = lut3(lambda x, y, m: (x & m) | (y & ~m))
    return Uint32(_asm(T.i32(), [_u32(a, loc, ip), _u32(b, loc, ip)],
                       f"lop3.b32 $0, $1, $2, {mask:#x}, {lut:#x};", "=r,r,r", loc, ip))


@dsl_user_op
def and_not(a, b, mask: int, *, loc=None, ip=None) -> Uint32:
    """a & ~b & mask: one LOP3."""
    lut = lut3(lambda x, y, m: x & ~y & m)
    return Uint32(_asm(T.i32(), [_u32(a, loc, ip), _u32(b, loc, ip)],
                       f"lop3.b32 $0, $1, $2, {mask:#x}, {lut:#x};", "=r,r,r", loc, ip))


@dsl_user_op
def prmt(a, b, selector: int, *, loc=None, ip=None) -> Uint32:
    """Byte permute of {b, a} (a = bytes 0-3) by an immediate selector (PTX prmt, default mode:
    selector nibble i picks output byte i; with its bit 3 set, the picked byte's msb fills it)."""
    return Uint32(_asm(T.i32(), [_u32(a, loc, ip), _u32(b, loc, ip)],
                       f"prmt.b32 $0, $1, $2, {selector:#x};", "=r,r,r", loc, ip))


@dsl_user_op
def as_f32(a, *, loc=None, ip=None) -> Float32:
    """The 32 bits of `a` read as an fp32 value (no conversion)."""
    return Float32(llvm.bitcast(T.f32(), _u32(a, loc, ip), loc=loc, ip=ip))


# -- packed bf16 and tensor-core math ----------------------------------------------------------


@dsl_user_op
def mul_bf16x2(a, b, *, loc=None, ip=None) -> Uint32:
    """Packed bf16x2 product, round to nearest even. PTX has no .ftz for bf16: subnormal inputs
    and results are kept (the NVFP4 dequantisation relies on it)."""
    return Uint32(_asm(T.i32(), [_u32(a, loc, ip), _u32(b, loc, ip)],
                       "mul.rn.bf16x2 $0, $1, $2;", "=r,r,r", loc, ip))


@dsl_user_op
def mul_bf16x2_by_half(a, b, half: int, *, loc=None, ip=None) -> Uint32:
    """Both halves of `a` times one bf16 half of `b` (0 = low). ptxas folds the broadcast into
    the HMUL2 operand swizzle (.H0_H0 / .H1_H1): still one instruction."""
    pick = "lo, lo" if half == 0 else "hi, hi"
    return Uint32(_asm(T.i32(), [_u32(a, loc, ip), _u32(b, loc, ip)],
                       "{\n\t.reg .b16 lo, hi;\n\t.reg .b32 bb;\n\tmov.b32 {lo, hi}, $2;\n\t"
                       f"mov.b32 bb, {{{pick}}};\n\tmul.rn.bf16x2 $0, $1, bb;\n\t}}",
                       "=r,r,r", loc, ip))


@dsl_user_op
def mma_bf16_m16n8k16(a, b, c, *, loc=None, ip=None) -> list:
    """One warp-wide mma.sync m16n8k16, bf16 inputs, fp32 accumulate: returns c + A·B.

    a: 4 registers (bf16x2) of A (16x16, row-major), b: 2 registers of B (16x8, column-major),
    c: 4 fp32 of C, in the PTX ISA fragment layout: with g = lane / 4 and t = lane % 4,
    a0 = A[g][2t..2t+1], a1 = A[g+8][2t..2t+1], a2 = A[g][2t+8..2t+9], a3 = A[g+8][2t+8..2t+9];
    b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1].
    """
    f32 = T.f32()
    args = [_u32(v, loc, ip) for v in a] + [_u32(v, loc, ip) for v in b]
    args += [Float32(v).ir_value(loc=loc, ip=ip) for v in c]
    res = _asm(llvm.StructType.get_literal([f32] * 4), args,
               "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
               "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f", loc, ip)
    return [Float32(llvm.extractvalue(f32, res, [i], loc=loc, ip=ip)) for i in range(4)]


# -- weight loads and the PDL wait ---------------------------------------------------------------


def _ld_nc(suffix: str, n: int, addr, loc, ip):
    """ld.global.nc of n 32-bit registers at a byte address, as volatile asm."""
    outs = "{" + ", ".join(f"${i}" for i in range(n)) + "}" if n > 1 else "$0"
    ret = llvm.StructType.get_literal([T.i32()] * n) if n > 1 else T.i32()
    return _asm(ret, [Int64(addr).ir_value(loc=loc, ip=ip)],
                f"ld.global.nc{suffix} {outs}, [${n}];", ",".join(["=r"] * n + ["l"]),
                loc, ip, side_effects=True)


@dsl_user_op
def ld_weight_v4(addr, *, loc=None, ip=None) -> list:
    """16 weight bytes at a 16-byte aligned global byte address, as 4 u32 (LDG.128.CONSTANT)."""
    res = _ld_nc(".v4.u32", 4, addr, loc, ip)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_weight_u16(addr, *, loc=None, ip=None) -> Uint32:
    """2 weight bytes at a 2-byte aligned global byte address, zero-extended."""
    return Uint32(_ld_nc(".u16", 1, addr, loc, ip))


@dsl_user_op
def ld_weight_f32(m, *, loc=None, ip=None) -> Float32:
    """m[0] of a one-element fp32 weight tensor (e.g. an NVFP4 scale2)."""
    return as_f32(Uint32(_ld_nc(".b32", 1, m.iterator.toint(loc=loc, ip=ip), loc, ip)),
                  loc=loc, ip=ip)


@dsl_user_op
def griddepcontrol_wait_after_loads(*, loc=None, ip=None) -> None:
    """griddepcontrol.wait that stays below the loads issued before it, in SASS too.

    A volatile store to a dummy shared word just before the wait keeps the earlier global
    loads (ld.global.nc included) above ACQBULK without waiting for their data, as a fence
    would (MEMBAR). The memory clobber keeps LLVM from hoisting the input loads that follow.
    Costs one STS and 4 bytes of static shared memory."""
    _asm(None, [], "{\n\t.shared .align 4 .b32 pdl_order_word;\n\t"
         "st.volatile.shared.b32 [pdl_order_word], 0;\n\tgriddepcontrol.wait;\n\t}",
         "~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def griddepcontrol_wait_after_values(values, *, loc=None, ip=None) -> None:
    """griddepcontrol_wait_after_loads that also keeps the computation of `values` (u32
    registers, e.g. weight-only dequantisation) above the wait in SASS: ptxas otherwise sinks
    such math below ACQBULK, next to its first use. The values are summed (IADD3, about one
    per two values) into the word the volatile store writes, so the store, and the wait
    behind it, depend on every one of them. A sum, not a XOR: two loads of one address (the
    compiler merges them) XOR to a constant 0, and the store then no longer waits for the load
    (attn_prefill's tiny specialisation lost its sinks prefetch that way). The stored word is
    never read."""
    fold = Uint32(values[0])
    for v in values[1:]:
        fold = fold + Uint32(v)
    _asm(None, [_u32(fold, loc, ip)],
         "{\n\t.shared .align 4 .b32 pdl_order_word;\n\t"
         "st.volatile.shared.b32 [pdl_order_word], $0;\n\tgriddepcontrol.wait;\n\t}",
         "r,~{memory}", loc, ip, side_effects=True)


# -- tensor-core tiles: shared-memory staging, ldmatrix, fast math (the prefill kernels) -------


def _i64(v, loc, ip):
    return Int64(v).ir_value(loc=loc, ip=ip)


@dsl_user_op
def smem_addr(tensor, *, loc=None, ip=None) -> Uint32:
    """The 32-bit shared-window address of a shared-memory tensor's first byte (what cp.async,
    ldmatrix and ld.shared take)."""
    generic = tensor.iterator.toint(loc=loc, ip=ip)
    return Uint32(_asm(T.i32(), [_i64(generic, loc, ip)],
                       "{\n\t.reg .u64 a;\n\tcvta.to.shared.u64 a, $1;\n\tcvt.u32.u64 $0, a;\n\t}",
                       "=r,l", loc, ip))


@dsl_user_op
def ld_weight_u32(addr, *, loc=None, ip=None) -> Uint32:
    """One 32-bit weight word at a global byte address (ld.global.nc, volatile: stays in program
    order with the PDL wait)."""
    return Uint32(_ld_nc(".b32", 1, addr, loc, ip))


@dsl_user_op
def ld_u32(addr, *, loc=None, ip=None) -> Uint32:
    """One 32-bit word at a global byte address (plain ld.global: data a predecessor wrote)."""
    return Uint32(_asm(T.i32(), [_i64(addr, loc, ip)], "ld.global.b32 $0, [$1];", "=r,l",
                       loc, ip, side_effects=True))


@dsl_user_op
def ld_u32_if(addr, pred, *, loc=None, ip=None) -> Uint32:
    """ld_u32(addr) where `pred` holds, else 0, as one predicated load (no branch)."""
    from cutlass import Int32

    return Uint32(_asm(T.i32(), [_i64(addr, loc, ip), Int32(pred).ir_value(loc=loc, ip=ip)],
                       "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\tmov.b32 $0, 0;\n\t"
                       "@p ld.global.b32 $0, [$1];\n\t}", "=r,l,r", loc, ip, side_effects=True))


@dsl_user_op
def ld_v4(addr, *, loc=None, ip=None) -> list:
    """16 bytes at a 16-byte aligned global byte address, as 4 u32 (plain ld.global.v4: data a
    predecessor wrote; volatile, so it stays below the PDL wait)."""
    res = _asm(llvm.StructType.get_literal([T.i32()] * 4), [_i64(addr, loc, ip)],
               "ld.global.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", loc, ip,
               side_effects=True)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def mul_rn_f32(a, b, *, loc=None, ip=None) -> Float32:
    """a·b in fp32, rounded to nearest even: an explicit .rn, so ptxas never contracts it into
    an FMA with a following add (a reference that rounds the product first needs that)."""
    return Float32(_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip),
                                  Float32(b).ir_value(loc=loc, ip=ip)],
                        "mul.rn.f32 $0, $1, $2;", "=f,f,f", loc, ip))


@dsl_user_op
def add_rn_f32(a, b, *, loc=None, ip=None) -> Float32:
    """a + b in fp32, rounded to nearest even (explicit .rn: never contracted, see mul_rn_f32)."""
    return Float32(_asm(T.f32(), [Float32(a).ir_value(loc=loc, ip=ip),
                                  Float32(b).ir_value(loc=loc, ip=ip)],
                        "add.rn.f32 $0, $1, $2;", "=f,f,f", loc, ip))


@dsl_user_op
def st_u32(addr, value, *, loc=None, ip=None) -> None:
    """Store one 32-bit word at a global byte address."""
    _asm(None, [_i64(addr, loc, ip), _u32(value, loc, ip)], "st.global.b32 [$0], $1;",
         "l,r,~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def cp_async_16(dst, src, nbytes, *, loc=None, ip=None) -> None:
    """cp.async of 16 bytes from global byte address `src` to shared address `dst` (u32); only
    the first `nbytes` (0 or 16) are read, the rest zero-filled (L2 only: .cg)."""
    from cutlass import Int32

    _asm(None, [_u32(dst, loc, ip), _i64(src, loc, ip), Int32(nbytes).ir_value(loc=loc, ip=ip)],
         "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", loc, ip,
         side_effects=True)


@dsl_user_op
def cp_async_commit(*, loc=None, ip=None) -> None:
    """Close the group of cp.async issued since the last commit."""
    _asm(None, [], "cp.async.commit_group;", "~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def cp_async_wait(pending: int, *, loc=None, ip=None) -> None:
    """Wait until at most `pending` committed cp.async groups of this thread are in flight."""
    _asm(None, [], f"cp.async.wait_group {pending};", "~{memory}", loc, ip, side_effects=True)


def _ldmatrix(addr, trans: bool, loc, ip) -> list:
    res = _asm(llvm.StructType.get_literal([T.i32()] * 4), [_u32(addr, loc, ip)],
               f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 "
               "{$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r,~{memory}", loc, ip, side_effects=True)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ldmatrix_x4(addr, *, loc=None, ip=None) -> list:
    """Four 8x8 bf16 matrices from shared memory: lanes 8i … 8i+7 give the row addresses of
    matrix i (16 bytes each); register i of lane (g, t) holds row g, columns 2t, 2t+1 of
    matrix i (the mma B fragment of a row-major [n][k] tile)."""
    return _ldmatrix(addr, False, loc, ip)


@dsl_user_op
def ldmatrix_x4_trans(addr, *, loc=None, ip=None) -> list:
    """ldmatrix_x4 transposed: register i of lane (g, t) holds rows 2t, 2t+1 of column g of
    matrix i (the mma B fragment of a row-major [k][n] tile)."""
    return _ldmatrix(addr, True, loc, ip)


@dsl_user_op
def ex2(x, *, loc=None, ip=None) -> Float32:
    """2^x (ex2.approx.ftz.f32: ~2^-22 relative; 2^-inf = 0)."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)],
                        "ex2.approx.ftz.f32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def pack_bf16(lo, hi, *, loc=None, ip=None) -> Uint32:
    """bf16x2 {lo, hi} (lo in bits 0-15) of two fp32 values, round to nearest even."""
    return Uint32(_asm(T.i32(), [Float32(hi).ir_value(loc=loc, ip=ip),
                                 Float32(lo).ir_value(loc=loc, ip=ip)],
                       "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", loc, ip))


@dsl_user_op
def ld_weight_v2(addr, *, loc=None, ip=None) -> list:
    """8 weight bytes at an 8-byte aligned global byte address, as 2 u32 (ld.global.nc.v2)."""
    res = _ld_nc(".v2.u32", 2, addr, loc, ip)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(2)]


@dsl_user_op
def ld_weight_u8(addr, *, loc=None, ip=None) -> Uint32:
    """One weight byte at a global byte address, zero-extended."""
    return Uint32(_ld_nc(".u8", 1, addr, loc, ip))


@dsl_user_op
def st_v4(addr, words, *, loc=None, ip=None) -> None:
    """Store 4 u32 (16 bytes) at a 16-byte aligned global byte address."""
    _asm(None, [_i64(addr, loc, ip)] + [_u32(w, loc, ip) for w in words],
         "st.global.v4.b32 [$0], {$1, $2, $3, $4};", "l,r,r,r,r,~{memory}", loc, ip,
         side_effects=True)


@dsl_user_op
def ld_shared_v4(addr, *, loc=None, ip=None) -> list:
    """16 bytes at a 16-byte aligned shared-window address (u32), as 4 u32 (LDS.128)."""
    res = _asm(llvm.StructType.get_literal([T.i32()] * 4), [_u32(addr, loc, ip)],
               "ld.shared.v4.u32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,r,~{memory}", loc, ip,
               side_effects=True)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def st_shared_u16(addr, value, *, loc=None, ip=None) -> None:
    """Store the low 16 bits of `value` at a 2-byte aligned shared-window address (u32)."""
    _asm(None, [_u32(addr, loc, ip), _u32(value, loc, ip)],
         "{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, $1;\n\tst.shared.b16 [$0], lo;\n\t}",
         "r,r,~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def cp_async_8(dst, src, *, loc=None, ip=None) -> None:
    """cp.async of 8 bytes from global byte address `src` to shared address `dst` (u32), through
    L1 (.ca: the only caching cp.async takes below 16 bytes)."""
    _asm(None, [_u32(dst, loc, ip), _i64(src, loc, ip)],
         "cp.async.ca.shared.global [$0], [$1], 8;", "r,l,~{memory}", loc, ip,
         side_effects=True)


@dsl_user_op
def ld_shared_u16(addr, *, loc=None, ip=None) -> Uint32:
    """2 bytes at a 2-byte aligned shared-window address (u32), zero-extended."""
    return Uint32(_asm(T.i32(), [_u32(addr, loc, ip)],
                       "{\n\t.reg .b16 h;\n\tld.shared.b16 h, [$1];\n\tcvt.u32.u16 $0, h;\n\t}",
                       "=r,r,~{memory}", loc, ip, side_effects=True))


# -- top-k over a warp (the routers: kernels/decode/moe_router.py, kernels/prefill/moe_route.py) --


@dsl_user_op
def order_key(x, *, loc=None, ip=None) -> Int32:
    """An int32 whose signed order is the float order of fp32 `x` (negative floats' magnitude
    bits flipped), so the largest float wins an integer max (warp_redux_sync)."""
    bits = Int32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def lane_best(keys, ids, svals):
    """(key, id, s) of the largest key among a lane's candidates (ids ascending; ties keep the
    lower id), as a depth-log2(n) tree of selects rather than a chain (trace-time helper)."""
    items = list(zip(keys, ids, svals))
    while len(items) > 1:
        nxt = []
        for a in range(0, len(items) - 1, 2):
            (ka, ia, sa), (kb, ib, sb) = items[a], items[a + 1]
            first = ka >= kb
            nxt.append((cutlass.select_(first, ka, kb), cutlass.select_(first, ia, ib),
                        cutlass.select_(first, sa, sb)))
        items = nxt + items[len(items) - len(items) % 2:]
    k, i, sv = items[0]
    return Int32(k), Int32(i), Float32(sv)



# -- Hopper warpgroup MMA (wgmma, sm_90a only: kernels/prefill/attn_prefill_wg.py) ----------------


def _f32_struct(n: int):
    return llvm.StructType.get_literal([T.f32()] * n)


def _f32_list(res, n: int, loc, ip) -> list:
    return [Float32(llvm.extractvalue(T.f32(), res, [i], loc=loc, ip=ip)) for i in range(n)]


@dsl_user_op
def smem_desc(addr, lbo: int, sbo: int, *, loc=None, ip=None) -> Int64:
    """A wgmma shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format") for a
    128-byte-swizzled operand at shared-window address `addr` (u32; its swizzle atoms
    1024-byte aligned, so the base offset is 0): start address >> 4 in bits 0-13, the leading
    and stride byte offsets >> 4 in bits 16-29 and 32-45 (`lbo`, `sbo`: bytes, compile time),
    swizzle mode 1 (128 B) in bits 62-63."""
    hi = (sbo >> 4) | (1 << 30)  # bits 32-45 and 62-63 of the descriptor, as its high word
    lo = (Uint32(addr) >> 4) & Uint32(0x3FFF) | Uint32(((lbo >> 4) & 0x3FFF) << 16)
    return (Int64(hi) << 32) | Int64(lo)


@dsl_user_op
def wgmma_fence(*, loc=None, ip=None) -> None:
    """wgmma.fence: orders earlier register writes of accumulators and A fragments (and shared
    memory writes) before the warpgroup's next wgmma."""
    _asm(None, [], "wgmma.fence.sync.aligned;", "~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def wgmma_commit(*, loc=None, ip=None) -> None:
    """wgmma.commit_group: the wgmmas issued since the last commit become one group."""
    _asm(None, [], "wgmma.commit_group.sync.aligned;", "~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def wgmma_wait(pending: int, *, loc=None, ip=None) -> None:
    """wgmma.wait_group: until at most `pending` committed groups are still running."""
    _asm(None, [], f"wgmma.wait_group.sync.aligned {pending};", "~{memory}", loc, ip,
         side_effects=True)


@dsl_user_op
def fence_proxy_async_shared(*, loc=None, ip=None) -> None:
    """fence.proxy.async.shared::cta: this thread's shared-memory writes (cp.async, st.shared)
    become visible to the async proxy, through which wgmma reads its shared operands."""
    _asm(None, [], "fence.proxy.async.shared::cta;", "~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def fence_values(values, *, loc=None, ip=None) -> list:
    """The fp32 `values` passed through an empty volatile asm: their uses cannot move above
    an earlier volatile asm (a wgmma.wait_group), which their SSA values alone would allow."""
    n = len(values)
    res = _asm(_f32_struct(n), [Float32(v).ir_value(loc=loc, ip=ip) for v in values], "",
               ",".join(["=f"] * n + [str(i) for i in range(n)]), loc, ip, side_effects=True)
    return _f32_list(res, n, loc, ip)


def _wgmma_text(n: int, nacc: int, a_regs: bool, trans_b: int) -> tuple[str, str]:
    """Text and constraints of one m64nNk16 bf16 wgmma with fp32 accumulators (tied in/out),
    scale-d from an i32 operand (0: D = A·B, else D += A·B)."""
    d = ", ".join(f"${i}" for i in range(nacc))
    k = nacc * 2  # after the outputs and the tied inputs
    if a_regs:
        a = "{" + ", ".join(f"${k + i}" for i in range(4)) + "}"
        b, scale = f"${k + 4}", f"${k + 5}"
        tail = f"p, 1, 1, {trans_b}"
        cons = ["r"] * 4 + ["l", "r"]
    else:
        a, b, scale = f"${k}", f"${k + 1}", f"${k + 2}"
        tail = f"p, 1, 1, 0, {trans_b}"
        cons = ["l", "l", "r"]
    text = ("{\n\t.reg .pred p;\n\t"
            f"setp.ne.b32 p, {scale}, 0;\n\t"
            f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 {{{d}}}, {a}, {b}, {tail};"
            "\n\t}")
    constraints = ",".join(["=f"] * nacc + [str(i) for i in range(nacc)] + cons)
    return text, constraints


@dsl_user_op
def wgmma_ss(n: int, desc_a, desc_b, acc, accumulate, *, trans_b: int = 0, loc=None,
             ip=None) -> list:
    """One warpgroup-wide wgmma m64nNk16 (bf16 in, fp32 accumulate), A and B from shared
    memory by descriptor (`smem_desc`): returns the thread's N/2 accumulators (the m64nN
    fragment: warp w of the warpgroup, lane g·4 + t holds rows 16w + g and + 8, columns
    8j + 2t and + 1 of n-tile j, as c0..c3 of mma.sync m16n8k16 per 8 columns), A·B added to
    `acc` when `accumulate` (an Int32, nonzero) else replacing it. Asynchronous: the values
    are ready after wgmma_commit and wgmma_wait (then `fence_values`)."""
    text, cons = _wgmma_text(n, n // 2, False, trans_b)
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in acc]
    args += [Int64(desc_a).ir_value(loc=loc, ip=ip), Int64(desc_b).ir_value(loc=loc, ip=ip),
             Int32(accumulate).ir_value(loc=loc, ip=ip)]
    res = _asm(_f32_struct(n // 2), args, text, cons, loc, ip, side_effects=True)
    return _f32_list(res, n // 2, loc, ip)


@dsl_user_op
def wgmma_rs(n: int, a, desc_b, acc, accumulate, *, trans_b: int = 0, loc=None,
             ip=None) -> list:
    """As `wgmma_ss` with A from registers: `a` the 4 bf16x2 registers of the warp's 16 rows
    in mma.sync m16n8k16's A layout (a0 = A[g][2t..], a1 = A[g+8][2t..], a2 = A[g][2t+8..],
    a3 = A[g+8][2t+8..]); `trans_b` = 1 reads B from an MN-major (N-contiguous) layout."""
    text, cons = _wgmma_text(n, n // 2, True, trans_b)
    args = [Float32(v).ir_value(loc=loc, ip=ip) for v in acc]
    args += [_u32(v, loc, ip) for v in a]
    args += [Int64(desc_b).ir_value(loc=loc, ip=ip), Int32(accumulate).ir_value(loc=loc, ip=ip)]
    res = _asm(_f32_struct(n // 2), args, text, cons, loc, ip, side_effects=True)
    return _f32_list(res, n // 2, loc, ip)


@dsl_user_op
def st_shared_v4(addr, words, *, loc=None, ip=None) -> None:
    """Store 4 u32 (16 bytes) at a 16-byte aligned shared-window address (u32, STS.128)."""
    _asm(None, [_u32(addr, loc, ip)] + [_u32(w, loc, ip) for w in words],
         "st.shared.v4.b32 [$0], {$1, $2, $3, $4};", "r,r,r,r,r,~{memory}", loc, ip,
         side_effects=True)


@dsl_user_op
def st_shared_u32(addr, value, *, loc=None, ip=None) -> None:
    """Store a u32 at a 4-byte aligned shared-window address (u32)."""
    _asm(None, [_u32(addr, loc, ip), _u32(value, loc, ip)], "st.shared.b32 [$0], $1;",
         "r,r,~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def ld_shared_u32(addr, *, loc=None, ip=None) -> Uint32:
    """A u32 at a 4-byte aligned shared-window address (u32)."""
    return Uint32(_asm(T.i32(), [_u32(addr, loc, ip)], "ld.shared.b32 $0, [$1];",
                       "=r,r,~{memory}", loc, ip, side_effects=True))


@dsl_user_op
def atom_add_acq_rel(addr, *, loc=None, ip=None) -> Uint32:
    """atom.acq_rel.gpu add 1 at a global u32 byte address; the old value. Release: this
    thread's earlier writes (and, after a CTA barrier, its CTA's: the release is cumulative)
    are visible before the add; acquire: writes released before earlier adds are visible
    after it (cooperative groups' grid-sync pattern; split-KV's last-arriver combine)."""
    return Uint32(_asm(T.i32(), [_i64(addr, loc, ip)],
                       "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;", "=r,l,~{memory}", loc,
                       ip, side_effects=True))


@dsl_user_op
def st_relaxed_zero(addr, *, loc=None, ip=None) -> None:
    """st.relaxed.gpu 0 at a global u32 byte address (a completion counter reset for the next
    launch)."""
    _asm(None, [_i64(addr, loc, ip)], "st.relaxed.gpu.global.u32 [$0], 0;", "l,~{memory}",
         loc, ip, side_effects=True)


@dsl_user_op
def ld_cg_v4_if(addr, pred, *, loc=None, ip=None) -> list:
    """16 bytes at a 16-byte aligned global byte address where `pred` holds (else zeros), as
    4 u32, through L2 only (ld.global.cg: data other CTAs of this launch wrote)."""
    from cutlass import Int32

    res = _asm(llvm.StructType.get_literal([T.i32()] * 4),
               [_i64(addr, loc, ip), Int32(pred).ir_value(loc=loc, ip=ip)],
               "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $5, 0;\n\tmov.b32 $0, 0;\n\tmov.b32 $1, 0;"
               "\n\tmov.b32 $2, 0;\n\tmov.b32 $3, 0;\n\t"
               "@p ld.global.cg.v4.u32 {$0, $1, $2, $3}, [$4];\n\t}", "=r,=r,=r,=r,l,r", loc,
               ip, side_effects=True)
    return [Uint32(llvm.extractvalue(T.i32(), res, [i], loc=loc, ip=ip)) for i in range(4)]


@dsl_user_op
def ld_cg_u32_if(addr, pred, *, loc=None, ip=None) -> Uint32:
    """As ld_cg_v4_if for one 32-bit word (zero where `pred` does not hold)."""
    from cutlass import Int32

    return Uint32(_asm(T.i32(), [_i64(addr, loc, ip), Int32(pred).ir_value(loc=loc, ip=ip)],
                       "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, $2, 0;\n\tmov.b32 $0, 0;\n\t"
                       "@p ld.global.cg.b32 $0, [$1];\n\t}", "=r,l,r", loc, ip,
                       side_effects=True))


@dsl_user_op
def st_v2(addr, words, *, loc=None, ip=None) -> None:
    """Store 2 u32 (8 bytes) at an 8-byte aligned global byte address."""
    _asm(None, [_i64(addr, loc, ip)] + [_u32(w, loc, ip) for w in words],
         "st.global.v2.b32 [$0], {$1, $2};", "l,r,r,~{memory}", loc, ip, side_effects=True)


@dsl_user_op
def lg2(x, *, loc=None, ip=None) -> Float32:
    """log2(x) (lg2.approx.f32: ~2^-22 relative; lg2(0) = -inf)."""
    return Float32(_asm(T.f32(), [Float32(x).ir_value(loc=loc, ip=ip)],
                        "lg2.approx.f32 $0, $1;", "=f,f", loc, ip))


@dsl_user_op
def f32_bits(x, *, loc=None, ip=None) -> Uint32:
    """The 32 bits of fp32 `x` as a u32 (no conversion; as_f32's inverse)."""
    return Uint32(llvm.bitcast(T.i32(), Float32(x).ir_value(loc=loc, ip=ip), loc=loc, ip=ip))
