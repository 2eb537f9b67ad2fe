"""Prefill attention (a chunk of T query tokens) over the BF16 KV cache and the chunk's own keys:
flash attention on tensor cores with GQA packing, causal mask, exact sliding window and sinks.

The chunk's tokens sit at positions n … n+T−1 (n = start[0], the tokens already cached). Query
token i (position p = n + i) of head h sees keys max(0, p − W + 1) … p (W > 0, sliding layers)
or 0 … p (W = 0, full layers). Keys at positions < n come from the cache: a sliding layer's
ring (slot table[0], entry pos % W) or a full layer's pages (page table[pos // P], entry pos % P,
P = KV_PAGE); keys at positions ≥ n from k_new / v_new [T, HKV, D]. The caller writes the chunk's
keys into the ring after this kernel, so a chunk of any size never overwrites a ring entry its
own later queries still need (capture/prefill.py). Must match `reference.attention`
(DESIGN §1, §4): s_j = q·k_j / sqrt(D) in fp32, out = Σ e^(s_j−m) v_j / (Σ e^(s_j−m) + e^(sink−m)),
rounded once to bf16; a sink of −inf means no sink.

Design (FlashAttention-2's loop, Dao 2023, written for this layout). Grid (ceil(T / TQ), HKV),
4 warps of 32 MMA rows each (two m16 tiles), so every K and V fragment a warp loads by ldmatrix
feeds two MMAs: with one m16 tile per warp (8 warps, until 2026-12-02) shared-memory reads
matched the tensor-core time. GQA packing: a CTA takes TQ = 4·32/G consecutive tokens and all G
query heads of one KV head, so each K/V tile is loaded once for its G heads; CTA row R is token
R // G, head R % G. Q's rows sit in shared memory (loaded once by cp.async, read as A fragments
each tile: there are no registers left to hold them). Keys go in 32-key tiles aligned to
absolute positions (a page of a full layer holds two), in three shared-memory stages filled by
cp.async two tiles ahead, so one barrier per tile suffices (16-byte copies; a copy whose key lies outside the CTA's range [lo, hi] is a zero fill,
so an unwritten NaN entry never reaches a product). 64-key tiles spill registers (the scores
and the output accumulator of two m-tiles take ~190 of 255); sm_100a's ptxas spills 32-key
tiles too, so that build takes 16-key tiles (`tile_keys`; the same launch and code otherwise). Rows are padded to D + 8 values so
ldmatrix reads are free of bank conflicts. Per tile and warp, on mma.sync m16n8k16 (bf16 in,
fp32 out): S = Q·Kᵀ (Q and K by ldmatrix), online softmax in log2 units (ex2.approx), P rounded
to bf16 as the A operand of O += P·V (V by ldmatrix.trans). ~252 registers and 87 KB of shared
memory: two CTAs per SM, so one's softmax overlaps the other's MMAs. Only tiles that cross a
row's causal edge or window start evaluate the mask. CTAs take query
blocks last first (the longest causal rows start first; the short ones fill the last wave). P is rounded to
bf16 alone, not split into hi + lo parts as attn_decode does: on the H200 (2026-12-01) the split
cost a third more attention time (a full layer at 8K: 2.83 -> 3.75 ms) and moved flint-nano's
log-probability gap to the reference only from 2.43e-4 to 2.33e-4 nats. The running max
starts at the sink (log2 units) and the running sum at 1 in one lane of each quad, so the sink
enters each row's denominator exactly once; with no sink (−inf) the max guard keeps a row with
no key seen yet at zero.

PDL: the sinks (a weight) are loaded before `griddepcontrol.wait`; q, k_new, v_new, the cache,
the table and start are inputs, read after it, in every thread.

Tolerance (GPU test): ‖out − ref‖/‖ref‖ ≤ 1e-2 per launch; expected ~3e-3: the bf16 output
rounding (≤ 2^-9 relative per element) plus P rounded to bf16 before P·V (≤ 2^-9 relative per
weight, averaging out over keys), fp32 summation order and ex2.approx (~2^-22).
Shape legend: T chunk tokens, HQ / HKV query / KV heads, G = HQ/HKV, D head dim, P ring length W
(sliding) or page size (full), NB rings or pages, NT table entries.
"""

import math

import torch

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import KV_PAGE, KernelDef, Launch, Spec, TensorArg

