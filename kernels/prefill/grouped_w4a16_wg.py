"""The routed experts of a large prefill chunk as grouped W4A16 GEMMs on Hopper's warpgroup MMA
(wgmma): the same function, arguments, tile schedule, reference and tolerance as
`grouped_w4a16` (kernels/prefill/grouped_w4a16.py: KIND 0 gate/up with SwiGLU over the pairs'
gathered x rows, KIND 1 down), for tiles of NT = 64 or 128 pairs. Its GPU tests passed on the
H200; the prefill runs it for chunks above 1,536 rows (capture/prefill.py W4A16_WG_MIN,
Prefill.set_w4a16_wg): 8K NVFP4 routed experts 67 -> 52 ms, but below 2K tokens the mostly
empty 64-pair tiles lose to grouped_w4a16 (perf log, 2026-12-02 sixth and seventh sessions).

Why. At 8K tokens the routed experts on `grouped_w4a16` take 67 ms of an NVFP4 prefill (~210
TFLOP/s, perf log 2026-12-02): that kernel decodes every weight in registers into mma.sync
fragments again for each tile of NT ≤ 32 pairs (larger tiles did not pay: the fragments of x and
the accumulators of mma.sync share the registers), and the loop is issue-bound on the decoding.
Here each CTA decodes its weight rows once per 64-k step into shared memory, where both
warpgroups' wgmmas read them for all NT = 128 pairs of the tile: 4× fewer decodes per weight
than NT = 32, and no operand fragments in registers.

Design. Grid (N_out / 64 (KIND 0) or N_out / 128 (KIND 1), NTILES), 8 warps = 2 warpgroups.
KIND 0: warpgroup 0 computes gate rows f0 … f0+63 and warpgroup 1 up rows f0 … f0+63 of the
tile's expert; KIND 1: the two warpgroups take down rows f0 … f0+63 and f0+64 … f0+127. K goes
in steps of BK = 64 (one 128-byte row of the swizzled layout). Per step each thread of a
warpgroup decodes 32 k of one of its 64 weight rows (16 code bytes, 2 scale bytes, loaded into
registers a step ahead; e2m1·e4m3·2^-7 in bf16, exact, by gemv_mma.frag_ops, then put back in
natural k order) and stores them into the warpgroup's A tile in the canonical 128-byte-swizzled
layout (16-byte chunk c of row r at chunk c ^ (r mod 8)); the tile's x rows (KIND 0 gathered
through tok, zero fills past the tile's rows) come by cp.async into one of four x stages two
steps ahead. After one barrier, 4 wgmma m64nNTk16 per warpgroup (A = its weight rows, B = the x rows,
both K-major from shared memory) run asynchronously while the next step is decoded: each
warpgroup waits for its previous step's wgmmas (wgmma.wait_group 1) before overwriting that
step's A tile (its own rows, two A stages), and the x stage step s refills (for step s + 2) was
last read by step s − 2's wgmmas, which both warpgroups had waited for before step s's barrier. The epilogue scales
by scale2·2^7 in fp32 and rounds once (the reference's one rounding), KIND 0 passes g through
shared memory to the up warpgroup for act = bf16(silu(g)·u), and the tile goes out through
shared memory as whole 16-byte runs of each output row.

sm_100a has no wgmma: that build (compiled in CI, never run here) issues the same products as
mma.sync m16n8k16 per warp with ldmatrix from the same layouts.

PDL: the tile schedule is an input and selects the expert, so every load follows
griddepcontrol.wait (one wait at the top, in every thread; `routed_weights`).

Tolerance (GPU test): as grouped_w4a16, ‖out − ref‖/‖ref‖ ≤ 1e-2 per launch (expected ~2e-3).
SUB = 1 (the default at NT = 128, `SUB`): a tile of at most NT / 2 rows (an expert's last
tile) runs a second copy of the main loop and epilogue that is NT / 2 wide, chosen per CTA
from the tile's row count. Why: at 8K tokens an expert holds ~192 ± 14 pairs, so its second
128-pair tile is about half empty, and the wgmmas, the x copies and the B reads of its empty
half are a quarter of the kernel's tensor work; the decode into shared memory is per tile and
does not shrink. The columns past a tile's rows are never written out, so what the narrow loop
leaves out changes no output bit.

RS = 1 (the default at NT = 64, `RS`): the decoded weights go to wgmma as A from registers, so
no A tile is stored to or read from shared memory (32 of a step's ~80 KB there at NT = 128).
Each thread of a quad loads its two rows' 32 code bytes of a step (the quad shares them) and
decodes from each code word only its pair (t, t + 4), which is what wgmma's A fragment slots
(2t, 2t + 1) multiply when x is in `pair_order` (position 2i + j of each 8-element chunk holds
element i + 4j): the prefill copies x into that order once per layer, and KIND 0 writes act
in it for KIND 1. 125 / 94 registers at NT = 64 (two CTAs per SM), 156 / 134 at NT = 128 (one).
Measured on the H100 (perf log, twenty-seventh session): at NT = 64 gate/up 2K 272-278 ->
266-268 us, down 135 -> 132 us, the whole 2K NVFP4 prefill 38.7 -> 38.2 ms (the pair-order
copy included); at NT = 128 one CTA per SM loses the overlap (8K gate/up 646 -> 971 us), so
there it stays a bench spec. Tolerance as above; not bit for bit equal to RS = 0 (the k order
of each product's sum differs).

W0 = 1 (RS = 1 only; the model's at NT = 64, `W0`, a benchmark variant at NT = 128): each
step waits for its own wgmmas
(wgmma.wait_group 0) instead of the step before's, so only one step's A fragments are live.
Why: at NT = 128, RS = 1 took 156 / 134 registers (one CTA per SM) because the fragments of
two steps and the next step's code words are live beside the 64 accumulators; ptxas keeps
W0 = 1 at 127 / 118 with no spills, so two CTAs share an SM again and one CTA's decode runs
under the other's wgmmas, while the shared-memory traffic of a step drops from ~80 KB (A tile
stored and read by wgmma) to ~48 KB plus the quads' repeated code loads through L1 (ncu: L1 /
shared memory at 82% of its peak with RS = 0, eleventh session). Same products in the same
order: bit for bit the RS = 1 output (GPU test, passed on an H100). Measured on the H100
(thirty-ninth session, `tools/probe_grouped_w4a16.py`, two passes): at NT = 128 and 8K tokens
slower (gate/up 652 -> 759 µs, down 303.5 -> 309 µs): the decode no longer overlapping the
CTA's own wgmmas costs more than the shared memory it saves; at NT = 64 and 2K tokens faster
(gate/up 267.6 -> 263.0 µs, down 132.5 -> 115.3 µs: 79 registers, three down CTAs an SM),
and the whole 2K NVFP4 prefill 35.9 -> 34.7 ms, so it is the model's there.

WS = 1, a warp-specialized form (one producer warpgroup, or two with WP = 2, decoding into
shared memory for the two wgmma warpgroups), was measured slower on the H100 and removed (the
code: `git show dabc55c`): 8K gate/up at NT = 128 646 µs default, 1,294 µs WS = 1 (its second
form), 861 µs WS = 1 WP = 2; 2K at NT = 64 267 µs default, 553 µs WS = 1, 351 µs WS = 1 WP = 2
(tools/probe_grouped_w4a16.py, perf log twenty-eighth session).

Spec values: KIND, H hidden, M expert width, E routed experts, NT pairs per tile, SUB (0, 1;
every spec names it), RS (0, 1), W0 (0, 1; named only where 1).
"""

