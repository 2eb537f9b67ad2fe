"""Prefill attention on Hopper's warpgroup MMA (wgmma): the same function, arguments, reference
and tolerance as `attn_prefill` (kernels/prefill/attn_prefill.py: causal, exact sliding window,
sinks, GQA packing, the cached prefix from the ring or the pages), with the tensor-core work
issued by warpgroups reading their operands from shared memory instead of warps loading
fragments by ldmatrix for mma.sync. The prefill's default since its GPU tests passed on the H200
(capture/prefill.py ATTN_KERNEL): a full layer at 8K tokens in 0.96 ms since FC (~572 TFLOP/s,
74% of the dense BF16 peak measured beside it, 2026-12-07; 1.19 ms before it, 1.44 ms before
the per-tile work was cut in the eleventh session) against attn_prefill's 2.17 ms (perf log).

Why. On the H200 `attn_prefill` runs a full layer at 8K tokens at ~253 TFLOP/s (33% of the dense
BF16 peak), and attention is most of a 32K or 100K prefill (perf log, 2026-12-02). mma.sync
needs every operand in registers, so each warp reloads K and V fragments from shared memory for
its own rows; wgmma m64nNk16 reads both operands of S = Q·Kᵀ, and V of O += P·V, from shared
memory once per warpgroup of 64 rows (FlashAttention-3, Shah et al. 2024, uses it for the same
reason; this kernel has its warpgroups but not yet its producer warp or its overlap of one
tile's softmax with the next tile's MMAs).

Design. Grid (ceil(T / TQ), HKV), 8 warps = 2 warpgroups of 64 MMA rows: 128 rows = TQ = 128/G
tokens × G query heads of one KV head (row R: token R // G, head R % G), so each K/V tile is
loaded once for its G heads. Keys in tiles of BN = 64 aligned to absolute positions, in ST
shared-memory stages filled by cp.async ST − 1 tiles ahead (one barrier per tile, as
attn_prefill; copies outside the CTA's key range are zero fills). ST = 2 (the default, 99 KB)
lets two CTAs share an SM, so one's softmax can overlap the other's wgmmas (the kernel uses
128 registers, which two CTAs of 256 threads fill exactly); ST = 3 (a bench variant,
`bench_specs`, 131 KB) keeps one CTA per SM with two tiles in flight. Which is faster is for
the H200 to say. Shared memory holds Q, K and V in the
canonical 128-byte-swizzled layout wgmma reads: rows of 64 values (128 B) in blocks of D/64
columns, 16-byte chunk c of row r at chunk c ^ (r mod 8), atoms 1024-byte aligned. Per tile:
S = Q·Kᵀ as D/16 wgmma m64n64k16 (Q and K K-major), committed, and on full layers the next
tile's copies issued under it (one page-table read per tile: pages of KV_PAGE = BN keys), then
waited; the mask where a row's causal edge or window start crosses the tile; the online softmax
in log2 units per row (a warp owns whole rows: lanes of a quad share them by shuffles; FMNMX
for the max, the 1/√D scale folded into each exponent's FFMA), whose reference max moves only
when a tile's max passes it by more than RESCALE_AT = 8 (FlashAttention-4's conditional
rescaling: weights stay ≤ 2^8, O and l keep one reference, and a warp skips O's 64 multiplies
unless one of its rows moved; most tiles after a row's first do); P rounded to bf16 in
registers, already in the A-fragment layout of wgmma's register form (the accumulator layout of
m64n64 is mma.sync's per 8 columns); O += P·V as BN/16 wgmma m64nDk16 with V read MN-major
(leading byte offset: the stride between 64-column blocks; stride byte offset: between groups
of 8 keys). The tile's last wgmma group is waited before the next barrier, so a stage is
never refilled while a wgmma still reads it; cp.async writes are made visible to wgmma's async
proxy by fence.proxy.async before that barrier. Sinks and the end as attn_prefill: the running
max starts at the sink and the sum at 1 in one lane of each quad.

Split-KV (specs SPLITS = 4, 16; full layers; 2026-12-04): a short chunk after a long prefix has
few CTAs (25 tokens: 8), each walking every key tile in order. With SPLITS, grid z splits a
CTA's key tiles into n = min(SPLITS, ceil(tiles / SPLIT_MIN_TILES)) runs of chunk = max(
SPLIT_MIN_TILES, ceil(tiles / n)) tiles (CTAs past n walk none and stop); each writes its rows'
O / l (fp32 [SPLITS, T, HQ, D]) and log2-sum-exp (fp32 [SPLITS, T, HQ]); the CTA whose
acq_rel add on its (query block, KV head) counter comes last (after a CTA barrier: the release
covers the CTA's partial stores) combines the n partials (ld.global.cg), writes the bf16 output
and resets the counter for the next launch. The sink enters split 0 only (the other splits
start at max −inf, sum 0), so it counts once in the combined denominator. `splits_for` picks
SPLITS per chunk size and the prefill (capture/prefill.py) uses it after SPLIT_MIN_START cached
tokens. 25 queries after 8,192 keys: 206 → 45.5 µs (H200, perf log). SPLITS = 2 for a 512-row
chunk after 8K of history (128 CTAs, one an SM, where the kernel is laid out for two) was
built and measured on an H100 (2026-12-07, `tools/probe_attn_speed.py`): 199.5 µs unsplit,
203.4 µs in two, 220.8 in four (a resumed chat turn 20.85 → 20.86 ms with two), so it was
removed; the unsplit chunk already runs at 355 TFLOP/s there.

Warp-specialized form (spec WS = 1, a bench variant until timed on the H200; written
2026-12-05 without a GPU): FlashAttention-3's structure (Shah et al. 2024, §3.1) on the same
arguments and rows. 12 warps, one CTA per SM (160 KB of shared memory at D = 128): warpgroups
0 and 1 are consumers of 64 rows each (setmaxnreg 224), warpgroup 2 the producer (setmaxnreg
56), which alone issues the cp.async copies (the same addresses as above: the chunk's new keys,
ring entries or pages, two page reads per 128-key tile) into ST = 2 stages each of K and of V,
tiles of WS_BN = 128 keys. Two pipelines, K and V, handed over by named barriers of all 384
threads: the producer arrives on a stage's "full" barrier once its own copies into it are
complete (cp.async.wait_group) and fenced for the async proxy, as the plain form's threads do
before their CTA barrier; the consumers arrive on its "empty" barrier once the wgmma reading
it has been waited (mbarriers' waits are loops, and a loop in the iteration's body made ptxas
wait for the P·V before the softmax instead of after it). Consumer
step for tile j: wait K_j and V_{j-1}; on its turn (a named barrier per consumer, handed over
after issuing: ping-pong, so one warpgroup's softmax runs under the other's products) issue S_j
= Q·K_jᵀ and then O += P_{j-1}·V_{j-1} as two wgmma groups; wait S_j, release K_j, mask
(edge tiles only: the loop runs in three branch-free runs, window edge, inside, causal edge),
online softmax; wait the P·V, release V_{j-1}, rescale O if a row's max moved (O then holds
tile j − 1 at the old reference max, like l), pack P_j. SASS (sm_90a): no local memory,
168 registers at launch, the P·V's wait after the softmax's exponentials. Prediction:
a full layer at 8K 1.19 → ~0.95–1.05 ms (≥ 520 TFLOP/s), 32K 635 → ~570 ms, 100K 3.94 →
~3.4 s. sm_100a builds the same roles with mma.sync (it spills; never run).

Fewer instructions a key tile (spec FC = 1, written 2026-12-07; every model spec's since the
H200 timed it the same day, FC = 0 the bench variant): the SASS of the full layer's loop
(sm_90a, nvdisasm) has ~530 instructions a thread per key tile on its common path: ~200 of them
the per-copy address work of `load_tile` (for each of a thread's 4 K/V chunk rows: new key or
cached, page, bounds, swizzle, two 64-bit selects) and ~80 the 12 wgmma descriptors built from
their addresses, against ~170 for the softmax. Per SM and tile, two CTAs' 16 warps issue ~2,000
cycles of instructions against ~2,050 cycles of tensor work at the peak, so issue, not the
tensor pipe, can bound the loop. FC = 1 cuts both: (1) run copies: a tile inside [lo, qmax]
whose 64 keys are all the chunk's own, or all in one page, or in one unwrapped run of the ring,
is copied from one base at one row stride; a thread's chunk rows are rows_pass = 16 apart, so
its copies sit at immediate offsets in shared memory (a row's swizzle, row mod 8, is the same
in every pass) and one stride apart in global memory; every other tile (the causal and window
edges, the boundary between the cache and the chunk, a ring wrap) takes `load_tile`; (2) each
operand's descriptor is built once a tile and stepped by adding the step's offset >> 4 to its
start-address field (bits 0-13; no carry: every address is below 256 KB); (3) sliding layers,
too, issue the next tile's copies under the tile's S wgmmas (the plain form does so on full
layers only: there the ring's copy addresses took ptxas to 144 registers). The same bytes land
in the same places and the descriptors are the same values, so the output is bit for bit the
default form's (GPU test). ptxas took 152-171 registers for the extra path unasked; the launch
asks for two CTAs per SM (`min_blocks_per_mp`), which holds it at 128 with no spills (not the
split specs, one CTA per SM as before FC, nor sm_100a's build: held at 128 they spilled).
Common path ~530 → ~390 instructions a tile. Prediction: a full layer at 8K and at 32K −8 to
−18% (1.19 → ~0.98-1.10 ms at 8K on the H200), sliding layers −3 to −10%; if the tensor pipe,
not issue, bounds the loop, nothing.

sm_100a has no wgmma: that build (compiled in CI, never run here) issues the same products as
mma.sync m16n8k16 per warp with ldmatrix from the same swizzled layout; the rest of the kernel
is shared.

PDL: the sinks (a weight) are loaded before `griddepcontrol.wait`; q, k_new, v_new, the cache,
the table and start are inputs, read after it, in every thread; the split partials and
counters are workspaces, touched only after it.

Tolerance (GPU test): as attn_prefill, ‖out − ref‖/‖ref‖ ≤ 1e-2 per launch, expected ~3e-3.
"""

