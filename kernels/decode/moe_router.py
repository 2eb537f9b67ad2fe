"""MoE router for decode rows: residual add + FFN RMSNorm + fp32 router GEMV + sigmoid + top-k,
and the slot list the expert kernels read (kernel 6 of docs/decode-kernels.md).

Follows DESIGN §1 (router: logits = h·routerᵀ in fp32, s = sigmoid, top-k of s + bias, weights
= the picked s, renormalised when NORM, times `scaling`; one group) and §4 (rounding points); it
must match `reference.residual_add`, `reference.rms_norm` and `reference.route`. Per row b:
residual_out = bf16(residual + x), h = rms_norm(residual_out, norm_w, eps) (bf16), ids [TOPK]
in descending order of s + bias (torch.topk's order; ties go to the lower expert id), weights
aligned with them. Rows with row_mask 0 are padding: ids −1, weights 0, and they pick no slot.
Slot list: experts [S] = the distinct experts any live row picked, ascending, then −1;
slot_w [S, B] = the weight row b gives experts[s], −1.0 where b did not pick it.
residual_out and h must not alias x or residual: every CTA reads all of x and residual.

Design: grid E/EPC CTAs of 256 threads, CTA i owning experts [i·EPC, (i+1)·EPC) (EPC = 2 at
B ≤ 2, else 4, so B = 1 spreads the 2 MB fp32 router of the full config over 128 SMs). Thread t
owns the 8-value chunks t, t + 256, … of H: before griddepcontrol.wait it loads norm_w and its
EPC router rows' chunks (16-byte volatile ld.global.nc). After the wait every CTA recomputes the
B-row RMSNorm from x and residual (L2 hits after the first CTA; each CTA writes only the chunks
c ≡ i mod #CTAs of residual_out and h, so each element is written exactly once), rounds h to
bf16 as the reference does, and dots it with its router rows in fp32: per thread EPC·B partial
sums, a transposing warp butterfly (EPC·B − 1 + a few shuffles for all of them), a cross-warp
sum in shared memory, then s = sigmoid(logit) goes to the scores workspace [B, E]. Last CTA finishes: after a barrier thread 0 does a release fence and
an atomic add on the counter (the grid-sync pattern); the CTA that sees the final count does an
acquire fence, resets the counter to 0 (graph replays start from zero) and reads every score
with ld.global.cg (written by other SMs: never from L1). Warp b takes row b: lane l holds the
experts l + 32j with key s + bias (bias fp32, never rounded), turned once into an
order-preserving int; each of TOPK rounds takes every lane's best candidate (a select tree),
then the warp's: redux.sync max of the key, redux.sync min of the ids holding it (ties go to
the lower expert id, deterministic), the winner's s by one shuffle from its lane, and the
winner's key becomes INT_MIN (taken). Picks go to shared memory (a used flag per expert, the
weight per expert and row, both cleared by every CTA before its atomic, off the last CTA's
path), then a ballot/popc prefix sum over the experts writes experts[] ascending and slot_w,
and the tail is filled with −1. At B = 1 (S = TOPK) lane r instead writes pick r straight to
its rank among the (warp-uniform) picks: no shared memory, no barriers after the top-k.
PDL: norm_w, router and each lane's bias candidates (weights) are loaded before the wait in
every CTA; x, residual, row_mask, the scores and the counter only after it, in every thread.
Tolerance (tests/test_moe_router_gpu.py): residual_out bit-exact (one fp32 add of two bf16,
rounded once); h rel. ≤ 1e-2 (bf16 rounding; the hardware rsqrt and another summation order can
flip a last bit); the routing is checked against `reference.route` run on the kernel's own h
(a one-ulp flip of one h element moves a logit by ~1e-4): ids equal except near ties (s + bias
within 1e-6 relative), weights rel. ≤ 1e-5 (fp32 logits differ only in summation order, ~1e-7;
sigmoid and the division are fp32 with a few ulp).
Shape legend: B batch bucket, H hidden, E routed experts, TOPK experts per row,
S = min(E, B·TOPK) slots.
"""

