"""Decode attention (one query token per row) over the BF16 KV cache: GQA, sinks, window,
split-KV with the combine in the same launch.

Row b's query at p = positions[b] sees keys max(0, p − W + 1) … p (W > 0, sliding layers, a ring
of W entries: key t at table[b, 0], entry t % W) or 0 … p (W = 0, full layers, paged: key t at
page table[b, t // P], entry t % P); layout and arguments in docs/decode-kernels.md (kernel 4).
Must match `reference.attention` on the gathered keys (DESIGN §1, §4): s_j = q·k_j / sqrt(D) in
fp32, out = Σ e^(s_j−m) v_j / (Σ e^(s_j−m) + e^(sink−m)), rounded once to bf16.

Design. Grid (SPLITS, HKV, B), 8 warps per CTA. A row's visible keys are cut into 32-key tiles
aligned to absolute positions (so a tile never straddles a page; P is a multiple of 32), and
the tiles into n = `row_splits` ≤ SPLITS contiguous chunks; CTA x < n takes chunk x, CTAs
x ≥ n exit. Its warps take the chunk's tiles round-robin (one tile = one step: all 32
16-byte K and V loads of a lane, 16 KB per warp, are issued before the first MMA waits), keep an
online softmax for the G query heads of their KV head, on tensor cores (mma.sync m16n8k16,
bf16 in, fp32 accumulate):
  * S = Q·Kᵀ with M = the G heads (rows ≥ G zero), N = 8 keys, K = d. The head dimension is
    permuted (the same way for q and k, so the dot products are unchanged) so that each lane
    loads 16-byte chunks of its key: lane (g, t) holds d = 32c + 8t … +7 of key g.
  * O += P·V computed as Oᵀ[d, head] = Vᵀ·Pᵀ: M = 16 values of d, K = 16 keys, N = the heads.
    The S accumulator of lane (g, t) (head g, keys 2t, 2t+1) is exactly the Pᵀ fragment it
    must supply, so P never leaves registers. Vᵀ fragments: row r of m-tile j is
    d = (D/16)·r + j, so lane g loads two contiguous D/16-value runs of each of its keys and
    pairs keys with one PRMT per register. P is split into bf16 hi + lo parts (two MMAs), so
    P·V is exact to ~2^-16, not bf16-rounded.
  * Keys outside [lo, p] get logit −inf, and their V words are zeroed by a select (unwritten
    cache entries may hold NaN; 0·NaN would poison the MMA).
Warps are merged through shared memory into the CTA's partial (normalised o, log2-sum-exp
lse; an empty chunk writes o = 0, lse = −inf). Each CTA then syncs and its thread 0 bumps
counters[b, kvh] with atom.acq_rel.gpu (cooperative groups' grid-sync pattern: the barrier
plus the cumulative release publish every thread's partial); the CTA that sees n − 1 syncs
again, reads the n partials with ld.global.cg (written by other SMs; bypasses L1), combines
them with the sink (added to the denominator once, whatever n), writes out and resets the
counter to 0 for the next launch.

Split heuristic (`row_splits`, in the kernel and mirrored here): tiles = number of 32-key
tiles in the visible range, m = `min_tiles`, n = min(SPLITS, ceil(tiles / m)),
chunk = max(m, ceil(tiles / n)) tiles per split. A short range is a latency problem, not a
bandwidth one: a CTA reading 8 tiles (128 KB) alone is slower than several SMs reading a few
each, but every partial adds 4 KB to what the combining CTA reads; the H200 sweep in the
constants' comments puts the best m at 3 to 4 tiles (most warps of such a CTA idle).
SPLITS (`splits_for`) gives ~128 CTAs per row for full layers (one per SM of the H200's
132: at 100K, 32 splits per KV head, 98 tiles per CTA), and for sliding layers the same bound,
capped at ceil(17 / m) for a window's 17 tiles (6 at W = 513). It does not depend on the
bucket, so a row is split the same way alone or among 7 others (batch invariance).
When n is clamped to SPLITS the last chunks can be empty (257 tiles in 32 splits of 9
leave 3): such a CTA writes o = 0, lse = −inf and still counts towards the n arrivals.

Latency: the dependent round trips of a launch are positions (with q, the ring slot and, paged,
a guess of the warp's first page id, right whenever chunk = m: every short row; else the
page is loaded once p is known) -> K/V -> partial store + counter atomic (its release waits
for the stores) -> every lse and the first ≤ 32 partials of a head. In both load rounds an
XOR fold into a value ptxas cannot prove zero keeps the loads ahead of their first use (it
would otherwise sink them past the `split < n` exit or the first exp2).

Not yet done for speed (measure first): a second CTA per SM (228 registers now allow one),
fewer warps per CTA for short rows, cp.async multi-stage loads, and a combine through a
thread-block cluster's shared memory instead of global memory and a counter.

PDL: only the sinks (a weight; each thread loads those of its combine heads) are read before
`griddepcontrol.wait`; q, positions, table, the cache and the counters are inputs.
Tolerance (GPU test): ‖out − ref‖/‖ref‖ ≤ 1e-2. Expected ~2e-3: the bf16 output rounding
(≤ 2^-9 per element), plus fp32 summation order, ex2.approx / lg2.approx (~2^-22 relative) and
the hi/lo-split P (~2^-16); the combine's rescaling is exact up to fp32 rounding.
Shape legend: B batch bucket, HQ / HKV query / KV heads, G = HQ/HKV, D head dim, P page size
(full) or ring length W (sliding), T pages per row (dynamic), NB pages/slots (dynamic).
"""

import math

import torch

from flint_graph import reference
from flint_graph.kernels.decode import qk_norm_rope_kv as qk
from flint_graph.kernels.toolchain.spec import (BUCKETS, KV_PAGE, KernelDef, Launch, ScalarArg,
                                                Spec, TensorArg)

WARPS = 8  # warps per CTA
TILE = 32  # keys per warp step: 4 QK key columns of 8, 2 PV k-steps of 16
KSUB = TILE // 16
CTA_TARGET = 128  # SPLITS·HKV·B ≈ this many CTAs at most (one per SM, 132 on the H200)
# `min_tiles` per layer kind, from an H200 sweep of the tiles per split (B = 1):
MIN_TILES_FULL = 4  # 1K keys: 1 tile 8.1 µs, 2: 7.1, 4: 6.9, 8: 7.6 (32 partials cost more)
MIN_TILES_SLIDING = 3  # W = 513: 1 tile 6.8 µs, 2: 6.4, 3: 6.3, 4: 6.35, 6: 6.8
LOG2E = 1.4426950408889634
# 1: the model's decode step folds qk_norm_rope_kv into this kernel (QKN = 1 specs), one
# launch a layer fewer; 0 until its GPU tests have passed on the device
FOLD_QK = 0