WARPS = 4
ROWS = 32  # MMA rows per warp: two m16 tiles, so each K/V fragment loaded feeds two MMAs
BN = 32  # keys per tile on sm_90a (a page of a full layer holds KV_PAGE / BN tiles)
BN_OTHER = 16  # on sm_100a (compiled in CI, not run here): with 32 its ptxas spills 26-50 values
PAD = 8  # bf16 values of padding per shared-memory row (conflict-free ldmatrix)
STAGES = 3
LOG2E = 1.4426950408889634


def tile_keys(arch: str) -> int:
    """Keys per tile for `arch`: BN on sm_90a, BN_OTHER elsewhere. The shared memory the launch
    declares is BN's, which fits either."""
    return BN if arch == "sm_90a" else BN_OTHER


def tokens_per_cta(spec: Spec) -> int:
    """TQ: query tokens per CTA (4 warps × 32 rows / G heads)."""
    return WARPS * ROWS // (spec["HQ"] // spec["HKV"])


def _check(spec: Spec) -> None:
    hq, hkv, d = spec["HQ"], spec["HKV"], spec["D"]
    if hkv < 1 or hq % hkv or hq // hkv not in (1, 2, 4, 8, 16):
        raise ValueError(f"attn_prefill: HQ / HKV = {hq} / {hkv} must be 1, 2, 4, 8 or 16")
    if d % 32 or d > 256:
        raise ValueError(f"attn_prefill: head dim D = {d} must be a multiple of 32, ≤ 256")
    if spec["RING"] not in (0, 1):
        raise ValueError(f"attn_prefill: RING = {spec['RING']}; expected 0 (pages) or 1 (ring)")
    if spec["RING"]:
        if spec["W"] != spec["P"] or spec["P"] < 1:
            raise ValueError(f"attn_prefill: a ring needs W = P ≥ 1, found W = {spec['W']}, "
                             f"P = {spec['P']}")
    elif spec["P"] != KV_PAGE or spec["W"]:
        raise ValueError(f"attn_prefill: paged layers need W = 0 and P = {KV_PAGE}, found "
                         f"W = {spec['W']}, P = {spec['P']}")


def _args(spec: Spec):
    _check(spec)
    hq, hkv, d, p = spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    return (TensorArg("q", "bf16", ("T", hq, d), "input"),
            TensorArg("k_new", "bf16", ("T", hkv, d), "input"),
            TensorArg("v_new", "bf16", ("T", hkv, d), "input"),
            TensorArg("k_cache", "bf16", ("NB", hkv, p, d), "input"),
            TensorArg("v_cache", "bf16", ("NB", hkv, p, d), "input"),
            TensorArg("table", "i32", ("NT",), "input", align=4),
            TensorArg("start", "i32", (1,), "input", align=4),
            TensorArg("sinks", "f32", (hq,), "weight", align=4),
            TensorArg("out", "bf16", ("T", hq * d), "output"))


def _row_bytes(spec: Spec) -> int:
    return (spec["D"] + PAD) * 2


def _launch(spec: Spec) -> Launch:
    smem = (STAGES * 2 * BN + WARPS * ROWS) * _row_bytes(spec)  # K/V stages, then Q
    return Launch(grid=(("T", tokens_per_cta(spec)), spec["HKV"], 1),
                  block=(32 * WARPS, 1, 1), smem=smem)


def _specs(cfg, buckets=()) -> list[Spec]:
    """One specialisation per attention layer kind; prefill has no batch bucket."""
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    out = []
    if cfg.num_sliding_layers:
        w = cfg.sliding_window
        out.append(KERNEL.spec(HQ=hq, HKV=hkv, D=d, P=w, RING=1, W=w))
    if cfg.num_full_layers:
        out.append(KERNEL.spec(HQ=hq, HKV=hkv, D=d, P=KV_PAGE, RING=0, W=0))
    return out


