"""MoE gate and up projections for decode, fused with SiLU·mul: kernel 7 of docs/decode-kernels.md.

For each expert slot s < S = min(E, B·TOPK) with e = experts[s] ≥ 0, and for EVERY row b (the
batch is the mma's N dimension, so extra rows cost no weight bytes; moe_down ignores the rows
that did not pick e): act[s, b] = bf16(silu(g)·u), g = bf16(h_b · gate_eᵀ), u = bf16(h_b · up_eᵀ);
the same for the shared expert (or the dense MLP when TOPK = 0) into act_sh [B, MS]. It must
match `reference.swiglu`'s first half: `reference.linear` for g and u (fp32 sums, one bf16
rounding each), then `F.silu(g.float()) * u.float()` rounded once (DESIGN §4). Slots with
e = −1 are left untouched (their CTAs exit right after the wait); `_reference` marks them NaN.

Design (FMT 1 NVFP4 W4A16, FMT 0 BF16; the fragment math is gemv_nvfp4 / gemv_bf16's): a flat
grid of CTAs, each owning 16 output rows of one matrix pair: the MS/16 shared (dense) tiles
first, then S·M/16 routed tiles (slot-major). A CTA computes two m16 tiles, rows n0..n0+15 of
gate and of up, against the same x loads (B fragment, n = batch row; columns ≥ B repeat row
B − 1 and are never stored), so silu(g)·u needs no second pass. 8 warps and the 4 lanes of each
lane quad split K: NVFP4 lanes take 32-k chunks (a 16-byte code load and a 2-byte scale load
per row per step, dequantised with gemv_mma.frag_ops), BF16 lanes 8-k chunks (16-byte loads fed
to mma.sync as they are). At H = 2048 an NVFP4 lane holds its whole share (2 steps x 4 rows) in
registers at once: full size B = 1 is 7 x 32 CTAs reading ~8 MB. Warps' fp32 16x8 tiles are
summed in shared memory; 16·B threads then apply scale2, round g and u, take silu(g)·u, store.
Only the picked experts' weights (and the shared ones) are read, once each, whatever the rows.
80-114 registers and 10 KB of shared memory per 256-thread CTA: 2-3 CTAs per SM, so the 224
CTAs of full size B = 1 are all resident at once. experts must hold ids in 0..E−1 or −1.

PDL: the shared (dense) weights are loaded before griddepcontrol.wait with dsl_util's volatile
`ld_weight_*` (dsl_util.griddepcontrol_wait_after_loads keeps them above the wait in SASS);
`experts` is an input, so a routed CTA learns its expert, then loads its weights and its
scale2 (all volatile weight loads, in one burst), after the wait; h is read after it too.
The shared scale2 is loaded before the wait, in every CTA. Measured on the H200 and dropped:
CTA i bulk-prefetching (cp.async.bulk.prefetch.L2) the weights of tile i + 264, a wave later
(MoE B = 8 unchanged at 28.7 µs, dense B = 8 10.4 -> 11.5 µs).

PD = 1 (a bench spec since 2026-12-07; PD = 2 below is the model's): after issuing its own weight loads, routed
tile j of slot s bulk-prefetches into L2 the j-th of M/16 equal runs of expert experts[s]'s
down codes (thread 0) and block scales (thread 32) — 16 KB and 2 KB at full size — so the
moe_down launch that follows finds its routed weights in L2 instead of starting its DRAM
requests after its own wait. Why: at B = 1 this launch reads ~8 MB in ~5 µs, well below the
copy rate, so the expert's 4.1 MB of down weights fit in its idle DRAM time. moe_down's
routed weights are therefore arguments here (only prefetched, never read for values; passed
at PD = 0 too, so every MoE spec has one signature). Predicted: moe_down −1 to −1.5 µs a
layer, this launch +0 to +0.5 µs, −25 to −70 µs a step at B ≤ 2. Measured on the H200
(tools/probe_moe_pd.py, the whole NVFP4 step at 1K, PD 0 / 1 alternated four times, logits
bit for bit equal): B = 1 1.6646 -> 1.6781 ms (+13.5 µs), B = 2 2.0180 -> 2.0034 (−14.6 µs),
B = 4 2.4884 -> 2.5146 (+26.2 µs); so PD = 1 was the model spec at B = 2 only (until PD = 2). At B = 1 the
prefetch's 4 MB of DRAM requests slow this launch's own loads more than they save moe_down.
PD = 2 (the model spec at B = 1 and 2, `pd_for`) issues the same prefetches after the CTA's
MMA loop, when its own loads are in, so they share no queue with them; it leaves moe_down less
lead. Measured on an H100 (2026-12-07, the same probe, PD 0 / 1 / 2 alternated four times,
logits bit for bit equal; each round within 3 µs of its median): B = 1 1.7608 / 1.7763 /
1.7298 ms (PD = 2 −31.0 µs against PD = 0; predicted 0 to −20), B = 2 2.1025 / 2.1119 /
2.0395 (−63.0 µs), B = 4 2.6177 / 2.7248 / 2.6765 (+58.8 µs: at B = 4 the launch moves
~4× the routed bytes and has no idle DRAM time to lend). Not yet measured on the H200.

Tolerance (GPU test): ‖out − ref‖/‖ref‖ ≤ 1e-2 per output. The dequantised products are exact
on both sides (the NVFP4 trick gives e2m1·e4m3·2^-7 exactly; BF16 is exact), so g and u differ
from the reference only by the fp32 summation order (~1e-6 relative) and one fp32 rounding of
·scale2; that can flip a bf16 rounding of g or u (2^-8 relative, rarely), and the final
rounding adds ≤ 2^-9: expected ~2e-3 norm-wise, as for the GEMVs.

Spec values: B bucket, H hidden (multiple of 64), E routed experts, M expert width, MS shared
(or dense) width (M, MS multiples of 16), TOPK experts per token, FMT. With TOPK = 0 (dense
layers) `experts`, the routed weights and `act` are not arguments and E = M = 0 (placeholders:
no extent uses them).
"""

