"""MoE down projections + routing-weighted sum + shared expert + residual add, for decode rows.

For each row b of the batch: residual_out[b] = bf16(residual[b] + bf16(Σ_s slot_w[s,b] ·
bf16(down_{experts[s]}(act[s,b])) + bf16(shared_down(act_sh[b])))), the fp32 sum running over
the slots row b picked (slot_w[s,b] ≥ 0) in ascending slot order, which is ascending expert id
(`experts` is sorted, −1 marks unused slots), then the shared term. It must match
`reference.moe`'s weighted sum (each expert's down projection a bf16-rounded `reference.linear`)
followed by `reference.residual_add` (docs/decode-kernels.md kernel 8, DESIGN §4). With TOPK = 0
(the dense MLP layers) only the shared path exists: its down projection, rounded, plus the
residual; the routed arguments are absent and E = M = 0 in the spec.

Design: one CTA owns 16 output rows of H (128 CTAs at H = 2048) and every slot of the batch, so
each picked expert's weights are read once whatever number of rows picked it: the B rows are the
columns n of mma.sync m16n8k16 tiles (W as A: 16 rows x 16 k, act[s] as B), as in
gemv_nvfp4.py / gemv_bf16.py, whose fragment math (gemv_mma.frag_ops) and dsl_util
instructions this file uses. Warp w of W takes slots w, w + W, … (a dynamic loop that loads the
next trip's expert id and act predicate a trip ahead); for a live slot its 4-lane quads split
K = M (NVFP4: 32-k lane chunks, 16-byte code + 2-byte scale loads of rows g and g+8; BF16: 8-k
chunks). All of a slot's weight and act loads are in flight at once (BF16: 8 of its 16 steps
at a time): the HMMA accumulators start from a zero computed from every loaded register
(`_zero_after`), else ptxas sinks each load next to its use. A lane loads act column g only
where slot_w[s, g] ≥ 0, zeros otherwise: a padding row (all −1) is never read, so its garbage
cannot reach the mma, and act costs L2 reads only where picked. The warp rounds its
16x8 fp32 tile ·scale2 to bf16, weights it by slot_w (0 where not picked) and stores it to
shared memory at [slot, column, row]. The shared (dense) down projection is split over all
warps (chunk t + 4·(warp + W·step)); each warp stores its fp32 partial ·scale2. Then one
thread per (row, column) adds the slot products in slot order (an exact +0 for slots the row
did not pick), adds the shared partials in warp order, rounded, rounds the sum, adds the
residual, rounds and stores.

Batch invariance: a row's result never depends on the other rows (bitwise): the per-slot K
split and its summation order depend on M and the format only, the shared split on W (the
same for every B), a column of an mma tile is computed from its own column alone, and the slot
sum adds exact zeros for the other rows' slots. So a request's output is the same alone or
batched.

PDL: the shared (dense) down weights and their scale2 are loaded (dsl_util's volatile
ld.global.nc, up to PREFETCH steps per lane) before griddepcontrol.wait, which
`griddepcontrol_wait_after_loads` pins below them in SASS too. Everything else is read after
it: experts, slot_w, act, act_sh, residual (NVFP4: right after the wait, not after the final
barrier), and the routed weights (which expert is an input; each trip's scale2 is a volatile
weight load that `after_loads` keeps with the trip's weights). Measured on the H200 and
dropped: cp.async.bulk.prefetch.L2 of a warp's later trips' experts (B = 8 NVFP4 14.9 ->
16.3 µs) and of the dense rows before the wait (5.5 -> 5.8 µs at B = 1).

Tolerance (GPU test): ‖out − ref‖/‖ref‖ ≤ 1e-2 on residual_out, also with a tiny residual so
the MoE term is what is compared. Every e2m1·e4m3 product is exact; only the fp32 summation
order inside each projection differs from the reference (and scale2 multiplies the fp32 sum, not
each weight), which can move a bf16-rounded expert or shared output by one bf16 ulp in rare
elements; the weighted sum, its rounding and the residual add are the reference's own
operations in its order: expected ~1e-3 norm-wise, the bf16 rounding (2^-9) level.

Shape legend: B batch bucket, H hidden, E routed experts, M expert width, MS shared (dense)
width, TOPK experts per row, S = min(E, B·TOPK) slots, FMT 0 BF16 / 1 NVFP4.
"""

import math

