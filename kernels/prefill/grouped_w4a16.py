"""The routed experts of a prefill chunk as grouped W4A16 GEMMs: NVFP4 expert weights read as
they are (4.5 bits per weight) and decoded in registers, never into a BF16 scratch.

Two specialisations (KIND):
  KIND 0, gate/up with SwiGLU: act[r] = bf16(silu(g)·u), g = bf16(x[tok[r]] · gate_eᵀ),
    u = bf16(x[tok[r]] · up_eᵀ) for every sorted (token, expert) pair r of expert e: the rows of x
    are gathered on load through tok (the pair's token), so no gathered copy of x exists.
  KIND 1, down: y[r] = bf16(act[r] · down_eᵀ), rows in the same sorted order (moe_combine then
    weights them and adds the shared expert and the residual, capture/prefill.py).
Each must match `reference.linear` on the dequantised weights (and `reference.swiglu`'s
activation for KIND 0): e2m1·e4m3 products are exact here, so only the fp32 summation order
differs, plus one fp32 rounding of ·scale2 before the bf16 rounding (DESIGN §4).

The pairs are sorted by expert (capture/prefill.py `group_pairs`); `tile_schedule` cuts each
expert's pairs into tiles of NT rows on the device (no host synchronisation): tiles int32
[NTILES, 4] = (expert, first pair, rows, 0), expert −1 for the unused tail of the bound
NTILES = min(P, ceil(P / NT) + min(E, P)) (`max_tiles`). Grid (N_out / CTA_ROWS, NTILES): a CTA
owns CTA_ROWS output features of one tile; consecutive CTAs share a tile (its x rows stay in
L2) and consecutive tiles of an expert share its weights.

Design ("swap AB": the weights are the MMA's M operand, the chunk's tokens its N operand, as in
the decode GEMVs, gemv_nvfp4.py): 4 warps, each owning two m16 tiles (KIND 0: the same 16 rows
of gate and of up, so silu(g)·u needs no second pass; KIND 1: 32 rows of down) against all NT
tokens (NT / 8 n-tiles), so each dequantised A fragment feeds NT / 8 MMAs and each x fragment
two. K goes in steps of BK = 128: lane quad position t takes the 32-k chunk 32t of the step,
its codes (16 bytes) and two scale bytes per row loaded straight into registers one step ahead
and dequantised with gemv_mma.frag_ops (bf16 e2m1·e4m3·2^-7, exact; scale2·2^7 in the fp32
epilogue); x steps go through shared memory (cp.async, STAGES stages, two steps ahead, one
barrier per step), rows of 256 bytes whose 16-byte units are XOR-swizzled so the LDS.128 of a
quarter warp (two rows, four quads' units 4t + j) hit eight distinct bank groups. The
epilogue transposes the tile through shared memory and stores whole 16-byte runs of each
output row.

WS = 1 (a benchmark variant, `bench_specs`, NT ≤ WS_MAX_NT): each step's weight rows, too, go
through shared memory by cp.async (thread i copies CTA weight row i: 64 code bytes and 8 scale
bytes per step), WS_STAGES steps deep, and each lane reads its fragment words back with
LDS.128 (two rows of a quarter warp are 128 contiguous bytes: no bank conflict). Why: at 512
tokens the default kernel reads NVFP4 at ~2 TB/s with only the next step's weights in flight
per warp, and more register steps (D = 3, 4) did not help (perf log); staging keeps three steps
in flight without registers (82 instead of 104 at NT 16). Measured on the H200 it is slower at
every length (512 tokens 19.8 → 23.5 ms, 8K 186.5 → 196.5 ms; perf log 2026-12-02): the loop is
issue-bound on the dequantisation, and staging adds instructions to it. Kept as a variant only.

SH = 1 (capture/prefill.py FOLD_SHARED): the shared expert is one more group, expert id E, of
the same launch, its weights passed as three (KIND 1) or six (KIND 0) more arguments of one
expert's shape; a tile whose expert is E reads them instead of the routed stack. The prefill
lays its tiles first and its rows as the pairs after the routed ones (`shared_tiles`), so one
launch covers what were two on a side stream: at 25 tokens the shared expert alone is 8 + 16
CTAs of latency-bound steps that shared the SMs with the routed launches.

WB = 16 (BF16 experts, the prefill of a BF16 checkpoint): the same kernel with BF16 weights, read
as they are, so a chunk reads each expert it touches once, where torch._grouped_mm (or the
decode kernels in groups of 8 rows) served short BF16 chunks. A lane's 32-k chunk of a weight row
is 64 bytes (four LDG.128 per row and step, no dequantisation) whose natural bf16 pairs feed the
MMA with x's natural pairs (xpairs' reordering is the NVFP4 decode's). Two steps of them would
take 128 registers; ptxas keeps 75 at the full config (it issues each step's loads nearer their
MMAs) and spills at NT = 32, so only NT = 16 is built. SH = 1 only (the prefill folds the shared
expert in); no scale2.

PDL: the tile schedule is an input, and the experts' weights are known only from it, so every
load follows griddepcontrol.wait (one wait at the top, in every thread).

Tolerance (GPU test): ‖out − ref‖/‖ref‖ ≤ 1e-2 per launch; expected ~2e-3, the bf16 output
rounding (≤ 2^-9 relative); fp32 summation order and the ·scale2 rounding may flip a bf16
rounding of g or u (KIND 0) in rare elements, and the hardware exp's last ulp the SwiGLU
rounding. Rows of no tile (padding pairs) are never written.
PF = 2, 4 or 8 (PF = 2 the model's for gate/up at NT 16, `PF_MODEL`; the others benchmark
variants, `bench_specs`): each lane also asks L2 for one of its
quad's four weight rows' 128-byte code line PF steps ahead (`prefetch.global.L2`, once every two
steps: a line holds two steps of a row), and for each row's scale line at the start. Why: at 512
tokens the loop is latency-bound (ncu, tenth session: 48% of cycles issue, DRAM 39% of peak),
and the SASS shows ptxas issuing the next step's code loads halfway through the current step,
so each warp still waits most of a DRAM round trip a step; a prefetch has no destination
register for ptxas to save, so it stays where it is written. Changes no output bit (GPU
test). Measured on the H100 (perf log, twenty-eighth session): gate/up at 512 tokens (NT 16)
152-153 -> 137.5 us with PF = 2, slower with 4 and 8 (161, 195: lines fetched that far ahead
are evicted or crowd the loads in flight); NT 32 at 1,024 tokens -1%; down slower with any PF.

Spec values: KIND, H hidden, M expert width, E routed experts, NT pairs per tile, D weight steps
held in registers (D − 1 in flight while one is computed); optional WS, SH, WB and PF (above).
"""

