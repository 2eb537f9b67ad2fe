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

PDL: the shared (dense) weights are loaded before griddepcontrol.wait with dsl_util's volatile
`ld_weight_*` (dsl_util.griddepcontrol_wait_after_loads keeps them above the wait in SASS);
`experts` is an input, so a routed CTA learns its expert, then loads its weights, after the
wait; h (and every scale2, a plain load) are read after it too.

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
from flint_graph.kernels.spec import BUCKETS, KernelDef, Launch, Spec, TensorArg, unique_specs
from flint_graph.nvfp4 import E2M1_GRID, ue4m3_to_float
from flint_graph.weights import NVFP4Weight, expert_weight

ROWS = 16  # output rows of each of gate and up per CTA (one m16 tile each)
WARPS = 8  # split K
DEPTH = {0: 4, 1: 2}  # FMT -> weight steps in flight per lane (4 rows each)
KCHUNK = {0: 8, 1: 32}  # FMT -> k per lane chunk (16 weight bytes per row)
SMEM = 8 * 2 * ROWS * WARPS * 4  # fp32 partials [batch col][gate/up row][warp]


def slots(spec: Spec) -> int:
    """S: expert slots of a launch (0 for a dense layer)."""
    return min(spec["E"], spec["B"] * spec["TOPK"])


def _args(spec: Spec):
    b, h, m, ms, fmt = spec["B"], spec["H"], spec["M"], spec["MS"], spec["FMT"]
    e, s = spec["E"], slots(spec)
    moe = spec["TOPK"] > 0

    def weights(prefix, lead, n2):
        if fmt == 0:
            return [TensorArg(prefix.rstrip("_") or "w", "bf16", (*lead, h), "weight")]
        return [TensorArg(prefix + "codes", "u8", (*lead, h // 2), "weight"),
                TensorArg(prefix + "scales", "u8", (*lead, h // 16), "weight", align=4),
                TensorArg(prefix + "scale2", "f32", (n2,), "weight", align=4)]

    out = [TensorArg("h", "bf16", (b, h), "input")]
    if moe:
        out += [TensorArg("experts", "i32", (s,), "input", align=4)]
        out += weights("gate_", (e, m), e) + weights("up_", (e, m), e)
    out += weights("sh_gate_", (ms,), 1) + weights("sh_up_", (ms,), 1)
    if moe:
        out += [TensorArg("act", "bf16", (s, b, m), "output")]
    out += [TensorArg("act_sh", "bf16", (b, ms), "output")]
    return tuple(out)


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
                                       TOPK=cfg.num_experts_per_tok, FMT=fmt))
            if cfg.first_k_dense_replace > 0:
                out.append(KERNEL.spec(B=b, H=h, E=0, M=0, MS=cfg.intermediate_size, TOPK=0,
                                       FMT=fmt))
    return unique_specs(out)


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
    return (0.6 + 0.8 * u) / (e2m1_rms * e4m3_rms * math.sqrt(k)) * (1 + 1 / 3)


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
    if moe:
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

    def go(*ts):
        return body, ts

    if moe and fmt == 1:
        @cute.kernel
        def moe_gate_up_kernel(h: cute.Tensor, ex: cute.Tensor, gc: cute.Tensor,
                               gs: cute.Tensor, g2: cute.Tensor, uc: cute.Tensor,
                               us: cute.Tensor, u2: cute.Tensor, sgc: cute.Tensor,
                               sgs: cute.Tensor, sg2: cute.Tensor, suc: cute.Tensor,
                               sus: cute.Tensor, su2: cute.Tensor, act: cute.Tensor,
                               act_sh: cute.Tensor):
            body([h, ex, gc, gs, g2, uc, us, u2, sgc, sgs, sg2, suc, sus, su2, act, act_sh])

        @cute.jit
        def moe_gate_up(h: cute.Tensor, ex: cute.Tensor, gc: cute.Tensor, gs: cute.Tensor,
                        g2: cute.Tensor, uc: cute.Tensor, us: cute.Tensor, u2: cute.Tensor,
                        sgc: cute.Tensor, sgs: cute.Tensor, sg2: cute.Tensor,
                        suc: cute.Tensor, sus: cute.Tensor, su2: cute.Tensor,
                        act: cute.Tensor, act_sh: cute.Tensor, stream: cuda.CUstream):
            moe_gate_up_kernel(h, ex, gc, gs, g2, uc, us, u2, sgc, sgs, sg2, suc, sus, su2, act,
                               act_sh).launch(grid=launch.grid, block=launch.block,
                                              smem=launch.smem, stream=stream, use_pdl=True)
    elif moe:
        @cute.kernel
        def moe_gate_up_kernel(h: cute.Tensor, ex: cute.Tensor, gw: cute.Tensor,
                               uw: cute.Tensor, sgw: cute.Tensor, suw: cute.Tensor,
                               act: cute.Tensor, act_sh: cute.Tensor):
            body([h, ex, gw, uw, sgw, suw, act, act_sh])

        @cute.jit
        def moe_gate_up(h: cute.Tensor, ex: cute.Tensor, gw: cute.Tensor, uw: cute.Tensor,
                        sgw: cute.Tensor, suw: cute.Tensor, act: cute.Tensor,
                        act_sh: cute.Tensor, stream: cuda.CUstream):
            moe_gate_up_kernel(h, ex, gw, uw, sgw, suw, act, act_sh).launch(
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