import math

from flint_graph.kernels.prefill import grouped_w4a16 as gw
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, Spec

WARPS = 8  # two warpgroups
BK = 64  # k per step: one 128-byte row of the swizzled layout
X_STAGES = 4  # x tiles in shared memory, filled X_AHEAD steps ahead
X_AHEAD = 2  # so a refilled stage was last read X_STAGES − X_AHEAD = 2 steps before
W_STAGES = 2
NTS = (64, 128)  # pairs per tile: wgmma's N
# SUB per NT in the model's specs. H100, tools/probe_grouped_w4a16.py (perf log, twenty-sixth
# session): NT = 128 at 8K tokens gate/up 667 -> 648 us, down 320 -> 304 us, and the whole 8K
# NVFP4 prefill 123.5 -> 122.1 ms; NT = 64 at 2K slower (gate/up 272 -> 295 us: almost no tile
# has at most 32 rows there, and the second copy of the loop doubles the code).
SUB = {64: 0, 128: 1}
# RS per NT in the model's specs (H100, perf log, twenty-seventh session; the module doc).
RS = {64: 1, 128: 0}
# W0 per NT in the model's specs (RS = 1 only). H100, tools/probe_grouped_w4a16.py (perf log,
# thirty-ninth session): NT = 64 at 2K tokens gate/up 267.6 -> 263.0 us, down 132.5 -> 115.3
# us, the whole 2K NVFP4 prefill 36.08 / 35.77 -> 34.64 / 34.71 ms; NT = 128 (with RS = 1) at
# 8K gate/up 652 -> 759 us, slower, so RS = 0 stays there.
W0 = {64: 1, 128: 0}


def cta_rows(kind: int) -> int:
    """Output features per CTA: 64 (KIND 0: gate and up, one warpgroup each) or 128."""
    return 64 if kind == 0 else 128