import math

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import BUCKETS, KernelDef, Launch, ScalarArg, Spec, TensorArg

THREADS = 256
WARPS = THREADS // 32
VEC = 8  # bf16 values per 16-byte load (an H chunk)
MAX_CAND = 16  # top-k candidates per lane (E ≤ 512), one bit each in an int32 mask


def _epc(spec: Spec) -> int:
    """Experts per CTA: 2 at B ≤ 2 (128 CTAs for E = 256), else 4 (each CTA's RMSNorm of B
    rows costs B·H·4 bytes of L2 reads: fewer CTAs at larger B)."""
    e = spec["E"]
    for cand in ((2, 1) if spec["B"] <= 2 else (4, 2, 1)):
        if e % cand == 0:
            return cand
    return 1


def _slots(spec: Spec) -> int:
    return min(spec["E"], spec["B"] * spec["TOPK"])


def _args(spec: Spec):
    b, h, e, k = spec["B"], spec["H"], spec["E"], spec["TOPK"]
    s = _slots(spec)
    return (TensorArg("x", "bf16", (b, h), "input"),
            TensorArg("residual", "bf16", (b, h), "input"),
            TensorArg("row_mask", "i32", (b,), "input", align=4),
            TensorArg("norm_w", "bf16", (h,), "weight"),
            TensorArg("router", "f32", (e, h), "weight"),
            TensorArg("bias", "f32", (e,), "weight", align=4),
            TensorArg("residual_out", "bf16", (b, h), "output"),
            TensorArg("h", "bf16", (b, h), "output"),
            TensorArg("ids", "i32", (b, k), "output", align=4),
            TensorArg("weights", "f32", (b, k), "output", align=4),
            TensorArg("experts", "i32", (s,), "output", align=4),
            TensorArg("slot_w", "f32", (s, b), "output", align=4),
            TensorArg("scores", "f32", (b, e), "workspace", align=4),
            TensorArg("counter", "i32", (1,), "workspace", align=4),
            ScalarArg("eps", "f32"),
            ScalarArg("scaling", "f32"))


