"""A prefill chunk's MoE routing and pair grouping in two launches (in place of ~45 small torch
ops per MoE layer): the experts each token picks, and the (token, expert) pairs grouped by
expert for the grouped expert GEMMs (grouped_w4a16.py) and the combine (moe_combine.py).

KIND 0, pick (one warp per token): logit_e = (p2_e + p1_e) + p0_e from the router's three
  tensor-core parts (capture/prefill.py `split_router`, parts fp32 [T, 3E]), s = sigmoid(logit),
  the top-K of s + bias (ties to the lower expert id), weights = the picked s, divided by their
  sum when NORM, times `scaling` — `reference.route` (DESIGN §1) — written in ascending expert
  id (the order the reference's combine adds them): ids int32 [T, K], weights fp32 [T, K]. Each
  live pick takes the next free row of its expert by an atomic add on counts int32 [E] (zero on
  entry): rank int32 [T, K]. Rows ≥ valid[0] (a bucket's padding) pick nothing: ids E,
  weights 0. The order of the rows within an expert thus varies from run to run, the values
  never do: every GEMM row is computed alone, and the combine reads rows by position.
KIND 1, place (one CTA per PLACE_TOKENS tokens): first_e = Σ_{e' < e} counts (every CTA
  scans the E counts), the tile schedule of NT pairs (`grouped_w4a16.tile_schedule`'s rows,
  its unused tail expert −1) and offs int32 [E] (end of each expert's rows,
  `torch._grouped_mm`'s offsets) from CTA 0, then each live pick of the CTA's tokens takes row
  r = first_id + rank: tok[r] = its token, pos[t, k] = r (padding rows' pos 0); rows past the
  live pairs get tok 0 (a gather through all of tok stays in bounds). counts int32 [E + 1]
  (pick's E counts, then a CTA counter) is reset to zero for the next layer by the last CTA
  to have read it (barrier, fence, atomic on counts[E], as moe_router). Why several CTAs: one
  CTA placed an 8K chunk's 49,152 pairs in 64 µs a layer (3 ms of the prefill; perf log).

PDL: pick loads its bias candidates (a weight) before griddepcontrol.wait, the parts, valid and
counts after it; place reads everything after it. Both in every thread.

Tolerance (GPU test): as the decode router (moe_router.py): ids equal to `reference.route`'s
on the same logits except near ties (s + bias within 1e-6 relative), weights rel. ≤ 1e-5
(sigmoid and the division in fp32, a few ulp); place exact: tiles equal `tile_schedule`, and
tok/pos a consistent grouping (every live pair once, expert rows contiguous).
Spec values: KIND, E experts, K picks per token, NORM (pick), NT pairs per tile (place).
"""

import math

import torch

from flint_graph import reference
from flint_graph.kernels.prefill import grouped_w4a16, grouped_w4a16_wg
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, ScalarArg, Spec, TensorArg

PICK_WARPS = 4  # tokens per pick CTA
PLACE_THREADS = 512
PLACE_TOKENS = 256  # tokens a place CTA writes tok and pos for
MAX_CAND = 16  # candidates per lane: E ≤ 512


def _check(spec: Spec) -> None:
    e, k = spec["E"], spec["K"]
    if spec["KIND"] not in (0, 1):
        raise ValueError(f"moe_route: KIND = {spec['KIND']}; expected 0 (pick) or 1 (place)")
    if not 1 <= e <= 32 * MAX_CAND:
        raise ValueError(f"moe_route: E = {e}; expected 1 to {32 * MAX_CAND}")
    if not 1 <= k <= min(32, e):
        raise ValueError(f"moe_route: K = {k}; expected 1 to min(32, E)")