def fits(cfg) -> bool:
    """Whether `cfg`'s expert shapes suit the kernel (H and M multiples of BK and of the CTA's
    output rows): Flint (2048, 512) and flint-nano (256, 128) do, the tiny config does not."""
    h, m = cfg.hidden_size, cfg.moe_intermediate_size
    return bool(cfg.n_routed_experts) and h % 128 == 0 and m % 64 == 0


def _check(spec: Spec) -> None:
    kind, h, m, nt = spec["KIND"], spec["H"], spec["M"], spec["NT"]
    if kind not in (0, 1):
        raise ValueError(f"grouped_w4a16_wg: KIND = {kind}; expected 0 (gate/up) or 1 (down)")
    if nt not in NTS:
        raise ValueError(f"grouped_w4a16_wg: NT = {nt}; expected one of {NTS}")
    if spec["E"] < 1:
        raise ValueError(f"grouped_w4a16_wg: E = {spec['E']}; expected ≥ 1")
    unknown = sorted(set(spec.as_dict()) - {"KIND", "H", "M", "E", "NT", "SUB", "RS", "W0"})
    if unknown:  # e.g. WS or WP, removed (the module doc)
        raise ValueError(f"grouped_w4a16_wg: no compile-time value {', '.join(unknown)}; it "
                         "takes KIND, H, M, E, NT, SUB, RS and W0")
    for key in ("SUB", "RS", "W0"):
        if spec.as_dict().get(key, 0) not in (0, 1):
            raise ValueError(f"grouped_w4a16_wg: {key} = {spec[key]}; expected 0 or 1")
    if spec.as_dict().get("W0", 0) and not spec.as_dict().get("RS", 0):
        raise ValueError("grouped_w4a16_wg: W0 = 1 needs RS = 1 (it frees the A fragments "
                         "that only RS = 1 keeps in registers)")

    k_dim, n_out = (h, m) if kind == 0 else (m, h)
    if k_dim % BK or n_out % cta_rows(kind):
        raise ValueError(f"grouped_w4a16_wg: K = {k_dim} must be a multiple of {BK} and N = "
                         f"{n_out} of {cta_rows(kind)} (KIND {kind})")


def _args(spec: Spec):
    _check(spec)
    return gw._args(gw.KERNEL.spec(KIND=spec["KIND"], H=spec["H"], M=spec["M"], E=spec["E"],
                                   NT=16, D=gw.DEPTH))


def _layout(spec: Spec) -> dict[str, int]:
    """Byte offsets in the 1024-aligned shared-memory block: the A (weight) stages, each two
    warpgroups × 64 rows × 128 B (none with RS = 1), then the x stages, NT rows × 128 B; the
    epilogue reuses it."""
    w_stage = 2 * 64 * 128
    x_stage = spec["NT"] * 128
    x0 = 0 if spec.as_dict().get("RS", 0) else W_STAGES * w_stage  # RS = 1: A in registers
    return {"w_stage": w_stage, "x0": x0, "x_stage": x_stage,
            "total": x0 + X_STAGES * x_stage}


def _out_pitch(spec: Spec) -> int:
    return cta_rows(spec["KIND"]) * 2 + 16  # bytes per token row of the output tile (+ pad)