import math

import torch

from flint_graph import reference
from flint_graph.checkpoints import nvfp4
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, Spec, TensorArg

WARPS = 4
BK = 128  # k per step: four lanes of a quad × 32
STAGES = 3  # x steps in shared memory
DEPTH = 2  # weight steps in registers by default (the one computed and the next): spec D
DEPTHS = (2, 3, 4)  # D values built for benchmarks (`bench_specs`)
# WS = 1 (a benchmark variant): the weights of a step, like x, go through shared memory by
# cp.async, WS_STAGES steps deep, instead of one step ahead in registers (D is then unused)
WS_STAGES = 4
WS_MAX_NT = 32  # WS = 1 is built for NT ≤ this (bench_specs); larger tiles keep WS = 0
W_ROW_BYTES = BK // 2 + BK // 16  # one weight row's codes and scale bytes of a step
W_ROWS = WARPS * 2 * 16  # weight rows a CTA reads: two m16 tiles per warp (gate and up, or down)
ROW_BYTES = BK * 2  # one x row of a step in shared memory
NTS = (16, 32, 64)
PFS = (0, 2, 4, 8)  # L2 prefetch distances in steps (PF; 0: none): a code line is two steps
PF_NTS = (16, 32)  # NT of the PF bench specs: the chunks grouped_w4a16 runs (≤ 1,536 rows)
# PF of the model's routed (and SH) specs by (KIND, NT); others 0. H100, the kernel alone at
# 512 tokens (perf log, twenty-eighth session): gate/up NT 16 152.2-153.3 -> 137.5-137.6 us
# with PF = 2 (PF = 4 161, PF = 8 195); NT 32 at 1,024 tokens 168.7-169.1 -> 167.4-167.7;
# down slower with every PF (67.0-67.5 -> 73.0-74.2: its 4 steps are all prefetched at once).
PF_MODEL = {(0, 16): 2}
WB_NT = (16,)  # NT of the WB = 16 (BF16) specs (NT = 32 spills at the full config)


def cta_rows(kind: int) -> int:
    """Output features per CTA: 4 warps × 16 rows (KIND 0, each of gate and up) or × 32."""
    return WARPS * (16 if kind == 0 else 32)