def _args(spec: Spec):
    _check(spec)
    e, k = spec["E"], spec["K"]
    if spec["KIND"] == 0:
        return (TensorArg("parts", "f32", ("T", 3 * e), "input"),
                TensorArg("bias", "f32", (e,), "weight", align=4),
                TensorArg("valid", "i32", (1,), "input", align=4),
                TensorArg("counts", "i32", (e,), "output", align=4),
                TensorArg("ids", "i32", ("T", k), "output", align=4),
                TensorArg("weights", "f32", ("T", k), "output", align=4),
                TensorArg("rank", "i32", ("T", k), "output", align=4),
                ScalarArg("scaling", "f32"))
    return (TensorArg("ids", "i32", ("T", k), "input", align=4),
            TensorArg("rank", "i32", ("T", k), "input", align=4),
            TensorArg("valid", "i32", (1,), "input", align=4),
            TensorArg("counts", "i32", (e + 1,), "workspace", align=4),
            TensorArg("tiles", "i32", ("NTILES", 4), "output"),
            TensorArg("offs", "i32", (e,), "output", align=4),
            TensorArg("tok", "i32", ("P",), "output", align=4),
            TensorArg("pos", "i32", ("T", k), "output", align=4))


def _launch(spec: Spec) -> Launch:
    if spec["KIND"] == 0:
        return Launch(grid=(("T", PICK_WARPS), 1, 1), block=(32 * PICK_WARPS, 1, 1))
    return Launch(grid=(("T", PLACE_TOKENS), 1, 1), block=(PLACE_THREADS, 1, 1),
                  smem=_place_smem(spec))