def _smem(spec: Spec) -> int:
    main = _layout(spec)["total"]
    exch = 128 * (spec["NT"] // 2) * 4 if spec["KIND"] == 0 else 0  # g: fp32 per up thread
    return max(main, exch + spec["NT"] * _out_pitch(spec)) + 1024  # + in-kernel alignment


def _launch(spec: Spec) -> Launch:
    n_out = spec["M"] if spec["KIND"] == 0 else spec["H"]
    return Launch(grid=(n_out // cta_rows(spec["KIND"]), ("NTILES", 1), 1),
                  block=(32 * WARPS, 1, 1), smem=_smem(spec))


def _specs(cfg, buckets=()) -> list[Spec]:
    """Gate/up and down of the routed experts for each NT; none where the kernel does not fit
    (`fits`). The shared expert of large chunks runs on cuBLAS (capture/prefill.py)."""
    if not fits(cfg):
        return []
    e, h, m = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    return [KERNEL.spec(**spec_values(KIND=kind, H=h, M=m, E=e, NT=nt, SUB=SUB[nt], RS=RS[nt],
                                      W0=W0[nt]))
            for kind in (0, 1) for nt in NTS]


# values that are the kernel's form without them: a spec (and the cache key) never names them
UNNAMED = {"RS": 0, "W0": 0}


def spec_values(**values: int) -> dict[str, int]:
    """`values` as a spec names them: without RS = 0 or W0 = 0 (`UNNAMED`)."""
    return {k: v for k, v in values.items() if UNNAMED.get(k, -1) != v}


def variant(spec: Spec, **values: int) -> Spec:
    """`spec` with spec values `values` (a bench variant, e.g. SUB=0 or RS=0): RS = 0 drops
    W0 (RS = 1's), so RS=0 alone names the plain form at every NT."""
    base = spec.as_dict()
    if values.get("RS") == 0:
        base = {k: v for k, v in base.items() if k != "W0"}
    return KERNEL.spec(**spec_values(**{**base, **values}))


def check_variant(values: dict[str, int], nts=NTS) -> None:
    """Whether spec values `values` (a bench variant, e.g. {"SUB": 0, "RS": 1}) make,
    with the model's other values at each NT of `nts`, a valid spec that the cache build
    makes (`_specs` and `bench_specs` at Flint's shapes: the rules do not depend on them).
    Raises ValueError saying what is wrong, so a tool can refuse the option before any GPU
    work (a GPU machine without the CuTe DSL cannot build a missing one)."""
    from flint_graph.checkpoints.config import FlintConfig

    cfg = FlintConfig.preset("full")
    built = {s.id for s in _specs(cfg) + bench_specs(cfg)}
    for nt in nts:
        model = KERNEL.spec(**spec_values(KIND=0, H=2048, M=512, E=256, NT=nt, SUB=SUB[nt],
                                          RS=RS[nt], W0=W0[nt]))
        spec = variant(model, **values)
        _check(spec)
        if spec.id not in built:
            raise ValueError(f"at NT = {nt} that is no spec tools/build_gpu_cache.py builds "
                             "(the model's, each with the other SUB, the other RS, or RS = 1 "
                             "with W0 = 1)")


def bench_specs(cfg, buckets=()) -> list[Spec]:
    """Benchmark variants: each model spec with the other SUB, with the other RS (W0 = 0),
    and in its RS = 1 form with the other W0 (RS = 1 W0 = 1 where the model has RS = 0)."""
    model = _specs(cfg, buckets)

    def rs1_w0(s: Spec) -> int:
        v = s.as_dict()
        return 1 - v.get("W0", 0) if v.get("RS", 0) else 1

    return ([KERNEL.spec(**{**s.as_dict(), "SUB": 1 - s["SUB"]}) for s in model]
            + [KERNEL.spec(**spec_values(**{**s.as_dict(), "RS": 1 - s.as_dict().get("RS", 0),
                                            "W0": 0})) for s in model]
            + [KERNEL.spec(**spec_values(**{**s.as_dict(), "RS": 1, "W0": rs1_w0(s)}))
               for s in model])


def pair_order(t):
    """RS = 1's order of an input's last dimension (x for KIND 0, act for KIND 1; KIND 0 writes
    act in it): within each 8-element chunk, position 2i + j holds element i + 4j (i < 4,
    j < 2), the pairs (k, k + 4) the e2m1 decode makes from one code word. Shape kept."""
    *lead, k = t.shape
    return t.reshape(*lead, k // 8, 2, 4).transpose(-1, -2).reshape(*lead, k)


def natural_order(t):
    """The inverse of `pair_order`."""
    *lead, k = t.shape
    return t.reshape(*lead, k // 8, 4, 2).transpose(-1, -2).reshape(*lead, k)


def _reference(spec: Spec, *args):
    """grouped_w4a16's reference; with RS = 1 on the input in `pair_order` (and for KIND 0
    the output in it)."""
    if not spec.as_dict().get("RS", 0):
        return gw._reference(spec, *args)
    (out,) = gw._reference(spec, natural_order(args[0]), *args[1:])
    return (pair_order(out) if spec["KIND"] == 0 else out,)


def make_args(spec: Spec, **kw) -> list:
    """grouped_w4a16.make_args for this spec's NT (the tile schedule's size); with RS = 1 the
    input in `pair_order`."""
    args = gw.make_args(spec, **kw)
    if spec.as_dict().get("RS", 0):
        args[0] = pair_order(args[0]).contiguous()
    return args


def _build(spec: Spec, arch: str = "sm_90a"):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64, Uint32

    from flint_graph.kernels.decode.gemv_mma import frag_ops
    from flint_graph.kernels.toolchain import dsl_util as du

    _check(spec)
    wg = arch == "sm_90a"  # wgmma; elsewhere mma.sync on the same layouts
    kind, h, m, e, nt = spec["KIND"], spec["H"], spec["M"], spec["E"], spec["NT"]
    sub = spec.as_dict().get("SUB", 0)
    rs = spec.as_dict().get("RS", 0)
    k_dim, n_out = (h, m) if kind == 0 else (m, h)
    rows_cta = cta_rows(kind)
    steps = k_dim // BK
    threads = 32 * WARPS
    lay = _layout(spec)
    code_row, scale_row = k_dim // 2, k_dim // 16  # bytes per weight row
    out_pitch = _out_pitch(spec)
    out_units = rows_cta * 2 // 16
    nacc = nt // 2  # accumulators per thread: m64 × NT over 128 threads
    exch_bytes = 128 * nacc * 4 if kind == 0 else 0
    launch = _launch(spec)
    dequant, _, scales = frag_ops()
    w0 = spec.as_dict().get("W0", 0)

    def swz(row, chunk):
        """Byte offset of 16-byte chunk `chunk` (0..7) of 128-byte row `row` (swizzled)."""
        return row * 128 + ((chunk ^ (row % 8)) * 16)

    def x_chunks(ti, mx, mtok, pair0, nrows):
        """(source addresses, byte counts 16 or 0, swizzled stage offsets) of thread ti's x
        chunks of each step: chunk ti % 8 of rows ti // 8 + 32i; rows past the tile's nrows
        read nothing (zero fill). KIND 0 gathers each pair's token row through tok
        (trace-time helper)."""
        chunk = ti % 8
        xrows = [ti // 8 + (threads // 8) * i for i in range(nt * 8 // threads)]
        src, nbytes = gw.x_sources(mx, mtok, kind, pair0, nrows, xrows, k_dim, chunk * 16)
        dst = [Uint32(swz(row, chunk)) for row in xrows]
        return src, nbytes, dst

    def load_x(s, base, dst, src, nbytes):
        """cp.async this thread's x chunks of step s into its stage (trace-time helper)."""
        stage = base + Uint32(lay["x0"] + (s % X_STAGES) * lay["x_stage"])
        for d, a, n in zip(dst, src, nbytes):
            du.cp_async_16(stage + d, a + Int64(s * BK * 2), n)
        du.cp_async_commit()

    def x_ready(s, base, dst, src, nbytes):
        """Step s's x tile (its shared address), once every thread's copies are in and fenced
        for wgmma (one barrier), with the stage of step s + X_AHEAD refilled after it."""
        du.cp_async_wait(min(X_AHEAD - 1, steps - 1 - s))
        du.fence_proxy_async_shared()
        cute.arch.sync_threads()
        if s + X_AHEAD < steps:
            load_x(s + X_AHEAD, base, dst, src, nbytes)
        return base + Uint32(lay["x0"] + (s % X_STAGES) * lay["x_stage"])

    def load_w(s, ca, sa):
        """This thread's 16 code bytes and 2 scale bytes of step s (registers)."""
        return du.ld_weight_v4(ca + Int64(s * BK // 2)), du.ld_weight_u16(sa + Int64(s * BK // 16))

    def store_w(stage, wrow, half, words, sbytes):
        """Decode this thread's 32 k of step `stage`'s weight row `wrow` and store them in
        natural k order into the swizzled A tile."""
        sc = scales(du.prmt(sbytes, sbytes, 0x5410))[0]  # (k 0..15, k 16..31) of the chunk
        for j in range(4):  # 8 codes each: k 8j … 8j+7 of the thread's 32
            p = [du.mul_bf16x2_by_half(v, sc, j // 2) for v in dequant(words[j])]
            # dequant gives pairs (k, k+4); natural order is (0,1) (2,3) (4,5) (6,7)
            nat = [du.prmt(p[0], p[1], 0x5410), du.prmt(p[2], p[3], 0x5410),
                   du.prmt(p[0], p[1], 0x7632), du.prmt(p[2], p[3], 0x7632)]
            du.st_shared_v4(stage + Uint32(swz(wrow, 4 * half + j)), nat)

    def load_rs(s, rows_c, rows_s):
        """RS = 1: this thread's two rows' code words (8 u32 each: k 8c … 8c + 7 of step s in
        word c) and scale words (4 bytes: one per 16 k) of step s (registers)."""
        words = [du.ld_weight_v4(c + Int64(s * BK // 2)) + du.ld_weight_v4(
            c + Int64(s * BK // 2 + 16)) for c in rows_c]
        return words, [du.ld_weight_u32(a + Int64(s * BK // 16)) for a in rows_s]

    def decode_rs(words, sw, t):
        """RS = 1: the wgmma A fragments of one step, per k16 block kk the 4 bf16x2 registers
        (row g: k pair of chunk 2kk, row g + 8: the same, then both of chunk 2kk + 1), each the
        pair (t, t + 4) of its code word (the x tile is in `pair_order`), e2m1 · e4m3 · 2^-7."""
        sh = Uint32(4) * Uint32(t)
        scs = [scales(du.prmt(sw[0], sw[1], sel)) for sel in (0x5410, 0x7632)]
        frags = []
        for kk in range(BK // 16):
            regs = []
            for c, r in ((2 * kk, 0), (2 * kk, 1), (2 * kk + 1, 0), (2 * kk + 1, 1)):
                w = words[r][c] >> sh
                e = du.select_bits(w, w << 6, 0x00770077)
                regs.append(du.mul_bf16x2_by_half((e << 6) & Uint32(0x81C081C0),
                                                  scs[kk // 2][r], kk % 2))
            frags.append(regs)
        return frags

    def mma_step(acc, a_tile, x_tile, warp, lane, nx):
        """acc += this warpgroup's A tile (64 rows × BK) · the x tile's first nx rows (× BK)ᵀ."""
        if wg:
            vals = [acc[i] for i in range(nx // 2)]
            for kk in range(BK // 16):
                da = du.smem_desc(a_tile + Uint32(kk * 32), 16, 1024)
                db = du.smem_desc(x_tile + Uint32(kk * 32), 16, 1024)
                vals = du.wgmma_ss(nx, da, db, vals, Int32(1))
            for i in range(nx // 2):
                acc[i] = vals[i]
            return
        w16 = (warp % 4) * 16
        m8 = lane // 8
        for kk in range(BK // 16):
            a = du.ldmatrix_x4(a_tile + Uint32(swz(w16 + lane % 16, 2 * kk + lane // 16)))
            for j in range(0, nx // 8, 2):
                # n-tiles j and j + 1 (tokens 8j … 8j + 15), chunks 2kk and 2kk + 1
                b = du.ldmatrix_x4(x_tile + Uint32(swz(8 * (j + m8 // 2) + lane % 8,
                                                       2 * kk + m8 % 2)))
                for hh in range(2):
                    c4 = [acc[4 * (j + hh) + v] for v in range(4)]
                    c4 = du.mma_bf16_m16n8k16(a, [b[2 * hh], b[2 * hh + 1]], c4)
                    for v in range(4):
                        acc[4 * (j + hh) + v] = c4[v]

    @cute.jit
    def epilogue(acc, nx: cutlass.Constexpr, tid, base, ex, pair0, nrows, f0, stacks, mout):
        """Wait for the last wgmmas, then scale, round and store the tile's nx pairs × the
        CTA's rows from acc (all 256 threads, joined by the CTA's barrier)."""
        if cutlass.const_expr(wg):  # the last step's wgmmas
            du.wgmma_wait(0)
            vals = du.fence_values([acc[i] for i in range(nx // 2)])
            for i in cutlass.range_constexpr(nx // 2):
                acc[i] = vals[i]
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        wgi, tw = tid // 128, tid % 128
        # epilogue: scale2·2^7 (the decode's 2^-7), one rounding; KIND 0: SwiGLU
        s2 = cutlass.select_(wgi == 0, stacks[0][2].iterator.toint(),
                             stacks[1][2].iterator.toint())
        alpha = du.as_f32(du.ld_weight_u32(s2 + Int64(ex) * 4)) * Float32(128.0)
        du.cp_async_wait(0)
        cute.arch.sync_threads()  # every stage is read: reuse the block
        out_tile = base + Uint32(exch_bytes)
        w16 = (warp % 4) * 16
        if cutlass.const_expr(kind == 0):
            if wgi == 0:  # gate: bf16(g) for the up warpgroup's thread at the same place
                for i in cutlass.range_constexpr(nx // 2):
                    gb = du.pack_bf16(acc[i] * alpha, acc[i] * alpha)
                    du.st_shared_u32(base + Uint32((i * 128 + tw) * 4), gb << 16)
            cute.arch.sync_threads()
            if wgi == 1:
                for i in cutlass.range_constexpr(nx // 2):
                    gf = du.as_f32(du.ld_shared_u32(base + Uint32((i * 128 + tw) * 4)))
                    ub = du.pack_bf16(acc[i] * alpha, acc[i] * alpha)
                    uf = du.as_f32(ub << 16)
                    val = (gf / (Float32(1.0) + cute.math.exp(-gf))) * uf
                    tok_col = 8 * (i // 4) + 2 * t + i % 2
                    feat = w16 + g + 8 * ((i % 4) // 2)
                    if cutlass.const_expr(rs):  # act in pair_order: down's RS = 1 input
                        feat = (feat & ~7) + 2 * (feat & 3) + ((feat >> 2) & 1)
                    du.st_shared_u16(out_tile + Uint32(tok_col * out_pitch + feat * 2),
                                     du.pack_bf16(val, val))
        else:
            for i in cutlass.range_constexpr(nx // 2):
                tok_col = 8 * (i // 4) + 2 * t + i % 2
                feat = wgi * 64 + w16 + g + 8 * ((i % 4) // 2)
                du.st_shared_u16(out_tile + Uint32(tok_col * out_pitch + feat * 2),
                                 du.pack_bf16(acc[i] * alpha, acc[i] * alpha))
        cute.arch.sync_threads()
        ob = mout.iterator.toint() + f0 * 2
        for i in cutlass.range_constexpr(math.ceil(nx * out_units / threads)):
            c = tid + threads * i
            row, u = c // out_units, c % out_units
            if Uint32(row) < nrows:
                unit = du.ld_shared_v4(out_tile + Uint32(row * out_pitch + u * 16))
                du.st_v4(ob + (Int64(pair0) + Int64(row)) * (n_out * 2) + Int64(u * 16),
                         unit)

    @cute.jit
    def run(nx: cutlass.Constexpr, tid, base, dst, src, nbytes, ca, sa, ex, pair0, nrows, f0,
            stacks, mout):
        """The main loop and the epilogue of one tile for a tile width of nx pairs (wgmma's
        N): NT, or NT / 2 for a tile of at most NT / 2 rows where SUB = 1. Its arguments are
        what `body` set up (a function the DSL can trace inside a runtime branch takes its
        values as arguments, not from the enclosing scope)."""
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        wgi, tw = tid // 128, tid % 128
        wrow, half = tw // 2, tw % 2
        xn = nx * 8 // threads  # this thread's x chunks: rows tid // 8 + 32i, i < xn
        for s in cutlass.range_constexpr(min(X_AHEAD, steps)):
            load_x(s, base, dst[:xn], src[:xn], nbytes[:xn])
        acc = cute.make_rmem_tensor((nx // 2,), Float32)
        acc.fill(0.0)
        if cutlass.const_expr(rs):
            # rows 16·warp + g and + 8 of the warpgroup's 64 (wgmma's A fragment rows)
            r0 = Int64((warp % 4) * 16 + g) + f0
            if cutlass.const_expr(kind == 1):
                r0 = r0 + Int64(wgi * 64)
            cbase = cutlass.select_(wgi == 0, stacks[0][0].iterator.toint(),
                                    stacks[1][0].iterator.toint())
            sbase = cutlass.select_(wgi == 0, stacks[0][1].iterator.toint(),
                                    stacks[1][1].iterator.toint())
            grows = [Int64(ex) * n_out + r0, Int64(ex) * n_out + r0 + Int64(8)]
            rows_c = [cbase + gr * code_row for gr in grows]
            rows_s = [sbase + gr * scale_row for gr in grows]
            ahead = load_rs(0, rows_c, rows_s)
            for s in cutlass.range_constexpr(steps):
                rwords, rscales = ahead
                if cutlass.const_expr(s + 1 < steps):
                    ahead = load_rs(s + 1, rows_c, rows_s)
                frags = decode_rs(rwords, rscales, t)
                x_tile = x_ready(s, base, dst[:xn], src[:xn], nbytes[:xn])
                if cutlass.const_expr(wg):
                    du.wgmma_fence()
                    vals = [acc[i] for i in range(nx // 2)]
                    for kk in cutlass.range_constexpr(BK // 16):
                        db = du.smem_desc(x_tile + Uint32(kk * 32), 16, 1024)
                        vals = du.wgmma_rs(nx, frags[kk], db, vals, Int32(1))
                    for i in cutlass.range_constexpr(nx // 2):
                        acc[i] = vals[i]
                    du.wgmma_commit()
                    # the x stage step s + 2 refills was read by step s − 2's wgmmas, done
                    du.wgmma_wait(0 if w0 else 1)
                else:
                    m8 = lane // 8
                    for kk in cutlass.range_constexpr(BK // 16):
                        for j in cutlass.range_constexpr(0, nx // 8, 2):
                            b = du.ldmatrix_x4(x_tile + Uint32(swz(8 * (j + m8 // 2) + lane % 8,
                                                                   2 * kk + m8 % 2)))
                            for hh in cutlass.range_constexpr(2):
                                c4 = [acc[4 * (j + hh) + v] for v in range(4)]
                                c4 = du.mma_bf16_m16n8k16(frags[kk], [b[2 * hh], b[2 * hh + 1]],
                                                          c4)
                                for v in cutlass.range_constexpr(4):
                                    acc[4 * (j + hh) + v] = c4[v]
        a_off = wgi * 64 * 128  # this warpgroup's rows in an A stage
        if cutlass.const_expr(not rs):
            nxt = load_w(0, ca, sa)
        for s in cutlass.range_constexpr(0 if rs else steps):
            words, sbytes = nxt
            if cutlass.const_expr(s + 1 < steps):
                nxt = load_w(s + 1, ca, sa)
            a_tile = base + Uint32((s % W_STAGES) * lay["w_stage"]) + Uint32(a_off)
            store_w(a_tile, wrow, half, words, sbytes)
            x_tile = x_ready(s, base, dst[:xn], src[:xn], nbytes[:xn])
            if cutlass.const_expr(wg):
                du.wgmma_fence()
            mma_step(acc, a_tile, x_tile, warp, lane, nx)
            if cutlass.const_expr(wg):
                du.wgmma_commit()
                # the previous step's wgmmas are done: its A stage may be overwritten
                du.wgmma_wait(1)
        epilogue(acc, nx, tid, base, ex, pair0, nrows, f0, stacks, mout)

    @cute.jit
    def body(mx, mtok, mtiles, stacks, mout):
        tid, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        wgi, tw = tid // 128, tid % 128
        cute.arch.griddepcontrol_wait()  # the schedule, x and tok are the producers' outputs
        cute.arch.griddepcontrol_launch_dependents()
        info = du.ld_v4(mtiles.iterator.toint() + Int64(by) * 16)
        ex, pair0, nrows = info[0], info[1], info[2]
        if ex < Uint32(e):
            alloc = cutlass.memory.SmemAllocator()
            smem = alloc.allocate_tensor(cutlass.Uint8, cute.make_layout((launch.smem,)),
                                         byte_alignment=128)
            raw = du.smem_addr(smem)
            base = (raw + Uint32(1023)) & Uint32(0xFFFFFC00)  # swizzle atoms: 1024-aligned

            # this thread's x chunks: chunk tid % 8 of rows tid // 8 + 32i (fixed for steps)
            src, nbytes, dst = x_chunks(tid, mx, mtok, pair0, nrows)

            # this thread's weight row (of its warpgroup's 64) and k half of each step
            wrow, half = tw // 2, tw % 2
            f0 = Int64(bx * rows_cta)
            frow = f0 + Int64(wrow)
            if cutlass.const_expr(kind == 1):
                frow = frow + Int64(wgi * 64)
            codes_g = stacks[0][0].iterator.toint()
            codes_u = stacks[1][0].iterator.toint()
            scl_g = stacks[0][1].iterator.toint()
            scl_u = stacks[1][1].iterator.toint()
            grow = Int64(ex) * n_out + frow
            ca = (cutlass.select_(wgi == 0, codes_g, codes_u) + grow * code_row
                  + Int64(16 * half))
            sa = (cutlass.select_(wgi == 0, scl_g, scl_u) + grow * scale_row
                  + Int64(2 * half))

            args = (tid, base, dst, src, nbytes, ca, sa, ex, pair0, nrows, f0, stacks, mout)
            if cutlass.const_expr(sub):
                if nrows > Uint32(nt // 2):
                    run(nt, *args)
                else:
                    run(nt // 2, *args)
            else:
                run(nt, *args)

    if kind == 0:
        @cute.kernel
        def grouped_w4a16_wg_kernel(mx: cute.Tensor, mtok: cute.Tensor, mtiles: cute.Tensor,
                                    gc: cute.Tensor, gs: cute.Tensor, g2: cute.Tensor,
                                    uc: cute.Tensor, us: cute.Tensor, u2: cute.Tensor,
                                    mout: cute.Tensor):
            body(mx, mtok, mtiles, [(gc, gs, g2), (uc, us, u2)], mout)

        @cute.jit
        def grouped_w4a16_wg(mx: cute.Tensor, mtok: cute.Tensor, mtiles: cute.Tensor,
                             gc: cute.Tensor, gs: cute.Tensor, g2: cute.Tensor, uc: cute.Tensor,
                             us: cute.Tensor, u2: cute.Tensor, mout: cute.Tensor,
                             stream: cuda.CUstream):
            grouped_w4a16_wg_kernel(mx, mtok, mtiles, gc, gs, g2, uc, us, u2, mout).launch(
                grid=(n_out // rows_cta, mtiles.shape[0], 1), block=list(launch.block),
                smem=launch.smem, stream=stream)

        return grouped_w4a16_wg

    @cute.kernel
    def grouped_w4a16_wg_kernel(mx: cute.Tensor, mtiles: cute.Tensor, dc: cute.Tensor,
                                ds: cute.Tensor, d2: cute.Tensor, mout: cute.Tensor):
        body(mx, mx, mtiles, [(dc, ds, d2), (dc, ds, d2)], mout)

    @cute.jit
    def grouped_w4a16_wg(mx: cute.Tensor, mtiles: cute.Tensor, dc: cute.Tensor,
                         ds: cute.Tensor, d2: cute.Tensor, mout: cute.Tensor,
                         stream: cuda.CUstream):
        grouped_w4a16_wg_kernel(mx, mtiles, dc, ds, d2, mout).launch(
            grid=(n_out // rows_cta, mtiles.shape[0], 1), block=list(launch.block),
            smem=launch.smem, stream=stream)

    return grouped_w4a16_wg


KERNEL = KernelDef(name="grouped_w4a16_wg", args=_args, launch=_launch, specs=_specs,
                   build=_build, reference=_reference,
                   source_files=("toolchain/dsl_util.py", "decode/gemv_mma.py",
                                 "prefill/grouped_w4a16.py"),
                   build_takes_arch=True, routed_weights=True)