def max_tiles(pairs: int, experts: int, nt: int) -> int:
    """NTILES: the most tiles `pairs` sorted pairs over `experts` experts can need (each expert
    with pairs adds at most one partial tile; each tile holds at least one pair)."""
    return max(1, min(pairs, -(-pairs // nt) + min(experts, pairs)))


def tile_schedule(counts: torch.Tensor, nt: int, ntiles: int) -> torch.Tensor:
    """int32 [ntiles, 4] (expert, first pair, rows, 0) of the tiles of NT pairs that cover the
    pairs sorted by expert, whose counts per expert are int32 [E] (expert −1: no tile), all on
    counts' device (no host synchronisation). `ntiles` must be ≥ what the counts need
    (`max_tiles`), else the last pairs get no tile."""
    c = counts.long()
    per = (c + nt - 1) // nt
    end = per.cumsum(0)
    t = torch.arange(ntiles, device=counts.device)
    e = torch.searchsorted(end, t, right=True)
    ok = e < c.numel()
    ec = e.clamp(max=c.numel() - 1)
    j = t - (end[ec] - per[ec])
    first = c.cumsum(0) - c
    rows = (c[ec] - j * nt).clamp(max=nt)
    out = torch.stack([torch.where(ok, ec, -1), (first[ec] + j * nt) * ok, rows * ok,
                       torch.zeros_like(t)], dim=1)
    return out.int().contiguous()


def _check(spec: Spec) -> None:
    kind, h, m, nt = spec["KIND"], spec["H"], spec["M"], spec["NT"]
    if kind not in (0, 1):
        raise ValueError(f"grouped_w4a16: KIND = {kind}; expected 0 (gate/up) or 1 (down)")
    if nt not in NTS:
        raise ValueError(f"grouped_w4a16: NT = {nt}; expected one of {NTS}")
    if spec["E"] < 1:
        raise ValueError(f"grouped_w4a16: E = {spec['E']}; expected ≥ 1")
    if spec["D"] not in DEPTHS:
        raise ValueError(f"grouped_w4a16: D = {spec['D']}; expected one of {DEPTHS}")
    if _ws(spec) not in (0, 1):
        raise ValueError(f"grouped_w4a16: WS = {_ws(spec)}; expected 0 or 1")
    if _sh(spec) not in (0, 1) or (_sh(spec) and _ws(spec)):
        raise ValueError(f"grouped_w4a16: SH = {_sh(spec)} (WS = {_ws(spec)}); expected 0, or "
                         f"1 with WS = 0")
    if _pf(spec) not in PFS or (_pf(spec) and (_ws(spec) or _wb(spec) != 4)):
        raise ValueError(f"grouped_w4a16: PF = {_pf(spec)} (WS = {_ws(spec)}, WB = "
                         f"{_wb(spec)}); expected one of {PFS}, other than 0 only with WS = 0 "
                         "and WB = 4")
    if _wb(spec) not in (4, 16) or (_wb(spec) == 16 and (
            _ws(spec) or not _sh(spec) or spec["D"] != DEPTH or nt not in WB_NT)):
        raise ValueError(f"grouped_w4a16: WB = {_wb(spec)} (SH = {_sh(spec)}, WS = {_ws(spec)}, "
                         f"D = {spec['D']}, NT = {nt}); expected 4, or 16 with SH = 1, WS = 0, "
                         f"D = {DEPTH} and NT in {WB_NT}")
    k_dim, n_out = (h, m) if kind == 0 else (m, h)
    if k_dim % BK or n_out % cta_rows(kind):
        raise ValueError(f"grouped_w4a16: K = {k_dim} must be a multiple of {BK} and N = {n_out} "
                         f"of {cta_rows(kind)} (KIND {kind})")


def _args(spec: Spec):
    _check(spec)
    kind, h, m, e = spec["KIND"], spec["H"], spec["M"], spec["E"]

    def stack(name, n, k):
        if _wb(spec) == 16:
            return [TensorArg(name, "bf16", (e, n, k), "weight")]
        return [TensorArg(f"{name}_codes", "u8", (e, n, k // 2), "weight"),
                TensorArg(f"{name}_scales", "u8", (e, n, k // 16), "weight", align=2),
                TensorArg(f"{name}_scale2", "f32", (e,), "weight", align=4)]

    def shared(name, n, k):  # SH: the shared expert, one more group (expert id E)
        if _sh(spec) and _wb(spec) == 16:
            return [TensorArg(f"shared_{name}", "bf16", (n, k), "weight")]
        return [TensorArg(f"shared_{name}_codes", "u8", (n, k // 2), "weight"),
                TensorArg(f"shared_{name}_scales", "u8", (n, k // 16), "weight", align=2),
                TensorArg(f"shared_{name}_scale2", "f32", (1,), "weight", align=4)] \
            if _sh(spec) else []

    tiles = TensorArg("tiles", "i32", ("NTILES", 4), "input")
    if kind == 0:
        return (TensorArg("x", "bf16", ("T", h), "input"),
                TensorArg("tok", "i32", ("P",), "input", align=4), tiles,
                *stack("gate", m, h), *stack("up", m, h),
                *shared("gate", m, h), *shared("up", m, h),
                TensorArg("act", "bf16", ("P", m), "output"))
    return (TensorArg("act", "bf16", ("P", m), "input"), tiles, *stack("down", h, m),
            *shared("down", h, m), TensorArg("y", "bf16", ("P", h), "output"))


def _stage_bytes(spec: Spec) -> int:
    """Shared memory of one step's stage: the x tile, and with WS the CTA's weight rows."""
    return spec["NT"] * ROW_BYTES + (W_ROWS * W_ROW_BYTES if _ws(spec) else 0)


def _ws(spec: Spec) -> int:
    return spec.as_dict().get("WS", 0)


def _sh(spec: Spec) -> int:
    return spec.as_dict().get("SH", 0)


def _pf(spec: Spec) -> int:
    return spec.as_dict().get("PF", 0)


def _wb(spec: Spec) -> int:
    """Bits per weight: 4 (NVFP4 codes, scales and scale2) or 16 (BF16 experts)."""
    return spec.as_dict().get("WB", 4)


def _smem(spec: Spec) -> int:
    out_tile = spec["NT"] * (cta_rows(spec["KIND"]) * 2 + 16)
    return max((WS_STAGES if _ws(spec) else STAGES) * _stage_bytes(spec), out_tile)


def _launch(spec: Spec) -> Launch:
    n_out = spec["M"] if spec["KIND"] == 0 else spec["H"]
    return Launch(grid=(n_out // cta_rows(spec["KIND"]), ("NTILES", 1), 1),
                  block=(32 * WARPS, 1, 1), smem=_smem(spec))


def fits(cfg) -> bool:
    """Whether `cfg`'s expert shapes suit the kernel (H and M multiples of BK, M of 64 and H of
    128 as outputs). Flint (2048, 512) and flint-nano (256, 128) do; the tiny test config (64,
    64) does not, and its prefill decodes NVFP4 experts into BF16 instead."""
    h, m = cfg.hidden_size, cfg.moe_intermediate_size
    return bool(cfg.n_routed_experts) and h % BK == 0 and m % BK == 0 and m % cta_rows(0) == 0 \
        and h % cta_rows(1) == 0


def shared_width(cfg) -> int:
    """The shared expert's width as a one-expert group (E = 1), or 0 when the kernels do not
    take it (no shared expert, or a width they do not fit): the prefill then runs it on
    cuBLAS."""
    ms = cfg.n_shared_experts * cfg.moe_intermediate_size
    return ms if ms and fits(cfg) and ms % BK == 0 and ms % cta_rows(0) == 0 else 0


def _specs(cfg, buckets=()) -> list[Spec]:
    """Gate/up and down for every tile size NT (the prefill picks NT by chunk size), for the
    routed experts and, as one more group of one expert, the shared expert; none for a config
    the kernel does not fit (`fits`)."""
    if not fits(cfg):
        return []
    e, h, m = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    groups = [(e, m)] + ([(1, shared_width(cfg))] if shared_width(cfg) else [])
    specs = [KERNEL.spec(KIND=kind, H=h, M=width, E=n, NT=nt, D=DEPTH,
                         **_pf_model(kind, nt, n > 1)) for n, width in groups
             for kind in (0, 1) for nt in NTS]
    if shared_width(cfg) == m:  # SH: the shared expert as one more group of the routed launch
        specs += [KERNEL.spec(KIND=kind, H=h, M=m, E=e, NT=nt, D=DEPTH, SH=1,
                              **_pf_model(kind, nt, True))
                  for kind in (0, 1) for nt in NTS]
        # WB = 16: BF16 experts, for a BF16 checkpoint's short chunks (capture/prefill.py)
        specs += [KERNEL.spec(KIND=kind, H=h, M=m, E=e, NT=nt, D=DEPTH, SH=1, WB=16)
                  for kind in (0, 1) for nt in WB_NT]
    return specs


def _pf_model(kind: int, nt: int, routed: bool) -> dict:
    """The PF value a model spec names (PF_MODEL; none for PF = 0 and the shared expert's own
    one-expert launches)."""
    pf = PF_MODEL.get((kind, nt), 0) if routed else 0
    return {"PF": pf} if pf else {}


def without_pf(spec: Spec) -> dict:
    """`spec`'s values without PF: the base the other variants are named from."""
    return {k: v for k, v in spec.as_dict().items() if k != "PF"}


def bench_specs(cfg, buckets=()) -> list[Spec]:
    """The other weight-step depths D of `_specs`' kernels (tools/bench_prefill.py --depth)
    and WS = 1, both without PF, and each other PF at PF_NTS (the SH kernels too, so the
    prefill keeps the fold)."""
    base = [without_pf(s) for s in _specs(cfg) if not _sh(s) and _wb(s) == 4]
    pf_base = [s for s in _specs(cfg) if _wb(s) == 4 and s["NT"] in PF_NTS
               and (s["E"] > 1 or _sh(s))]
    return [KERNEL.spec(**{**s, "D": d}) for s in base for d in DEPTHS if d != DEPTH] \
        + [KERNEL.spec(**{**s, "WS": 1}) for s in base if s["NT"] <= WS_MAX_NT] \
        + [KERNEL.spec(**without_pf(s), **({"PF": pf} if pf else {})) for s in pf_base
           for pf in PFS if pf != _pf(s)]


def _dequant(codes, scales, scale2):
    """fp32 [..., N, K] of a stack's codes / scales / scale2 [E] (exact: `nvfp4.dequantize`)."""
    w = nvfp4.dequantize(codes, scales, torch.tensor(1.0, device=codes.device), torch.float32)
    return w * scale2.float().view(-1, 1, 1)


def _reference(spec: Spec, *args):
    """(out,): each tile's rows through its expert (reference.linear, then reference.swiglu's
    activation for KIND 0), with SH expert E the shared expert; rows of no tile keep `out`'s
    values."""
    sh = _sh(spec)
    if _wb(spec) == 16:  # BF16 stacks: one tensor each, the shared expert's one more expert
        *head, out = args
        if spec["KIND"] == 0:
            x, tok, tiles, g, u, *rest = head
            src, stacks = x[tok.long()], [g, u]
        else:
            src, tiles, d, *rest = head
            stacks = [d]
        mats = [torch.cat([st, sh_w[None]]).float() if sh else st.float()
                for st, sh_w in zip(stacks, rest or stacks)]
        first, second = mats[0], (mats[1] if spec["KIND"] == 0 else None)
    elif spec["KIND"] == 0:
        x, tok, tiles, gc, gs, g2, uc, us, u2, *rest, out = args
        src = x[tok.long()]
        first, second = _dequant(gc, gs, g2), _dequant(uc, us, u2)
        if sh:
            sgc, sgs, sg2, suc, sus, su2 = rest
            first = torch.cat([first, _dequant(sgc[None], sgs[None], sg2)])
            second = torch.cat([second, _dequant(suc[None], sus[None], su2)])
    else:
        src, tiles, dc, ds, d2, *rest, out = args
        first, second = _dequant(dc, ds, d2), None
        if sh:
            sdc, sds, sd2 = rest
            first = torch.cat([first, _dequant(sdc[None], sds[None], sd2)])
    res = out.clone()
    for ex, p0, rows, _ in tiles.tolist():
        if ex < 0:
            continue
        xs = src[p0:p0 + rows]
        a = reference.linear(xs, first[ex].to(xs.device))
        if second is not None:
            u = reference.linear(xs, second[ex].to(xs.device))
            a = (torch.nn.functional.silu(a.float()) * u.float()).to(torch.bfloat16)
        res[p0:p0 + rows] = a
    return (res,)


def shared_tiles(tokens: int, pairs: int, experts: int, nt: int) -> torch.Tensor:
    """int32 [ceil(tokens / NT), 4] (CPU): the SH tiles of the shared expert (id `experts`)
    holding every token of a chunk as the pairs `pairs` … `pairs` + tokens − 1 (their tok is
    0 … tokens − 1)."""
    first = torch.arange(0, tokens, nt)
    return torch.stack([torch.full_like(first, experts), pairs + first,
                        (tokens - first).clamp(max=nt), torch.zeros_like(first)], 1).int()


def make_args(spec: Spec, *, gen: torch.Generator, tokens: int = 77, experts_used: int = 20,
              device: str = "cuda", skew: bool = False) -> list:
    """Fresh arguments: a chunk of `tokens` tokens × TOPK = 6 picks spread over
    `experts_used` random experts (skew: one expert takes half the pairs, so it needs many
    tiles), pairs sorted by expert, tok their tokens; codes every byte value, scale bytes
    around 1 with 0x00, 0x7F and bit 7 among them, scale2 per expert (WB = 16: bf16 weights
    drawn from N(0, 1/K)); outputs NaN. The
    schedule holds max_tiles rows (its unused tail expert −1); with SH the shared expert's
    tiles (`shared_tiles`) come first and its pairs last."""
    kind, h, m, e, nt = spec["KIND"], spec["H"], spec["M"], spec["E"], spec["NT"]
    on = gen.device
    pairs = tokens * 6
    used = torch.randperm(e, generator=gen, device=on)[:max(1, min(experts_used, e))]
    pick = used[torch.randint(0, used.numel(), (pairs,), generator=gen, device=on)]
    if skew:
        pick[: pairs // 2] = used[0]
    ids, _ = pick.sort()
    counts = torch.bincount(ids, minlength=e).int()
    tiles = tile_schedule(counts, nt, max_tiles(pairs, e, nt))
    k_dim, n_out = (h, m) if kind == 0 else (m, h)

    def stack(count=e):
        if _wb(spec) == 16:  # BF16 weights of a trained model's scale
            return [(torch.randn(count, n_out, k_dim, generator=gen, device=on)
                     / math.sqrt(k_dim)).to(torch.bfloat16)]
        codes = torch.randint(0, 256, (count, n_out, k_dim // 2), generator=gen, device=on,
                              dtype=torch.int32).to(torch.uint8)
        scales = torch.randint(0x30, 0x40, (count, n_out, k_dim // 16), generator=gen,
                               device=on, dtype=torch.int32)
        special = torch.rand(scales.shape, generator=gen, device=on) < 0.01
        scales = torch.where(special, torch.tensor([0x00, 0x7F, 0xB8], device=on)[
            torch.randint(0, 3, scales.shape, generator=gen, device=on)], scales)
        scale2 = torch.rand(count, generator=gen, device=on) * 0.02 + 0.005
        return [codes, scales.to(torch.uint8), scale2]

    if _sh(spec):
        # the shared expert as expert E: every token once more, as pairs P … P + T − 1 (its
        # tiles first, as capture/prefill.py lays them out)
        tiles = torch.cat([shared_tiles(tokens, pairs, e, nt).to(on), tiles])
        shared = []
        for _ in range(2 if kind == 0 else 1):
            one = stack(1)
            shared += [one[0][0]] if _wb(spec) == 16 else [one[0][0], one[1][0], one[2]]
        pairs += tokens
    else:
        shared = []
    if kind == 0:
        x = torch.randn(tokens, h, generator=gen, device=on).to(torch.bfloat16)
        tok = torch.randint(0, tokens, (pairs,), generator=gen, device=on, dtype=torch.int32)
        if _sh(spec):
            tok[pairs - tokens:] = torch.arange(tokens, device=on, dtype=torch.int32)
        args = [x, tok, tiles, *stack(), *stack(), *shared]
    else:
        act = torch.randn(pairs, m, generator=gen, device=on).to(torch.bfloat16)
        args = [act, tiles, *stack(), *shared]
    out = torch.full((pairs, n_out), float("nan"), dtype=torch.bfloat16, device=on)
    return [a.to(device) for a in (*args, out)]


def x_sources(mx, mtok, kind: int, pair0, nrows, xrows: list[int], k_dim: int, offset: int):
    """(global byte addresses, byte counts 16 or 0) of one thread's 16-byte x pieces at byte
    `offset` of tile rows `xrows` (trace-time helper, after griddepcontrol.wait; shared with
    grouped_w4a16_wg): KIND 0 gathers each pair's token row through tok, KIND 1 reads pair
    rows pair0 + row; rows past the tile's `nrows` read nothing (a cp.async zero fill)."""
    import cutlass
    from cutlass import Int32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    oks = [Uint32(row) < nrows for row in xrows]
    if kind == 0:
        srows = [du.ld_u32_if(mtok.iterator.toint() + (Int64(pair0) + Int64(row)) * 4, ok)
                 for row, ok in zip(xrows, oks)]
    else:
        srows = [cutlass.select_(ok, pair0 + Uint32(row), Uint32(0))
                 for row, ok in zip(xrows, oks)]
    xb = mx.iterator.toint()
    return ([xb + Int64(srow) * (k_dim * 2) + Int64(offset) for srow in srows],
            [cutlass.select_(ok, Int32(16), Int32(0)) for ok in oks])


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int32, Int64, Uint32
    from cutlass.cutlass_dsl import dsl_user_op

    from flint_graph.kernels.decode.gemv_mma import frag_ops
    from flint_graph.kernels.toolchain import dsl_util as du

    _check(spec)
    kind, h, m, e, nt = spec["KIND"], spec["H"], spec["M"], spec["E"], spec["NT"]
    depth = spec["D"]
    k_dim, n_out = (h, m) if kind == 0 else (m, h)
    rows_cta = cta_rows(kind)
    steps = k_dim // BK
    ntn = nt // 8
    threads = 32 * WARPS
    units = ROW_BYTES // 16  # 16-byte units of an x row
    x_per_thread = nt * units // threads
    code_row, scale_row = k_dim // 2, k_dim // 16  # bytes per weight row
    out_pitch = rows_cta * 2 + 16
    out_units = rows_cta * 2 // 16
    out_per_thread = math.ceil(nt * out_units / threads)
    launch = _launch(spec)
    dequant, xpairs, scales = frag_ops()
    ws = _ws(spec)
    pf = _pf(spec)
    sh = _sh(spec)
    wb = _wb(spec)
    w_row = k_dim * 2  # WB = 16: bytes per BF16 weight row
    stages = WS_STAGES if ws else STAGES
    stage_bytes = _stage_bytes(spec)
    w_codes = nt * ROW_BYTES  # with WS: the stage's weight codes [CTA row][4 chunks × 16 B]
    w_scales = w_codes + W_ROWS * (BK // 2)  # then its scale bytes [CTA row][8 B]

    def _lane_rows(base, base_row, g, t):
        """(code address, scale address) of this lane's rows g and g + 8 of a stack whose
        codes and scales start at `base` (addresses), from row `base_row` (its chunk 32t of a
        step's k)."""
        codes, scl = base
        if cutlass.const_expr(wb == 16):  # BF16: the 64 bytes of k 32t … 32t + 31
            return [(codes + (base_row + Int64(g + 8 * r)) * w_row + Int64(64 * t), None)
                    for r in range(2)]
        return [(codes + (base_row + Int64(g + 8 * r)) * code_row + Int64(16 * t),
                 scl + (base_row + Int64(g + 8 * r)) * scale_row + Int64(2 * t))
                for r in range(2)]

    def _bases(stacks, sstacks, ex):
        """Per stack (codes, scales, scale2) addresses of expert `ex`'s matrix with its rows
        from 0: the routed stack's expert ex, or with SH the shared expert for ex = E."""
        out = []
        for i in range(2):
            st = stacks[i]
            if cutlass.const_expr(wb == 16):
                c = st[0].iterator.toint() + Int64(ex) * (n_out * w_row)
                if cutlass.const_expr(sh == 1):
                    c = cutlass.select_(ex == Uint32(e), sstacks[i][0].iterator.toint(), c)
                out.append((c, None, None))
                continue
            c = st[0].iterator.toint() + Int64(ex) * (n_out * code_row)
            sc = st[1].iterator.toint() + Int64(ex) * (n_out * scale_row)
            s2 = st[2].iterator.toint() + Int64(ex) * 4
            if cutlass.const_expr(sh == 1):
                mine = ex == Uint32(e)
                ss = sstacks[i]
                c = cutlass.select_(mine, ss[0].iterator.toint(), c)
                sc = cutlass.select_(mine, ss[1].iterator.toint(), sc)
                s2 = cutlass.select_(mine, ss[2].iterator.toint(), s2)
            out.append((c, sc, s2))
        return out

    def load_x(s, sbase, dst, src, nbytes, wsrc=None):
        """cp.async this thread's x units of step s into its stage, and with WS the CTA weight
        row it copies (`wsrc`: its codes and scales addresses) (a trace-time helper)."""
        base = sbase + Uint32((s % stages) * stage_bytes)
        for d, a, n in zip(dst, src, nbytes):
            du.cp_async_16(base + d, a + Int64(s * ROW_BYTES), n)
        if wsrc is not None:
            row, ca, sa = wsrc
            for c in range(4):
                du.cp_async_16(base + Uint32(w_codes) + row * Uint32(BK // 2) + Uint32(16 * c),
                               ca + Int64(s * BK // 2 + 16 * c), Int32(16))
            du.cp_async_8(base + Uint32(w_scales) + row * Uint32(BK // 16),
                          sa + Int64(s * BK // 16))
        du.cp_async_commit()

    def read_w(stage, warp, g, t, rc, rs):
        """WS: this lane's codes and scale bytes of the step in `stage` into slot 0."""
        for i in range(2):
            for r in range(2):
                row = Uint32(32 * warp + 16 * i + 8 * r + g)
                words = du.ld_shared_v4(stage + Uint32(w_codes) + row * Uint32(BK // 2)
                                        + Uint32(16 * t))
                for j in range(4):
                    rc[i, r, j, 0] = words[j]
                rs[i, r, 0] = du.ld_shared_u16(stage + Uint32(w_scales) + row * Uint32(BK // 16)
                                               + Uint32(2 * t))

    def load_w(s, wrows, rc, rs):
        """This lane's codes and scale bytes of step s into register slot s % depth (WB = 16:
        its BF16 weights, rc [i, r, j, word, slot])."""
        for i in range(2):
            for r in range(2):
                ca, sa = wrows[i][r]
                if cutlass.const_expr(wb == 16):
                    for j in range(4):
                        words = du.ld_weight_v4(ca + Int64(s * BK * 2 + 16 * j))
                        for w in range(4):
                            rc[i, r, j, w, s % depth] = words[w]
                    continue
                words = du.ld_weight_v4(ca + Int64(s * BK // 2))
                for j in range(4):
                    rc[i, r, j, s % depth] = words[j]
                rs[i, r, s % depth] = du.ld_weight_u16(sa + Int64(s * BK // 16))

    @dsl_user_op
    def prefetch_l2(addr, *, loc=None, ip=None):
        """prefetch.global.L2 of the line holding global byte address `addr`."""
        du._asm(None, [Int64(addr).ir_value(loc=loc, ip=ip)], "prefetch.global.L2 [$0];", "l",
                loc, ip, side_effects=True)

    def prefetch(s, pf_row):
        """PF: at each even step s, ask L2 for this lane's row's code line PF steps ahead (at
        step 0 also the lines from step D up to there, and the row's scales): trace-time
        helper, nothing where PF = 0. `pf_row`: (code, scale) addresses of the row at step 0."""
        if not pf or s % 2:
            return
        ca, sa = pf_row
        first = (depth + 1) // 2 * 2 if s == 0 else s + pf
        for step in range(first, s + pf + 1, 2):
            if step < steps:
                prefetch_l2(ca + Int64(step * BK // 2))
        if s == 0:
            for ln in range(-(-(steps * BK // 16) // 128)):
                prefetch_l2(sa + Int64(ln * 128))

    def swz(unit, row):
        """The physical 16-byte unit of x unit `unit` (0..15) in row `row` of a stage."""
        return unit ^ ((((unit >> 3) & 1) << 1) | (row & 1))

    @cute.jit
    def body(mx, mtok, mtiles, stacks, sstacks, mout):
        tid, _, _ = cute.arch.thread_idx()
        bx, by, _ = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        cute.arch.griddepcontrol_wait()  # the schedule, x and tok are the producers' outputs
        cute.arch.griddepcontrol_launch_dependents()
        info = du.ld_v4(mtiles.iterator.toint() + Int64(by) * 16)
        ex, pair0, nrows = info[0], info[1], info[2]
        if ex < Uint32(e + sh):
            alloc = cutlass.memory.SmemAllocator()
            smem = alloc.allocate_tensor(cutlass.Uint8, cute.make_layout((launch.smem,)),
                                         byte_alignment=128)
            sbase = du.smem_addr(smem)
            # this thread's x copies: unit tid % 16 of rows tid // 16 + 8i (fixed over steps)
            unit = tid % units
            xrows = [tid // units + (threads // units) * i for i in range(x_per_thread)]
            src, nbytes = x_sources(mx, mtok, kind, pair0, nrows, xrows, k_dim, unit * 16)
            dst = [Uint32(row * ROW_BYTES) + Uint32(swz(unit, row) * 16) for row in xrows]

            # the weight rows of this lane: m-tile i, rows g and g + 8
            f0 = Int64(bx * rows_cta)
            bases = _bases(stacks, sstacks, ex)
            wrows = [_lane_rows(bases[i][:2], f0
                                + Int64(16 * warp if kind == 0 else 32 * warp + 16 * i), g, t)
                     for i in range(2)]
            pf_row = None
            if cutlass.const_expr(pf > 0):  # lane t asks for its quad's row (i, r) = (t // 2,
                # t % 2): KIND 1 row 16i + 8r + g = 8t + g of the warp's 32; KIND 0 row 8r + g
                # of stack i (gate, up)
                if cutlass.const_expr(kind == 0):
                    prow = f0 + Int64(16 * warp + g) + Int64(8 * (t % 2))
                    up = t >= 2
                    pf_row = [cutlass.select_(up, bases[1][0], bases[0][0]) + prow * code_row,
                              cutlass.select_(up, bases[1][1], bases[0][1]) + prow * scale_row]
                else:
                    prow = f0 + Int64(32 * warp + g) + Int64(8 * t)
                    pf_row = [bases[0][0] + prow * code_row, bases[0][1] + prow * scale_row]
            slots = 1 if ws else depth
            rc = cute.make_rmem_tensor((2, 2, 4, 4, slots) if wb == 16 else (2, 2, 4, slots),
                                       Uint32)
            rs = cute.make_rmem_tensor((2, 2, slots), Uint32)
            wsrc = None
            if cutlass.const_expr(ws == 1):
                # WS: thread tid copies CTA weight row tid = 32·warp + 16·i + rr (m-tile i)
                wi, rr = (tid // 16) % 2, tid % 16
                wbase = Int64(ex) * n_out + f0 + Int64(rr)
                if cutlass.const_expr(kind == 0):
                    wbase = wbase + Int64(16 * warp)
                else:
                    wbase = wbase + Int64(32 * warp) + Int64(16 * wi)
                cs = [(st[0].iterator.toint() + wbase * code_row,
                       st[1].iterator.toint() + wbase * scale_row) for st in stacks]
                ca = cutlass.select_(wi == 0, cs[0][0], cs[1][0])
                sa = cutlass.select_(wi == 0, cs[0][1], cs[1][1])
                wsrc = (Uint32(tid), ca, sa)

            for s in cutlass.range_constexpr(min(stages - 1, steps)):
                load_x(s, sbase, dst, src, nbytes, wsrc)
            if cutlass.const_expr(ws == 0):
                for s in cutlass.range_constexpr(min(depth, steps)):
                    load_w(s, wrows, rc, rs)
            acc = cute.make_rmem_tensor((2, ntn, 4), Float32)
            acc.fill(0.0)
            for s in cutlass.range_constexpr(steps):
                prefetch(s, pf_row)
                du.cp_async_wait(min(stages - 2, steps - 1 - s))
                cute.arch.sync_threads()
                if cutlass.const_expr(s + stages - 1 < steps):
                    load_x(s + stages - 1, sbase, dst, src, nbytes, wsrc)
                stage = sbase + Uint32((s % stages) * stage_bytes)
                slot = 0 if ws else s % depth
                if cutlass.const_expr(ws == 1):
                    read_w(stage, warp, g, t, rc, rs)
                if cutlass.const_expr(wb == 4):
                    sc = [scales(du.prmt(rs[i, 0, slot], rs[i, 1, slot], 0x5410))
                          for i in range(2)]
                for j in cutlass.range_constexpr(4):
                    xp = []
                    for n in cutlass.range_constexpr(ntn):
                        row = 8 * n + g
                        x4 = du.ld_shared_v4(
                            stage + Uint32(row * ROW_BYTES) + Uint32(swz(4 * t + j, row) * 16))
                        # BF16 weights pair k as x does (natural order): no reordering
                        xp.append(x4 if wb == 16 else xpairs(x4))
                    for i in cutlass.range_constexpr(2):
                        if cutlass.const_expr(wb == 16):
                            a = [[rc[i, r, j, w, slot] for w in range(4)] for r in range(2)]
                        else:
                            a = [[du.mul_bf16x2_by_half(p, sc[i][r], j // 2)
                                  for p in dequant(rc[i, r, j, slot])] for r in range(2)]
                        for q in cutlass.range_constexpr(2):
                            frag = [a[0][2 * q], a[1][2 * q], a[0][2 * q + 1], a[1][2 * q + 1]]
                            for n in cutlass.range_constexpr(ntn):
                                c4 = du.mma_bf16_m16n8k16(frag, [xp[n][2 * q], xp[n][2 * q + 1]],
                                                          [acc[i, n, v] for v in range(4)])
                                for v in cutlass.range_constexpr(4):
                                    acc[i, n, v] = c4[v]
                if cutlass.const_expr(ws == 0 and s + depth < steps):
                    load_w(s + depth, wrows, rc, rs)

            # epilogue: scale2·2^7 (the bf16 dequantisation trick's 2^-7), round, SwiGLU
            if cutlass.const_expr(wb == 16):
                alpha = [Float32(1.0), Float32(1.0)]
            else:
                alpha = [du.as_f32(du.ld_weight_u32(bases[i][2])) * Float32(128.0)
                         for i in range(2)]
            du.cp_async_wait(0)
            cute.arch.sync_threads()  # every warp is done with the x stages: reuse them
            for n in cutlass.range_constexpr(ntn):
                for v in cutlass.range_constexpr(4):
                    tok_col = 8 * n + 2 * t + v % 2
                    feat = g + 8 * (v // 2)
                    if cutlass.const_expr(kind == 0):
                        gu = du.pack_bf16(acc[0, n, v] * alpha[0], acc[1, n, v] * alpha[1])
                        gf = du.as_f32(gu << 16)
                        uf = du.as_f32(gu & Uint32(0xFFFF0000))
                        val = (gf / (Float32(1.0) + cute.math.exp(-gf))) * uf
                        du.st_shared_u16(sbase + Uint32(tok_col * out_pitch
                                                        + (16 * warp + feat) * 2),
                                         du.pack_bf16(val, val))
                    else:
                        for i in cutlass.range_constexpr(2):
                            du.st_shared_u16(sbase + Uint32(tok_col * out_pitch
                                                            + (32 * warp + 16 * i + feat) * 2),
                                             du.pack_bf16(acc[i, n, v] * alpha[0],
                                                          acc[i, n, v] * alpha[0]))
            cute.arch.sync_threads()
            ob = mout.iterator.toint() + f0 * 2
            for i in cutlass.range_constexpr(out_per_thread):
                c = tid + threads * i
                row, u = c // out_units, c % out_units
                if Uint32(row) < nrows:
                    words = du.ld_shared_v4(sbase + Uint32(row * out_pitch + u * 16))
                    du.st_v4(ob + (Int64(pair0) + Int64(row)) * (n_out * 2) + Int64(u * 16),
                             words)

    def grid(mtiles):
        return dict(grid=(n_out // rows_cta, mtiles.shape[0], 1), block=list(launch.block),
                    smem=launch.smem)

    if wb == 16 and kind == 0:
        @cute.kernel
        def grouped_w4a16_kernel(mx: cute.Tensor, mtok: cute.Tensor, mtiles: cute.Tensor,
                                 mg: cute.Tensor, mu: cute.Tensor, msg: cute.Tensor,
                                 msu: cute.Tensor, mout: cute.Tensor):
            body(mx, mtok, mtiles, [(mg,), (mu,)], [(msg,), (msu,)], mout)

        @cute.jit
        def grouped_w4a16(mx: cute.Tensor, mtok: cute.Tensor, mtiles: cute.Tensor,
                          mg: cute.Tensor, mu: cute.Tensor, msg: cute.Tensor, msu: cute.Tensor,
                          mout: cute.Tensor, stream: cuda.CUstream):
            grouped_w4a16_kernel(mx, mtok, mtiles, mg, mu, msg, msu, mout).launch(
                **grid(mtiles), stream=stream)

        return grouped_w4a16

    if wb == 16:
        @cute.kernel
        def grouped_w4a16_kernel(mx: cute.Tensor, mtiles: cute.Tensor, md: cute.Tensor,
                                 msd: cute.Tensor, mout: cute.Tensor):
            body(mx, mx, mtiles, [(md,), (md,)], [(msd,), (msd,)], mout)

        @cute.jit
        def grouped_w4a16(mx: cute.Tensor, mtiles: cute.Tensor, md: cute.Tensor,
                          msd: cute.Tensor, mout: cute.Tensor, stream: cuda.CUstream):
            grouped_w4a16_kernel(mx, mtiles, md, msd, mout).launch(**grid(mtiles),
                                                                    stream=stream)

        return grouped_w4a16

    if kind == 0 and sh == 1:
        @cute.kernel
        def grouped_w4a16_kernel(mx: cute.Tensor, mtok: cute.Tensor, mtiles: cute.Tensor,
                                 gc: cute.Tensor, gs: cute.Tensor, g2: cute.Tensor,
                                 uc: cute.Tensor, us: cute.Tensor, u2: cute.Tensor,
                                 sgc: cute.Tensor, sgs: cute.Tensor, sg2: cute.Tensor,
                                 suc: cute.Tensor, sus: cute.Tensor, su2: cute.Tensor,
                                 mout: cute.Tensor):
            body(mx, mtok, mtiles, [(gc, gs, g2), (uc, us, u2)],
                 [(sgc, sgs, sg2), (suc, sus, su2)], mout)

        @cute.jit
        def grouped_w4a16(mx: cute.Tensor, mtok: cute.Tensor, mtiles: cute.Tensor,
                          gc: cute.Tensor, gs: cute.Tensor, g2: cute.Tensor, uc: cute.Tensor,
                          us: cute.Tensor, u2: cute.Tensor, sgc: cute.Tensor,
                          sgs: cute.Tensor, sg2: cute.Tensor, suc: cute.Tensor,
                          sus: cute.Tensor, su2: cute.Tensor, mout: cute.Tensor,
                          stream: cuda.CUstream):
            grouped_w4a16_kernel(mx, mtok, mtiles, gc, gs, g2, uc, us, u2, sgc, sgs, sg2, suc,
                                 sus, su2, mout).launch(**grid(mtiles), stream=stream)

        return grouped_w4a16

    if kind == 0:
        @cute.kernel
        def grouped_w4a16_kernel(mx: cute.Tensor, mtok: cute.Tensor, mtiles: cute.Tensor,
                                 gc: cute.Tensor, gs: cute.Tensor, g2: cute.Tensor,
                                 uc: cute.Tensor, us: cute.Tensor, u2: cute.Tensor,
                                 mout: cute.Tensor):
            body(mx, mtok, mtiles, [(gc, gs, g2), (uc, us, u2)], None, mout)

        @cute.jit
        def grouped_w4a16(mx: cute.Tensor, mtok: cute.Tensor, mtiles: cute.Tensor,
                          gc: cute.Tensor, gs: cute.Tensor, g2: cute.Tensor, uc: cute.Tensor,
                          us: cute.Tensor, u2: cute.Tensor, mout: cute.Tensor,
                          stream: cuda.CUstream):
            grouped_w4a16_kernel(mx, mtok, mtiles, gc, gs, g2, uc, us, u2, mout).launch(
                **grid(mtiles), stream=stream)

        return grouped_w4a16

    if sh == 1:
        @cute.kernel
        def grouped_w4a16_kernel(mx: cute.Tensor, mtiles: cute.Tensor, dc: cute.Tensor,
                                 ds: cute.Tensor, d2: cute.Tensor, sdc: cute.Tensor,
                                 sds: cute.Tensor, sd2: cute.Tensor, mout: cute.Tensor):
            body(mx, mx, mtiles, [(dc, ds, d2), (dc, ds, d2)],
                 [(sdc, sds, sd2), (sdc, sds, sd2)], mout)

        @cute.jit
        def grouped_w4a16(mx: cute.Tensor, mtiles: cute.Tensor, dc: cute.Tensor,
                          ds: cute.Tensor, d2: cute.Tensor, sdc: cute.Tensor, sds: cute.Tensor,
                          sd2: cute.Tensor, mout: cute.Tensor, stream: cuda.CUstream):
            grouped_w4a16_kernel(mx, mtiles, dc, ds, d2, sdc, sds, sd2, mout).launch(
                **grid(mtiles), stream=stream)

        return grouped_w4a16

    @cute.kernel
    def grouped_w4a16_kernel(mx: cute.Tensor, mtiles: cute.Tensor, dc: cute.Tensor,
                             ds: cute.Tensor, d2: cute.Tensor, mout: cute.Tensor):
        body(mx, mx, mtiles, [(dc, ds, d2), (dc, ds, d2)], None, mout)

    @cute.jit
    def grouped_w4a16(mx: cute.Tensor, mtiles: cute.Tensor, dc: cute.Tensor, ds: cute.Tensor,
                      d2: cute.Tensor, mout: cute.Tensor, stream: cuda.CUstream):
        grouped_w4a16_kernel(mx, mtiles, dc, ds, d2, mout).launch(**grid(mtiles),
                                                                   stream=stream)

    return grouped_w4a16


KERNEL = KernelDef(name="grouped_w4a16", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference,
                   source_files=("toolchain/dsl_util.py", "decode/gemv_mma.py"),
                   routed_weights=True)