def _max_tiles(window: int) -> int:
    """Most tiles one row's visible range can touch: a window of W keys spans at most
    ceil((W − 1)/TILE) + 1 tiles (17 at W = 513)."""
    return -(-(window - 1) // TILE) + 1


def min_tiles(window: int) -> int:
    """Fewest tiles one split of a row takes before the row uses another split (a short row
    spreads over n = ceil(tiles / min_tiles) CTAs): small, so a short range is read by many
    SMs at once, each with one round trip of loads; the combine's extra partials (4 KB each,
    read in the same round trip) cost less than a CTA reading 8 tiles (128 KB) alone."""
    return MIN_TILES_SLIDING if window else MIN_TILES_FULL


def splits_for(window: int, num_kv_heads: int) -> int:
    """SPLITS (the most chunks of one row), the same at every bucket: ~CTA_TARGET CTAs for one
    row (one per SM), and for sliding layers no more chunks than a full window has `min_tiles`
    runs of tiles. A row's split count, hence its summation order, then depends on its own
    length only, so its output is bitwise the same in any bucket beside any other rows (batch
    invariance); larger buckets just launch more CTAs (B·HKV·SPLITS)."""
    n = max(1, CTA_TARGET // num_kv_heads)
    if window:
        n = min(n, -(-_max_tiles(window) // min_tiles(window)))
    return n


def row_splits(num_tiles: int, splits: int, window: int = 0) -> tuple[int, int]:
    """(n, chunk): the splits one row with `num_tiles` visible tiles uses, and the tiles per
    split: n = min(SPLITS, ceil(num_tiles / m)), chunk = max(m, ceil(num_tiles / n)) with
    m = min_tiles(window), so a short row's chunks are m tiles each (the last one fewer) and
    the kernel can guess a split's first page before it knows the position. Mirrors the
    kernel (split i covers tiles [i·chunk, min((i+1)·chunk, num_tiles)))."""
    m = min_tiles(window)
    n = min(splits, -(-num_tiles // m))
    return n, max(m, -(-num_tiles // n))


def visible_range(p: int, window: int) -> tuple[int, int]:
    """(lo, hi): the first and last key position a query at p sees."""
    return (max(0, p - window + 1) if window else 0), p


def rope_pairs_in_lane(d: int) -> bool:
    """Whether the folded form's lane layout (lane (g, t): d = 32c + 8t … +7) keeps each RoPE
    pair d, d + D/2 within a lane (chunks c, c + D/64: D a multiple of 64) or lanes t, t ^ 2
    (D = 32); D = 96, 160, … would pair elements of other lanes."""
    return d == 32 or d % 64 == 0


def folded(spec: Spec) -> bool:
    """Whether `spec` is the folded form (QKN = 1: Q/K norm, RoPE and the KV write inside)."""
    return bool(spec.as_dict().get("QKN", 0))


def _check(spec: Spec) -> None:
    hq, hkv, d, p = spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    if folded(spec) and d > 32 * WARPS * 2:
        raise ValueError(f"attn_decode: QKN = 1 needs head dim D ≤ {64 * WARPS} (one thread a "
                         f"RoPE frequency), found D = {d}")
    if folded(spec) and spec["ROPE"] and not rope_pairs_in_lane(d):
        raise ValueError(f"attn_decode: QKN = 1 with RoPE needs head dim D = 32 or a multiple "
                         f"of 64 (each RoPE pair d, d + D/2 in one lane or lanes t, t ^ 2), "
                         f"found D = {d}")
    if hq % hkv or hq // hkv > 8:
        raise ValueError(f"attn_decode: HQ = {hq} must be a multiple of HKV = {hkv}, with "
                         f"at most 8 query heads per KV head")
    if d % 32:
        raise ValueError(f"attn_decode: head dim D = {d} must be a multiple of 32")
    if spec["RING"]:
        if spec["W"] != p or p < 1:
            raise ValueError(f"attn_decode: a ring needs W = P ≥ 1, found W = {spec['W']}, "
                             f"P = {p}")
    elif p % TILE or spec["W"]:
        raise ValueError(f"attn_decode: paged layers need W = 0 and P a multiple of {TILE}, "
                         f"found W = {spec['W']}, P = {p}")


def _args(spec: Spec):
    _check(spec)
    b, hq, hkv, d, p, s = (spec[k] for k in ("B", "HQ", "HKV", "D", "P", "SPLITS"))
    g = hq // hkv
    q = (TensorArg("qkv", "bf16", (b, (hq + 2 * hkv) * d), "input") if folded(spec) else
         TensorArg("q", "bf16", (b, hq, d), "input"))
    # QKN = 1 also writes each row's entry at its position into the caches (an "input": the
    # kernel reads every other entry of them, and the write is not an output to poison)
    return (q,
            TensorArg("k_cache", "bf16", ("NB", hkv, p, d), "input"),
            TensorArg("v_cache", "bf16", ("NB", hkv, p, d), "input"),
            TensorArg("table", "i32", (b, "T"), "input", align=4),
            TensorArg("positions", "i32", (b,), "input", align=4),
            TensorArg("sinks", "f32", (hq,), "weight", align=4),
            TensorArg("out", "bf16", (b, hq * d), "output"),
            TensorArg("o_part", "f32", (b, hkv, s, g, d), "workspace"),
            TensorArg("lse_part", "f32", (b, hkv, s, g), "workspace", align=4),
            TensorArg("counters", "i32", (b, hkv), "workspace", align=4)) + (
        (TensorArg("q_norm", "bf16", (d,), "weight"),
         TensorArg("k_norm", "bf16", (d,), "weight"),
         TensorArg("inv_freq", "f64", (d // 2,), "weight"),
         ScalarArg("eps", "f32")) if folded(spec) else ())


def _smem_layout(spec: Spec) -> list[tuple[str, int]]:
    """Shared buffers (name, fp32/i32 words): per-warp O, m, l; a flag; with QKN = 1 and
    ROPE = 1 the row's (cos, sin) table, D/2 pairs."""
    g, d = spec["HQ"] // spec["HKV"], spec["D"]
    out = [("o", WARPS * g * d), ("m", WARPS * g), ("l", WARPS * g), ("flag", 4)]
    if folded(spec) and spec["ROPE"]:
        out.append(("cos_sin", d))
    return out


def _launch(spec: Spec) -> Launch:
    smem = sum(-(-4 * n // 16) * 16 for _, n in _smem_layout(spec))
    return Launch(grid=(spec["SPLITS"], spec["HKV"], spec["B"]), block=(32 * WARPS, 1, 1),
                  smem=smem)


def _kinds(cfg) -> list[tuple[int, int, int]]:
    """(RING, P, W) of each attention layer kind `cfg` has."""
    out = []
    if cfg.num_sliding_layers:
        out.append((1, cfg.sliding_window, cfg.sliding_window))
    if cfg.num_full_layers:
        out.append((0, KV_PAGE, 0))
    return out


def fold_possible(cfg) -> bool:
    """Whether `cfg`'s attention can take the folded form (QKN = 1): per-head Q/K norm on,
    a head dim whose D/2 RoPE frequencies fit the CTA's threads, and (any RoPE layer) whose
    RoPE pairs the lane layout holds (`rope_pairs_in_lane`)."""
    d = cfg.head_dim
    rope = any(cfg.uses_rope(i) for i in range(cfg.num_hidden_layers))
    return (bool(cfg.qk_norm) and d % 32 == 0 and d <= 64 * WARPS
            and (not rope or rope_pairs_in_lane(d)))


def folded_specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """The QKN = 1 specs: one per bucket and (RING, ROPE) kind the config's layers have (a
    config whose full layers differ in RoPE gets both)."""
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    kinds: list[tuple[int, int]] = []
    for i in range(cfg.num_hidden_layers):
        kind = (int(cfg.is_sliding(i)), int(cfg.uses_rope(i)))
        if kind not in kinds:
            kinds.append(kind)
    out = []
    for b in buckets:
        for ring, rope in sorted(kinds, reverse=True):
            p, w = (cfg.sliding_window, cfg.sliding_window) if ring else (KV_PAGE, 0)
            out.append(KERNEL.spec(B=b, HQ=hq, HKV=hkv, D=d, P=p, RING=ring, W=w,
                                   SPLITS=splits_for(w, hkv), QKN=1, ROPE=rope))
    return out


def uses_fold(cfg) -> bool:
    """Whether the model's decode step runs the folded form: FOLD_QK and `fold_possible`."""
    return bool(FOLD_QK) and fold_possible(cfg)


def _plain_specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """The QKN = 0 specs (q normed and rotated by qk_norm_rope_kv before this kernel)."""
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    return [KERNEL.spec(B=b, HQ=hq, HKV=hkv, D=d, P=p, RING=ring, W=w,
                        SPLITS=splits_for(w, hkv))
            for b in buckets for ring, p, w in _kinds(cfg)]


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    return folded_specs(cfg, buckets) if uses_fold(cfg) else _plain_specs(cfg, buckets)


def specs_for(cfg, buckets=BUCKETS, fold: bool | None = None) -> list[Spec]:
    """The specs the decode step runs with the fold on or off (None: the model's choice,
    `uses_fold`). Raises ValueError for fold = True on a config that cannot take it."""
    if fold is None:
        return _specs(cfg, buckets)
    if not fold:
        return _plain_specs(cfg, buckets)
    if not fold_possible(cfg):
        raise ValueError(f"attn_decode: the folded form needs qk_norm and a head dim that is "
                         f"a multiple of 32 up to {64 * WARPS} (with RoPE layers: 32 or a "
                         f"multiple of 64), found qk_norm = {cfg.qk_norm}, head_dim = "
                         f"{cfg.head_dim}")
    return folded_specs(cfg, buckets)


def bench_specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """The model's specs, the other form's (folded or not, where the config can take the
    fold) and every one's SPLITS = 1 variant (the single-split oracle of the tests)."""
    out = _specs(cfg, buckets)
    if fold_possible(cfg):
        out += [s for s in specs_for(cfg, buckets, not uses_fold(cfg)) if s not in out]
    one = [KERNEL.spec(**{**s.as_dict(), "SPLITS": 1}) for s in out]
    return out + [s for s in one if s not in out]


def gather_kv(spec: Spec, k_cache, v_cache, table, p: int, b: int):
    """(k, v, k_pos) of the keys row b sees at position p, ascending: bf16 [S, HKV, D] ×2,
    int64 [S] (the order `reference.SequenceKV` hands to `reference.attention`)."""
    lo, hi = visible_range(p, spec["W"])
    pos = torch.arange(lo, hi + 1, device=k_cache.device)
    size = spec["P"]
    page = table[b, 0].long().expand_as(pos) if spec["RING"] else table[b].long()[pos // size]
    entry = pos % size
    return k_cache[page, :, entry], v_cache[page, :, entry], pos


def folded_inputs(spec: Spec, qkv, k_cache, v_cache, table, positions, q_norm, k_norm,
                  inv_freq, eps: float):
    """What the folded form (QKN = 1) computes before attention, from the QKV projection's
    output qkv bf16 [B, (HQ + 2·HKV)·D]: (q bf16 [B, HQ, D] normed and rotated, copies of
    k_cache and v_cache [NB, HKV, P, D] with each row's new key and value written at its
    position, the key entries bf16 [B, HKV, D], the value entries bf16 [B, HKV, D]), by
    qk_norm_rope_kv's reference (the two-kernel form's first kernel)."""
    q, k_new, v_new = qk._reference(spec, qkv, positions, table, q_norm, k_norm, inv_freq, eps)
    page, entry = qk.cache_entry(spec, positions, table)
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    for b in range(qkv.shape[0]):
        k_cache[page[b], :, entry[b]] = k_new[b]
        v_cache[page[b], :, entry[b]] = v_new[b]
    return q, k_cache, v_cache, k_new, v_new


def _reference(spec: Spec, q, k_cache, v_cache, table, positions, sinks, *rest):
    """(out,): bf16 [B, HQ·D], `reference.attention` per row on the keys it sees. QKN = 1: q
    is qkv and `rest` ends with q_norm, k_norm, inv_freq and eps (`folded_inputs` first)."""
    if folded(spec):
        q, k_cache, v_cache, _, _ = folded_inputs(spec, q, k_cache, v_cache, table, positions,
                                                  *rest[-4:])
    w = spec["W"] or None
    out = []
    for b in range(q.shape[0]):
        p = int(positions[b])
        k, v, pos = gather_kv(spec, k_cache, v_cache, table, p, b)
        qp = torch.tensor([p], device=q.device)
        out.append(reference.attention(q[b:b + 1], k, v, qp, pos, sinks, w))
    return (torch.cat(out).view(q.shape[0], -1),)


def make_args(spec: Spec, *, gen: torch.Generator, device: str = "cuda", positions=None,
              sinks=None, spare_pages: int = 3, poison_unseen: bool = True,
              theta: float = 10000.0, eps: float = 1e-5) -> list:
    """One fresh argument list in declared order.

    QKN = 1: q is replaced by qkv ~ N(0, 1) [B, (HQ + 2·HKV)·D], each row's entry at its
    position is NaN in both caches (the kernel must take the new key and value from qkv, not
    from the cache), and q_norm, k_norm (as qk_norm_rope_kv.make_args draws them), inv_freq
    for `theta` and eps follow the counters. Otherwise:

    positions: one int per row (default: random in 0 … 3·P). Full layers get shuffled,
    non-contiguous page ids (each row ceil((p+1)/P) pages among `spare_pages` unused ones;
    table entries past a row's pages point at a random page); sliding layers a shuffled slot
    per row among B + 1. q and the cache are Gaussian; every cache entry no row sees is NaN when
    `poison_unseen` (the kernel must not let it reach the output). sinks: a float for all heads
    or None (N(0, 1), like the synthetic checkpoints). Outputs and fp32 workspaces NaN,
    counters zero."""
    b_rows, hq, hkv, d, size = (spec[k] for k in ("B", "HQ", "HKV", "D", "P"))
    g, splits, on = hq // hkv, spec["SPLITS"], gen.device
    if positions is None:
        positions = torch.randint(0, 3 * size, (b_rows,), generator=gen, device=on).tolist()
    positions = [int(x) for x in positions]
    if len(positions) != b_rows or min(positions) < 0:
        raise ValueError(f"positions {positions}: expected {b_rows} values ≥ 0")
    if spec["RING"]:
        nb, t = b_rows + 1, 1
        table = torch.randperm(nb, generator=gen, device=on)[:b_rows].view(b_rows, 1)
    else:
        need = [p // size + 1 for p in positions]
        nb, t = sum(need) + spare_pages, max(need)
        ids = torch.randperm(nb, generator=gen, device=on)
        table = torch.randint(0, nb, (b_rows, t), generator=gen, device=on)
        start = 0
        for b, n in enumerate(need):
            table[b, :n] = ids[start:start + n]
            start += n
    table = table.to(torch.int32)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=on).to(torch.bfloat16)

    q, k_cache, v_cache = randn(b_rows, hq, d), randn(nb, hkv, size, d), randn(nb, hkv, size, d)
    if poison_unseen:
        seen = torch.zeros(nb, size, dtype=torch.bool, device=on)
        for b, p in enumerate(positions):
            lo, hi = visible_range(p, spec["W"])
            pos = torch.arange(lo, hi + 1, device=on)
            page = table[b, 0].long() if spec["RING"] else table[b].long()[pos // size]
            seen[page, pos % size] = True
        for cache in (k_cache, v_cache):
            cache.masked_fill_(~seen[:, None, :, None], float("nan"))
    if sinks is None:
        sinks_t = torch.randn(hq, generator=gen, device=on)
    else:
        sinks_t = torch.full((hq,), float(sinks), device=on)
    nan = float("nan")
    args = [q, k_cache, v_cache, table, torch.tensor(positions, dtype=torch.int32, device=on),
            sinks_t.float(), torch.full((b_rows, hq * d), nan, dtype=torch.bfloat16, device=on),
            torch.full((b_rows, hkv, splits, g, d), nan, device=on),
            torch.full((b_rows, hkv, splits, g), nan, device=on),
            torch.zeros(b_rows, hkv, dtype=torch.int32, device=on)]
    if folded(spec):
        args[0] = torch.randn(b_rows, (hq + 2 * hkv) * d, generator=gen,
                              device=on).to(torch.bfloat16)
        page, entry = qk.cache_entry(spec, args[4], table)
        for cache in (k_cache, v_cache):
            cache[page, :, entry] = float("nan")

        def norm_w():
            w = math.sqrt(2.0) * (1.0 + 0.05 * torch.randn(d, generator=gen, device=on))
            return w.to(torch.bfloat16)

        args += [norm_w(), norm_w(), qk.rope_inv_freq(d, theta, on)]
        return [a.to(device) for a in args] + [eps]
    return [a.to(device) for a in args]


def bytes_moved(spec: Spec, args) -> int:
    """Least DRAM bytes of one launch: the visible K and V, q, out, positions, the table
    entries used and the sinks (the split partials stay in L2). QKN = 1: qkv instead of q,
    the new key and value entries written, the norm weights and (ROPE) inv_freq."""
    hq, hkv, d, size = (spec[k] for k in ("HQ", "HKV", "D", "P"))
    total = 0
    for p in args[4].tolist():
        lo, hi = visible_range(p, spec["W"])
        total += (hi - lo + 1) * hkv * d * 2 * 2
        total += 4 * (1 if spec["RING"] else hi // size + 1) + 4
    total += 2 * 2 * spec["B"] * hq * d + 4 * hq
    if folded(spec):
        total += 2 * 2 * spec["B"] * hkv * d * 2 + 2 * d * 2 + (d // 2 * 8 if spec["ROPE"] else 0)
    return total


def _ops():
    """Inline-PTX helpers (global loads/stores by byte address, fences, atomics, fast math)."""
    from cutlass import Float32, Int32, Int64, Uint32
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    def asm(ret, args, text, cons, side=True):
        return llvm.inline_asm(ret, args, text, cons, has_side_effects=side,
                               is_align_stack=False, asm_dialect=llvm.AsmDialect.AD_ATT)

    def addr(a):
        return Int64(a).ir_value()

    def ld_words(a, n, cg=False):
        """n (1, 2 or 4) u32 at a byte address (plain ld.global; .cg bypasses L1)."""
        vec = {1: "", 2: ".v2", 4: ".v4"}[n]
        outs = "{" + ", ".join(f"${i}" for i in range(n)) + "}" if n > 1 else "$0"
        ret = llvm.StructType.get_literal([T.i32()] * n) if n > 1 else T.i32()
        res = asm(ret, [addr(a)], f"ld.global{'.cg' if cg else ''}{vec}.u32 {outs}, [${n}];",
                  ",".join(["=r"] * n + ["l"]))
        if n == 1:
            return [Uint32(res)]
        return [Uint32(llvm.extractvalue(T.i32(), res, [i])) for i in range(n)]

    def ld_words_if(a, n, ok):
        """ld_words(a, n, cg=True) where ok (i32) ≠ 0, else n zeros: a predicated load in one
        asm block, so no branch keeps it from issuing with the loads around it."""
        vec = {1: "", 2: ".v2", 4: ".v4"}[n]
        outs = "{" + ", ".join(f"${i}" for i in range(n)) + "}" if n > 1 else "$0"
        zero = " ".join(f"@!p mov.b32 ${i}, 0;" for i in range(n))
        ret = llvm.StructType.get_literal([T.i32()] * n) if n > 1 else T.i32()
        res = asm(ret, [addr(a), Int32(ok).ir_value()],
                  f"{{ .reg .pred p; setp.ne.b32 p, ${n + 1}, 0; "
                  f"@p ld.global.cg{vec}.u32 {outs}, [${n}]; {zero} }}",
                  ",".join(["=r"] * n + ["l", "r"]))
        if n == 1:
            return [Uint32(res)]
        return [Uint32(llvm.extractvalue(T.i32(), res, [i])) for i in range(n)]

    def ld_nc_u32(a):
        """One 32-bit weight word at a byte address (ld.global.nc: LDG.CONSTANT, may go before
        the PDL wait)."""
        return Uint32(asm(T.i32(), [addr(a)], "ld.global.nc.b32 $0, [$1];", "=r,l"))

    def as_f32(w):
        return Float32(llvm.bitcast(T.f32(), Uint32(w).ir_value()))

    def ld_cg_f32(a, n):
        return [as_f32(w) for w in ld_words(a, n, cg=True)]

    def atom_inc(a):
        return Uint32(asm(T.i32(), [addr(a)], "atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;",
                          "=r,l,~{memory}"))

    def st_zero(a):
        asm(None, [addr(a)], "st.relaxed.gpu.global.u32 [$0], 0;", "l,~{memory}")

    def st_words(a, words):
        """Store len(words) (1, 2 or 4) u32 at a byte address aligned to their size."""
        n = len(words)
        vec = {1: "", 2: ".v2", 4: ".v4"}[n]
        ins = "{" + ", ".join(f"${i + 1}" for i in range(n)) + "}" if n > 1 else "$1"
        asm(None, [addr(a)] + [Uint32(w).ir_value() for w in words],
            f"st.global{vec}.b32 [$0], {ins};", ",".join(["l"] + ["r"] * n) + ",~{memory}")

    def ex2(x):
        return Float32(asm(T.f32(), [Float32(x).ir_value()], "ex2.approx.ftz.f32 $0, $1;",
                           "=f,f", side=False))

    def lg2(x):
        return Float32(asm(T.f32(), [Float32(x).ir_value()], "lg2.approx.f32 $0, $1;",
                           "=f,f", side=False))

    def pack_bf16(lo, hi):
        """bf16x2 {lo, hi} (lo in bits 0-15), round to nearest even."""
        return Uint32(asm(T.i32(), [Float32(hi).ir_value(), Float32(lo).ir_value()],
                          "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", side=False))

    return dict(ld_words=ld_words, ld_words_if=ld_words_if, ld_nc_u32=ld_nc_u32,
                ld_cg_f32=ld_cg_f32, as_f32=as_f32, atom_inc=atom_inc, st_zero=st_zero,
                st_words=st_words, ex2=ex2, lg2=lg2, pack_bf16=pack_bf16)


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Float64, Int32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    _check(spec)
    qkn, rope = folded(spec), bool(spec.as_dict().get("ROPE", 0))
    hq, hkv, d, size = spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    ring, window, splits = spec["RING"], spec["W"], spec["SPLITS"]
    g_heads = hq // hkv
    ops = _ops()
    ex2, pack = ops["ex2"], ops["pack_bf16"]
    threads = 32 * WARPS
    ksteps = d // 16  # QK k-steps, and PV m-tiles
    kchunks = d // 32  # 16-byte chunks of a key per lane (QK)
    run = d // 32  # u32 words of one V run (D/16 values)
    vload = 4 if run % 4 == 0 else (2 if run % 2 == 0 else 1)
    qk_scale = LOG2E / math.sqrt(d)
    row_bytes = d * 2
    items = g_heads * d // 4  # combine: (head, 4 values of d) per thread item
    # partials per combine round (all lse in round 1); 16 above 64 splits, where 128 lse words
    # and 32 partials spilled (flint-nano's one KV head: 128 splits, 624 bytes). The sum runs
    # over the splits in the same order whatever the rounds.
    unroll = min(splits, 32 if splits <= 64 else 16)
    mt = min_tiles(window)
    ninf = float("-inf")
    launch = _launch(spec)
    qkv_row = (hq + 2 * hkv) * d  # elements of one row of qkv (QKN = 1)
    half = d // 2

    def unpack(words):
        """bf16 pairs -> fp32 values, low half first."""
        out = []
        for w in words:
            out += [ops["as_f32"](w << 16), ops["as_f32"](w & Uint32(0xFFFF0000))]
        return out

    def norm_rope(words, weight, eps, t, cs_addr):
        """One head held by a quad, lane (g, t) with d = 32c + 8t … +7 in words 4c … 4c + 3
        (`words`, bf16 pairs) -> the same words of bf16(rmsnorm(x)·w) (`reference.rms_norm`),
        rotated when ROPE (`reference.rotate`, once rounded). weight(c): the 4 words of the
        norm weight at chunk c. The RoPE partner d ± D/2 is chunk c ± kchunks/2 of the same
        lane, or (D = 32, one chunk) lane t ^ 2's; the (cos, sin) of frequency i are fp32
        words 2i, 2i + 1 at shared address cs_addr. Every lane of the warp must call it (the
        sum of squares is a quad butterfly)."""
        x = unpack(words)
        ss = Float32(0.0)
        for v in x:
            ss = ss + v * v
        ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=1)
        ss = ss + cute.arch.shuffle_sync_bfly(ss, offset=2)
        rstd = cute.math.rsqrt(ss / Float32(d) + eps)
        y = []
        for c in range(kchunks):
            wf = unpack(weight(c))
            y += [((x[8 * c + k] * rstd) * wf[k]).to(BFloat16).to(Float32) for k in range(8)]
        if cutlass.const_expr(not rope):
            return [pack(y[2 * j], y[2 * j + 1]) for j in range(len(words))]
        out = [None] * len(y)
        groups = max(1, kchunks // 2)
        for c in range(kchunks):
            # frequency i = (32c + 8t + k) mod D/2: 8 consecutive (cos, sin) pairs
            first = 32 * (c % groups) + (8 * (t % 2) if kchunks == 1 else 8 * t)
            cs = []
            for j in range(4):
                cs += du.ld_shared_v4(cs_addr + Uint32(8 * first + 16 * j))
            for k in range(8):
                v = y[8 * c + k]
                if cutlass.const_expr(kchunks == 1):
                    other = cute.arch.shuffle_sync_bfly(v, offset=2)
                    other = cutlass.select_(t < 2, -other, other)
                elif cutlass.const_expr(c < groups):
                    other = -y[8 * (c + groups) + k]
                else:
                    other = y[8 * (c - groups) + k]
                out[8 * c + k] = v * ops["as_f32"](cs[2 * k]) + other * ops["as_f32"](cs[2 * k + 1])
        return [pack(out[2 * j], out[2 * j + 1]) for j in range(len(words))]

    @cute.jit
    def body(mq: cute.Tensor, mk: cute.Tensor, mv: cute.Tensor, mtable: cute.Tensor,
             mpos: cute.Tensor, msinks: cute.Tensor, mout: cute.Tensor, mop: cute.Tensor,
             mlp: cute.Tensor, mcnt: cute.Tensor, mqn: cute.Tensor, mkn: cute.Tensor,
             mfreq: cute.Tensor, eps: Float32):
        """The kernel; with QKN = 1, mq is qkv and mqn, mkn, mfreq, eps the fold's weights
        (with QKN = 0 they are unused stand-ins)."""
        tid, _, _ = cute.arch.thread_idx()
        split, kvh, b = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        alloc = cutlass.memory.SmemAllocator()
        s_o = alloc.allocate_tensor(Float32, cute.make_layout(
            (WARPS, g_heads, d), stride=(g_heads * d, d, 1)), byte_alignment=16)
        s_m = alloc.allocate_tensor(Float32, cute.make_layout(
            (WARPS, g_heads), stride=(g_heads, 1)), byte_alignment=16)
        s_l = alloc.allocate_tensor(Float32, cute.make_layout(
            (WARPS, g_heads), stride=(g_heads, 1)), byte_alignment=16)
        s_flag = alloc.allocate_tensor(Int32, cute.make_layout((4,)), byte_alignment=16)
        cs_addr = Uint32(0)
        if cutlass.const_expr(qkn and rope):
            s_cs = alloc.allocate_tensor(Float32, cute.make_layout((d,)), byte_alignment=16)
            cs_addr = du.smem_addr(s_cs)

        # the sinks (a weight) of this thread's combine heads, in flight before the wait
        rsink = cute.make_rmem_tensor((-(-items // threads),), Float32)
        sink_words = []
        for it in cutlass.range_constexpr(-(-items // threads)):
            hs = cutlass.min((tid + it * threads) // (d // 4), g_heads - 1)
            sink_words.append(ops["ld_nc_u32"](msinks.iterator.toint()
                                               + Int64(kvh * g_heads + hs) * 4))
            rsink[it] = ops["as_f32"](sink_words[-1])
        # QKN = 1: the norm weights (q_norm and k_norm at the lane's d) and inv_freq[tid] are
        # weights too, in flight with the sinks
        wq, wk = [], []
        rf = cute.make_rmem_tensor((2,), Uint32)
        if cutlass.const_expr(qkn):
            for c in cutlass.range_constexpr(kchunks):
                wq += du.ld_weight_v4(mqn.iterator.toint() + Int64(16 * t + 64 * c))
                wk += du.ld_weight_v4(mkn.iterator.toint() + Int64(16 * t + 64 * c))
            if cutlass.const_expr(rope):
                freq_addr = mfreq.iterator.toint() + Int64(cutlass.min(tid, half - 1)) * 8
                rf[0] = du.ld_weight_u32(freq_addr)
                rf[1] = du.ld_weight_u32(freq_addr + 4)
        # everything below is a predecessor's output; the sinks' words feed the wait, so ptxas
        # keeps their loads above it (it sank them below ACQBULK in some specialisations)
        du.griddepcontrol_wait_after_values(
            sink_words + wq + wk + ([rf[0], rf[1]] if rope else []))
        cute.arch.griddepcontrol_launch_dependents()

        # loads that do not depend on the position go out with it: one round trip for all
        p = mpos[b]
        # q as the A operand (rows = heads g; rows ≥ G and g + 8 zero), permuted d
        rq = cute.make_rmem_tensor((4 * kchunks,), Uint32)
        hg = cutlass.min(g, g_heads - 1)
        if cutlass.const_expr(qkn):
            qaddr = mq.iterator.toint() + (Int64(b * qkv_row + (kvh * g_heads + hg) * d)
                                           + 8 * t) * 2
        else:
            qaddr = mq.iterator.toint() + (Int64(b * hq + kvh * g_heads + hg) * d + 8 * t) * 2
        for c in cutlass.range_constexpr(kchunks):
            qw = ops["ld_words"](qaddr + 64 * c, 4)
            for i in cutlass.range_constexpr(4):
                rq[4 * c + i] = cutlass.select_(g < g_heads, qw[i], Uint32(0))
        # QKN = 1: warp 0 reads the row's new key and value (head kvh of qkv, lane (g, t) the
        # words of d = 32c + 8t … +7, as q) with q; every quad holds the whole head
        rkn = cute.make_rmem_tensor((2, 4 * kchunks), Uint32)
        if cutlass.const_expr(qkn):
            if warp == 0:  # quad 0's lanes load (predicated: 512 bytes a CTA, exiting or not)
                knew = mq.iterator.toint() + (Int64(b * qkv_row + (hq + kvh) * d) + 8 * t) * 2
                quad0 = cutlass.select_(g == 0, Int32(1), Int32(0))
                for j in cutlass.range_constexpr(2):
                    for c in cutlass.range_constexpr(kchunks):
                        kw = ops["ld_words_if"](knew + Int64(j * hkv * d * 2) + 64 * c, 4, quad0)
                        for i in cutlass.range_constexpr(4):
                            rkn[j, 4 * c + i] = kw[i]
        kbase = mk.iterator.toint()
        vbase = mv.iterator.toint()
        head_stride = Int64(size * row_bytes)
        kvh_off = Int64(kvh) * head_stride
        slot = Int32(0)
        if cutlass.const_expr(ring == 1):
            slot = mtable[b, 0]
        slot_off = Int64(slot) * Int64(hkv) * head_stride + kvh_off
        # paged: the page of this warp's first tile when the row is short (chunk = mt tiles,
        # split·mt + warp), guessed before p is known; reloaded below if the guess is wrong
        guess = Int32(0)
        guess_pg = Int32(0)
        if cutlass.const_expr(ring == 0):
            guess = cutlass.min((split * mt + warp) // (size // TILE), mtable.shape[1] - 1)
            guess_pg = mtable[b, guess]

        lo = Int32(0)
        if cutlass.const_expr(window > 0):
            lo = cutlass.max(p - (window - 1), Int32(0))
        t0 = lo // TILE
        t1 = p // TILE + 1
        # ptxas would sink the q and table loads below the `split < n` exit (a second round
        # trip after p's): n takes (every such word & zero), a zero it cannot prove
        zero = Uint32(p) >> 31  # positions are ≥ 0
        fold = rq[0]
        for i in cutlass.range_constexpr(1, 4 * kchunks):
            fold = fold ^ rq[i]
        if cutlass.const_expr(ring == 1):
            fold = fold ^ Uint32(slot)
        else:
            fold = fold ^ Uint32(guess_pg)
        ntiles = t1 - t0 + Int32(fold & zero)
        n = cutlass.min(Int32(splits), (ntiles + (mt - 1)) // mt)  # `row_splits`
        chunk = cutlass.max((ntiles + n - 1) // n, Int32(mt))
        my_lo = t0 + split * chunk
        my_hi = cutlass.min(my_lo + chunk, t1)
        if cutlass.const_expr(qkn):
            # CTAs past the row's n splits exit before any of the fold's work (at B = 8 a 1K
            # full layer launches 1,024 CTAs, most of them such, and they run in waves)
            if split < n:
                # the fold: q normed and rotated in every warp; the split holding key p's tile
                # writes the new key (normed, rotated) and value into the caches, and its loop
                # below reads them back from there (the barrier orders the write before the
                # loads of every warp of the CTA); no other CTA of this launch reads that entry
                mine = (split == (t1 - 1 - t0) // chunk) & (warp == 0)
                page_p = Int32(0)
                if cutlass.const_expr(ring == 0):
                    if mine:
                        page_p = mtable[b, p // size]
                if cutlass.const_expr(rope):
                    if tid < half:  # the row's (cos, sin) table, one frequency a thread
                        cs0, sn0 = qk.cos_sin_f64(p, cute.recast_tensor(rf, Float64)[0])
                        s_cs[2 * tid] = cs0
                        s_cs[2 * tid + 1] = sn0
                    cute.arch.sync_threads()
                nq = norm_rope([rq[i] for i in range(4 * kchunks)],
                               lambda c: wq[4 * c:4 * c + 4], eps, t, cs_addr)
                for i in cutlass.range_constexpr(4 * kchunks):
                    rq[i] = nq[i]
                if mine:
                    nk = norm_rope([rkn[0, i] for i in range(4 * kchunks)],
                                   lambda c: wk[4 * c:4 * c + 4], eps, t, cs_addr)
                    if g == 0:
                        entry = kvh_off + Int64(p % size) * row_bytes + 16 * t
                        if cutlass.const_expr(ring == 1):
                            entry = entry + slot_off - kvh_off
                        else:
                            entry = entry + Int64(page_p) * Int64(hkv) * head_stride
                        for c in cutlass.range_constexpr(kchunks):
                            ops["st_words"](kbase + entry + 64 * c, nk[4 * c:4 * c + 4])
                            ops["st_words"](vbase + entry + 64 * c,
                                            [rkn[1, 4 * c + i] for i in range(4)])
                cute.arch.sync_threads()
        if split < n:
            acc = cute.make_rmem_tensor((ksteps, 4), Float32)
            acc.fill(0.0)
            st = cute.make_rmem_tensor((2,), Float32)  # running max (log2 units), sum
            st[0] = Float32(ninf)
            st[1] = Float32(0.0)
            rk = cute.make_rmem_tensor((2 * KSUB, 4 * kchunks), Uint32)
            rv = cute.make_rmem_tensor((4 * KSUB, 2, run), Uint32)
            # page id of this warp's next tile, loaded a step ahead (clamped into the row's
            # pages) so no step starts with a dependent table load
            rpg = cute.make_rmem_tensor((1,), Int32)
            rpg[0] = guess_pg
            if cutlass.const_expr(ring == 0):
                first = cutlass.min(my_lo + warp, t1 - 1) // (size // TILE)
                if first != guess:
                    rpg[0] = mtable[b, first]
            for tile in cutlass.range(my_lo + warp, my_hi, WARPS):
                key0 = tile * TILE
                page_off = slot_off
                if cutlass.const_expr(ring == 0):
                    page_off = Int64(rpg[0]) * Int64(hkv) * head_stride + kvh_off
                    rpg[0] = mtable[b, cutlass.min(tile + WARPS, t1 - 1) // (size // TILE)]
                # every load of the step first, V then K (16 KB per warp in flight)
                # V of 16-key k-step ks: keys 2t, 2t+1, 2t+8, 2t+9, runs of D/16 values at
                # d = (D/16)(g + 8r); keys outside [lo, p] zeroed (the cache may hold NaN)
                for kk in cutlass.range_constexpr(4 * KSUB):
                    kp = key0 + 16 * (kk // 4) + 2 * t + (kk % 2) + 8 * (kk % 4 // 2)
                    ok = (kp >= lo) & (kp <= p)
                    a = vbase + page_off + Int64(kp % size) * row_bytes + (d // 16) * 2 * g
                    for r in cutlass.range_constexpr(2):
                        for w0 in cutlass.range_constexpr(0, run, vload):
                            vw = ops["ld_words"](a + (d // 16) * 2 * 8 * r + 4 * w0, vload)
                            for i in cutlass.range_constexpr(vload):
                                rv[kk, r, w0 + i] = cutlass.select_(ok, vw[i], Uint32(0))
                # K: lane (g, t) loads key 8·nt + g, d = 32c + 8t … +7
                for nt in cutlass.range_constexpr(2 * KSUB):
                    kp = key0 + 8 * nt + g
                    a = kbase + page_off + Int64(kp % size) * row_bytes + 16 * t
                    for c in cutlass.range_constexpr(kchunks):
                        kw = ops["ld_words"](a + 64 * c, 4)
                        for i in cutlass.range_constexpr(4):
                            rk[nt, 4 * c + i] = kw[i]
                # ptxas would sink the V loads (and some K loads) below the first MMAs, making
                # a step cost two round trips: the first MMA takes q XOR (every loaded word &
                # zero), a zero ptxas cannot prove, so all 32 loads are in flight before it
                fold = rv[0, 0, 0]
                for kk in cutlass.range_constexpr(4 * KSUB):
                    for r in cutlass.range_constexpr(2):
                        for w0 in cutlass.range_constexpr(run):
                            if cutlass.const_expr(kk + r + w0 > 0):
                                fold = fold ^ rv[kk, r, w0]
                for nt in cutlass.range_constexpr(2 * KSUB):
                    for i in cutlass.range_constexpr(4 * kchunks):
                        fold = fold ^ rk[nt, i]
                if cutlass.const_expr(ring == 0):  # the next page id: in flight with them
                    fold = fold ^ Uint32(rpg[0])
                q0 = rq[0] ^ (fold & zero)
                # S = Q·Kᵀ: lane (g, t) gets head g, keys 8·nt + 2t + e -> sc[2·nt + e]
                sc = []
                for nt in cutlass.range_constexpr(2 * KSUB):
                    c4 = [Float32(0.0)] * 4
                    for s in cutlass.range_constexpr(ksteps):
                        qa = q0 if nt + s == 0 else rq[2 * s]
                        c4 = du.mma_bf16_m16n8k16(
                            [qa, Uint32(0), rq[2 * s + 1], Uint32(0)],
                            [rk[nt, 2 * s], rk[nt, 2 * s + 1]], c4)
                    for e in cutlass.range_constexpr(2):
                        kp = key0 + 8 * nt + 2 * t + e
                        ok = (kp >= lo) & (kp <= p)
                        sc.append(cutlass.select_(ok, c4[e] * qk_scale, Float32(ninf)))
                mx = sc[0]
                for e in cutlass.range_constexpr(1, 4 * KSUB):
                    mx = cutlass.max(mx, sc[e])
                mx = cutlass.max(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
                mx = cutlass.max(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
                m_old = st[0]
                m_new = cutlass.max(m_old, mx)
                m_use = cutlass.select_(m_new == Float32(ninf), Float32(0.0), m_new)
                alpha = ex2(m_old - m_use)
                pr = []
                psum = Float32(0.0)
                for e in cutlass.range_constexpr(4 * KSUB):
                    pr.append(ex2(sc[e] - m_use))
                    psum = psum + pr[e]
                st[0] = m_new
                st[1] = st[1] * alpha + psum
                # Oᵀ columns are heads 2t, 2t+1: their rescale factors live in lanes 8t, 8t+4
                a0 = cute.arch.shuffle_sync(alpha, offset=8 * t)
                a1 = cute.arch.shuffle_sync(alpha, offset=8 * t + 4)
                # Pᵀ B fragments of k-step ks: keys 16ks + 2t (+1) and 16ks + 8 + 2t (+1) are
                # sc[4ks + 0, 1] and sc[4ks + 2, 3]; hi + lo bf16 parts keep P to ~2^-16
                hi, lo_part = [], []
                for j in cutlass.range_constexpr(2 * KSUB):
                    w = pack(pr[2 * j], pr[2 * j + 1])
                    hi.append(w)
                    r0 = pr[2 * j] - ops["as_f32"](w << 16)
                    r1 = pr[2 * j + 1] - ops["as_f32"](w & Uint32(0xFFFF0000))
                    lo_part.append(pack(r0, r1))
                for j in cutlass.range_constexpr(ksteps):
                    wd, sel = j // 2, (0x5410 if j % 2 == 0 else 0x7632)
                    c4 = [acc[j, 0] * a0, acc[j, 1] * a1, acc[j, 2] * a0, acc[j, 3] * a1]
                    for ks in cutlass.range_constexpr(KSUB):
                        v0 = 4 * ks
                        fa = [du.prmt(rv[v0, 0, wd], rv[v0 + 1, 0, wd], sel),
                              du.prmt(rv[v0, 1, wd], rv[v0 + 1, 1, wd], sel),
                              du.prmt(rv[v0 + 2, 0, wd], rv[v0 + 3, 0, wd], sel),
                              du.prmt(rv[v0 + 2, 1, wd], rv[v0 + 3, 1, wd], sel)]
                        c4 = du.mma_bf16_m16n8k16(fa, [hi[2 * ks], hi[2 * ks + 1]], c4)
                        c4 = du.mma_bf16_m16n8k16(fa, [lo_part[2 * ks], lo_part[2 * ks + 1]], c4)
                    for i in cutlass.range_constexpr(4):
                        acc[j, i] = c4[i]

            # this warp's state -> shared memory
            lsum = st[1]
            lsum = lsum + cute.arch.shuffle_sync_bfly(lsum, offset=1)
            lsum = lsum + cute.arch.shuffle_sync_bfly(lsum, offset=2)
            if (t == 0) & (g < g_heads):
                s_m[warp, g] = st[0]
                s_l[warp, g] = lsum
            for hh in cutlass.range_constexpr(2):
                h = 2 * t + hh
                if h < g_heads:
                    for j in cutlass.range_constexpr(ksteps):
                        s_o[warp, h, (d // 16) * g + j] = acc[j, hh]
                        s_o[warp, h, (d // 16) * (g + 8) + j] = acc[j, 2 + hh]
            cute.arch.sync_threads()

            # the CTA's partial: normalised o and lse (log2 units) per head
            for it in cutlass.range_constexpr(-(-items // threads)):
                item = tid + it * threads
                if item < items:
                    h, d0 = item // (d // 4), (item % (d // 4)) * 4
                    mm = s_m[0, h]
                    for w in cutlass.range_constexpr(1, WARPS):
                        mm = cutlass.max(mm, s_m[w, h])
                    mu = cutlass.select_(mm == Float32(ninf), Float32(0.0), mm)
                    ll = Float32(0.0)
                    ov = [Float32(0.0)] * 4
                    for w in cutlass.range_constexpr(WARPS):
                        f = ex2(s_m[w, h] - mu)
                        ll = ll + s_l[w, h] * f
                        for e in cutlass.range_constexpr(4):
                            ov[e] = ov[e] + s_o[w, h, d0 + e] * f
                    has = ll > Float32(0.0)
                    inv = Float32(1.0) / cutlass.select_(has, ll, Float32(1.0))
                    for e in cutlass.range_constexpr(4):
                        mop[b, kvh, split, h, d0 + e] = cutlass.select_(has, ov[e] * inv,
                                                                         Float32(0.0))
                    if d0 == 0:
                        mlp[b, kvh, split, h] = cutlass.select_(has, mu + ops["lg2"](ll),
                                                                Float32(ninf))
            # the barrier orders every thread's partial stores before thread 0's acq_rel
            # atomic, whose release is cumulative (gpu scope); its acquire, followed by the
            # barrier, orders the other CTAs' partials before every thread's loads below: the
            # pattern of cooperative groups' grid sync, one MEMBAR instead of one per thread
            cute.arch.sync_threads()
            cnt = mcnt.iterator.toint() + Int64(b * hkv + kvh) * 4
            if tid == 0:
                s_flag[0] = Int32(ops["atom_inc"](cnt))
            cute.arch.sync_threads()
            if s_flag[0] == n - 1:  # the last CTA of (b, kvh): combine the n partials
                lbase = mlp.iterator.toint() + Int64((b * hkv + kvh) * splits) * g_heads * 4
                obase = mop.iterator.toint() + Int64((b * hkv + kvh) * splits) * (
                    g_heads * d * 4)
                for it in cutlass.range_constexpr(-(-items // threads)):
                    item = tid + it * threads
                    if item < items:
                        h, d0 = item // (d // 4), (item % (d // 4)) * 4
                        # round 1 loads every lse of head h and the first `unroll` partials
                        # together (predicated off past n: no traffic for unused splits)
                        lw = []
                        for i in cutlass.range_constexpr(splits):
                            ok = cutlass.select_(Int32(i) < n, Int32(1), Int32(0))
                            lw.append(ops["ld_words_if"](lbase + Int64(i * g_heads + h) * 4, 1,
                                                         ok)[0])
                        pw = []
                        for u in cutlass.range_constexpr(unroll):
                            ok = cutlass.select_(Int32(u) < n, Int32(1), Int32(0))
                            pw.append(ops["ld_words_if"](
                                obase + Int64((u * g_heads + h) * d + d0) * 4, 4, ok))
                        # as in the main loop: the first lse use takes (every word & zero), so
                        # ptxas issues all these loads before any of them is waited for
                        fold = lw[0]
                        for i in cutlass.range_constexpr(1, splits):
                            fold = fold ^ lw[i]
                        for u in cutlass.range_constexpr(unroll):
                            for e in cutlass.range_constexpr(4):
                                fold = fold ^ pw[u][e]
                        lw[0] = lw[0] ^ (fold & zero)
                        lv = [ops["as_f32"](w) for w in lw]
                        po = [[ops["as_f32"](w) for w in ws] for ws in pw]
                        sink = rsink[it] * LOG2E
                        mm = sink
                        for i in cutlass.range_constexpr(splits):
                            lv[i] = cutlass.select_(Int32(i) < n, lv[i], Float32(ninf))
                            mm = cutlass.max(mm, lv[i])
                        den = ex2(sink - mm)
                        wt = []
                        for i in cutlass.range_constexpr(splits):
                            wt.append(cutlass.select_(Int32(i) < n, ex2(lv[i] - mm),
                                                      Float32(0.0)))
                            den = den + wt[i]
                        num = cute.make_rmem_tensor((4,), Float32)
                        num.fill(0.0)
                        for u in cutlass.range_constexpr(unroll):
                            for e in cutlass.range_constexpr(4):
                                num[e] = num[e] + po[u][e] * wt[u]
                        for grp in cutlass.range_constexpr(1, -(-splits // unroll)):
                            if grp * unroll < n:  # later rounds: only rows with > unroll splits
                                for u in cutlass.range_constexpr(unroll):
                                    si = grp * unroll + u
                                    if cutlass.const_expr(si < splits):
                                        sic = cutlass.min(Int32(si), n - 1)
                                        pg = ops["ld_cg_f32"](
                                            obase + Int64((sic * g_heads + h) * d + d0) * 4, 4)
                                        for e in cutlass.range_constexpr(4):
                                            num[e] = num[e] + pg[e] * wt[si]
                        inv = Float32(1.0) / den
                        col = (kvh * g_heads + h) * d + d0
                        for e in cutlass.range_constexpr(4):
                            mout[b, col + e] = (num[e] * inv).to(BFloat16)
                if tid == 0:
                    ops["st_zero"](cnt)  # ready for the next launch (graph replay)

    if qkn:
        @cute.kernel
        def attn_decode_qk_kernel(mq: cute.Tensor, mk: cute.Tensor, mv: cute.Tensor,
                                  mtable: cute.Tensor, mpos: cute.Tensor, msinks: cute.Tensor,
                                  mout: cute.Tensor, mop: cute.Tensor, mlp: cute.Tensor,
                                  mcnt: cute.Tensor, mqn: cute.Tensor, mkn: cute.Tensor,
                                  mfreq: cute.Tensor, eps: Float32):
            body(mq, mk, mv, mtable, mpos, msinks, mout, mop, mlp, mcnt, mqn, mkn, mfreq, eps)

        @cute.jit
        def attn_decode_qk(mq: cute.Tensor, mk: cute.Tensor, mv: cute.Tensor,
                           mtable: cute.Tensor, mpos: cute.Tensor, msinks: cute.Tensor,
                           mout: cute.Tensor, mop: cute.Tensor, mlp: cute.Tensor,
                           mcnt: cute.Tensor, mqn: cute.Tensor, mkn: cute.Tensor,
                           mfreq: cute.Tensor, eps: Float32, stream: cuda.CUstream):
            attn_decode_qk_kernel(mq, mk, mv, mtable, mpos, msinks, mout, mop, mlp, mcnt, mqn,
                                  mkn, mfreq, eps).launch(
                grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
                use_pdl=True)

        return attn_decode_qk

    @cute.kernel
    def attn_decode_kernel(mq: cute.Tensor, mk: cute.Tensor, mv: cute.Tensor,
                           mtable: cute.Tensor, mpos: cute.Tensor, msinks: cute.Tensor,
                           mout: cute.Tensor, mop: cute.Tensor, mlp: cute.Tensor,
                           mcnt: cute.Tensor):
        body(mq, mk, mv, mtable, mpos, msinks, mout, mop, mlp, mcnt, mq, mq, mq, Float32(0.0))

    @cute.jit
    def attn_decode(mq: cute.Tensor, mk: cute.Tensor, mv: cute.Tensor, mtable: cute.Tensor,
                    mpos: cute.Tensor, msinks: cute.Tensor, mout: cute.Tensor,
                    mop: cute.Tensor, mlp: cute.Tensor, mcnt: cute.Tensor,
                    stream: cuda.CUstream):
        attn_decode_kernel(mq, mk, mv, mtable, mpos, msinks, mout, mop, mlp, mcnt).launch(
            grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream, use_pdl=True)

    return attn_decode


KERNEL = KernelDef(name="attn_decode", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference,
                   source_files=("toolchain/dsl_util.py", "decode/qk_norm_rope_kv.py"))