import math

import torch
import torch.nn.functional as F

from flint_graph import reference
from flint_graph.kernels.toolchain.spec import BUCKETS, KernelDef, Launch, Spec, TensorArg, unique_specs
from flint_graph.checkpoints.nvfp4 import E2M1_GRID, ue4m3_to_float
from flint_graph.checkpoints.weights import NVFP4Weight, expert_weight

ROWS = 16  # output rows of each of gate and up per CTA (one m16 tile each)
WARPS = 8  # split K
DEPTH = {0: 4, 1: 2}  # FMT -> weight steps in flight per lane (4 rows each)
KCHUNK = {0: 8, 1: 32}  # FMT -> k per lane chunk (16 weight bytes per row)
SMEM = 8 * 2 * ROWS * WARPS * 4  # fp32 partials [batch col][gate/up row][warp]
# bucket -> PD of its model spec where a prefetch of moe_down's weights into L2 was measured
# faster (tools/probe_moe_pd.py, perf log thirty-fourth session, H100): PD = 2 at B = 1 and 2
# (−31 and −63 µs a step against none); at B = 4 none is fastest (PD = 2 +59 µs)
PD_MODEL = {1: 2, 2: 2}
PD_VALUES = (0, 1, 2)  # built: none, after the CTA's loads, after its MMA loop (the model's)


def pd_for(batch: int) -> int:
    """PD of the model spec at bucket `batch`: PD_MODEL's (routed CTAs prefetch the down rows
    of their expert into L2 for moe_down) where it was measured faster, else 0."""
    return PD_MODEL.get(batch, 0)


def slots(spec: Spec) -> int:
    """S: expert slots of a launch (0 for a dense layer)."""
    return min(spec["E"], spec["B"] * spec["TOPK"])