def _place_smem(spec: Spec) -> int:
    return 4 * (2 * spec["E"] + 2 * PLACE_THREADS // 32 + 8)


def _specs(cfg, buckets=()) -> list[Spec]:
    """Pick, and place for each tile size the grouped W4A16 kernels take; none without MoE
    layers or where the shapes do not suit (E up to 512)."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    if not e or e > 32 * MAX_CAND or not 1 <= k <= min(32, e) \
            or cfg.first_k_dense_replace >= cfg.num_hidden_layers:
        return []
    out = [KERNEL.spec(KIND=0, E=e, K=k, NORM=int(cfg.norm_topk_prob))]
    nts = sorted(set(grouped_w4a16.NTS) | set(grouped_w4a16_wg.NTS))  # both W4A16 kernels
    return out + [KERNEL.spec(KIND=1, E=e, K=k, NT=nt) for nt in nts]


def pick_reference(spec: Spec, parts, bias, valid, scaling: float):
    """(ids int32, weights fp32) [T, K] of `reference.route` on the parts' logits, ascending id
    per token; rows ≥ valid: ids E, weights 0."""
    e = spec["E"]
    t = parts.shape[0]
    p = parts.view(t, 3, e)
    logits = (p[:, 2] + p[:, 1]) + p[:, 0]
    ids, w = reference.route(None, None, bias, spec["K"], scaling, bool(spec["NORM"]),
                             logits=logits)
    ids, order = ids.sort(dim=-1)
    w = w.gather(-1, order)
    live = (torch.arange(t, device=parts.device) < int(valid[0]))[:, None]
    return torch.where(live, ids, e).int(), torch.where(live, w, 0.0)


def _reference(spec: Spec, *args):
    """Pick: (counts, ids, weights, rank) with ranks in token order (the kernel's may be any
    order within an expert); place: (counts zeroed, tiles, offs, tok, pos) of the given ids and
    ranks."""
    if spec["KIND"] == 0:
        parts, bias, valid, counts, _, _, _, scaling = args
        ids, w = pick_reference(spec, parts, bias, valid, scaling)
        flat = ids.reshape(-1).long()
        live = flat < spec["E"]
        cnt = torch.bincount(flat[live], minlength=spec["E"]).int()
        rank = torch.zeros_like(flat)
        seen: dict[int, int] = {}
        for q, ex in enumerate(flat.tolist()):
            if ex < spec["E"]:
                rank[q] = seen.get(ex, 0)
                seen[ex] = rank[q].item() + 1
        return counts + cnt, ids, w, rank.view_as(ids).int()
    ids, rank, valid, counts, tiles, offs, tok, pos = args
    e, nt = spec["E"], spec["NT"]
    c = counts[:e].long()
    first = c.cumsum(0) - c
    out_tiles = grouped_w4a16.tile_schedule(counts[:e], nt, tiles.shape[0])
    live = (torch.arange(ids.shape[0], device=ids.device)[:, None] < int(valid[0])).expand_as(
        ids)
    dest = torch.where(live, first[ids.long().clamp(max=e - 1)] + rank.long(), 0)
    out_tok = tok.clone()
    toks = torch.arange(ids.shape[0], device=ids.device)[:, None].expand_as(ids)
    out_tok[int(live.sum()):] = 0
    out_tok[dest[live]] = toks[live].int()
    return (torch.zeros_like(counts), out_tiles, (first + c).int(), out_tok, dest.int())


def make_args(spec: Spec, *, gen: torch.Generator, tokens: int = 77, valid: int | None = None,
              device: str = "cuda", ties: bool = False) -> list:
    """Pick: parts with logits ~N(0, 2) split into three fp32 parts (their sum order as the
    prefill's), bias ~N(0, 0.1) (ties: every logit and bias equal in pairs of experts),
    counts zero, outputs poisoned; place: the reference pick of such parts (ranks in token
    order), counts to match (and place's CTA counter, zero), the schedule's bound rows,
    outputs poisoned."""
    e, k = spec["E"], spec["K"]
    on = gen.device
    valid = tokens if valid is None else valid
    logits = 2 * torch.randn(tokens, e, generator=gen, device=on)
    bias = 0.1 * torch.randn(e, generator=gen, device=on)
    if ties:
        logits[:, 1::2] = logits[:, 0::2]
        bias[1::2] = bias[0::2]
    hi = logits.to(torch.bfloat16).float()
    mid = (logits - hi).to(torch.bfloat16).float()
    parts = torch.cat([hi, mid, logits - hi - mid], dim=1).contiguous()
    v = torch.tensor([valid], dtype=torch.int32, device=on)
    if spec["KIND"] == 0:
        args = [parts, bias, v, torch.zeros(e, dtype=torch.int32, device=on),
                torch.full((tokens, k), -7, dtype=torch.int32, device=on),
                torch.full((tokens, k), float("nan"), device=on),
                torch.full((tokens, k), -7, dtype=torch.int32, device=on)]
        return [a.to(device) for a in args] + [2.5]
    pick = KERNEL.spec(KIND=0, E=e, K=k, NORM=1)
    counts, ids, _, rank = _reference(pick, parts, bias, v, torch.zeros(e, dtype=torch.int32,
                                                                        device=on),
                                      None, None, None, 2.5)
    counts = torch.cat([counts, counts.new_zeros(1)])  # place's CTA counter, zero on entry
    ntiles = grouped_w4a16.max_tiles(tokens * k, e, spec["NT"])
    args = [ids, rank, v, counts, torch.full((ntiles, 4), -7, dtype=torch.int32, device=on),
            torch.full((e,), -7, dtype=torch.int32, device=on),
            torch.full((tokens * k,), -7, dtype=torch.int32, device=on),
            torch.full((tokens, k), -7, dtype=torch.int32, device=on)]
    return [a.to(device) for a in args]


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64

    from flint_graph.kernels.toolchain import dsl_util as du

    _check(spec)
    e, k = spec["E"], spec["K"]
    cand = -(-e // 32)
    ragged = e % 32 != 0
    int_min = -(2 ** 31)


    if spec["KIND"] == 0:
        norm = bool(spec["NORM"])

        @cute.kernel
        def moe_pick_kernel(mparts: cute.Tensor, mbias: cute.Tensor, mvalid: cute.Tensor,
                            mcounts: cute.Tensor, mids: cute.Tensor, mw: cute.Tensor,
                            mrank: cute.Tensor, scaling: Float32):
            tid, _, _ = cute.arch.thread_idx()
            bx, _, _ = cute.arch.block_idx()
            warp, lane = tid // 32, tid % 32
            bias = [du.ld_weight_u32(mbias.iterator.toint()
                                     + Int64(cutlass.min(lane + 32 * j, e - 1)) * 4)
                    for j in range(cand)]
            du.griddepcontrol_wait_after_values(bias)
            cute.arch.griddepcontrol_launch_dependents()
            tok = bx * PICK_WARPS + warp
            if tok < mparts.shape[0]:
                live = tok < mvalid[0]
                keys, sv = [], []
                for j in cutlass.range_constexpr(cand):
                    ex = lane + 32 * j
                    if cutlass.const_expr(ragged):
                        ex = cutlass.min(ex, e - 1)
                    p = [mparts[tok, part * e + ex] for part in range(3)]
                    logit = (p[2] + p[1]) + p[0]
                    s = Float32(1.0) / (Float32(1.0) + cute.math.exp(-logit))
                    key = du.order_key(s + du.as_f32(bias[j]))
                    if cutlass.const_expr(ragged):  # lanes past the last expert: never picked
                        key = cutlass.select_(lane + 32 * j < e, key, Int32(int_min))
                    keys.append(key)
                    sv.append(s)
                pick_id, pick_s = [], []
                for r in cutlass.range_constexpr(k):
                    bk, bi, bs = du.lane_best(keys, [lane + 32 * j for j in range(cand)], sv)
                    kmax = cute.arch.warp_redux_sync(bk, "max")
                    win = cute.arch.warp_redux_sync(cutlass.select_(bk == kmax, bi, Int32(e)),
                                                    "min")
                    ws = cute.arch.shuffle_sync(bs, offset=win & 31)
                    keys = [cutlass.select_(lane + 32 * j == win, Int32(int_min), keys[j])
                            for j in range(cand)]
                    pick_id.append(win)
                    pick_s.append(ws)
                den = pick_s[0]
                for r in cutlass.range_constexpr(1, k):
                    den = den + pick_s[r]
                for r in cutlass.range_constexpr(k):
                    if lane == r:
                        wt = pick_s[r] * scaling
                        if cutlass.const_expr(norm):
                            wt = pick_s[r] / den * scaling
                        rk = Int32(0)  # the pick's place in ascending id order
                        for j in cutlass.range_constexpr(k):
                            rk = rk + cutlass.select_(pick_id[j] < pick_id[r], Int32(1),
                                                      Int32(0))
                        row = Int32(0)
                        if live:
                            row = cute.arch.atomic_add(mcounts.iterator + pick_id[r], Int32(1),
                                                       sem="relaxed", scope="gpu")
                        mids[tok, rk] = cutlass.select_(live, pick_id[r], Int32(e))
                        mw[tok, rk] = cutlass.select_(live, wt, Float32(0.0))
                        mrank[tok, rk] = row

        @cute.jit
        def moe_pick(mparts: cute.Tensor, mbias: cute.Tensor, mvalid: cute.Tensor,
                     mcounts: cute.Tensor, mids: cute.Tensor, mw: cute.Tensor,
                     mrank: cute.Tensor, scaling: Float32, stream: cuda.CUstream):
            moe_pick_kernel(mparts, mbias, mvalid, mcounts, mids, mw, mrank, scaling).launch(
                grid=(cute.ceil_div(mparts.shape[0], PICK_WARPS), 1, 1),
                block=[32 * PICK_WARPS, 1, 1], stream=stream)

        return moe_pick

    nt = spec["NT"]
    threads = PLACE_THREADS
    warps = threads // 32
    rounds = math.ceil(e / threads)
    smem_bytes = _place_smem(spec)

    @cute.jit
    def block_scan(v, lane, warp, s_warp):
        """Exclusive prefix sum over the CTA's threads of v (Int32), and the total: a warp
        shuffle scan, then the warps' totals through shared memory."""
        inc = v
        for i in cutlass.range_constexpr(5):
            up = cute.arch.shuffle_sync_up(inc, offset=1 << i)
            inc = inc + cutlass.select_(lane >= (1 << i), up, Int32(0))
        if lane == 31:
            s_warp[warp] = inc
        cute.arch.sync_threads()
        before, total = Int32(0), Int32(0)
        for w in cutlass.range_constexpr(warps):
            wv = s_warp[w]
            before = before + cutlass.select_(Int32(w) < warp, wv, Int32(0))
            total = total + wv
        cute.arch.sync_threads()  # s_warp is reused by the next scan
        return inc - v + before, total

    @cute.kernel
    def moe_place_kernel(mids: cute.Tensor, mrank: cute.Tensor, mvalid: cute.Tensor,
                         mcounts: cute.Tensor, mtiles: cute.Tensor, moffs: cute.Tensor,
                         mtok: cute.Tensor, mpos: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32
        alloc = cutlass.memory.SmemAllocator()
        smem = alloc.allocate_tensor(Int32, cute.make_layout((smem_bytes // 4,)),
                                     byte_alignment=16)
        s_first = cute.make_tensor(smem.iterator, cute.make_layout((e,)))
        s_warp = cute.make_tensor(smem.iterator + 2 * e, cute.make_layout((warps,)))
        s_flag = cute.make_tensor(smem.iterator + 2 * e + 2 * warps, cute.make_layout((1,)))
        cute.arch.griddepcontrol_wait()
        cute.arch.griddepcontrol_launch_dependents()
        t_total = mids.shape[0]
        nctas = (t_total + (PLACE_TOKENS - 1)) // PLACE_TOKENS
        lead = bx == 0  # writes the schedule and offs; every CTA scans the counts
        base_pairs, base_tiles = Int32(0), Int32(0)
        for rd in cutlass.range_constexpr(rounds):
            ex = rd * threads + tid
            c = Int32(0)
            if ex < e:
                c = mcounts[ex]
            ntl = (c + (nt - 1)) // nt
            first, tot_c = block_scan(c, lane, warp, s_warp)
            tile0, tot_t = block_scan(ntl, lane, warp, s_warp)
            if ex < e:
                s_first[ex] = base_pairs + first
                if lead:
                    moffs[ex] = base_pairs + first + c
                    for j in cutlass.range(ntl):
                        row = base_tiles + tile0 + j
                        mtiles[row, 0] = ex
                        mtiles[row, 1] = base_pairs + first + j * nt
                        mtiles[row, 2] = cutlass.min(c - j * nt, Int32(nt))
                        mtiles[row, 3] = Int32(0)
            base_pairs = base_pairs + tot_c
            base_tiles = base_tiles + tot_t
        if lead:
            ntiles = mtiles.shape[0]
            for row in cutlass.range(base_tiles + tid, ntiles, threads):
                mtiles[row, 0] = Int32(-1)
                mtiles[row, 1] = Int32(0)
                mtiles[row, 2] = Int32(0)
                mtiles[row, 3] = Int32(0)
        # the last CTA to have read the counts zeroes them for the next layer's pick
        # (grid-sync pattern: barrier, fence, atomic on the counter counts[E])
        cute.arch.sync_threads()
        if tid == 0:
            cute.arch.fence_acq_rel_gpu()
            old = cute.arch.atomic_add(mcounts.iterator + e, Int32(1), sem="relaxed",
                                       scope="gpu")
            is_last = Int32(0)
            if old == nctas - 1:
                cute.arch.fence_acq_rel_gpu()
                is_last = Int32(1)
            s_flag[0] = is_last
        cute.arch.sync_threads()
        if s_flag[0] != 0:
            for ex in cutlass.range(tid, e + 1, threads):
                mcounts[ex] = Int32(0)
        live_pairs = cutlass.min(mvalid[0], t_total) * k
        q_end = cutlass.min((bx + 1) * PLACE_TOKENS, t_total) * k
        for q in cutlass.range(bx * (PLACE_TOKENS * k) + tid, q_end, threads):
            t, r = q // k, q % k
            dest = Int32(0)
            if q < live_pairs:
                dest = s_first[mids[t, r]] + mrank[t, r]
                mtok[dest] = t
            else:
                mtok[q] = Int32(0)  # rows past the live pairs: no tile reads them
            mpos[t, r] = dest

    @cute.jit
    def moe_place(mids: cute.Tensor, mrank: cute.Tensor, mvalid: cute.Tensor,
                  mcounts: cute.Tensor, mtiles: cute.Tensor, moffs: cute.Tensor,
                  mtok: cute.Tensor, mpos: cute.Tensor, stream: cuda.CUstream):
        moe_place_kernel(mids, mrank, mvalid, mcounts, mtiles, moffs, mtok, mpos).launch(
            grid=(cute.ceil_div(mids.shape[0], PLACE_TOKENS), 1, 1), block=[threads, 1, 1],
            smem=smem_bytes, stream=stream)

    return moe_place


KERNEL = KernelDef(name="moe_route", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",
                                                       "prefill/grouped_w4a16.py"))