def gather_keys(spec: Spec, k_new, v_new, k_cache, v_cache, table, n: int):
    """(k, v, k_pos) of every key the chunk may see, ascending: the cached prefix (ring entries
    of positions max(0, n − W + 1) … n − 1, or pages 0 … n − 1) then the chunk's own keys.
    bf16 [S, HKV, D] ×2, int64 [S]."""
    dev = k_new.device
    lo = max(0, n - spec["W"] + 1) if spec["RING"] else 0
    pos = torch.arange(lo, n, device=dev)
    size = spec["P"]
    page = table[0].long().expand_as(pos) if spec["RING"] else table.long()[pos // size]
    k = torch.cat([k_cache[page, :, pos % size], k_new])
    v = torch.cat([v_cache[page, :, pos % size], v_new])
    return k, v, torch.cat([pos, torch.arange(n, n + k_new.shape[0], device=dev)])


def _reference(spec: Spec, q, k_new, v_new, k_cache, v_cache, table, start, sinks, out):
    """(out,): bf16 [T, HQ·D], `reference.attention` on the keys `gather_keys` finds."""
    n = int(start[0])
    k, v, pos = gather_keys(spec, k_new, v_new, k_cache, v_cache, table, n)
    q_pos = torch.arange(n, n + q.shape[0], device=q.device)
    s = None if bool(torch.isneginf(sinks).all()) else sinks
    res = reference.attention(q, k, v, q_pos, pos, s, spec["W"] or None)
    return (res.reshape(q.shape[0], -1),)


def make_args(spec: Spec, *, gen: torch.Generator, tokens: int, start: int,
              device: str = "cuda", sinks=None, poison_unseen: bool = True) -> list:
    """One fresh argument list in declared order: a chunk of `tokens` queries after `start`
    cached tokens. Full layers get a shuffled, non-contiguous page table (plus spare pages);
    sliding layers a ring slot among 3. Gaussian q, keys and values; cache entries no query
    may see are NaN when `poison_unseen` (the ring's positions before n − W + 1, unused pages).
    sinks: a float for every head, "none" for −inf, or None for N(0, 1). out is NaN."""
    hq, hkv, d, size = spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    on = gen.device

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=on).to(torch.bfloat16)

    if spec["RING"]:
        nb = 3
        table = torch.randint(0, nb, (1,), generator=gen, device=on)
    else:
        need = max(1, -(-(start + tokens) // size))
        nb = need + 3
        table = torch.randperm(nb, generator=gen, device=on)[:need]
    k_cache, v_cache = randn(nb, hkv, size, d), randn(nb, hkv, size, d)
    if poison_unseen:
        seen = torch.zeros(nb, size, dtype=torch.bool, device=on)
        lo = max(0, start - spec["W"] + 1) if spec["RING"] else 0
        pos = torch.arange(lo, start, device=on)
        page = table[0].expand_as(pos) if spec["RING"] else table[pos // size]
        seen[page, pos % size] = True
        for cache in (k_cache, v_cache):
            cache.masked_fill_(~seen[:, None, :, None], float("nan"))
    if sinks is None:
        sinks_t = torch.randn(hq, generator=gen, device=on)
    elif sinks == "none":
        sinks_t = torch.full((hq,), float("-inf"), device=on)
    else:
        sinks_t = torch.full((hq,), float(sinks), device=on)
    args = [randn(tokens, hq, d), randn(tokens, hkv, d), randn(tokens, hkv, d), k_cache, v_cache,
            table.to(torch.int32), torch.tensor([start], dtype=torch.int32, device=on),
            sinks_t.float(),
            torch.full((tokens, hq * d), float("nan"), dtype=torch.bfloat16, device=on)]
    return [a.to(device) for a in args]


def flops(spec: Spec, tokens: int, start: int) -> int:
    """Tensor-core FLOPs the visible (query, key) pairs need: 4·D·HQ per pair (QKᵀ and PV)."""
    pairs = 0
    for i in range(tokens):
        p = start + i
        lo = max(0, p - spec["W"] + 1) if spec["W"] else 0
        pairs += p - lo + 1
    return 4 * spec["D"] * spec["HQ"] * pairs


def _build(spec: Spec, arch: str = "sm_90a"):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    _check(spec)
    bn = tile_keys(arch)
    hq, hkv, d, size = spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    ring, window = spec["RING"], spec["W"]
    g_heads = hq // hkv
    tq = tokens_per_cta(spec)
    rows = WARPS * ROWS  # the CTA's MMA rows: tq tokens × G heads
    threads = 32 * WARPS
    rb = _row_bytes(spec)
    tile_bytes = bn * rb
    stage_bytes = 2 * tile_bytes
    q_off = STAGES * stage_bytes  # Q's rows follow the K/V stages
    chunks = bn * d // 8  # 16-byte copies per K (or V) tile
    per_thread = chunks // threads if chunks >= threads else 1
    cpr = d // 8  # copies per key row
    q_per_thread = rows * cpr // threads
    ksteps = d // 16
    dtiles = d // 8
    qk_scale = LOG2E / math.sqrt(d)
    ninf = float("-inf")
    launch = _launch(spec)

    def load_tile(tile, stage, tid, kvh, n, lo, qmax, slot, sbase, kc, vc, kn, vn, tb, mtable):
        """cp.async this thread's copies of K and V tile `tile` into `stage` (a trace-time
        helper: everything dynamic comes in as an argument)."""
        kb = tile * bn
        for i in range(per_thread):
            c = tid + threads * i
            row, col = c // cpr, c % cpr
            kp = kb + row
            ok = (kp >= lo) & (kp <= qmax)
            if chunks < threads:
                ok = ok & (tid < chunks)
            new = kp >= n
            src_new = Int64(cutlass.max(kp - n, Int32(0)) * hkv + kvh) * (d * 2)
            cached = kp < n
            src_old = Int64(0)
            if ring == 1:
                ent = cutlass.max(kp, Int32(0)) % size
                src_old = (Int64(slot * hkv + kvh) * size + Int64(ent)) * (d * 2)
            else:
                pidx = cutlass.min(cutlass.max(kp, Int32(0)) // size, mtable.shape[0] - 1)
                page = du.ld_u32_if(tb + Int64(pidx) * 4, ok & cached)
                src_old = (Int64(Int32(page) * hkv + kvh) * size + Int64(kp % size)) * (d * 2)
            off = Int64(col * 16)
            dst = sbase + Uint32(stage * stage_bytes + row * rb + col * 16)
            nbytes = cutlass.select_(ok, Int32(16), Int32(0))
            ka = cutlass.select_(new, kn + src_new, kc + src_old) + off
            va = cutlass.select_(new, vn + src_new, vc + src_old) + off
            du.cp_async_16(dst, ka, nbytes)
            du.cp_async_16(dst + Uint32(tile_bytes), va, nbytes)
        du.cp_async_commit()

    @cute.kernel
    def attn_prefill_kernel(mq: cute.Tensor, mkn: cute.Tensor, mvn: cute.Tensor,
                            mkc: cute.Tensor, mvc: cute.Tensor, mtable: cute.Tensor,
                            mstart: cute.Tensor, msinks: cute.Tensor, mout: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        blk, kvh, _ = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        alloc = cutlass.memory.SmemAllocator()
        smem = alloc.allocate_tensor(cutlass.Uint8, cute.make_layout((launch.smem,)),
                                     byte_alignment=128)
        sbase = du.smem_addr(smem)

        # this lane's four rows i = 2·mt + r: CTA row R = 32·warp + 16·mt + g + 8·r is token
        # R // G, head R % G of the block. The token is the lane's first plus a constant per
        # row (G divides 16, so 16·mt + 8·r splits off exactly; for G = 16, g + 8·r < 16 adds
        # nothing): one register for four rows, which the 3-stage loop needs to stay unspilled
        lane_tok = (ROWS * warp) // g_heads + (g // g_heads if g_heads <= 8 else 0)
        row_tok = [(16 * (i // 2) + 8 * (i % 2)) // g_heads for i in range(4)]
        row_head = [g % g_heads if g_heads <= 8 else g + 8 * (i % 2) for i in range(4)]
        # their sinks (a weight) before the wait; G divides 16, so rows i and i + 2 share a head
        sw0 = du.ld_weight_u32(msinks.iterator.toint() + Int64(kvh * g_heads + g % g_heads) * 4)
        sw1 = du.ld_weight_u32(msinks.iterator.toint()
                               + Int64(kvh * g_heads + (g + 8) % g_heads) * 4)
        du.griddepcontrol_wait_after_values([sw0, sw1])
        cute.arch.griddepcontrol_launch_dependents()

        # the last query block first: causal work grows with the block, and the GPU starts
        # CTAs in block order, so the longest ones start first and the short ones fill the tail
        nblk, _, _ = cute.arch.grid_dim()
        qblk = nblk - 1 - blk
        n = mstart[0]
        t_total = mq.shape[0]
        q0 = qblk * tq
        last = t_total - 1
        qpos0 = n + q0 + lane_tok
        qpos = [qpos0 + row_tok[i] for i in range(4)]

        # the CTA's key range [lo, hi] and its bn-key tiles
        qmin = n + q0
        qmax = n + cutlass.min(q0 + tq - 1, last)
        lo = Int32(0)
        if cutlass.const_expr(window > 0):
            lo = cutlass.max(qmin - (window - 1), Int32(0))
        t_first = lo // bn
        ntiles = qmax // bn + 1 - t_first

        kc, vc = mkc.iterator.toint(), mvc.iterator.toint()
        kn, vn = mkn.iterator.toint(), mvn.iterator.toint()
        tb = mtable.iterator.toint()
        slot = Int32(0)
        if cutlass.const_expr(ring == 1):
            slot = mtable[0]

        # Q's rows into shared memory (tokens past the chunk are zero fills), committed with
        # the first K/V tile; every warp reads its A fragments from there by ldmatrix
        qb = mq.iterator.toint()
        qs = sbase + Uint32(q_off)
        for i in range(q_per_thread):
            c = tid + threads * i
            row, col = c // cpr, c % cpr
            tok = q0 + row // g_heads
            src = Int64(cutlass.min(tok, last) * hq + kvh * g_heads + row % g_heads) * (d * 2)
            du.cp_async_16(qs + Uint32(row * rb + col * 16), qb + src + Int64(col * 16),
                           cutlass.select_(tok <= last, Int32(16), Int32(0)))

        acc = cute.make_rmem_tensor((2, dtiles, 4), Float32)
        acc.fill(0.0)
        st = cute.make_rmem_tensor((4, 2), Float32)  # per row: running max (log2), sum
        for i in cutlass.range_constexpr(4):
            sink = du.as_f32(sw0 if i % 2 == 0 else sw1) * Float32(LOG2E)
            st[i, 0] = sink
            st[i, 1] = cutlass.select_((t == 0) & (sink != Float32(ninf)), Float32(1.0),
                                       Float32(0.0))

        # three stages, two tiles in flight: the load issued after iteration it's barrier
        # refills the stage iteration it − 1 read, which every thread has left by then, so one
        # barrier per tile suffices; loads past the range are zero fills with no global read
        for pre in cutlass.range_constexpr(STAGES - 1):
            load_tile(t_first + pre, pre, tid, kvh, n, lo, qmax, slot, sbase, kc, vc, kn, vn,
                      tb, mtable)
        qa = qs + Uint32((ROWS * warp + lane % 16) * rb + 8 * (lane // 16) * 2)
        for it in cutlass.range(ntiles):
            tile = t_first + it
            stage = it % STAGES
            du.cp_async_wait(STAGES - 2)
            cute.arch.sync_threads()
            load_tile(tile + STAGES - 1, (it + STAGES - 1) % STAGES, tid, kvh, n, lo, qmax, slot,
                      sbase, kc, vc, kn, vn, tb, mtable)
            kb = tile * bn
            ks = sbase + Uint32(stage * stage_bytes)
            vs = ks + Uint32(tile_bytes)
            # S = Q·Kᵀ for both m-tiles: n-tile j holds keys kb + 8j + 2t (+1) of rows g (c0,
            # c1) and g + 8 (c2, c3); each K fragment feeds both m-tiles
            sc = cute.make_rmem_tensor((2, bn // 2), Float32)
            sc.fill(0.0)
            for s in cutlass.range_constexpr(0, ksteps, 2):
                a = [du.ldmatrix_x4(qa + Uint32(16 * mt * rb + (16 * (s + h)) * 2))
                     for mt in range(2) for h in range(2)]
                for j in cutlass.range_constexpr(bn // 8):
                    b = du.ldmatrix_x4(ks + Uint32((8 * j + lane % 8) * rb
                                                   + (16 * s + 8 * (lane // 8)) * 2))
                    for mt in cutlass.range_constexpr(2):
                        c4 = [sc[mt, 4 * j + e] for e in range(4)]
                        c4 = du.mma_bf16_m16n8k16(a[2 * mt], [b[0], b[1]], c4)
                        c4 = du.mma_bf16_m16n8k16(a[2 * mt + 1], [b[2], b[3]], c4)
                        for e in cutlass.range_constexpr(4):
                            sc[mt, 4 * j + e] = c4[e]
            # mask only where a row's causal edge or window start falls inside the tile
            edge = kb + (bn - 1) > qmin
            if cutlass.const_expr(window > 0):
                edge = edge | (kb <= qmax - window)
            for mt in cutlass.range_constexpr(2):
                for j in cutlass.range_constexpr(bn // 8):
                    for e in cutlass.range_constexpr(4):
                        sc[mt, 4 * j + e] = sc[mt, 4 * j + e] * Float32(qk_scale)
            if edge:
                for mt in cutlass.range_constexpr(2):
                    for j in cutlass.range_constexpr(bn // 8):
                        for e in cutlass.range_constexpr(4):
                            kp = kb + 8 * j + 2 * t + e % 2
                            p = qpos[2 * mt + e // 2]
                            ok = kp <= p
                            if cutlass.const_expr(window > 0):
                                ok = ok & (kp > p - window)
                            sc[mt, 4 * j + e] = cutlass.select_(ok, sc[mt, 4 * j + e],
                                                                Float32(ninf))
            # online softmax per row (log2 units); rows' quads share max and rescale; the
            # weights overwrite the scores
            for i in cutlass.range_constexpr(4):
                mt, r = i // 2, i % 2
                mx = sc[mt, 2 * r]
                for j in cutlass.range_constexpr(bn // 8):
                    for e in cutlass.range_constexpr(2):
                        mx = cutlass.max(mx, sc[mt, 4 * j + 2 * r + e])
                mx = cutlass.max(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
                mx = cutlass.max(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
                m_old = st[i, 0]
                m_new = cutlass.max(m_old, mx)
                m_use = cutlass.select_(m_new == Float32(ninf), Float32(0.0), m_new)
                alpha = du.ex2(m_old - m_use)
                psum = Float32(0.0)
                for j in cutlass.range_constexpr(bn // 8):
                    for e in cutlass.range_constexpr(2):
                        v = du.ex2(sc[mt, 4 * j + 2 * r + e] - m_use)
                        sc[mt, 4 * j + 2 * r + e] = v
                        psum = psum + v
                st[i, 0] = m_new
                st[i, 1] = st[i, 1] * alpha + psum
                for jd in cutlass.range_constexpr(dtiles):
                    acc[mt, jd, 2 * r] = acc[mt, jd, 2 * r] * alpha
                    acc[mt, jd, 2 * r + 1] = acc[mt, jd, 2 * r + 1] * alpha
            # O += P·V: k-step kk covers keys 16kk … 16kk+15 (n-tiles 2kk, 2kk + 1 of S); each
            # V fragment feeds both m-tiles
            for kk in cutlass.range_constexpr(bn // 16):
                pa = [[du.pack_bf16(sc[mt, 8 * kk + 2 * e], sc[mt, 8 * kk + 2 * e + 1])
                       for e in range(4)] for mt in range(2)]
                for jd in cutlass.range_constexpr(0, dtiles, 2):
                    m = lane // 8
                    sa = vs + Uint32((16 * kk + 8 * (m % 2) + lane % 8) * rb
                                     + (8 * jd + 8 * (m // 2)) * 2)
                    b = du.ldmatrix_x4_trans(sa)
                    for mt in cutlass.range_constexpr(2):
                        c0 = du.mma_bf16_m16n8k16(pa[mt], [b[0], b[1]],
                                                  [acc[mt, jd, e] for e in range(4)])
                        c1 = du.mma_bf16_m16n8k16(pa[mt], [b[2], b[3]],
                                                  [acc[mt, jd + 1, e] for e in range(4)])
                        for e in cutlass.range_constexpr(4):
                            acc[mt, jd, e] = c0[e]
                            acc[mt, jd + 1, e] = c1[e]

        ob = mout.iterator.toint()
        for i in cutlass.range_constexpr(4):
            mt, r = i // 2, i % 2
            l_row = st[i, 1]
            l_row = l_row + cute.arch.shuffle_sync_bfly(l_row, offset=1)
            l_row = l_row + cute.arch.shuffle_sync_bfly(l_row, offset=2)
            inv = Float32(1.0) / l_row
            tok = q0 + lane_tok + row_tok[i]
            if tok <= last:
                row = Int64(tok * hq + kvh * g_heads + row_head[i]) * (d * 2)
                for jd in cutlass.range_constexpr(dtiles):
                    du.st_u32(ob + row + (8 * jd + 2 * t) * 2,
                              du.pack_bf16(acc[mt, jd, 2 * r] * inv,
                                           acc[mt, jd, 2 * r + 1] * inv))

    @cute.jit
    def attn_prefill(mq: cute.Tensor, mkn: cute.Tensor, mvn: cute.Tensor, mkc: cute.Tensor,
                     mvc: cute.Tensor, mtable: cute.Tensor, mstart: cute.Tensor,
                     msinks: cute.Tensor, mout: cute.Tensor, stream: cuda.CUstream):
        grid = (cute.ceil_div(mq.shape[0], tq), hkv, 1)
        attn_prefill_kernel(mq, mkn, mvn, mkc, mvc, mtable, mstart, msinks, mout).launch(
            grid=grid, block=list(launch.block), smem=launch.smem, stream=stream)

    return attn_prefill


KERNEL = KernelDef(name="attn_prefill", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",),
                   build_takes_arch=True)