import math

import torch

from flint_graph.kernels.prefill import attn_prefill
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, Spec, TensorArg

WARPS = 8  # two warpgroups
ROWS = 16  # MMA rows per warp (64 per warpgroup: wgmma's M)
BN = 64  # keys per tile
STAGES = 2  # spec ST: shared-memory stages of K and V (2: two CTAs per SM)
STAGE_CHOICES = (2, 3)
LOG2E = 1.4426950408889634
DS = (64, 128)  # head dims this kernel takes (O is 64 × D fp32 per warpgroup in registers)
RESCALE_AT = 8.0  # a row's reference max moves (O and l rescaled) only past this growth, log2
SPLIT_CHOICES = (4, 16)  # spec SPLITS built: key-range splits of a short chunk
SPLIT_PICKS = SPLIT_CHOICES  # ... and those `splits_for` picks from (bench_reuse.py can narrow it)
SPLIT_MIN_TILES = 4  # a split takes at least this many key tiles (256 keys)
SPLIT_CTAS = 128  # a chunk splits its keys only while it has fewer CTAs than this
# ... and only after this many cached keys: before, a CTA's key loop is short and the partials'
# round trip costs more than it saves (a cold 25-token BF16 prompt: +0.4 ms, H200)
SPLIT_MIN_START = 1024
# The warp-specialized form (spec WS = 1, FlashAttention-3's structure; see the module doc)
WS_BN = 128  # keys per tile
WS_WARPS = 12  # consumer warpgroups 0 and 1 (the 128 rows), producer warpgroup 2
WS_PRODUCER_REGS = 56  # setmaxnreg: the producer only computes copy addresses (40 spilled)
WS_CONSUMER_REGS = 224  # 56·128 + 224·256 ≤ the SM's 65,536 registers
# named barriers: Q loaded (consumers); consumer c's turn, WS_TURN_BAR + c; stage s of K
# full, V full, K empty, V empty (all 384 threads): WS_FULL_K + s, … (ST = 2 each)
WS_Q_BAR, WS_TURN_BAR, WS_FULL_K, WS_FULL_V, WS_EMPTY_K, WS_EMPTY_V = 1, 2, 4, 6, 8, 10


def fits(cfg) -> bool:
    """Whether `cfg`'s attention suits this kernel: head dim in DS and G = HQ / HKV dividing
    16 (the tiny test config's head dim 32 does not: it keeps attn_prefill)."""
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    return cfg.head_dim in DS and hkv >= 1 and hq % hkv == 0 and hq // hkv in (1, 2, 4, 8, 16)


def tokens_per_cta(spec: Spec) -> int:
    """TQ: query tokens per CTA (8 warps × 16 rows / G heads)."""
    return WARPS * ROWS // (spec["HQ"] // spec["HKV"])


def _check(spec: Spec) -> None:
    attn_prefill._check(spec)
    if spec["D"] not in DS:
        raise ValueError(f"attn_prefill_wg: head dim D = {spec['D']}; expected one of {DS}")
    if spec["ST"] not in STAGE_CHOICES:
        raise ValueError(f"attn_prefill_wg: ST = {spec['ST']} stages; expected one of "
                         f"{STAGE_CHOICES}")
    if _splits(spec) not in (1,) + SPLIT_CHOICES:
        raise ValueError(f"attn_prefill_wg: SPLITS = {_splits(spec)}; expected one of "
                         f"{SPLIT_CHOICES} (or no SPLITS: one CTA walks a row's keys)")
    if _ws(spec) not in (0, 1):
        raise ValueError(f"attn_prefill_wg: WS = {_ws(spec)}; expected 1 (warp-specialized) "
                         "or no WS")
    if _fc(spec) not in (0, 1) or (_fc(spec) and _ws(spec)):
        raise ValueError(f"attn_prefill_wg: FC = {_fc(spec)}; expected 1 (the plain form's "
                         "run copies) or no FC, and not with WS = 1")
    if _ws(spec) and (spec["ST"] != 2 or _splits(spec) != 1):
        raise ValueError(f"attn_prefill_wg: WS = 1 takes ST = 2 and no SPLITS (got ST = "
                         f"{spec['ST']}, SPLITS = {_splits(spec)})")


def _splits(spec: Spec) -> int:
    return dict(spec.values).get("SPLITS", 1)


def _ws(spec: Spec) -> int:
    return dict(spec.values).get("WS", 0)


def _fc(spec: Spec) -> int:
    return dict(spec.values).get("FC", 0)


def _bn(spec: Spec) -> int:
    """Keys per tile: WS_BN in the warp-specialized form, else BN."""
    return WS_BN if _ws(spec) else BN