def _smem_bytes(spec: Spec) -> int:
    b, e = spec["B"], spec["E"]
    sizes = [WARPS * b, b, WARPS * _epc(spec) * b, 4, WARPS, e, e * b]  # 4-byte words
    return sum(-(-4 * n // 16) * 16 for n in sizes)


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(spec["E"] // _epc(spec), 1, 1), block=(THREADS, 1, 1),
                  smem=_smem_bytes(spec))


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """One specialisation per bucket when the config has MoE layers (none otherwise)."""
    if cfg.n_group != 1 or cfg.topk_group != 1:
        raise ValueError(f"moe_router: n_group = {cfg.n_group}, topk_group = {cfg.topk_group}; "
                         f"expected 1 (grouped routing is not implemented)")
    if cfg.hidden_size % VEC:
        raise ValueError(f"moe_router: hidden_size {cfg.hidden_size} must be a multiple of {VEC}")
    if not 1 <= cfg.num_experts_per_tok <= min(32, cfg.n_routed_experts):
        raise ValueError(f"moe_router: num_experts_per_tok {cfg.num_experts_per_tok}; expected "
                         f"1 to min(32, n_routed_experts)")
    if cfg.n_routed_experts > 32 * MAX_CAND:
        raise ValueError(f"moe_router: n_routed_experts {cfg.n_routed_experts}; expected at "
                         f"most {32 * MAX_CAND} ({MAX_CAND} top-k candidates per lane)")
    if cfg.first_k_dense_replace >= cfg.num_hidden_layers:
        return []
    return [KERNEL.spec(B=b, H=cfg.hidden_size, E=cfg.n_routed_experts,
                        TOPK=cfg.num_experts_per_tok, NORM=int(cfg.norm_topk_prob))
            for b in buckets]


def _reference(spec: Spec, x, residual, row_mask, norm_w, router, bias, scores, counter,
               eps: float, scaling: float):
    """(residual_out, h, ids, weights, experts, slot_w) as the kernel writes them; padding rows'
    residual_out and h are whatever the formula gives (the kernel's may differ there)."""
    r = reference.residual_add(residual, x)
    h = reference.rms_norm(r, norm_w, eps)
    ids, w = reference.route(h, router, bias, spec["TOPK"], scaling, bool(spec["NORM"]))
    return (r, h) + slot_list(spec, ids, w, row_mask)


def slot_list(spec: Spec, ids, weights, row_mask):
    """(ids i32, weights f32, experts, slot_w) from per-row picks: padding rows (row_mask 0)
    get ids −1 and weights 0 and pick no slot. Used by the reference and the GPU test (on the
    kernel's own ids and weights)."""
    import torch

    live = (row_mask != 0)[:, None]
    ids = torch.where(live, ids.long(), -1)
    weights = torch.where(live, weights.float(), 0.0)
    s, b_rows = _slots(spec), ids.shape[0]
    picked = torch.unique(ids[ids >= 0])  # ascending
    experts = torch.full((s,), -1, dtype=torch.int32, device=ids.device)
    experts[:picked.numel()] = picked.to(torch.int32)
    slot_w = torch.full((s, b_rows), -1.0, dtype=torch.float32, device=ids.device)
    for i, e in enumerate(picked.tolist()):
        rows, cols = (ids == e).nonzero(as_tuple=True)
        slot_w[i, rows] = weights[rows, cols]
    return ids.to(torch.int32), weights, experts, slot_w


def make_args(spec: Spec, *, gen, device: str = "cuda", row_mask=None, eps: float = 1e-5,
              scaling: float = 2.5) -> list:
    """One fresh argument list in declared order: x, residual ~N(0, 1) bf16, norm_w ~1 + 0.1·N,
    router ~N(0, 1/H) fp32 (the synthetic checkpoint's scale: logits ~N(0, 1)), bias
    ~N(0, 0.005) fp32; outputs NaN (ids, experts −1), scores NaN, counter 0. row_mask: a list
    of 0/1 per row (default all live). Drawn on `gen`'s device, moved to `device`."""
    import torch

    b, h, e, k = spec["B"], spec["H"], spec["E"], spec["TOPK"]
    s, on = _slots(spec), gen.device

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=on)

    mask = torch.ones(b, dtype=torch.int32) if row_mask is None else torch.tensor(
        row_mask, dtype=torch.int32)
    nan = float("nan")
    args = [randn(b, h).bfloat16(), randn(b, h).bfloat16(), mask.to(on),
            (1.0 + 0.1 * randn(h)).bfloat16(), randn(e, h) / math.sqrt(h), 0.005 * randn(e),
            torch.full((b, h), nan, dtype=torch.bfloat16), torch.full((b, h), nan,
                                                                       dtype=torch.bfloat16),
            torch.full((b, k), -1, dtype=torch.int32), torch.full((b, k), nan),
            torch.full((s,), -1, dtype=torch.int32), torch.full((s, b), nan),
            torch.full((b, e), nan), torch.zeros(1, dtype=torch.int32)]
    return [t.to(device) for t in args] + [eps, scaling]


def bytes_moved(spec: Spec, args) -> int:
    """Least DRAM bytes of one launch: read x, residual, row_mask, norm_w, router, bias; write
    residual_out, h, ids, weights, experts, slot_w (the scores workspace stays in L2)."""
    b, h, e, k = spec["B"], spec["H"], spec["E"], spec["TOPK"]
    s = _slots(spec)
    return (2 * b * h * 2 + 4 * b + 2 * h + 4 * e * h + 4 * e
            + 2 * b * h * 2 + 2 * 4 * b * k + 4 * s + 4 * s * b)


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int32, Int64, Uint32
    from cutlass.cutlass_dsl import dsl_user_op

    from flint_graph.kernels.toolchain import dsl_util as du

    b_rows, h, e_all, topk, norm = spec["B"], spec["H"], spec["E"], spec["TOPK"], spec["NORM"]
    epc, s_slots = _epc(spec), _slots(spec)
    launch = _launch(spec)
    nctas = launch.grid[0]
    nch = h // VEC
    cpt = math.ceil(nch / THREADS)  # chunks per thread
    ragged = nch % THREADS != 0
    nv = epc * b_rows  # dot products per CTA, v = e·B + b
    if nv & (nv - 1) or nv > 32:
        raise ValueError(f"moe_router: {epc} experts per CTA x B = {b_rows} rows must be a "
                         f"power of two ≤ 32")
    cand = math.ceil(e_all / 32)  # candidates per lane in the top-k
    rounds = math.ceil(e_all / THREADS)  # slot-list compaction rounds
    INT_MIN = -(2 ** 31)  # key of a taken or absent candidate: below every float's int order

    def warp_sums(vals, lane):
        """Warp sums of n = len(vals) (a power of two ≤ 32) values in n − 1 + 5 − log2(n)
        shuffles instead of 5n (a transposing butterfly: at each step a lane keeps half of its
        values and sends the other half to its partner). Returns (sum, index): the lane holds
        the warp sum of vals[index]; lanes whose low 5 − log2(n) bits are 0 hold distinct
        indices."""
        off = 16
        index = Int32(0)
        while len(vals) > 1:
            half = len(vals) // 2
            upper = (lane & off) != 0
            vals = [cutlass.select_(upper, vals[i + half], vals[i])
                    + cute.arch.shuffle_sync_bfly(cutlass.select_(upper, vals[i],
                                                                  vals[i + half]), offset=off)
                    for i in range(half)]
            index = index + cutlass.select_(upper, Int32(half), Int32(0))
            off //= 2
        v = vals[0]
        while off >= 1:
            v = v + cute.arch.shuffle_sync_bfly(v, offset=off)
            off //= 2
        return v, index

    @dsl_user_op
    def ld_f32_at(a, *, loc=None, ip=None):
        """One fp32 weight word at a 4-byte aligned global byte address (dsl_util's volatile
        ld.global.nc)."""
        return du.as_f32(Uint32(du._ld_nc(".b32", 1, a, loc, ip)), loc=loc, ip=ip)

    @cute.kernel
    def moe_router_kernel(mx: cute.Tensor, mres: cute.Tensor, mmask: cute.Tensor,
                          mnw: cute.Tensor, mrouter: cute.Tensor, mbias: cute.Tensor,
                          mro: cute.Tensor, mh: cute.Tensor, mids: cute.Tensor,
                          mwts: cute.Tensor, mexp: cute.Tensor, mslot: cute.Tensor,
                          mscores: cute.Tensor, mcnt: cute.Tensor, eps: Float32,
                          scaling: Float32):
        tid, _, _ = cute.arch.thread_idx()
        cta, _, _ = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32
        e0 = cta * epc

        # weights first (PDL prologue): norm_w and this CTA's router rows, 16 B per load
        rnw = cute.make_rmem_tensor((4, cpt), Uint32)
        rrt = cute.make_rmem_tensor((VEC, epc, cpt), Uint32)  # 8 fp32 per expert
        nw_addr, rt_addr = mnw.iterator.toint(), mrouter.iterator.toint()
        for j in cutlass.range_constexpr(cpt):
            c = tid + THREADS * j
            if cutlass.const_expr(ragged):
                c = cutlass.min(c, nch - 1)  # idle threads read a real chunk, then ignore it
            v = du.ld_weight_v4(nw_addr + Int64(c) * 16)
            for i in cutlass.range_constexpr(4):
                rnw[i, j] = v[i]
            for e in cutlass.range_constexpr(epc):
                row = rt_addr + Int64(e0 + e) * (4 * h) + Int64(c) * 32
                for half in cutlass.range_constexpr(2):
                    v = du.ld_weight_v4(row + 16 * half)
                    for i in cutlass.range_constexpr(4):
                        rrt[4 * half + i, e, j] = v[i]
        # the bias of this lane's top-k candidates (experts lane + 32j): a weight, so it is read
        # here by every CTA (1 KB, L2) rather than by the last CTA after its atomic
        rbias = []
        b_addr = mbias.iterator.toint()
        for j in cutlass.range_constexpr(cand):
            rbias.append(ld_f32_at(b_addr + Int64(cutlass.min(lane + 32 * j, e_all - 1)) * 4))
        du.griddepcontrol_wait_after_loads()
        cute.arch.griddepcontrol_launch_dependents()

        smem = cutlass.memory.SmemAllocator()
        s_ss = smem.allocate_tensor(Float32, cute.make_layout((WARPS, b_rows)), 16)
        s_rstd = smem.allocate_tensor(Float32, cute.make_layout((b_rows,)), 16)
        s_dot = smem.allocate_tensor(Float32, cute.make_layout((WARPS, nv)), 16)
        s_flag = smem.allocate_tensor(Int32, cute.make_layout((4,)), 16)
        s_cnt = smem.allocate_tensor(Int32, cute.make_layout((WARPS,)), 16)
        s_used = smem.allocate_tensor(Int32, cute.make_layout((e_all,)), 16)
        s_w = smem.allocate_tensor(Float32, cute.make_layout((e_all, b_rows)), 16)

        # residual add and RMSNorm of all B rows (inputs: after the wait)
        gx = cute.flat_divide(mx, (1, VEC))  # (1, VEC, B, nch)
        gres = cute.flat_divide(mres, (1, VEC))
        gro = cute.flat_divide(mro, (1, VEC))
        gh = cute.flat_divide(mh, (1, VEC))
        ld = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16, num_bits_per_copy=128)
        st = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), BFloat16, num_bits_per_copy=128)
        rx = cute.make_rmem_tensor((VEC, b_rows, cpt), BFloat16)
        rr = cute.make_rmem_tensor((VEC, b_rows, cpt), BFloat16)
        for j in cutlass.range_constexpr(cpt):
            c = tid + THREADS * j
            if cutlass.const_expr(ragged):
                c = cutlass.min(c, nch - 1)
            for b in cutlass.range_constexpr(b_rows):
                cute.copy(ld, gx[0, None, b, c], rx[None, b, j])
                cute.copy(ld, gres[0, None, b, c], rr[None, b, j])
        ss = [Float32(0.0)] * b_rows
        for j in cutlass.range_constexpr(cpt):
            live_c = tid + THREADS * j < nch
            for b in cutlass.range_constexpr(b_rows):
                rsum = rx[None, b, j].load().to(Float32) + rr[None, b, j].load().to(Float32)
                rr[None, b, j].store(rsum.to(BFloat16))  # the new residual, rounded once
                rf = rr[None, b, j].load().to(Float32)
                part = (rf * rf).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                if cutlass.const_expr(ragged):
                    part = cutlass.select_(live_c, part, Float32(0.0))
                ss[b] = ss[b] + part
        ss_sum, ss_row = warp_sums(ss, lane)
        if lane % (32 // b_rows) == 0:
            s_ss[warp, ss_row] = ss_sum
        cute.arch.sync_threads()
        if tid < b_rows:
            tot = Float32(0.0)
            for w in cutlass.range_constexpr(WARPS):
                tot = tot + s_ss[w, tid]
            s_rstd[tid] = cute.math.rsqrt(tot / Float32(h) + eps)
        cute.arch.sync_threads()

        # h = bf16(r · rstd · w); each element of residual_out and h written by one CTA
        acc = [Float32(0.0)] * nv
        for j in cutlass.range_constexpr(cpt):
            c_raw = tid + THREADS * j
            c = cutlass.min(c_raw, nch - 1) if cutlass.const_expr(ragged) else c_raw
            live_c = c_raw < nch
            wf = cute.recast_tensor(rnw[None, j], BFloat16).load().to(Float32)
            rw = [cute.recast_tensor(rrt[None, e, j], Float32).load()
                  for e in range(epc)]
            for b in cutlass.range_constexpr(b_rows):
                hv = (rr[None, b, j].load().to(Float32) * s_rstd[b]) * wf
                rx[None, b, j].store(hv.to(BFloat16))
                hf = rx[None, b, j].load().to(Float32)
                for e in cutlass.range_constexpr(epc):
                    part = (hf * rw[e]).reduce(cute.ReductionOp.ADD, Float32(0.0), 0)
                    if cutlass.const_expr(ragged):
                        part = cutlass.select_(live_c, part, Float32(0.0))
                    acc[e * b_rows + b] = acc[e * b_rows + b] + part
                if live_c & (c_raw % nctas == cta):
                    cute.copy(st, rr[None, b, j], gro[0, None, b, c])
                    cute.copy(st, rx[None, b, j], gh[0, None, b, c])
        dot_sum, dot_v = warp_sums(acc, lane)
        if lane % (32 // nv) == 0:
            s_dot[warp, dot_v] = dot_sum
        cute.arch.sync_threads()
        if tid < nv:
            logit = Float32(0.0)
            for w in cutlass.range_constexpr(WARPS):
                logit = logit + s_dot[w, tid]
            mscores[tid % b_rows, e0 + tid // b_rows] = (
                Float32(1.0) / (Float32(1.0) + cute.math.exp(-logit)))

        # the slot list's shared-memory state (B > 1), cleared by every CTA before the atomic
        # (only the last CTA uses it; the barrier below orders it before the top-k)
        for i in cutlass.range_constexpr(math.ceil(e_all * b_rows / THREADS) * (b_rows > 1)):
            ix = tid + THREADS * i
            if ix < e_all * b_rows:
                s_w[ix // b_rows, ix % b_rows] = Float32(-1.0)
        for i in cutlass.range_constexpr(math.ceil(e_all / THREADS) * (b_rows > 1)):
            ix = tid + THREADS * i
            if ix < e_all:
                s_used[ix] = Int32(0)
        # last CTA to finish does the top-k (grid-sync pattern: barrier, fence, atomic)
        cute.arch.sync_threads()
        if tid == 0:
            cute.arch.fence_acq_rel_gpu()
            old = cute.arch.atomic_add(mcnt.iterator, Int32(1), sem="relaxed", scope="gpu")
            is_last = Int32(0)
            if old == nctas - 1:
                cute.arch.fence_acq_rel_gpu()
                mcnt[0] = Int32(0)  # every CTA has counted: ready for the next launch
                is_last = Int32(1)
            s_flag[0] = is_last
        cute.arch.sync_threads()
        if s_flag[0] != 0:
            if warp < b_rows:
                # warp b: the top-k of row b; lane l holds experts l + 32j, key s + bias
                rb = warp
                live = mmask[rb] != 0
                keys, sv = [], []
                for j in cutlass.range_constexpr(cand):
                    ex = lane + 32 * j
                    exc = cutlass.min(ex, e_all - 1) if cutlass.const_expr(e_all % 32) else ex
                    sc = cute.arch.load(mscores.iterator + (rb * e_all + exc), Float32,
                                        cop="cg")  # other SMs wrote it: bypass L1
                    key = du.order_key(sc + rbias[j])
                    if cutlass.const_expr(e_all % 32):
                        key = cutlass.select_(ex < e_all, key, Int32(INT_MIN))
                    keys.append(key)
                    sv.append(sc)
                pick_id, pick_s = [], []
                for r in cutlass.range_constexpr(topk):
                    bk, bi, bs = du.lane_best(keys, [lane + 32 * j for j in range(cand)], sv)
                    kmax = cute.arch.warp_redux_sync(bk, "max")
                    win = cute.arch.warp_redux_sync(
                        cutlass.select_(bk == kmax, bi, Int32(e_all)), "min")
                    ws = cute.arch.shuffle_sync(bs, offset=win & 31)  # from the winner's lane
                    # the winner drops out: its key becomes the least int (below every real key)
                    keys = [cutlass.select_(lane + 32 * j == win, Int32(INT_MIN), keys[j])
                            for j in range(cand)]
                    pick_id.append(win)
                    pick_s.append(ws)
                den = pick_s[0]
                for r in cutlass.range_constexpr(1, topk):
                    den = den + pick_s[r]
                for r in cutlass.range_constexpr(topk):
                    wt = pick_s[r] * scaling
                    if cutlass.const_expr(norm):
                        wt = pick_s[r] / den * scaling
                    if lane == r:
                        mids[rb, r] = cutlass.select_(live, pick_id[r], Int32(-1))
                        mwts[rb, r] = cutlass.select_(live, wt, Float32(0.0))
                        if cutlass.const_expr(b_rows == 1):
                            # B = 1: the slot list is the row's picks by ascending id (S = TOPK):
                            # lane r writes pick r at its rank (the picks are warp-uniform)
                            rank = Int32(0)
                            for j in cutlass.range_constexpr(topk):
                                rank = rank + cutlass.select_(pick_id[j] < pick_id[r], Int32(1),
                                                              Int32(0))
                            mexp[rank] = cutlass.select_(live, pick_id[r], Int32(-1))
                            mslot[rank, 0] = cutlass.select_(live, wt, Float32(-1.0))
                        else:
                            if live:
                                s_used[pick_id[r]] = Int32(1)
                                s_w[pick_id[r], rb] = wt
            if cutlass.const_expr(b_rows > 1):
                cute.arch.sync_threads()
                # slot list: ascending picked experts by a ballot/popc prefix sum
                base = Int32(0)
                for rd in cutlass.range_constexpr(rounds):
                    ex = rd * THREADS + tid
                    used = s_used[cutlass.min(ex, e_all - 1)] != 0
                    if cutlass.const_expr(e_all % THREADS):
                        used = used & (ex < e_all)
                    bal = cute.arch.vote_ballot_sync(used)
                    rank = cute.arch.popc(Uint32(bal) & cute.arch.lanemask_lt())
                    if lane == 0:
                        s_cnt[warp] = Int32(cute.arch.popc(Uint32(bal)))
                    cute.arch.sync_threads()
                    before, total = Int32(0), Int32(0)
                    for w in cutlass.range_constexpr(WARPS):
                        n = s_cnt[w]
                        before = before + cutlass.select_(warp > w, n, Int32(0))
                        total = total + n
                    if used:
                        pos = base + before + Int32(rank)
                        mexp[pos] = ex
                        for b in cutlass.range_constexpr(b_rows):
                            mslot[pos, b] = s_w[ex, b]
                    base = base + total
                    cute.arch.sync_threads()
                for i in cutlass.range_constexpr(math.ceil(s_slots / THREADS)):
                    ps = tid + THREADS * i
                    if (ps < s_slots) & (ps >= base):
                        mexp[ps] = Int32(-1)
                        for b in cutlass.range_constexpr(b_rows):
                            mslot[ps, b] = Float32(-1.0)

    @cute.jit
    def moe_router(mx: cute.Tensor, mres: cute.Tensor, mmask: cute.Tensor, mnw: cute.Tensor,
                   mrouter: cute.Tensor, mbias: cute.Tensor, mro: cute.Tensor, mh: cute.Tensor,
                   mids: cute.Tensor, mwts: cute.Tensor, mexp: cute.Tensor, mslot: cute.Tensor,
                   mscores: cute.Tensor, mcnt: cute.Tensor, eps: cutlass.Float32,
                   scaling: cutlass.Float32, stream: cuda.CUstream):
        moe_router_kernel(mx, mres, mmask, mnw, mrouter, mbias, mro, mh, mids, mwts, mexp,
                          mslot, mscores, mcnt, eps, scaling).launch(
            grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
            use_pdl=True)

    return moe_router


KERNEL = KernelDef(name="moe_router", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",))