import torch

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import BUCKETS, KernelDef, Launch, Spec, TensorArg, unique_specs
from flint_graph.checkpoints.weights import NVFP4Weight, expert_weight

ROWS = 16  # output rows per CTA (one m16 tile)
# Warps per CTA. MoE layers: 8, so a warp may hold a whole slot's weights and act in registers
# (255 per thread; 48 slots at B = 8 are 6 trips of 8 slots in flight per SM); dense layers
# (K = 10944): 16, a longer split-K, as gemv_nvfp4 V=4. Never a function of B: the shared
# term's summation order depends on it.
MOE_WARPS, DENSE_WARPS = 8, 16
PREFETCH = {0: 8, 1: 4}  # FMT -> shared weight steps in flight per lane (also before the wait)
EXPERT_BATCH = {0: 8, 1: 4}  # FMT -> routed steps (weights + act) in flight per lane at once
KSTEP = {0: 8, 1: 32}  # FMT -> k per lane chunk (one 16-byte weight load per row)


def slots(spec: Spec) -> int:
    """S, the slot count of the router's expert list: min(E, B·TOPK) (0 for dense layers)."""
    return min(spec["E"], spec["B"] * spec["TOPK"])


def _warps(spec: Spec) -> int:
    return MOE_WARPS if spec["TOPK"] else DENSE_WARPS


def _slot_iters(spec: Spec) -> int:
    """Trips of each warp's slot loop (slots padded to a multiple of the warps)."""
    return math.ceil(slots(spec) / _warps(spec))