def splits_for(cfg, tokens: int) -> int:
    """SPLITS for a chunk of `tokens` queries: 1 (no split) when its CTAs (ceil(T·G/128) per KV
    head) already reach SPLIT_CTAS, else the smallest choice that does, else the largest. A
    short chunk after a long cached prefix otherwise walks every key tile on a handful of SMs
    (25 tokens after 8K: 8 CTAs, 201 µs per full layer on the H200, perf log 2026-12-04)."""
    g = cfg.num_attention_heads // cfg.num_key_value_heads
    ctas = -(-tokens * g // (WARPS * ROWS)) * cfg.num_key_value_heads
    if ctas >= SPLIT_CTAS:
        return 1
    return next((s for s in SPLIT_PICKS if ctas * s >= SPLIT_CTAS), SPLIT_PICKS[-1])


def split_rows(cfg) -> tuple[int, int]:
    """(most SPLITS·T, most T) over the chunks `splits_for` splits: what the split partials and
    counters must hold (the prefill allocates them once)."""
    top = WARPS * ROWS * SPLIT_CTAS // (cfg.num_attention_heads // cfg.num_key_value_heads)
    split = [t for t in range(1, top + 1) if splits_for(cfg, t) > 1]
    return max(splits_for(cfg, t) * t for t in split), max(split)


def make_args(spec: Spec, **kw) -> list:
    """attn_prefill.make_args (same keywords), plus, with SPLITS > 1, NaN partials and zero
    counters."""
    args = attn_prefill.make_args(spec, **kw)
    s = _splits(spec)
    if s == 1:
        return args
    t, dev = args[0].shape[0], args[0].device
    nan = float("nan")
    return args + [torch.full((s, t, spec["HQ"], spec["D"]), nan, device=dev),
                   torch.full((s, t, spec["HQ"]), nan, device=dev),
                   torch.zeros(t, spec["HKV"], dtype=torch.int32, device=dev)]


def _reference(spec: Spec, *args):
    """attn_prefill's reference on the first nine arguments (the partials are scratch)."""
    return attn_prefill._reference(spec, *args[:9])


def _args(spec: Spec):
    """attn_prefill's arguments; with SPLITS > 1 also the split partials (O normalised by its
    split's sum, fp32 [SPLITS, T, HQ, D]; log2-sum-exp per row, fp32 [SPLITS, T, HQ]) and the
    completion counters of the last-arriving CTA's combine (i32 [T, HKV]: one per query block
    and KV head, left zero by every launch)."""
    _check(spec)
    base = attn_prefill._args(spec)
    s = _splits(spec)
    if s == 1:
        return base
    hq, hkv, d = spec["HQ"], spec["HKV"], spec["D"]
    return base + (TensorArg("o_part", "f32", (s, "T", hq, d), "workspace"),
                   TensorArg("lse_part", "f32", (s, "T", hq), "workspace", align=4),
                   TensorArg("counters", "i32", ("T", hkv), "workspace", align=4))


def _layout(spec: Spec) -> dict[str, int]:
    """Byte offsets in the 1024-aligned shared-memory block: Q, then the K/V stages."""
    d = spec["D"]
    q_bytes = WARPS * ROWS * d * 2
    if _ws(spec):
        # K stages, then V stages (two pipelines, handed over by named barriers)
        tile = WS_BN * d * 2
        return {"q": 0, "k": q_bytes, "v": q_bytes + spec["ST"] * tile, "tile": tile,
                "total": q_bytes + 2 * spec["ST"] * tile}
    tile = BN * d * 2
    total = q_bytes + spec["ST"] * 2 * tile
    if _splits(spec) > 1:
        return {"q": 0, "stages": q_bytes, "tile": tile, "stage": 2 * tile, "flag": total,
                "total": total + 16}  # the combine's flag: this CTA arrived last
    return {"q": 0, "stages": q_bytes, "tile": tile, "stage": 2 * tile, "total": total}


def _launch(spec: Spec) -> Launch:
    # + 1024: the dynamic block is aligned to 1024 bytes inside the kernel
    warps = WS_WARPS if _ws(spec) else WARPS
    return Launch(grid=(("T", tokens_per_cta(spec)), spec["HKV"], _splits(spec)),
                  block=(32 * warps, 1, 1), smem=_layout(spec)["total"] + 1024)


def _specs(cfg, buckets=()) -> list[Spec]:
    """One specialisation per attention layer kind, as attn_prefill (plus ST = STAGES and
    FC = 1, the default since the H200 timed it), and the full layer's again with SPLITS in
    SPLIT_CHOICES (short chunks, `splits_for`); none where it does not fit (`fits`)."""
    if not fits(cfg):
        return []
    base = [KERNEL.spec(**s.as_dict(), ST=STAGES, FC=1)
            for s in attn_prefill._specs(cfg, buckets)]
    # full layers only: a sliding layer's window bounds its key loop (16 µs for 25 tokens)
    return base + [KERNEL.spec(**s.as_dict(), SPLITS=n) for s in base if not s["RING"]
                   for n in SPLIT_CHOICES]


def variant(spec: Spec, **values: int) -> Spec:
    """`spec` with other spec values (a bench variant: ST=3, WS=1, FC=0), where a value of 0
    for FC, WS or SPLITS means the key is left out, as the built specs name them, and WS = 1
    drops FC (the warp-specialized form has its own copies)."""
    merged = {**spec.as_dict(), **values}
    if merged.get("WS"):
        merged.pop("FC", None)
    for key in ("FC", "WS", "SPLITS"):
        if merged.get(key) == 0:
            del merged[key]
    return KERNEL.spec(**merged)


def bench_specs(cfg, buckets=()) -> list[Spec]:
    """The model specs' other stage count, their warp-specialized form and the form before
    FC (per-copy addresses and descriptors; the last with SPLITS too): tools/bench_prefill.py
    --attn-kernel attn_prefill_wg:ST=3, attn_prefill_wg:WS=1, attn_prefill_wg:FC=0."""
    model = _specs(cfg, buckets)
    base = [s for s in model if _splits(s) == 1]
    return ([variant(s, ST=st) for s in base for st in STAGE_CHOICES if st != STAGES]
            + [variant(s, WS=1) for s in base]
            + [variant(s, FC=0) for s in model])


def _build(spec: Spec, arch: str = "sm_90a"):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Boolean, Float32, Int32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    _check(spec)
    wg = arch == "sm_90a"  # wgmma; elsewhere mma.sync on the same layout
    hq, hkv, d, size = spec["HQ"], spec["HKV"], spec["D"], spec["P"]
    ring, window = spec["RING"], spec["W"]
    stages = spec["ST"]
    splits = _splits(spec)
    g_heads = hq // hkv
    tq = tokens_per_cta(spec)
    rows = WARPS * ROWS
    threads = 32 * WARPS
    lay = _layout(spec)
    blk_q = rows * 128  # bytes of one 64-column block of Q
    cpr = d // 8  # 16-byte chunks per row
    q_per_thread = rows * cpr // threads
    ksteps = d // 16
    ntile_s = BN // 8  # n-tiles of S per warp row block
    dtiles = d // 8
    qk_scale = LOG2E / math.sqrt(d)
    ninf = float("-inf")
    launch = _launch(spec)
    fc = _fc(spec)
    rows_pass = threads // cpr  # key rows one pass of the CTA's 16-byte copies covers
    passes = BN * cpr // threads
    # FC's run copies rely on it: a chunk row's swizzle (row mod 8) is the same in every pass
    assert not fc or rows_pass % 8 == 0, (spec.id, rows_pass)


    def swz(row, chunk, blk_bytes):
        """Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled operand whose
        64-column blocks are `blk_bytes` apart (trace-time helper on DSL integers)."""
        return (chunk // 8) * blk_bytes + row * 128 + ((chunk % 8) ^ (row % 8)) * 16

    def load_tile(tile, stage, tid, kvh, n, lo, qmax, slot, base, kc, vc, kn, vn, tb, mtable,
                  dsts=None, nthr=threads, bn=BN):
        """cp.async this thread's chunks of K and V tile `tile` (`bn` keys) into `stage`, one of
        `nthr` threads, and commit them as one group. `dsts`: instead, the shared addresses
        (K, V) of the tile's destinations, either None to skip that operand (the
        warp-specialized form's separate K and V pipelines)."""
        if dsts is not None:
            # the tile number through an opaque asm: otherwise LLVM shares this pass's address
            # arithmetic with the other operand's pass and keeps all of it live across the
            # barrier wait between them (the producer then spilled even at 80 registers)
            tile = Int32(du.f32_bits(du.fence_values([du.as_f32(Uint32(tile))])[0]))
        kb = tile * bn
        if dsts is None:
            ks = base + Uint32(lay["stages"] + stage * lay["stage"])
        else:
            kdst, vdst = dsts
        one_page = ring == 0 and size % bn == 0  # a key tile lies in one page
        # or in bn // size pages, and thread `tid`'s i-th chunk row's page is known at trace
        # time: rows tid // cpr + (nthr // cpr)·i
        some_pages = (ring == 0 and not one_page and bn % size == 0 and nthr % cpr == 0
                      and size % (nthr // cpr) == 0)
        page_t = Uint32(0)
        pages = []
        kb_ent = Int32(0)
        if ring == 1:
            kb_ent = kb % size  # one division per tile, not one per 16-byte copy
        if one_page:  # one page-table read per tile, not one per 16-byte copy
            pidx_t = cutlass.min(cutlass.max(kb, Int32(0)) // size, mtable.shape[0] - 1)
            page_t = du.ld_u32_if(tb + Int64(pidx_t) * 4,
                                  (kb < n) & (kb <= qmax) & (kb + (bn - 1) >= lo))
        if some_pages:
            for h in range(bn // size):
                kh = kb + h * size
                pidx_h = cutlass.min(cutlass.max(kh, Int32(0)) // size, mtable.shape[0] - 1)
                pages.append(du.ld_u32_if(tb + Int64(pidx_h) * 4,
                                          (kh < n) & (kh <= qmax) & (kh + (size - 1) >= lo)))
        for i in range(bn * cpr // nthr):
            c = tid + nthr * i
            row, col = c // cpr, c % cpr
            kp = kb + row
            ok = (kp >= lo) & (kp <= qmax)
            new = kp >= n
            src_new = Int64(cutlass.max(kp - n, Int32(0)) * hkv + kvh) * (d * 2)
            cached = kp < n
            src_old = Int64(0)
            if ring == 1:
                ent = kb_ent + row  # kb ≥ 0 and row < BN < size: one wrap at most
                ent = cutlass.select_(ent >= size, ent - size, ent)
                src_old = (Int64(slot * hkv + kvh) * size + Int64(ent)) * (d * 2)
            else:
                page = page_t
                if some_pages:
                    page = pages[(nthr // cpr) * i // size]
                elif not one_page:
                    pidx = cutlass.min(cutlass.max(kp, Int32(0)) // size, mtable.shape[0] - 1)
                    page = du.ld_u32_if(tb + Int64(pidx) * 4, ok & cached)
                src_old = (Int64(Int32(page) * hkv + kvh) * size + Int64(kp % size)) * (d * 2)
            off = Int64(col * 16)
            if dsts is None:
                dst = ks + Uint32(swz(row, col, bn * 128))
                nbytes = cutlass.select_(ok, Int32(16), Int32(0))
                ka = cutlass.select_(new, kn + src_new, kc + src_old) + off
                va = cutlass.select_(new, vn + src_new, vc + src_old) + off
                du.cp_async_16(dst, ka, nbytes)
                du.cp_async_16(dst + Uint32(lay["tile"]), va, nbytes)
                continue
            at = Uint32(swz(row, col, bn * 128))
            nbytes = cutlass.select_(ok, Int32(16), Int32(0))
            for dst, cache, fresh in ((kdst, kc, kn), (vdst, vc, vn)):
                if dst is not None:
                    du.cp_async_16(dst + at, cutlass.select_(new, fresh + src_new,
                                                             cache + src_old) + off, nbytes)
        du.cp_async_commit()

    def scores_issue(qs, ks, warp, bn=BN):
        """Issue S = Q·Kᵀ of this warpgroup's 64 rows and the tile's `bn` keys as one committed
        wgmma group; returns its accumulators (valid after `scores_wait`)."""
        wgi = warp // 4
        vals = [Float32(0.0)] * (bn // 2)
        du.wgmma_fence()
        dq0 = du.smem_desc(qs + Uint32(wgi * 64 * 128), 16, 1024) if fc else None
        dk0 = du.smem_desc(ks, 16, 1024) if fc else None
        for s in range(ksteps):
            # K-major: k-step s is 32 bytes into a 128-byte row of block s // 4
            qo, ko = (s // 4) * blk_q + (s % 4) * 32, (s // 4) * bn * 128 + (s % 4) * 32
            if fc:  # the start address field (addr >> 4, bits 0-13) plus the step's offset
                da, db = dq0 + Int64(qo >> 4), dk0 + Int64(ko >> 4)
            else:
                da = du.smem_desc(qs + Uint32(qo + wgi * 64 * 128), 16, 1024)
                db = du.smem_desc(ks + Uint32(ko), 16, 1024)
            vals = du.wgmma_ss(bn, da, db, vals, Int32(1 if s else 0))
        du.wgmma_commit()
        return vals

    def scores_wait(sc, vals):
        du.wgmma_wait(0)
        vals = du.fence_values(vals)
        for i in range(len(vals)):
            sc[i] = vals[i]

    def scores(sc, qs, ks, warp, lane, bn=BN):
        """S = Q·Kᵀ of this warp's 16 rows and the tile's `bn` keys into `sc` (bn/2 fp32 in the
        m16n8 accumulator layout per 8 keys). A trace-time helper, as load_tile: its loops
        unroll in Python."""
        if wg:
            scores_wait(sc, scores_issue(qs, ks, warp, bn))
        else:
            sc.fill(0.0)
            r_a = ROWS * warp + lane % 16
            for s in range(0, ksteps, 2):
                a = [du.ldmatrix_x4(qs + Uint32(swz(r_a, 2 * (s + h) + lane // 16, blk_q)))
                     for h in range(2)]
                for j in range(bn // 8):
                    b = du.ldmatrix_x4(ks + Uint32(swz(8 * j + lane % 8, 2 * s + lane // 8,
                                                       bn * 128)))
                    c4 = [sc[4 * j + e] for e in range(4)]
                    c4 = du.mma_bf16_m16n8k16(a[0], [b[0], b[1]], c4)
                    c4 = du.mma_bf16_m16n8k16(a[1], [b[2], b[3]], c4)
                    for e in range(4):
                        sc[4 * j + e] = c4[e]

    def pv_issue(vs, pa, acc, bn=BN):
        """Issue acc + P·V (wgmma) as one committed group: P's A fragments `pa` (bn/16 k-steps
        × 4 bf16x2), V from `vs`; returns the accumulators (valid after its wgmma_wait)."""
        vals = [acc[i] for i in range(dtiles * 4)]
        du.wgmma_fence()
        dv0 = du.smem_desc(vs, bn * 128, 1024) if fc else None
        for kk in range(bn // 16):
            # MN-major: 16 keys = two 1024-byte groups of 8 rows; 64-column blocks apart
            if fc:
                db = dv0 + Int64((kk * 16 * 128) >> 4)
            else:
                db = du.smem_desc(vs + Uint32(kk * 16 * 128), bn * 128, 1024)
            vals = du.wgmma_rs(d, pa[kk], db, vals, Int32(1), trans_b=1)
        du.wgmma_commit()
        return vals

    def pv(vs, pa, acc, lane, bn=BN):
        """acc += P·V in place: P's A fragments `pa` (bn/16 k-steps × 4 bf16x2), V from `vs`."""
        if wg:
            vals = pv_issue(vs, pa, acc, bn)
            du.wgmma_wait(0)
            vals = du.fence_values(vals)
            for i in range(dtiles * 4):
                acc[i] = vals[i]
        else:
            for kk in range(bn // 16):
                for jd in range(0, dtiles, 2):
                    m = lane // 8
                    b = du.ldmatrix_x4_trans(vs + Uint32(swz(16 * kk + 8 * (m % 2) + lane % 8,
                                                             jd + m // 2, bn * 128)))
                    for h in range(2):
                        c4 = [acc[4 * (jd + h) + e] for e in range(4)]
                        c4 = du.mma_bf16_m16n8k16(pa[kk], [b[2 * h], b[2 * h + 1]], c4)
                        for e in range(4):
                            acc[4 * (jd + h) + e] = c4[e]

    def softmax_lazy(sc, st, nts=BN // 8):
        """The online softmax of one tile (raw scores in `sc`, replaced by the weights): the
        scale is folded into each exponent's FMA, and a row's reference max moves, rescaling
        l and O, only when the tile's max exceeds it by more than RESCALE_AT (log2 units;
        FlashAttention-4's conditional rescaling): every weight stays ≤ 2^RESCALE_AT, O and l
        keep one common reference, so out = O / l is unchanged, and most tiles past a row's
        first skip the multiplies of O (the warp skips them unless a row of it moved).
        Returns (whether a row of the warp moved, the two rows' factors for O)."""
        moved = Boolean(False)
        alphas = [Float32(1.0)] * 2
        for r in range(2):
            # FMNMX (cutlass.max lowers to a NaN-propagating compare-and-select, 4 instructions)
            mx = sc[2 * r]
            for j in range(nts):
                for e in range(2):
                    mx = cute.arch.fmax(mx, sc[4 * j + 2 * r + e])
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=1))
            mx = cute.arch.fmax(mx, cute.arch.shuffle_sync_bfly(mx, offset=2))
            mxs = mx * Float32(qk_scale)
            m_ref = st[r, 0]
            need = mxs > m_ref + Float32(RESCALE_AT)
            m_new = cutlass.select_(need, mxs, m_ref)
            m_use = cutlass.select_(m_new == Float32(ninf), Float32(0.0), m_new)
            alpha = cutlass.select_(need, du.ex2(m_ref - m_use), Float32(1.0))
            psum = Float32(0.0)
            for j in range(nts):
                for e in range(2):
                    # one FFMA (ptxas contracts the plain multiply and subtract) and one MUFU
                    v = du.ex2(sc[4 * j + 2 * r + e] * Float32(qk_scale) - m_use)
                    sc[4 * j + 2 * r + e] = v
                    psum = psum + v
            st[r, 0] = m_new
            st[r, 1] = st[r, 1] * alpha + psum
            alphas[r] = alpha
            moved = moved | need
        return cute.arch.vote_any_sync(moved), alphas

    def start(warp, g, kvh, msinks):
        """The kernel's opening, both forms: the dynamic shared block's 1024-aligned base (the
        swizzle atoms need it), this lane's two rows R = 16·warp + g + 8·r (token R // G, head
        R % G; 16·warp is a multiple of G) and their sinks, loaded before the PDL wait (a
        weight), then the wait and the early launch of the dependents."""
        alloc = cutlass.memory.SmemAllocator()
        smem = alloc.allocate_tensor(cutlass.Uint8, cute.make_layout((launch.smem,)),
                                     byte_alignment=128)
        raw = du.smem_addr(smem)
        base = (raw + Uint32(1023)) & Uint32(0xFFFFFC00)
        row_r = [ROWS * warp + g + 8 * r for r in range(2)]
        row_head = [(g + 8 * r) % g_heads for r in range(2)]
        sw = [du.ld_weight_u32(msinks.iterator.toint() + Int64(kvh * g_heads + row_head[r]) * 4)
              for r in range(2)]
        du.griddepcontrol_wait_after_values(sw)
        cute.arch.griddepcontrol_launch_dependents()
        return base, row_r, row_head, sw

    def sources(mkc, mvc, mkn, mvn, mtable):
        """The copies' global base addresses (K and V cache, the chunk's K and V, the page
        table) and a ring layer's slot (read after the PDL wait: the table is an input)."""
        slot = Int32(0)
        kc, vc = mkc.iterator.toint(), mvc.iterator.toint()
        kn, vn = mkn.iterator.toint(), mvn.iterator.toint()
        tb = mtable.iterator.toint()
        if cutlass.const_expr(ring == 1):
            slot = mtable[0]
        return kc, vc, kn, vn, tb, slot

    def block_keys(blk, mq, mstart, bn):
        """This CTA's query block (the last one first: the longest causal rows start first)
        and its key tiles: (qblk, n cached tokens, T, the block's first token q0, the chunk's
        last token, the block's first and last positions, the lowest key any of its rows sees,
        the first key tile, the number of key tiles of `bn` keys)."""
        nblk, _, _ = cute.arch.grid_dim()
        qblk = nblk - 1 - blk
        n = mstart[0]
        t_total = mq.shape[0]
        q0 = qblk * tq
        last = t_total - 1
        qmin = n + q0
        qmax = n + cutlass.min(q0 + tq - 1, last)
        lo = Int32(0)
        if cutlass.const_expr(window > 0):
            lo = cutlass.max(qmin - (window - 1), Int32(0))
        t_first = lo // bn
        return qblk, n, t_total, q0, last, qmin, qmax, lo, t_first, qmax // bn + 1 - t_first

    @cute.jit
    def store_out(ob: Int64, st: cute.Tensor, acc: cute.Tensor, q0: Int32, last: Int32,
                  kvh: Int32, warp: Int32, lane: Int32):
        """The output rows of this thread (O / l as bf16; tokens past the chunk skipped)."""
        g, t = lane // 4, lane % 4
        for r in cutlass.range_constexpr(2):
            l_row = st[r, 1]
            l_row = l_row + cute.arch.shuffle_sync_bfly(l_row, offset=1)
            l_row = l_row + cute.arch.shuffle_sync_bfly(l_row, offset=2)
            inv = Float32(1.0) / l_row
            tok = q0 + (ROWS * warp + g + 8 * r) // g_heads
            if tok <= last:
                orow = Int64(tok * hq + kvh * g_heads + (g + 8 * r) % g_heads) * (d * 2)
                for jd in cutlass.range_constexpr(dtiles):
                    du.st_u32(ob + orow + (8 * jd + 2 * t) * 2,
                              du.pack_bf16(acc[4 * jd + 2 * r] * inv,
                                           acc[4 * jd + 2 * r + 1] * inv))

    def mask_scores(sc, kb, t, qpos, nts):
        """−inf for the scores in `sc` (a tile of nts·8 keys from kb) that a row may not see:
        past its position (causal) or, on sliding layers, window or more before it."""
        for j in range(nts):
            for e in range(4):
                kp = kb + 8 * j + 2 * t + e % 2
                p = qpos[e // 2]
                ok = kp <= p
                if cutlass.const_expr(window > 0):
                    ok = ok & (kp > p - window)
                sc[4 * j + e] = cutlass.select_(ok, sc[4 * j + e], Float32(ninf))

    def rescale(acc, alphas):
        """O's two rows of this thread times their softmax factors."""
        for r in range(2):
            for jd in range(dtiles):
                acc[4 * jd + 2 * r] = acc[4 * jd + 2 * r] * alphas[r]
                acc[4 * jd + 2 * r + 1] = acc[4 * jd + 2 * r + 1] * alphas[r]

    @cute.kernel
    def attn_prefill_wg_kernel(mq: cute.Tensor, mkn: cute.Tensor, mvn: cute.Tensor,
                               mkc: cute.Tensor, mvc: cute.Tensor, mtable: cute.Tensor,
                               mstart: cute.Tensor, msinks: cute.Tensor, mout: cute.Tensor,
                               mop: cute.Tensor = None, mlp: cute.Tensor = None,
                               mcnt: cute.Tensor = None):
        tid, _, _ = cute.arch.thread_idx()
        blk, kvh, split = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        base, row_r, row_head, sw = start(warp, g, kvh, msinks)

        qblk, n, t_total, q0, last, qmin, qmax, lo, t_first, ntiles = block_keys(
            blk, mq, mstart, BN)
        qpos = [n + q0 + row_r[r] // g_heads for r in range(2)]
        nsp = Int32(1)
        if cutlass.const_expr(splits > 1):
            # split `split` of nsp takes `chunk` tiles from t_first + split·chunk (the last
            # ones may be empty: nsp is clamped to SPLITS); CTAs past nsp walk no tiles and
            # take no part in the combine
            nsp = cutlass.min(Int32(splits), (ntiles + (SPLIT_MIN_TILES - 1)) // SPLIT_MIN_TILES)
            chunk = cutlass.max(Int32(SPLIT_MIN_TILES), (ntiles + nsp - 1) // nsp)
            t_first = t_first + split * chunk
            ntiles = cutlass.max(cutlass.min(chunk, ntiles - split * chunk), Int32(0))

        kc, vc, kn, vn, tb, slot = sources(mkc, mvc, mkn, mvn, mtable)

        # Q's 128 rows (tokens past the chunk are zero fills), committed with the first tile
        qb = mq.iterator.toint()
        qs = base + Uint32(lay["q"])
        for i in range(q_per_thread):
            c = tid + threads * i
            row, col = c // cpr, c % cpr
            tok = q0 + row // g_heads
            src = Int64(cutlass.min(tok, last) * hq + kvh * g_heads + row % g_heads) * (d * 2)
            du.cp_async_16(qs + Uint32(swz(row, col, blk_q)), qb + src + Int64(col * 16),
                           cutlass.select_(tok <= last, Int32(16), Int32(0)))

        acc = cute.make_rmem_tensor((dtiles * 4,), Float32)
        acc.fill(0.0)
        sc = cute.make_rmem_tensor((BN // 2,), Float32)
        st = cute.make_rmem_tensor((2, 2), Float32)  # per row: running max (log2), sum
        for r in cutlass.range_constexpr(2):
            sink = du.as_f32(sw[r]) * Float32(LOG2E)
            if cutlass.const_expr(splits > 1):  # the sink enters the row once: in split 0
                sink = cutlass.select_(split == 0, sink, Float32(ninf))
            st[r, 0] = sink
            st[r, 1] = cutlass.select_((t == 0) & (sink != Float32(ninf)), Float32(1.0),
                                       Float32(0.0))

        for pre in cutlass.range_constexpr(stages - 1):
            load_tile(t_first + pre, pre, tid, kvh, n, lo, qmax, slot, base, kc, vc, kn, vn, tb,
                      mtable)
        # FC = 1: this thread's offsets in a key tile (first pass; the others at immediates):
        # in the stage (swizzled), in the chunk's K/V (rows hkv·D·2 bytes apart) and in a
        # page or ring (rows D·2 apart)
        row0, col0 = tid // cpr, tid % cpr
        dst_thr = Uint32(swz(row0, col0, BN * 128))
        for it in cutlass.range(ntiles):
            tile = t_first + it
            stage = it % stages
            du.cp_async_wait(stages - 2)
            du.fence_proxy_async_shared()
            cute.arch.sync_threads()
            kb = tile * BN
            ks = base + Uint32(lay["stages"] + stage * lay["stage"])
            vs = ks + Uint32(lay["tile"])
            if cutlass.const_expr(fc == 1):
                # run copies (module doc, FC): a tile inside [lo, qmax] whose keys are all
                # the chunk's or all in one page / one unwrapped run of the ring takes its
                # copies at one stride from one base; any other tile the per-copy path. On
                # both layer kinds under the S wgmmas (128 registers: the launch asks for two
                # CTAs an SM)
                pend = None
                if cutlass.const_expr(wg):
                    pend = scores_issue(qs, ks, warp)
                nt = tile + stages - 1
                kbn = nt * BN
                nks = base + Uint32(lay["stages"] + ((it + stages - 1) % stages) * lay["stage"])
                inside = (kbn >= lo) & (kbn + (BN - 1) <= qmax)
                fresh = inside & (kbn >= n)
                stored = inside & (kbn + (BN - 1) < n)
                if cutlass.const_expr(ring == 1):
                    stored = stored & (kbn % size + BN <= size)
                if fresh | stored:
                    # one base and row stride for both: the chunk's K/V rows are hkv·D·2
                    # bytes apart, a page's or ring's D·2
                    off_n = Int64((kbn - n) * hkv + kvh) * (d * 2)
                    off_c = Int64(0)
                    if cutlass.const_expr(ring == 1):
                        off_c = (Int64(slot * hkv + kvh) * size + Int64(kbn % size)) * (d * 2)
                    else:
                        pg = du.ld_u32_if(tb + Int64(kbn // size) * 4, stored)
                        off_c = Int64(Int32(pg) * hkv + kvh) * (size * d * 2)
                    stride = cutlass.select_(fresh, Int32(hkv * d * 2), Int32(d * 2))
                    thr = Int64(row0 * stride + col0 * 16)
                    kbase = cutlass.select_(fresh, kn + off_n, kc + off_c) + thr
                    vbase = cutlass.select_(fresh, vn + off_n, vc + off_c) + thr
                    for i in range(passes):
                        srci = Int64(stride * (i * rows_pass))
                        du.cp_async_16(nks + dst_thr + Uint32(i * rows_pass * 128), kbase + srci,
                                       Int32(16))
                        du.cp_async_16(nks + dst_thr + Uint32(lay["tile"] + i * rows_pass * 128),
                                       vbase + srci, Int32(16))
                    du.cp_async_commit()
                else:
                    load_tile(nt, (it + stages - 1) % stages, tid, kvh, n, lo, qmax, slot,
                              base, kc, vc, kn, vn, tb, mtable)
                if cutlass.const_expr(wg):
                    scores_wait(sc, pend)
                else:
                    scores(sc, qs, ks, warp, lane)
            elif wg and ring == 0:
                # the next tile's copies are issued while this tile's S wgmmas run (they
                # write another stage, whose last readers were waited before the barrier).
                # Not on ring layers: their copies' addresses with S's accumulators live
                # took ptxas to 144 registers, one CTA per SM instead of two.
                pend = scores_issue(qs, ks, warp)
                load_tile(tile + stages - 1, (it + stages - 1) % stages, tid, kvh, n, lo,
                          qmax, slot, base, kc, vc, kn, vn, tb, mtable)
                scores_wait(sc, pend)
            else:
                load_tile(tile + stages - 1, (it + stages - 1) % stages, tid, kvh, n, lo,
                          qmax, slot, base, kc, vc, kn, vn, tb, mtable)
                scores(sc, qs, ks, warp, lane)
            edge = kb + (BN - 1) > qmin
            if cutlass.const_expr(window > 0):
                edge = edge | (kb <= qmax - window)
            if edge:
                mask_scores(sc, kb, t, qpos, ntile_s)
            # online softmax per row (log2 units); the weights replace the scores
            moved, alphas = softmax_lazy(sc, st)
            if moved:
                rescale(acc, alphas)
            # P as A fragments: k-step kk = keys 16kk … 16kk + 15 = n-tiles 2kk, 2kk + 1
            pa = [[du.pack_bf16(sc[8 * kk + 2 * e], sc[8 * kk + 2 * e + 1]) for e in range(4)]
                  for kk in range(BN // 16)]
            pv(vs, pa, acc, lane)

        ob = mout.iterator.toint()
        if cutlass.const_expr(splits > 1):
            if split < nsp:
                # this split's partials: O / l (fp32) and log2(l) + the reference max per row
                op, lp = mop.iterator.toint(), mlp.iterator.toint()
                for r in cutlass.range_constexpr(2):
                    l_row = st[r, 1]
                    l_row = l_row + cute.arch.shuffle_sync_bfly(l_row, offset=1)
                    l_row = l_row + cute.arch.shuffle_sync_bfly(l_row, offset=2)
                    has = l_row > Float32(0.0)
                    inv = Float32(1.0) / cutlass.select_(has, l_row, Float32(1.0))
                    m_row = st[r, 0]
                    m_use = cutlass.select_(m_row == Float32(ninf), Float32(0.0), m_row)
                    lse = cutlass.select_(has, m_use + du.lg2(l_row), Float32(ninf))
                    tok = q0 + row_r[r] // g_heads
                    if tok <= last:
                        prow = Int64((split * t_total + tok) * hq + kvh * g_heads + row_head[r])
                        for jd in cutlass.range_constexpr(dtiles):
                            du.st_v2(op + (prow * d + 8 * jd + 2 * t) * 4,
                                     [du.f32_bits(acc[4 * jd + 2 * r + e] * inv)
                                      for e in range(2)])
                        if t == 0:
                            du.st_u32(lp + prow * 4, du.f32_bits(lse))
                # the barrier orders every thread's partial stores before thread 0's acq_rel
                # add, whose release is cumulative; its acquire and the barrier after it order
                # the other splits' partials before this CTA's loads (attn_decode's combine)
                cute.arch.sync_threads()
                cnt = mcnt.iterator.toint() + Int64(qblk * hkv + kvh) * 4
                flag = base + Uint32(lay["flag"])
                if tid == 0:
                    du.st_shared_u32(flag, du.atom_add_acq_rel(cnt))
                cute.arch.sync_threads()
                if Int32(du.ld_shared_u32(flag)) == nsp - 1:  # the last split: combine all
                    for it in cutlass.range_constexpr(rows * (d // 4) // threads):
                        item = tid + it * threads
                        row, d0 = item // (d // 4), (item % (d // 4)) * 4
                        tok = q0 + row // g_heads
                        ok = tok <= last
                        prow0 = Int64(cutlass.min(tok, last) * hq + kvh * g_heads
                                      + row % g_heads)
                        lv = []
                        for i in cutlass.range_constexpr(splits):
                            use = ok & (Int32(i) < nsp)
                            w = du.ld_cg_u32_if(lp + (Int64(i * t_total) * hq + prow0) * 4,
                                                use)
                            lv.append(cutlass.select_(use, du.as_f32(w), Float32(ninf)))
                        mm = lv[0]
                        for i in cutlass.range_constexpr(1, splits):
                            mm = cute.arch.fmax(mm, lv[i])
                        mu = cutlass.select_(mm == Float32(ninf), Float32(0.0), mm)
                        den = Float32(0.0)
                        num = [Float32(0.0)] * 4
                        for i in cutlass.range_constexpr(splits):
                            wt = du.ex2(lv[i] - mu)  # 0 for an unused or empty split
                            den = den + wt
                            pw = du.ld_cg_v4_if(
                                op + ((Int64(i * t_total) * hq + prow0) * d + d0) * 4,
                                ok & (Int32(i) < nsp))
                            for e in cutlass.range_constexpr(4):
                                num[e] = num[e] + du.as_f32(pw[e]) * wt
                        inv = Float32(1.0) / cutlass.select_(den > Float32(0.0), den,
                                                              Float32(1.0))
                        if ok:
                            du.st_v2(ob + (prow0 * d + d0) * 2,
                                     [du.pack_bf16(num[2 * e] * inv, num[2 * e + 1] * inv)
                                      for e in range(2)])
                    if tid == 0:
                        du.st_relaxed_zero(cnt)  # ready for the next launch (graph replay)
        else:
            store_out(ob, st, acc, q0, last, kvh, warp, lane)

    @cute.kernel
    def attn_prefill_ws_kernel(mq: cute.Tensor, mkn: cute.Tensor, mvn: cute.Tensor,
                               mkc: cute.Tensor, mvc: cute.Tensor, mtable: cute.Tensor,
                               mstart: cute.Tensor, msinks: cute.Tensor, mout: cute.Tensor):
        """The warp-specialized form (WS = 1): warpgroups 0 and 1 compute 64 rows each, 2
        copies K and V tiles of WS_BN keys into ST stages of two pipelines."""
        tid, _, _ = cute.arch.thread_idx()
        blk, kvh, _ = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        bn = WS_BN
        nts = bn // 8
        base, row_r, row_head, sw = start(warp, g, kvh, msinks)
        consumers, producers = 256, 128
        everyone = consumers + producers

        _, n, t_total, q0, last, qmin, qmax, lo, t_first, ntiles = block_keys(
            blk, mq, mstart, bn)
        kst, vst = base + Uint32(lay["k"]), base + Uint32(lay["v"])
        # The stages change hands by named barriers of all 384 threads: the producer arrives
        # on "full" once its copies into a stage are complete and fenced for wgmma's async
        # proxy, the consumers wait there; the consumers arrive on "empty" once the wgmma
        # reading the stage is waited, the producer waits there before refilling it. A
        # barrier's phases cannot mix: each side's next arrival needs the other side's wait
        # of the phase before. The consumers release a tile's stage only when a tile ST later
        # refills it, so every barrier sees as many arrivals as waits. (mbarriers, whose
        # waits are loops, made ptxas wait for the P·V before the softmax: a loop in the
        # iteration's body stops it keeping a wgmma in flight across the body.)

        if warp >= 8:
            # the producer: tile it's K, then V, each a cp.async group; a stage is handed over
            # once this thread's copies into it are complete and fenced for wgmma's async
            # proxy, and refilled only after every consumer thread released it
            cute.arch.setmaxregister_decrease(WS_PRODUCER_REGS)
            ptid = tid - consumers
            kc, vc, kn, vn, tb, slot = sources(mkc, mvc, mkn, mvn, mtable)
            for it in cutlass.range(ntiles):
                s_k = it % stages
                if it >= stages:
                    cute.arch.barrier(barrier_id=WS_EMPTY_K + s_k, number_of_threads=everyone)
                load_tile(t_first + it, 0, ptid, kvh, n, lo, qmax, slot, base, kc, vc, kn, vn,
                          tb, mtable, dsts=(kst + Uint32(lay["tile"]) * Uint32(s_k), None),
                          nthr=producers, bn=bn)
                if it >= 1:  # V of the tile before is complete
                    du.cp_async_wait(1)
                    du.fence_proxy_async_shared()
                    cute.arch.barrier_arrive(barrier_id=WS_FULL_V + (it - 1) % stages,
                                             number_of_threads=everyone)
                if it >= stages:
                    cute.arch.barrier(barrier_id=WS_EMPTY_V + s_k, number_of_threads=everyone)
                load_tile(t_first + it, 0, ptid, kvh, n, lo, qmax, slot, base, kc, vc, kn, vn,
                          tb, mtable, dsts=(None, vst + Uint32(lay["tile"]) * Uint32(s_k)),
                          nthr=producers, bn=bn)
                du.cp_async_wait(1)  # K of this tile is complete
                du.fence_proxy_async_shared()
                cute.arch.barrier_arrive(barrier_id=WS_FULL_K + s_k, number_of_threads=everyone)
            du.cp_async_wait(0)
            du.fence_proxy_async_shared()
            cute.arch.barrier_arrive(barrier_id=WS_FULL_V + (ntiles - 1) % stages,
                                     number_of_threads=everyone)
        else:
            cute.arch.setmaxregister_increase(WS_CONSUMER_REGS)
            c = warp // 4  # this consumer warpgroup: rows 64c … 64c + 63
            qpos = [n + q0 + row_r[r] // g_heads for r in range(2)]
            qb = mq.iterator.toint()
            qs = base + Uint32(lay["q"])
            for i in cutlass.range_constexpr(rows * cpr // consumers):
                ci = tid + consumers * i
                row, col = ci // cpr, ci % cpr
                tok = q0 + row // g_heads
                src = Int64(cutlass.min(tok, last) * hq + kvh * g_heads + row % g_heads) * (d * 2)
                du.cp_async_16(qs + Uint32(swz(row, col, blk_q)), qb + src + Int64(col * 16),
                               cutlass.select_(tok <= last, Int32(16), Int32(0)))
            du.cp_async_commit()
            du.cp_async_wait(0)
            du.fence_proxy_async_shared()
            cute.arch.barrier(barrier_id=WS_Q_BAR, number_of_threads=consumers)

            acc = cute.make_rmem_tensor((dtiles * 4,), Float32)
            acc.fill(0.0)
            sc = cute.make_rmem_tensor((bn // 2,), Float32)
            pbuf = cute.make_rmem_tensor((bn // 2,), Uint32)  # P of the tile before, bf16x2
            st = cute.make_rmem_tensor((2, 2), Float32)
            for r in cutlass.range_constexpr(2):
                sink = du.as_f32(sw[r]) * Float32(LOG2E)
                st[r, 0] = sink
                st[r, 1] = cutlass.select_((t == 0) & (sink != Float32(ninf)), Float32(1.0),
                                           Float32(0.0))
            # Ping-pong (FlashAttention-3): the consumers take turns issuing their wgmmas, so
            # one's softmax runs while the other's products use the tensor cores. Consumer c
            # waits on barrier WS_TURN_BAR + c, and after issuing lets the other go; consumer
            # 1 opens the first turn and skips its last hand-over (each barrier then sees
            # as many arrivals as waits).
            mine = WS_TURN_BAR + c
            other = WS_TURN_BAR + 1 - c
            if c == 1:
                cute.arch.barrier_arrive(barrier_id=WS_TURN_BAR, number_of_threads=consumers)

            # tile 0: S only (its P·V is issued with tile 1's S)
            cute.arch.barrier(barrier_id=WS_FULL_K, number_of_threads=everyone)
            cute.arch.barrier(barrier_id=mine, number_of_threads=consumers)
            if cutlass.const_expr(wg):
                pend = scores_issue(qs, kst, warp, bn)
                cute.arch.barrier_arrive(barrier_id=other, number_of_threads=consumers)
                scores_wait(sc, pend)
            else:
                cute.arch.barrier_arrive(barrier_id=other, number_of_threads=consumers)
                scores(sc, qs, kst, warp, lane, bn)
            if ntiles > stages:  # tile ST refills this stage
                cute.arch.barrier_arrive(barrier_id=WS_EMPTY_K, number_of_threads=everyone)
            kb = t_first * bn
            edge = kb + (bn - 1) > qmin
            if cutlass.const_expr(window > 0):
                edge = edge | (kb <= qmax - window)
            if edge:
                mask_scores(sc, kb, t, qpos, nts)
            softmax_lazy(sc, st, nts)  # O is still zero: nothing to rescale
            for i in cutlass.range_constexpr(bn // 2):
                pbuf[i] = du.pack_bf16(sc[2 * i], sc[2 * i + 1])

            # Tiles 1 … ntiles − 1 in three runs: those a row's window starts in, those
            # wholly inside every row's range, those the causal edge crosses. Each run's body
            # is branch-free up to the P·V's wait: with a branch (`if edge:`) there, ptxas
            # moved that wait above the softmax, which is then no longer under the P·V.
            t_end = t_first + ntiles
            w_end = t_first + 1
            if cutlass.const_expr(window > 0):
                w_end = cutlass.max(w_end, cutlass.min(
                    cutlass.select_(qmax >= window, (qmax - window) // bn + 1, Int32(0)),
                    t_end))
            c_from = cutlass.max(cutlass.min((qmin + 1) // bn, t_end), w_end)
            for run in cutlass.range_constexpr(3):
                masked = run != 1
                r_lo, r_hi = ((t_first + 1, w_end), (w_end, c_from), (c_from, t_end))[run]
                for tile in cutlass.range(r_lo, r_hi):
                    it = tile - t_first
                    s_k = it % stages
                    s_v = (it - 1) % stages
                    ks = kst + Uint32(lay["tile"]) * Uint32(s_k)
                    vs = vst + Uint32(lay["tile"]) * Uint32(s_v)
                    cute.arch.barrier(barrier_id=WS_FULL_K + s_k, number_of_threads=everyone)
                    cute.arch.barrier(barrier_id=WS_FULL_V + s_v, number_of_threads=everyone)
                    cute.arch.barrier(barrier_id=mine, number_of_threads=consumers)
                    pa = [[pbuf[4 * kk + e] for e in range(4)] for kk in range(bn // 16)]
                    if cutlass.const_expr(wg):
                        # this tile's S, then the tile before's P·V: two groups, in order
                        pend = scores_issue(qs, ks, warp, bn)
                        pend_o = pv_issue(vs, pa, acc, bn)
                        cute.arch.barrier_arrive(barrier_id=other, number_of_threads=consumers)
                        du.wgmma_wait(1)
                        vals = du.fence_values(pend)
                        for i in cutlass.range_constexpr(bn // 2):
                            sc[i] = vals[i]
                    else:
                        cute.arch.barrier_arrive(barrier_id=other, number_of_threads=consumers)
                        scores(sc, qs, ks, warp, lane, bn)
                    if it + stages < ntiles:
                        cute.arch.barrier_arrive(barrier_id=WS_EMPTY_K + s_k,
                                                 number_of_threads=everyone)
                    if cutlass.const_expr(masked):
                        mask_scores(sc, tile * bn, t, qpos, nts)
                    moved, alphas = softmax_lazy(sc, st, nts)
                    if cutlass.const_expr(wg):
                        du.wgmma_wait(0)  # the P·V, which reads pbuf and accumulates O
                        vals = du.fence_values(pend_o)
                        for i in cutlass.range_constexpr(dtiles * 4):
                            acc[i] = vals[i]
                    else:
                        pv(vs, pa, acc, lane, bn)
                    if it - 1 + stages < ntiles:
                        cute.arch.barrier_arrive(barrier_id=WS_EMPTY_V + s_v,
                                                 number_of_threads=everyone)
                    # O holds the tile before at the old reference max: both move together
                    if moved:
                        rescale(acc, alphas)
                    for i in cutlass.range_constexpr(bn // 2):
                        pbuf[i] = du.pack_bf16(sc[2 * i], sc[2 * i + 1])

            # the last tile's P·V
            s_v = (ntiles - 1) % stages
            vs = vst + Uint32(lay["tile"]) * Uint32(s_v)
            cute.arch.barrier(barrier_id=WS_FULL_V + s_v, number_of_threads=everyone)
            cute.arch.barrier(barrier_id=mine, number_of_threads=consumers)
            pa = [[pbuf[4 * kk + e] for e in range(4)]
                  for kk in range(bn // 16)]
            if cutlass.const_expr(wg):
                pend_o = pv_issue(vs, pa, acc, bn)
                if c == 0:
                    cute.arch.barrier_arrive(barrier_id=other, number_of_threads=consumers)
                du.wgmma_wait(0)
                vals = du.fence_values(pend_o)
                for i in cutlass.range_constexpr(dtiles * 4):
                    acc[i] = vals[i]
            else:
                if c == 0:
                    cute.arch.barrier_arrive(barrier_id=other, number_of_threads=consumers)
                pv(vs, pa, acc, lane, bn)

            ob = mout.iterator.toint()
            store_out(ob, st, acc, q0, last, kvh, warp, lane)

    # FC = 1: two CTAs per SM (≤ 128 registers) asked of ptxas, which otherwise took 152-171
    # for the run copies' extra path (the carveout only keeps the DSL from asking a GPU). Not
    # for the split specs (150 registers, one CTA per SM before FC too; held at 128 they spill
    # in the combine) nor on sm_100a (its mma.sync path spilled 56 bytes at 128)
    occupancy = ({"min_blocks_per_mp": 2, "preferred_smem_carveout": 100}
                 if fc and wg and splits == 1 else {})

    if _ws(spec):
        @cute.jit
        def attn_prefill_wg(mq: cute.Tensor, mkn: cute.Tensor, mvn: cute.Tensor,
                            mkc: cute.Tensor, mvc: cute.Tensor, mtable: cute.Tensor,
                            mstart: cute.Tensor, msinks: cute.Tensor, mout: cute.Tensor,
                            stream: cuda.CUstream):
            grid = (cute.ceil_div(mq.shape[0], tq), hkv, 1)
            attn_prefill_ws_kernel(mq, mkn, mvn, mkc, mvc, mtable, mstart, msinks,
                                   mout).launch(grid=grid, block=list(launch.block),
                                                smem=launch.smem, stream=stream)
        return attn_prefill_wg

    if splits > 1:
        @cute.jit
        def attn_prefill_wg(mq: cute.Tensor, mkn: cute.Tensor, mvn: cute.Tensor,
                            mkc: cute.Tensor, mvc: cute.Tensor, mtable: cute.Tensor,
                            mstart: cute.Tensor, msinks: cute.Tensor, mout: cute.Tensor,
                            mop: cute.Tensor, mlp: cute.Tensor, mcnt: cute.Tensor,
                            stream: cuda.CUstream):
            grid = (cute.ceil_div(mq.shape[0], tq), hkv, splits)
            attn_prefill_wg_kernel(mq, mkn, mvn, mkc, mvc, mtable, mstart, msinks, mout, mop,
                                   mlp, mcnt).launch(grid=grid, block=list(launch.block),
                                                     smem=launch.smem, stream=stream,
                                                     **occupancy)
        return attn_prefill_wg

    @cute.jit
    def attn_prefill_wg(mq: cute.Tensor, mkn: cute.Tensor, mvn: cute.Tensor, mkc: cute.Tensor,
                        mvc: cute.Tensor, mtable: cute.Tensor, mstart: cute.Tensor,
                        msinks: cute.Tensor, mout: cute.Tensor, stream: cuda.CUstream):
        grid = (cute.ceil_div(mq.shape[0], tq), hkv, 1)
        attn_prefill_wg_kernel(mq, mkn, mvn, mkc, mvc, mtable, mstart, msinks, mout).launch(
            grid=grid, block=list(launch.block), smem=launch.smem, stream=stream, **occupancy)

    return attn_prefill_wg


flops = attn_prefill.flops

KERNEL = KernelDef(name="attn_prefill_wg", args=_args, launch=_launch, specs=_specs,
                   build=_build, reference=_reference,
                   source_files=("toolchain/dsl_util.py", "prefill/attn_prefill.py"),
                   build_takes_arch=True)