def _args(spec: Spec):
    b, h, m, ms, fmt = spec["B"], spec["H"], spec["M"], spec["MS"], spec["FMT"]
    e, s = spec["E"], slots(spec)
    moe = spec["TOPK"] > 0

    def weights(prefix, lead, n2):
        if fmt == 0:
            return [TensorArg(prefix[:-1], "bf16", (*lead, h), "weight")]
        return [TensorArg(prefix + "codes", "u8", (*lead, h // 2), "weight"),
                TensorArg(prefix + "scales", "u8", (*lead, h // 16), "weight", align=4),
                TensorArg(prefix + "scale2", "f32", (n2,), "weight", align=4)]

    out = [TensorArg("h", "bf16", (b, h), "input")]
    if moe:
        out += [TensorArg("experts", "i32", (s,), "input", align=4)]
        out += weights("gate_", (e, m), e) + weights("up_", (e, m), e)
    out += weights("shared_gate_", (ms,), 1) + weights("shared_up_", (ms,), 1)
    if moe:
        out += _down_args(spec)
        out += [TensorArg("act", "bf16", (s, b, m), "output")]
    out += [TensorArg("act_sh", "bf16", (b, ms), "output")]
    return tuple(out)


def _down_args(spec: Spec) -> list[TensorArg]:
    """The routed down weights moe_down reads (its declarations), which PD = 1 and 2 prefetch into
    L2: NVFP4 codes and block scales (scale2 is one word per expert: not worth a request) or
    the BF16 matrix. Passed at PD = 0 too, so every MoE spec has one signature."""
    e, h, m = spec["E"], spec["H"], spec["M"]
    if spec["FMT"] == 0:
        return [TensorArg("down", "bf16", (e, h, m), "weight")]
    return [TensorArg("down_codes", "u8", (e, h, m // 2), "weight"),
            TensorArg("down_scales", "u8", (e, h, m // 16), "weight", align=4)]


def _tiles(spec: Spec) -> int:
    return spec["MS"] // ROWS + slots(spec) * (spec["M"] // ROWS)


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(_tiles(spec), 1, 1), block=(32 * WARPS, 1, 1), smem=SMEM)


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """Per bucket and format: the MoE layers' spec and the dense layers' (TOPK = 0)."""
    h, m = cfg.hidden_size, cfg.moe_intermediate_size
    ms = cfg.n_shared_experts * m
    if h % 64 or m % ROWS or ms % ROWS or cfg.intermediate_size % ROWS:
        raise ValueError(f"moe_gate_up: hidden_size {h} must be a multiple of 64 and the MLP "
                         f"widths ({m}, {ms}, {cfg.intermediate_size}) of {ROWS}")
    has_moe = cfg.num_hidden_layers > cfg.first_k_dense_replace
    if has_moe and ms == 0:
        raise ValueError("moe_gate_up: needs a shared expert (n_shared_experts ≥ 1)")
    out = []
    for b in buckets:
        for fmt in (0, 1):
            if has_moe:
                out.append(KERNEL.spec(B=b, H=h, E=cfg.n_routed_experts, M=m, MS=ms,
                                       TOPK=cfg.num_experts_per_tok, FMT=fmt, PD=pd_for(b)))
            if cfg.first_k_dense_replace > 0:
                out.append(KERNEL.spec(B=b, H=h, E=0, M=0, MS=cfg.intermediate_size, TOPK=0,
                                       FMT=fmt))
    return unique_specs(out)


def bench_specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """Benchmark variants: each MoE model spec with the other PD values (0 none, 1 after the
    CTA's weight loads, 2 after its MMA loop; tools/probe_moe_pd.py)."""
    return [KERNEL.spec(**{**s.as_dict(), "PD": pd}) for s in _specs(cfg, buckets)
            if s["TOPK"] > 0 for pd in PD_VALUES if pd != s["PD"]]


# -- reference, arguments, bytes ----------------------------------------------------------------


def _split(spec: Spec, args):
    """(h, experts or None, routed (gate, up) or None, shared (gate, up)) as reference Linears,
    from the declared non-output arguments in order."""
    h, rest = args[0], list(args[1:])
    experts = rest.pop(0) if spec["TOPK"] > 0 else None
    per = 3 if spec["FMT"] == 1 else 1

    def take(shared):
        t = [rest.pop(0) for _ in range(per)]
        if per == 1:
            return t[0]
        return NVFP4Weight(t[0], t[1], t[2][0] if shared else t[2])

    routed = (take(False), take(False)) if experts is not None else None
    return h, experts, routed, (take(True), take(True))


def swiglu_in(x, gate, up):
    """`reference.swiglu`'s first half: bf16(silu(bf16(x·gateᵀ)) · bf16(x·upᵀ)), fp32 inside."""
    g, u = reference.linear(x, gate), reference.linear(x, up)
    return (F.silu(g.float()) * u.float()).to(torch.bfloat16)


def _reference(spec: Spec, *args):
    """(act, act_sh) for TOPK > 0, else (act_sh,). act rows of unused slots (e = −1) are NaN:
    the kernel leaves them untouched."""
    h, experts, routed, shared = _split(spec, args)
    act_sh = swiglu_in(h, *shared)
    if experts is None:
        return (act_sh,)
    act = torch.full((slots(spec), spec["B"], spec["M"]), float("nan"), dtype=torch.bfloat16,
                     device=h.device)
    for s, e in enumerate(experts.tolist()):
        if e >= 0:
            act[s] = swiglu_in(h, expert_weight(routed[0], e), expert_weight(routed[1], e))
    return act, act_sh


def _scale2_for(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """n per-tensor scale2 values, none a power of two, that make a dot product of k uniform
    random NVFP4 weights with N(0, 1) inputs O(1) (silu then works in its curved range)."""
    e2m1_rms = math.sqrt(sum(v * v for v in E2M1_GRID) / len(E2M1_GRID))
    e4m3_rms = ue4m3_to_float(torch.arange(256, dtype=torch.uint8)).pow(2).mean().sqrt().item()
    u = torch.rand(n, generator=gen, device=gen.device).cpu()
    return (0.6 + 0.8 * u) / (e2m1_rms * e4m3_rms * math.sqrt(k))


def make_args(spec: Spec, *, gen: torch.Generator, device: str = "cuda", experts=None,
              poison_unpicked: bool = False) -> list:
    """One fresh argument list in declared order, drawn on `gen`'s device, moved to `device`.

    experts: the slot list (padded with −1 to S); default S distinct random experts, ascending
    (every slot used). poison_unpicked: the weights (BF16) or scale2 (NVFP4) of the experts not
    in the list are NaN, so a kernel that reads them writes NaN. h is N(0, 1); BF16 weights
    N(0, 1/H); NVFP4 code and scale bytes uniform over all 256 values; outputs NaN."""
    b, h, e, m, ms, fmt = (spec[v] for v in ("B", "H", "E", "M", "MS", "FMT"))
    moe, s = spec["TOPK"] > 0, slots(spec)
    on = gen.device

    def weights(lead, n2):
        if fmt == 0:
            w = torch.randn((*lead, h), generator=gen, device=on) / math.sqrt(h)
            return [w.to(torch.bfloat16)]
        return [torch.randint(0, 256, (*lead, h // 2), generator=gen, dtype=torch.uint8,
                              device=on),
                torch.randint(0, 256, (*lead, h // 16), generator=gen, dtype=torch.uint8,
                              device=on),
                _scale2_for(n2, h, gen).to(on)]

    out = [torch.randn((b, h), generator=gen, device=on).to(torch.bfloat16)]
    if moe:
        if experts is None:
            experts = sorted(torch.randperm(e, generator=gen, device=on)[:s].tolist())
        if len(experts) > s or any(not -1 <= x < e for x in experts):
            raise ValueError(f"experts {experts}: expected at most S = {s} ids in -1..{e - 1}")
        ids = list(experts) + [-1] * (s - len(experts))
        out.append(torch.tensor(ids, dtype=torch.int32, device=on))
        routed = weights((e, m), e) + weights((e, m), e)
        if poison_unpicked:
            unpicked = torch.ones(e, dtype=torch.bool, device=on)
            unpicked[[x for x in ids if x >= 0]] = False
            for t in routed:
                if t.is_floating_point():
                    t[unpicked] = float("nan")
        out += routed
    out += weights((ms,), 1) + weights((ms,), 1)
    if moe:  # moe_down's routed weights: only prefetched (PD = 1, 2), never read for values
        if fmt == 0:
            out.append((torch.randn((e, h, m), generator=gen, device=on)
                        / math.sqrt(m)).to(torch.bfloat16))
        else:
            out += [torch.randint(0, 256, (e, h, m // n), generator=gen, dtype=torch.uint8,
                                  device=on) for n in (2, 16)]
        out.append(torch.full((s, b, m), float("nan"), dtype=torch.bfloat16, device=on))
    out.append(torch.full((b, ms), float("nan"), dtype=torch.bfloat16, device=on))
    return [t.to(device) for t in out]


def bytes_moved(spec: Spec, args) -> int:
    """Least DRAM bytes of one launch: h and experts, the picked experts' gate and up (once
    each) and the shared ones, the act rows of used slots and act_sh."""
    b, h, m, ms, fmt = (spec[v] for v in ("B", "H", "M", "MS", "FMT"))
    per_row = 2 * h if fmt == 0 else h // 2 + h // 16
    scale2 = 0 if fmt == 0 else 4
    total = 2 * b * h + 2 * (ms * per_row + scale2) + 2 * b * ms
    if spec["TOPK"] > 0:
        picked = {x for x in args[1].tolist() if x >= 0}
        used = sum(x >= 0 for x in args[1].tolist())
        total += 4 * slots(spec) + len(picked) * 2 * (m * per_row + scale2) + used * 2 * b * m
    return total


# -- the kernel ---------------------------------------------------------------------------------


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute

    b_rows, k, m, ms, fmt = spec["B"], spec["H"], spec["M"], spec["MS"], spec["FMT"]
    moe = spec["TOPK"] > 0
    if k % 64 or m % ROWS or ms % ROWS:
        raise ValueError(f"moe_gate_up: H = {k} must be a multiple of 64, M = {m} and "
                         f"MS = {ms} of {ROWS}")
    launch = _launch(spec)
    body = _body(spec)

    if moe and fmt == 1:
        @cute.kernel
        def moe_gate_up_kernel(h: cute.Tensor, ex: cute.Tensor, gc: cute.Tensor,
                               gs: cute.Tensor, g2: cute.Tensor, uc: cute.Tensor,
                               us: cute.Tensor, u2: cute.Tensor, sgc: cute.Tensor,
                               sgs: cute.Tensor, sg2: cute.Tensor, suc: cute.Tensor,
                               sus: cute.Tensor, su2: cute.Tensor, dc: cute.Tensor,
                               ds: cute.Tensor, act: cute.Tensor, act_sh: cute.Tensor):
            body([h, ex, gc, gs, g2, uc, us, u2, sgc, sgs, sg2, suc, sus, su2, dc, ds, act,
                  act_sh])

        @cute.jit
        def moe_gate_up(h: cute.Tensor, ex: cute.Tensor, gc: cute.Tensor, gs: cute.Tensor,
                        g2: cute.Tensor, uc: cute.Tensor, us: cute.Tensor, u2: cute.Tensor,
                        sgc: cute.Tensor, sgs: cute.Tensor, sg2: cute.Tensor,
                        suc: cute.Tensor, sus: cute.Tensor, su2: cute.Tensor,
                        dc: cute.Tensor, ds: cute.Tensor, act: cute.Tensor,
                        act_sh: cute.Tensor, stream: cuda.CUstream):
            moe_gate_up_kernel(h, ex, gc, gs, g2, uc, us, u2, sgc, sgs, sg2, suc, sus, su2, dc,
                               ds, act, act_sh).launch(grid=launch.grid, block=launch.block,
                                                       smem=launch.smem, stream=stream,
                                                       use_pdl=True)
    elif moe:
        @cute.kernel
        def moe_gate_up_kernel(h: cute.Tensor, ex: cute.Tensor, gw: cute.Tensor,
                               uw: cute.Tensor, sgw: cute.Tensor, suw: cute.Tensor,
                               dw: cute.Tensor, act: cute.Tensor, act_sh: cute.Tensor):
            body([h, ex, gw, uw, sgw, suw, dw, act, act_sh])

        @cute.jit
        def moe_gate_up(h: cute.Tensor, ex: cute.Tensor, gw: cute.Tensor, uw: cute.Tensor,
                        sgw: cute.Tensor, suw: cute.Tensor, dw: cute.Tensor, act: cute.Tensor,
                        act_sh: cute.Tensor, stream: cuda.CUstream):
            moe_gate_up_kernel(h, ex, gw, uw, sgw, suw, dw, act, act_sh).launch(
                grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
                use_pdl=True)
    elif fmt == 1:
        @cute.kernel
        def moe_gate_up_kernel(h: cute.Tensor, sgc: cute.Tensor, sgs: cute.Tensor,
                               sg2: cute.Tensor, suc: cute.Tensor, sus: cute.Tensor,
                               su2: cute.Tensor, act_sh: cute.Tensor):
            body([h, sgc, sgs, sg2, suc, sus, su2, act_sh])

        @cute.jit
        def moe_gate_up(h: cute.Tensor, sgc: cute.Tensor, sgs: cute.Tensor, sg2: cute.Tensor,
                        suc: cute.Tensor, sus: cute.Tensor, su2: cute.Tensor,
                        act_sh: cute.Tensor, stream: cuda.CUstream):
            moe_gate_up_kernel(h, sgc, sgs, sg2, suc, sus, su2, act_sh).launch(
                grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
                use_pdl=True)
    else:
        @cute.kernel
        def moe_gate_up_kernel(h: cute.Tensor, sgw: cute.Tensor, suw: cute.Tensor,
                               act_sh: cute.Tensor):
            body([h, sgw, suw, act_sh])

        @cute.jit
        def moe_gate_up(h: cute.Tensor, sgw: cute.Tensor, suw: cute.Tensor,
                        act_sh: cute.Tensor, stream: cuda.CUstream):
            moe_gate_up_kernel(h, sgw, suw, act_sh).launch(
                grid=launch.grid, block=launch.block, smem=launch.smem, stream=stream,
                use_pdl=True)

    return moe_gate_up


def _body(spec: Spec):
    """The device code shared by the four signatures (@cute.jit, inlined into the kernel):
    ts are the declared tensor arguments in order."""
    import cutlass
    import cutlass.cute as cute
    from cutlass import BFloat16, Float32, Int32, Int64, Uint32
    from cutlass.cutlass_dsl import dsl_user_op

    from flint_graph.kernels.toolchain import dsl_util as du
    from flint_graph.kernels.decode.gemv_mma import frag_ops

    b_rows, k, m, ms, fmt = spec["B"], spec["H"], spec["M"], spec["MS"], spec["FMT"]
    moe, nvfp4 = spec["TOPK"] > 0, fmt == 1
    pd = spec.as_dict().get("PD", 0) if moe else 0  # 1: after its loads, 2: after its MMAs
    tiles_sh, tiles_r = ms // ROWS, max(m // ROWS, 1)
    nch = k // KCHUNK[fmt]  # lane chunks per row
    steps = math.ceil(nch / (4 * WARPS))  # lane chunk = t + 4 * (warp + WARPS * step)
    full = nch // (4 * WARPS)  # steps in which every lane's chunk exists
    depth = min(steps, DEPTH[fmt])
    xdepth = min(steps, 2)
    xwords = 4 if nvfp4 else 1  # 16-byte x loads per chunk
    row_bytes = k // 2 if nvfp4 else 2 * k  # code (or bf16) bytes per weight row
    per = 3 if nvfp4 else 1  # tensors per weight matrix
    if nvfp4:
        dequant, xpairs, scales = frag_ops()

    class Lane:
        """Per-thread indices, the x view and the register buffers of one CTA's rows: gate rows
        n0 + g, n0 + g + 8 and the same up rows (buffer row 2u + r: u 0 gate / 1 up)."""

        def __init__(self, mx, n0):
            tidx, _, _ = cute.arch.thread_idx()
            self.tidx, self.warp = tidx, tidx // 32
            self.g, self.t = tidx % 32 // 4, tidx % 4
            self.rows = (n0 + self.g, n0 + self.g + 8)
            self.gx = cute.flat_divide(mx, (1, 8))  # (1, 8, B, K/8)
            self.ld_x = cute.make_copy_atom(cute.nvgpu.CopyG2ROp(), BFloat16,
                                            num_bits_per_copy=128)
            self.rc = cute.make_rmem_tensor((4, 4, depth), Uint32)  # [word, row, slot]
            self.rs = cute.make_rmem_tensor((4, depth), Uint32)  # 2 scale bytes [row, slot]
            self.rx = cute.make_rmem_tensor((8, xwords, xdepth), BFloat16)
            self.rx32 = cute.recast_tensor(self.rx, Uint32)  # (4, xwords, xdepth)

        def chunk(self, s):
            c = self.t + 4 * (self.warp + WARPS * s)
            return c if s < full else cutlass.min(c, nch - 1)

        def load_w(self, s, bases):
            """Step s of the 4 rows; bases: per matrix (data, scales) byte addresses."""
            c, off = (self.chunk(0), 4 * WARPS * s) if s < full else (self.chunk(s), 0)
            for u in range(2):
                for r in range(2):
                    row = Int64(self.rows[r])
                    words = du.ld_weight_v4(bases[u][0] + row * row_bytes + Int64(c) * 16
                                            + 16 * off)
                    for i in range(4):
                        self.rc[i, 2 * u + r, s % depth] = words[i]
                    if nvfp4:
                        self.rs[2 * u + r, s % depth] = du.ld_weight_u16(
                            bases[u][1] + row * (k // 16) + Int64(c) * 2 + 2 * off)

        def a_frags(self, s):
            """A fragments of step s: [matrix][row half][u32 bf16x2]."""
            slot, out = s % depth, []
            for u in range(2):
                words = [[self.rc[j, 2 * u + r, slot] for j in range(4)] for r in range(2)]
                if s >= full:  # lanes past the end of K: zero weights
                    live = self.t + 4 * (self.warp + WARPS * s) < nch
                    words = [[cutlass.select_(live, w, Uint32(0)) for w in ws] for ws in words]
                if nvfp4:
                    sc = scales(du.prmt(self.rs[2 * u, slot], self.rs[2 * u + 1, slot], 0x5410))
                    a = [[], []]
                    for r in range(2):
                        for j in range(4):
                            a[r] += [du.mul_bf16x2_by_half(p, sc[r], j // 2)
                                     for p in dequant(words[r][j])]
                    out.append(a)
                else:
                    out.append(words)
            return out

        def load_x(self, s):
            bx = cutlass.min(self.g, b_rows - 1)  # batch columns >= B repeat the last row
            for j in range(xwords):
                cute.copy(self.ld_x, self.gx[0, None, bx, xwords * self.chunk(s) + j],
                          self.rx[None, j, s % xdepth])

        def mma_step(self, s, a, acc):
            """acc[matrix][chain] + this lane's share of both 16x8 tiles for step s."""
            xs = s % xdepth
            if nvfp4:
                xp = []
                for j in range(4):
                    xp += xpairs([self.rx32[i, j, xs] for i in range(4)])
            else:
                xp = [self.rx32[i, 0, xs] for i in range(4)]
            if s + xdepth < steps:  # x slot free again: refill it
                self.load_x(s + xdepth)
            for u in range(2):
                for mm in range(len(xp) // 2):
                    acc[u][mm % 2] = du.mma_bf16_m16n8k16(
                        [a[u][0][2 * mm], a[u][1][2 * mm], a[u][0][2 * mm + 1],
                         a[u][1][2 * mm + 1]], [xp[2 * mm], xp[2 * mm + 1]], acc[u][mm % 2])
            return acc

    i_sh = 2 + 2 * per if moe else 1  # first shared tensor: after h (and experts, routed)

    def addr(t):
        return t.iterator.toint()

    @dsl_user_op
    def ld_f32_at(a, *, loc=None, ip=None):
        """One fp32 weight word at a 4-byte aligned global byte address (volatile
        ld.global.nc, as dsl_util's weight loads: stays where it is issued)."""
        return du.as_f32(Uint32(du._ld_nc(".b32", 1, a, loc, ip)), loc=loc, ip=ip)

    @dsl_user_op
    def prefetch_l2(a, nbytes, *, loc=None, ip=None):
        """cp.async.bulk.prefetch.L2 of nbytes (a multiple of 16) at a 16-byte aligned global
        byte address: a hint, nothing waits for it."""
        du._asm(None, [Int64(a).ir_value(loc=loc, ip=ip), Int32(nbytes).ir_value(loc=loc, ip=ip)],
                "cp.async.bulk.prefetch.L2.global [$0], $1;", "l,r", loc, ip, side_effects=True)

    # PD: routed tile j of an expert prefetches the j-th of tiles_r equal runs of that expert's
    # down codes (thread 0) and block scales (thread 32), each widened to 16-byte bounds
    down_runs = []  # (index in ts, bytes per expert, bytes per run)
    if pd:
        per_expert = [k * m // 2, k * m // 16] if nvfp4 else [k * m * 2]
        down_runs = [(2 + 4 * per + i, n, (math.ceil(n / tiles_r) + 15) // 16 * 16)
                     for i, n in enumerate(per_expert)]

    @cute.jit
    def prefetch_down(ts, e, j, tidx):
        for i in cutlass.range_constexpr(len(down_runs)):
            at, n, run = down_runs[i]
            if tidx == 32 * i:
                off = Int64(j) * run
                if off < n:
                    start = addr(ts[at]) + Int64(e) * n + off
                    end = start + cutlass.min(Int64(run), Int64(n) - off)
                    a0 = start - start % 16
                    prefetch_l2(a0, Int32(end - a0 + 15) // 16 * 16)

    @cute.jit
    def body(ts):
        mx, mact_sh = ts[0], ts[-1]
        shared = ts[i_sh:i_sh + 2 * per]
        bidx, _, _ = cute.arch.block_idx()
        is_sh = bidx < tiles_sh  # shared (dense) tiles first; routed tiles slot-major
        jj = cutlass.max(bidx, tiles_sh) - tiles_sh
        slot = jj // tiles_r
        n0 = cutlass.select_(is_sh, bidx, jj - slot * tiles_r) * ROWS
        ln = Lane(mx, n0)
        # (a runtime `if` may not carry the Lane object: call its methods through locals)
        load_w, load_x, a_frags, mma_step = ln.load_w, ln.load_x, ln.a_frags, ln.mma_step
        tidx, warp, g, t = ln.tidx, ln.warp, ln.g, ln.t
        # (data, block scales) byte addresses per matrix; BF16 has no scales (index unused)
        sh_bases = [(addr(shared[per * u]), addr(shared[per * u + min(per - 1, 1)]))
                    for u in range(2)]
        # PDL prologue: the shared weights only (which expert a routed CTA runs is an input),
        # and the shared scale2 in every CTA (two L2 words: no round trip in the epilogue)
        if cutlass.const_expr(not moe):
            for s in cutlass.range_constexpr(depth):
                load_w(s, sh_bases)
        else:
            if is_sh:
                for s in cutlass.range_constexpr(depth):
                    load_w(s, sh_bases)
        s2_sh = [Float32(1.0), Float32(1.0)]
        if cutlass.const_expr(nvfp4):
            s2_sh = [du.ld_weight_f32(shared[2]), du.ld_weight_f32(shared[5])]
        du.griddepcontrol_wait_after_loads()
        cute.arch.griddepcontrol_launch_dependents()
        e = Int32(0)
        if cutlass.const_expr(moe):
            e = cutlass.select_(is_sh, Int32(0), ts[1][slot])  # -1: unused slot, exit
        if cutlass.const_expr(not moe) or e >= 0:
            w_bases = sh_bases
            if cutlass.const_expr(moe):
                routed = ts[2:2 + 2 * per]
                e64 = Int64(e)
                w_bases = [(cutlass.select_(is_sh, sh_bases[u][0],
                                            addr(routed[per * u]) + e64 * (m * row_bytes)),
                            cutlass.select_(is_sh, sh_bases[u][1],
                                            addr(routed[per * u + min(per - 1, 1)])
                                            + e64 * (m * (k // 16))))
                           for u in range(2)]
                if bidx >= tiles_sh:
                    for s in cutlass.range_constexpr(depth):
                        load_w(s, w_bases)
                    if cutlass.const_expr(pd == 1):
                        prefetch_down(ts, e, n0 // ROWS, tidx)
            # scale2 of the CTA's matrices, issued with its weights (not after the split-K
            # barrier, where a routed scale2[e] was one more dependent L2 round trip)
            g2, u2 = s2_sh[0], s2_sh[1]
            if cutlass.const_expr(moe and nvfp4):
                e4 = Int64(e) * 4  # e = 0 in shared CTAs: a real word, unused
                g2 = cutlass.select_(is_sh, s2_sh[0], ld_f32_at(addr(ts[4]) + e4))
                u2 = cutlass.select_(is_sh, s2_sh[1], ld_f32_at(addr(ts[7]) + e4))
            for s in cutlass.range_constexpr(xdepth):
                load_x(s)
            acc = [[[Float32(0.0)] * 4 for _ in range(2)] for _ in range(2)]
            for s in cutlass.range_constexpr(steps):
                a = a_frags(s)
                if cutlass.const_expr(s + depth < steps):
                    load_w(s + depth, w_bases)
                acc = mma_step(s, a, acc)
            if cutlass.const_expr(pd == 2):  # its own loads are in: no queue to share
                if bidx >= tiles_sh:
                    prefetch_down(ts, e, n0 // ROWS, tidx)
            # split-K over the warps: partials [batch col][gate row / ROWS + up row][warp]
            sp = cutlass.memory.SmemAllocator().allocate_tensor(
                Float32, cute.make_layout((8, 2 * ROWS, WARPS)), byte_alignment=16)
            for u in cutlass.range_constexpr(2):
                tile = [acc[u][0][i] + acc[u][1][i] for i in range(4)]  # rows g, g+8
                for i in cutlass.range_constexpr(4):
                    sp[2 * t + i % 2, ROWS * u + g + 8 * (i // 2), warp] = tile[i]
            cute.arch.sync_threads()
            if tidx < ROWS * b_rows:
                bb, r = tidx // ROWS, tidx % ROWS
                gsum, usum = sp[bb, r, 0], sp[bb, ROWS + r, 0]
                for w in cutlass.range_constexpr(1, WARPS):
                    gsum, usum = gsum + sp[bb, r, w], usum + sp[bb, ROWS + r, w]
                if cutlass.const_expr(nvfp4):  # 2^7 left by the bf16 scale trick
                    gsum, usum = gsum * (g2 * Float32(128.0)), usum * (u2 * Float32(128.0))
                gv = gsum.to(BFloat16).to(Float32)  # g and u are rounded once, as linear() does
                uv = usum.to(BFloat16).to(Float32)
                y = (gv / (Float32(1.0) + cute.math.exp(-gv)) * uv).to(BFloat16)
                if cutlass.const_expr(not moe):
                    mact_sh[bb, n0 + r] = y
                else:
                    if is_sh:
                        mact_sh[bb, n0 + r] = y
                    else:
                        ts[-2][slot, bb, n0 + r] = y

    return body


KERNEL = KernelDef(name="moe_gate_up", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py", "decode/gemv_mma.py"))