def _args(spec: Spec):
    b, h, e, m, ms = spec["B"], spec["H"], spec["E"], spec["M"], spec["MS"]
    fmt, s = spec["FMT"], slots(spec)
    routed = spec["TOPK"] > 0
    a = []
    if routed:
        a.append(TensorArg("act", "bf16", (s, b, m), "input"))
    a.append(TensorArg("act_sh", "bf16", (b, ms), "input"))
    if routed:
        a += [TensorArg("experts", "i32", (s,), "input", align=4),
              TensorArg("slot_w", "f32", (s, b), "input", align=4)]
    a.append(TensorArg("residual", "bf16", (b, h), "input"))
    if fmt == 1:
        if routed:
            a += [TensorArg("down_codes", "u8", (e, h, m // 2), "weight"),
                  TensorArg("down_scales", "u8", (e, h, m // 16), "weight", align=4),
                  TensorArg("down_scale2", "f32", (e,), "weight", align=4)]
        a += [TensorArg("shared_codes", "u8", (h, ms // 2), "weight"),
              TensorArg("shared_scales", "u8", (h, ms // 16), "weight", align=4),
              TensorArg("shared_scale2", "f32", (1,), "weight", align=4)]
    else:
        if routed:
            a.append(TensorArg("down", "bf16", (e, h, m), "weight"))
        a.append(TensorArg("shared_down", "bf16", (h, ms), "weight"))
    a.append(TensorArg("residual_out", "bf16", (b, h), "output"))
    return tuple(a)


def _smem(spec: Spec) -> int:
    """fp32 [slot, column, row] products plus [warp, column, row] shared partials."""
    w = _warps(spec)
    return (_slot_iters(spec) * w + w) * 8 * ROWS * 4


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(spec["H"] // ROWS, 1, 1), block=(32 * _warps(spec), 1, 1),
                  smem=_smem(spec))


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """Every bucket, both formats; the MoE layers (routed + shared) and, if the model has any,
    the dense layers (TOPK = 0, MS = intermediate_size; E = M = 0: no routed arguments)."""
    h, m, i = cfg.hidden_size, cfg.moe_intermediate_size, cfg.intermediate_size
    ms = cfg.n_shared_experts * m
    if h % ROWS or m % 64 or i % 64 or cfg.n_shared_experts < 1:
        raise ValueError(f"moe_down: hidden_size {h} must be a multiple of {ROWS}, "
                         f"moe_intermediate_size {m} and intermediate_size {i} of 64, and "
                         f"n_shared_experts ({cfg.n_shared_experts}) at least 1")
    out = []
    for b in buckets:
        for fmt in (0, 1):
            out.append(KERNEL.spec(B=b, H=h, E=cfg.n_routed_experts, M=m, MS=ms,
                                   TOPK=cfg.num_experts_per_tok, FMT=fmt))
            if cfg.first_k_dense_replace > 0:
                out.append(KERNEL.spec(B=b, H=h, E=0, M=0, MS=i, TOPK=0, FMT=fmt))
    return unique_specs(out)


def _split(spec: Spec, args):
    """{name: tensor} of the non-output arguments, by declared name."""
    names = [a.name for a in _args(spec) if a.role != "output"]
    return dict(zip(names, args))


def _weights(spec: Spec, t) -> tuple:
    """(routed down stack or None, shared down) as reference.linear takes them."""
    if spec["FMT"] == 1:
        routed = NVFP4Weight(t["down_codes"], t["down_scales"], t["down_scale2"]) \
            if spec["TOPK"] else None
        return routed, NVFP4Weight(t["shared_codes"], t["shared_scales"], t["shared_scale2"][0])
    return t.get("down"), t["shared_down"]


def _reference(spec: Spec, *args):
    """(residual_out,) bf16 [B, H]: reference.moe's weighted sum then reference.residual_add."""
    t = _split(spec, args)
    routed, shared = _weights(spec, t)
    acc = torch.zeros(t["residual"].shape, dtype=torch.float32, device=t["residual"].device)
    if spec["TOPK"]:
        experts, slot_w = t["experts"].tolist(), t["slot_w"]
        for s, e in enumerate(experts):  # ascending expert id, as reference.moe
            if e < 0:
                continue
            rows = (slot_w[s] >= 0).nonzero(as_tuple=True)[0]
            if rows.numel():
                y = reference.linear(t["act"][s, rows], expert_weight(routed, e))
                acc.index_add_(0, rows, y.float() * slot_w[s, rows, None])
    acc += reference.linear(t["act_sh"], shared).float()
    return (reference.residual_add(t["residual"], acc.to(reference.ACT_DTYPE)),)


GARBAGE = (float("nan"), float("inf"), float("-inf"), 1e30)  # a padding row's act values


def make_args(spec: Spec, *, gen: torch.Generator, device: str = "cuda", picks=None,
              pad_rows=(), residual_scale: float = 1.0):
    """One fresh argument list in declared order, drawn on `gen`'s device, moved to `device`.

    picks: per row a list of distinct expert ids (at most TOPK; none = a padding row);
    default: TOPK random distinct experts per row, except `pad_rows`, which pick none. The act
    and act_sh columns of `pad_rows` hold GARBAGE (NaN, ±inf, 1e30 in turn), which no other
    row's output may see. residual_scale scales the (random, nonzero) residual: a tiny one
    makes the MoE term dominate residual_out. Weights like the synthetic checkpoints (NVFP4:
    every code and scale byte value; per-expert scale2 positive, not powers of two), inputs
    Gaussian, routing weights in [0.1, 1), the output NaN-poisoned."""
    b, h, e, m, ms, topk = (spec[k] for k in ("B", "H", "E", "M", "MS", "TOPK"))
    on, s_count = gen.device, slots(spec)

    def randn(*shape, scale=1.0):
        return torch.randn(shape, generator=gen, device=on) * scale

    def u8(*shape):
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8, device=on)

    def garbage(n):
        return torch.tensor(GARBAGE).repeat(n // len(GARBAGE) + 1)[:n].to(torch.bfloat16)

    t = {}
    if topk:
        if picks is None:
            picks = [[] if r in pad_rows else
                     torch.randperm(e, generator=gen, device=on)[:topk].tolist()
                     for r in range(b)]
        picks = [list(p) for p in picks]
        experts = sorted({x for p in picks for x in p})
        if len(picks) != b or any(len(set(p)) != len(p) or len(p) > topk or
                                  not all(0 <= x < e for x in p) for p in picks):
            raise ValueError(f"picks {picks}: expected {b} rows of at most {topk} distinct "
                             f"expert ids in [0, {e})")
        slot_w = torch.full((s_count, b), -1.0)
        rw = torch.rand((b, topk), generator=gen, device=on).cpu() * 0.9 + 0.1
        for r, p in enumerate(picks):
            for j, x in enumerate(p):
                slot_w[experts.index(x), r] = rw[r, j]
        t["act"] = randn(s_count, b, m).to(torch.bfloat16)
        t["experts"] = torch.tensor(experts + [-1] * (s_count - len(experts)), dtype=torch.int32)
        t["slot_w"] = slot_w
    t["act_sh"] = randn(b, ms).to(torch.bfloat16)
    t["residual"] = randn(b, h, scale=residual_scale).to(torch.bfloat16)
    for r in pad_rows:
        if topk:
            t["act"][:, r] = garbage(m).to(on)
        t["act_sh"][r] = garbage(ms).to(on)
    if spec["FMT"] == 1:
        if topk:
            t["down_codes"], t["down_scales"] = u8(e, h, m // 2), u8(e, h, m // 16)
            t["down_scale2"] = randn(e).abs() * 0.01 + 1e-3
        t["shared_codes"], t["shared_scales"] = u8(h, ms // 2), u8(h, ms // 16)
        t["shared_scale2"] = randn(1).abs() * 0.01 + 1e-3
    else:
        if topk:
            t["down"] = randn(e, h, m, scale=m ** -0.5).to(torch.bfloat16)
        t["shared_down"] = randn(h, ms, scale=ms ** -0.5).to(torch.bfloat16)
    t["residual_out"] = torch.full((b, h), float("nan"), dtype=torch.bfloat16)
    return [t[a.name].to(device) for a in _args(spec)]


def row_alone(spec: Spec, args, r: int):
    """(spec, args) of row r of a batch launched alone at B = 1: its picked slots in the same
    (ascending) order, its act / act_sh / residual, the same weights, a fresh NaN output."""
    names = [a.name for a in _args(spec)]
    t = dict(zip(names, args))
    one = Spec.of(spec.kernel, **{**spec.as_dict(), "B": 1})
    out = dict(t)
    if spec["TOPK"]:
        mine = [s for s in range(slots(spec)) if t["experts"][s] >= 0 and t["slot_w"][s, r] >= 0]
        pad = slots(one) - len(mine)
        idx = torch.tensor(mine, dtype=torch.long, device=t["act"].device)
        act = t["act"][idx, r][:, None]  # [picked, 1, M]
        out["act"] = torch.cat([act, act.new_zeros(pad, 1, spec["M"]).normal_()]).contiguous()
        out["experts"] = torch.cat([t["experts"][idx], t["experts"].new_full((pad,), -1)])
        out["slot_w"] = torch.cat([t["slot_w"][idx, r][:, None],
                                   t["slot_w"].new_full((pad, 1), -1.0)]).contiguous()
    out["act_sh"] = t["act_sh"][r:r + 1].clone()
    out["residual"] = t["residual"][r:r + 1].clone()
    out["residual_out"] = torch.full_like(out["residual"], float("nan"))
    return one, [out[n] for n in names]


def bytes_moved(spec: Spec, args) -> int:
    """Least DRAM bytes of one launch: the picked experts' and the shared down weights once,
    act where picked, act_sh, experts, slot_w, residual read, residual_out written."""
    t = _split(spec, args[:-1])
    total = sum(t[k].numel() * t[k].element_size()
                for k in ("act_sh", "residual", "shared_codes", "shared_scales",
                          "shared_scale2", "shared_down") if k in t)
    total += 2 * spec["B"] * spec["H"]  # residual_out
    if spec["TOPK"]:
        m, h = spec["M"], spec["H"]
        used = sum(1 for x in t["experts"].tolist() if x >= 0)
        per_expert = h * (m // 2 + m // 16) + 4 if spec["FMT"] == 1 else 2 * h * m
        picked = int((t["slot_w"] >= 0).sum())
        total += used * per_expert + picked * 2 * m
        total += t["experts"].numel() * 4 + t["slot_w"].numel() * 4
    return total


def _zero_after():
    """A DSL helper (imports the DSL): zero_after(values) is an fp32 +0.0 that depends on every
    u32 of `values` (their XOR, masked to a finite bit pattern, times 0 in inline asm that
    neither LLVM nor ptxas folds). Starting the HMMA accumulators from it makes the first
    HMMA wait for all of a batch's loads, so ptxas issues them all before it; otherwise it
    sinks the routed weight and act loads next to their first use (a few in flight, to save
    registers), which serialises a slot's DRAM round trips. Related to
    dsl_util.griddepcontrol_wait_after_values; could move to dsl_util."""
    from cutlass import Float32, Uint32
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T, dsl_user_op

    @dsl_user_op
    def zero_after(values, *, loc=None, ip=None) -> Float32:
        fold = Uint32(values[0])
        for v in values[1:]:
            fold = fold ^ Uint32(v)
        return Float32(llvm.inline_asm(
            T.f32(), [fold.ir_value(loc=loc, ip=ip)],
            "{\n\t.reg .b32 t;\n\tand.b32 t, $1, 0x007fffff;\n\t"
            "mul.rn.f32 $0, t, 0f00000000;\n\t}",
            "=f,r", has_side_effects=False, is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT, loc=loc, ip=ip))

    return zero_after


def _body(spec: Spec):
    """The kernel body as a `@cute.jit` function of the declared arguments (one list)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int32, Int64, Uint32
    from cutlass.cutlass_dsl import dsl_user_op

    from flint_graph.kernels.toolchain import dsl_util as du
    from flint_graph.kernels.decode.gemv_mma import frag_ops

    b_rows, h, m, ms, fmt = spec["B"], spec["H"], spec["M"], spec["MS"], spec["FMT"]
    routed, n_slots, warps = spec["TOPK"] > 0, slots(spec), _warps(spec)
    iters = _slot_iters(spec)
    kstep = KSTEP[fmt]
    nsl = kstep // 8  # 16-byte x loads per lane step
    ix = {a.name: i for i, a in enumerate(_args(spec))}
    dequant, xpairs, scales = frag_ops()
    zero_after = _zero_after()
    nch_sh = ms // kstep  # shared: lane chunk t + 4 * (warp + warps * step)
    steps_sh = math.ceil(nch_sh / (4 * warps))
    full_sh = nch_sh // (4 * warps)  # steps in which every lane's chunk exists
    depth_sh = min(steps_sh, PREFETCH[fmt])
    nch_e = m // kstep  # routed: lane chunk t + 4 * step of a whole slot
    steps_e = math.ceil(nch_e / 4)
    full_e = nch_e // 4
    batch_e = min(steps_e, EXPERT_BATCH[fmt])
    # bytes of one weight row (codes or bf16) and of its scale row
    row_bytes_e, row_bytes_sh = (m // 2, ms // 2) if fmt == 1 else (2 * m, 2 * ms)

    def load_w(rows, srows, c):
        """One lane step of weights: per row (4 u32 of codes or bf16, 2 scale bytes or None)."""
        out = []
        for r in range(2):
            words = du.ld_weight_v4(rows[r] + Int64(c) * 16)
            sc = du.ld_weight_u16(srows[r] + Int64(c) * 2) if fmt == 1 else None
            out.append((words, sc))
        return out

    def mma_step(w, x32, acc, live):
        """acc + one lane step: w from load_w, x32 (4, nsl) u32 of the B column; weights of
        chunks past the end of K (live false) count as zero."""
        words = [list(w[r][0]) for r in range(2)]
        if live is not None:
            words = [[cutlass.select_(live, v, Uint32(0)) for v in row] for row in words]
        if fmt == 1:
            sc = scales(du.prmt(w[0][1], w[1][1], 0x5410))
            a = [[du.mul_bf16x2_by_half(p, sc[r], j // 2) for j in range(4)
                  for p in dequant(words[r][j])] for r in range(2)]
            xp = [p for j in range(4) for p in xpairs([x32[i, j] for i in range(4)])]
        else:
            a, xp = words, [x32[i, 0] for i in range(4)]
        for q in range(len(xp) // 2):  # two accumulator sets: two independent HMMA chains
            acc[q % 2] = du.mma_bf16_m16n8k16(
                [a[0][2 * q], a[1][2 * q], a[0][2 * q + 1], a[1][2 * q + 1]],
                [xp[2 * q], xp[2 * q + 1]], acc[q % 2])
        return acc

    def tile(acc):
        """The lane's C fragment: [i] is row g + 8 * (i // 2), column 2t + i % 2."""
        return [acc[0][i] + acc[1][i] for i in range(4)]

    def row_addrs(base, row0, row_bytes):
        return [base + Int64(row0 + 8 * r) * row_bytes for r in range(2)]

    # lane geometry (plain Python: the DSL stages loops and ifs inside the @cute.jit body)
    def chunk_sh(tq, warp, st):
        c = tq + 4 * (warp + warps * st)
        return c if st < full_sh else cutlass.min(c, nch_sh - 1)

    def live_sh(tq, warp, st):
        return None if st < full_sh else tq + 4 * (warp + warps * st) < nch_sh

    def chunk_e(tq, st):
        c = tq + 4 * st
        return c if st < full_e else cutlass.min(c, nch_e - 1)

    def live_e(tq, st):
        return None if st < full_e else tq + 4 * st < nch_e

    def prefetch(rows, srows, chunk, n):
        return [load_w(rows, srows, chunk(st)) for st in range(n)]

    def load_x(ld_x, src, rx):
        """nsl 16-byte x loads; src(j) is the j-th (8,) source view."""
        for j in range(nsl):
            cute.copy(ld_x, src(j), rx[None, j])
        return cute.recast_tensor(rx, Uint32)

    def weight_of(msw, s_c, col):
        """slot_w[s, col]; -1 (not picked) for the padding columns >= B."""
        wv = msw[s_c, cutlass.min(col, b_rows - 1)]
        return cutlass.select_(col < b_rows, wv, Float32(-1.0))

    @dsl_user_op
    def ld_u32_at(a, *, loc=None, ip=None):
        """One 32-bit weight word at a 4-byte aligned global byte address (dsl_util's
        volatile ld.global.nc)."""
        return Uint32(du._ld_nc(".b32", 1, a, loc, ip))

    def zeros_acc():
        return [[Float32(0.0)] * 4, [Float32(0.0)] * 4]

    def after_loads(acc, ws, xs, extra=()):
        """acc + 0, the 0 depending on one register of every load of a batch (weights from
        load_w, x tensors, extra u32 words): the batch's HMMAs wait for all of them, issued
        together."""
        vals = [v for w in ws for r in range(2) for v in (w[r][0][0], w[r][1]) if v is not None]
        vals += [x[0, j] for x in xs for j in range(nsl)] + list(extra)
        z = zero_after(vals)
        return [[a + z for a in chain] for chain in acc]

    @cute.jit
    def body(t):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp, g, tq = tidx // 32, tidx % 32 // 4, tidx % 4
        n0 = bidx * ROWS
        ld_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16, num_bits_per_copy=128)
        mres, mout = t[ix["residual"]], t[ix["residual_out"]]
        gsh = cute.flat_divide(t[ix["act_sh"]], (1, 8))  # (1, 8, B, MS/8)
        bx = cutlass.min(g, b_rows - 1)  # shared: columns >= B repeat the last row, unstored
        if cutlass.const_expr(fmt == 1):
            sh_rows = row_addrs(t[ix["shared_codes"]].iterator.toint(), n0 + g, row_bytes_sh)
            sh_srows = row_addrs(t[ix["shared_scales"]].iterator.toint(), n0 + g, ms // 16)
        else:
            sh_rows = row_addrs(t[ix["shared_down"]].iterator.toint(), n0 + g, row_bytes_sh)
            sh_srows = sh_rows

        # PDL prologue, weights only: the first shared (dense) steps and scale2
        wq = prefetch(sh_rows, sh_srows, lambda st: chunk_sh(tq, warp, st), depth_sh)
        s2_sh = Float32(1.0)
        if cutlass.const_expr(fmt == 1):
            s2_sh = du.ld_weight_f32(t[ix["shared_scale2"]])
        du.griddepcontrol_wait_after_loads()
        cute.arch.griddepcontrol_launch_dependents()

        # the epilogue's residual element, read now: after the final barrier it was one more
        # dependent L2 round trip on every CTA's critical path (BF16: read just before that
        # barrier instead; held across the slot loop it made ptxas spill at B = 4)
        res_col = cutlass.min(tidx // ROWS, b_rows - 1)
        res_early = Float32(0.0)
        if cutlass.const_expr(fmt == 1):
            res_early = mres[res_col, n0 + tidx % ROWS].to(Float32)

        sp = cutlass.memory.SmemAllocator()
        shp = sp.allocate_tensor(Float32, cute.make_layout((warps, 8, ROWS),
                                                           stride=(8 * ROWS, ROWS, 1)),
                                 byte_alignment=16)
        if cutlass.const_expr(routed):
            prod = sp.allocate_tensor(Float32, cute.make_layout((iters * warps, 8, ROWS),
                                                                stride=(8 * ROWS, ROWS, 1)),
                                      byte_alignment=16)
            mexp, msw = t[ix["experts"]], t[ix["slot_w"]]
            gact = cute.flat_divide(t[ix["act"]], (1, 1, 8))  # (1, 1, 8, S, B, M/8)
            if cutlass.const_expr(fmt == 1):
                e_codes = t[ix["down_codes"]].iterator.toint()
                e_scales = t[ix["down_scales"]].iterator.toint()
            else:
                e_codes = t[ix["down"]].iterator.toint()
                e_scales = e_codes
            # the first slot's expert id and act predicate, in flight during the shared GEMV
            s_first = cutlass.min(warp, n_slots - 1)
            e_next = cutlass.select_(warp < n_slots, mexp[s_first], Int32(-1))
            wg_next = weight_of(msw, s_first, g)
        # shared (dense) down projection, split-K over the warps
        xq = []
        for st in cutlass.range_constexpr(min(2, steps_sh)):
            xq.append(load_x(ld_x, lambda j: gsh[0, None, bx, nsl * chunk_sh(tq, warp, st) + j],
                             cute.make_rmem_tensor((8, nsl), BFloat16)))
        acc_sh = zeros_acc()
        for st in cutlass.range_constexpr(steps_sh):
            if cutlass.const_expr(st + 2 < steps_sh):
                xq.append(load_x(
                    ld_x, lambda j: gsh[0, None, bx, nsl * chunk_sh(tq, warp, st + 2) + j],
                    cute.make_rmem_tensor((8, nsl), BFloat16)))
            if cutlass.const_expr(st + depth_sh < steps_sh):
                wq.append(load_w(sh_rows, sh_srows, chunk_sh(tq, warp, st + depth_sh)))
            acc_sh = mma_step(wq[st], xq[st], acc_sh, live_sh(tq, warp, st))
        part_sh = tile(acc_sh)
        for i in cutlass.range_constexpr(4):
            # ·scale2 here, so it need not outlive the slot loop, and not as a scale2·2^7 right
            # after the wait (ptxas put that FMUL there, stalling the input loads on scale2)
            v = part_sh[i] * s2_sh
            if cutlass.const_expr(fmt == 1):
                v = v * Float32(128.0)  # 2^7 left by frag_ops' scale trick (exact)
            shp[warp, 2 * tq + i % 2, g + 8 * (i // 2)] = v

        if cutlass.const_expr(routed):
            for it in cutlass.range(iters, unroll=1):
                s = warp + warps * it
                s_c = cutlass.min(s, n_slots - 1)
                e, picked = e_next, wg_next >= Float32(0.0)
                s_after = cutlass.min(s + warps, n_slots - 1)  # next trip's, loaded ahead
                e_next = cutlass.select_(s + warps < n_slots, mexp[s_after], Int32(-1))
                wg_next = weight_of(msw, s_after, g)
                if e >= 0:
                    w_cols = [weight_of(msw, s_c, 2 * tq), weight_of(msw, s_c, 2 * tq + 1)]
                    e_rows = row_addrs(e_codes + Int64(e) * (h * row_bytes_e), n0 + g,
                                       row_bytes_e)
                    e_srows = e_rows
                    alpha_e = Float32(1.0)
                    alpha_pin = []
                    if cutlass.const_expr(fmt == 1):
                        e_srows = row_addrs(e_scales + Int64(e) * (h * (m // 16)), n0 + g,
                                            m // 16)
                        # scale2[e] issued with the weights (a plain load sank below the
                        # HMMAs: one more L2 round trip per trip); after_loads pins it there
                        alpha_bits = ld_u32_at(t[ix["down_scale2"]].iterator.toint()
                                               + Int64(e) * 4)
                        alpha_e = du.as_f32(alpha_bits) * Float32(128.0)
                        alpha_pin = [alpha_bits]
                    acc_e = zeros_acc()
                    for b0 in cutlass.range_constexpr(0, steps_e, batch_e):
                        nb = min(batch_e, steps_e - b0)
                        we = prefetch(e_rows, e_srows, lambda k: chunk_e(tq, b0 + k), nb)
                        xe = []
                        for k in cutlass.range_constexpr(nb):
                            rx = cute.make_rmem_tensor((8, nsl), BFloat16)
                            rx.fill(0.0)
                            if picked:  # act is read only where this column picked the slot
                                for j in cutlass.range_constexpr(nsl):
                                    cute.copy(ld_x, gact[0, 0, None, s, g,
                                                         nsl * chunk_e(tq, b0 + k) + j],
                                              rx[None, j])
                            xe.append(cute.recast_tensor(rx, Uint32))
                        acc_e = after_loads(acc_e, we, xe, alpha_pin if b0 == 0 else ())
                        # (the batch's loads in flight at once)
                        for k in cutlass.range_constexpr(nb):
                            acc_e = mma_step(we[k], xe[k], acc_e, live_e(tq, b0 + k))
                    y = tile(acc_e)
                    for i in cutlass.range_constexpr(4):
                        yb = (y[i] * alpha_e).to(BFloat16).to(Float32)  # the expert's output
                        wc = w_cols[i % 2]
                        prod[s, 2 * tq + i % 2, g + 8 * (i // 2)] = cutlass.select_(
                            wc >= Float32(0.0), wc * yb, Float32(0.0))
                else:
                    for i in cutlass.range_constexpr(4):
                        prod[s, 2 * tq + i % 2, g + 8 * (i // 2)] = Float32(0.0)
        if cutlass.const_expr(fmt == 0):
            res_early = mres[res_col, n0 + tidx % ROWS].to(Float32)
        cute.arch.sync_threads()
        # one thread per (row, column): slots in order, the shared term, the residual
        if tidx < ROWS * b_rows:
            col, r = tidx // ROWS, tidx % ROWS
            total = Float32(0.0)
            if cutlass.const_expr(routed):
                for sl in cutlass.range_constexpr(n_slots):
                    total = total + prod[sl, col, r]
            sh = shp[0, col, r]
            for w in cutlass.range_constexpr(1, warps):
                sh = sh + shp[w, col, r]
            total = total + sh.to(BFloat16).to(Float32)
            moe = total.to(BFloat16).to(Float32)
            mout[col, n0 + r] = (res_early + moe).to(BFloat16)

    return body


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    launch = _launch(spec)
    body = _body(spec)
    n_args = len(_args(spec))

    # One pass-through per arity (12: NVFP4 MoE, 8: BF16 MoE, 6: NVFP4 dense, 4: BF16 dense):
    # kernel parameter i is declared argument i; the body takes them as one list.
    if n_args == 12:
        @cute.kernel
        def moe_down_kernel(a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor, a3: cute.Tensor,
                            a4: cute.Tensor, a5: cute.Tensor, a6: cute.Tensor, a7: cute.Tensor,
                            a8: cute.Tensor, a9: cute.Tensor, a10: cute.Tensor,
                            a11: cute.Tensor):
            body([a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11])

        @cute.jit
        def moe_down(a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor, a3: cute.Tensor,
                     a4: cute.Tensor, a5: cute.Tensor, a6: cute.Tensor, a7: cute.Tensor,
                     a8: cute.Tensor, a9: cute.Tensor, a10: cute.Tensor, a11: cute.Tensor,
                     stream: cuda.CUstream):
            moe_down_kernel(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11).launch(
                grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
                use_pdl=True)
    elif n_args == 8:
        @cute.kernel
        def moe_down_kernel(a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor, a3: cute.Tensor,
                            a4: cute.Tensor, a5: cute.Tensor, a6: cute.Tensor,
                            a7: cute.Tensor):
            body([a0, a1, a2, a3, a4, a5, a6, a7])

        @cute.jit
        def moe_down(a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor, a3: cute.Tensor,
                     a4: cute.Tensor, a5: cute.Tensor, a6: cute.Tensor, a7: cute.Tensor,
                     stream: cuda.CUstream):
            moe_down_kernel(a0, a1, a2, a3, a4, a5, a6, a7).launch(
                grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
                use_pdl=True)
    elif n_args == 6:
        @cute.kernel
        def moe_down_kernel(a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor, a3: cute.Tensor,
                            a4: cute.Tensor, a5: cute.Tensor):
            body([a0, a1, a2, a3, a4, a5])

        @cute.jit
        def moe_down(a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor, a3: cute.Tensor,
                     a4: cute.Tensor, a5: cute.Tensor, stream: cuda.CUstream):
            moe_down_kernel(a0, a1, a2, a3, a4, a5).launch(
                grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
                use_pdl=True)
    else:
        @cute.kernel
        def moe_down_kernel(a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor,
                            a3: cute.Tensor):
            body([a0, a1, a2, a3])

        @cute.jit
        def moe_down(a0: cute.Tensor, a1: cute.Tensor, a2: cute.Tensor, a3: cute.Tensor,
                     stream: cuda.CUstream):
            moe_down_kernel(a0, a1, a2, a3).launch(
                grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
                use_pdl=True)

    return moe_down


KERNEL = KernelDef(name="moe_down", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py", "decode/gemv_mma.py"))
