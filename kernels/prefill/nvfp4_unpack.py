"""NVFP4 expert stacks decoded into a BF16 scratch (the prefill's per-layer decode before the
grouped expert GEMMs, capture/prefill.py): out = bf16(e2m1(code) · ue4m3(scale) · scale2[e]),
computed in fp32 and rounded once, i.e. `reference`'s dequantised weight (`nvfp4.dequantize`)
rounded to bf16.

Layout (weights.NVFP4Weight, NVIDIA order): the stack [E, N, K] is seen flat as S = E·N·K/16
sub-blocks of 16 values: codes u8 [S, 8] (element 2i in the low nibble of byte i), scales u8
[S] (unsigned E4M3, bit 7 ignored, 0x00 and 0x7F are zero, as `nvfp4._ue4m3_value`), scale2
f32 [E] (sub-block s belongs to expert s // SPE, SPE = N·K/16 sub-blocks per expert), out bf16
[S, 16]. One thread per sub-block: 8 code bytes and a scale byte in, 32 bytes out; a memory-bound
stream (2.56 bytes moved per value).

SKIP = 1 (the expert stacks): counts i32 [E] (pairs per expert, the prefill's routing result)
is an input, and sub-blocks of experts with no pair are skipped: their out rows keep whatever
was there (nothing reads them: their GEMM groups are empty). A short prompt touches few experts
(25 tokens pick ~114 of 256 per layer), so it decodes (and the GEMMs read) only those.

PDL: SKIP = 0 reads only weights, all before `griddepcontrol.wait`; the wait guards its stores
(the scratch it writes is what the previous layer's expert GEMMs read). SKIP = 1 reads counts
(an input) after the wait, in every thread, then its codes and scales (only the needed ones: a
prefetch before the wait would read every expert); only its expert's scale2 word is loaded
before the wait.
Tolerance (GPU test): bitwise equal to `nvfp4.dequantize(..., float32)` rounded to bf16 where
decoded; with SKIP, skipped experts' rows untouched (still the NaN poison).
"""

import torch

from flint_graph.checkpoints import nvfp4
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, Spec, TensorArg

THREADS = 256
# SPE of the one-matrix specialisation (E = 1): every sub-block takes scale2[0]. The prefill
# decodes dense NVFP4 projections with it and scale2 = 1, applying their scale2 in fp32 after
# the GEMM.
DENSE_SPE = 1 << 30


def _args(spec: Spec):
    if spec["E"] < 1 or spec["SPE"] < 1:
        raise ValueError(f"nvfp4_unpack: E = {spec['E']}, SPE = {spec['SPE']}; expected ≥ 1")
    if spec["SKIP"] not in (0, 1):
        raise ValueError(f"nvfp4_unpack: SKIP = {spec['SKIP']}; expected 0 or 1")
    args = [TensorArg("codes", "u8", ("S", 8), "weight", align=8),
            TensorArg("scales", "u8", ("S",), "weight", align=1),
            TensorArg("scale2", "f32", (spec["E"],), "weight", align=4)]
    if spec["SKIP"]:
        args.append(TensorArg("counts", "i32", (spec["E"],), "input", align=4))
    return (*args, TensorArg("out", "bf16", ("S", 16), "output"))


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(("S", THREADS), 1, 1), block=(THREADS, 1, 1))


def _specs(cfg, buckets=()) -> list[Spec]:
    """The one-matrix specialisation, and one per expert stack shape of `cfg` (gate/up
    [M, H], down [H, M])."""
    e, h, m = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
    out = [KERNEL.spec(E=1, SPE=DENSE_SPE, SKIP=0)]
    if e:  # gate, up and down have M·H values per expert alike
        out.append(KERNEL.spec(E=e, SPE=m * h // 16, SKIP=1))
    return out


def _reference(spec: Spec, codes, scales, scale2, *rest):
    """(out,): the flat sub-blocks decoded exactly in fp32, rounded once to bf16 (with SKIP,
    experts whose count is 0 keep `out`'s values)."""
    s = codes.shape[0]
    e = torch.arange(s, device=codes.device) // spec["SPE"]
    vals = nvfp4.dequantize(codes.view(s, 1, 8), scales.view(s, 1, 1), torch.tensor(1.0),
                            torch.float32).view(s, 16)
    res = (vals * scale2.float()[e, None]).to(torch.bfloat16)
    if spec["SKIP"]:
        counts, out = rest
        res = torch.where((counts[e] != 0)[:, None], res, out)
    return (res,)


def make_args(spec: Spec, *, gen: torch.Generator, experts: int | None = None,
              device: str = "cuda") -> list:
    """Random codes and scale bytes (every byte value, 0x7F and bit 7 included), scale2 not a
    power of two, out poisoned with NaN, for `experts` experts (default E); the one-matrix
    specialisation gets 4096 sub-blocks. With SKIP, counts are random in 0 … 3 (about a
    quarter of the experts skipped), expert 0 nonzero."""
    e = experts or spec["E"]
    if not 1 <= e <= spec["E"]:
        raise ValueError(f"experts = {e}: expected 1 … E = {spec['E']}")
    s = e * min(spec["SPE"], 4096)
    on = gen.device
    codes = torch.randint(0, 256, (s, 8), generator=gen, device=on, dtype=torch.int32)
    scales = torch.randint(0, 256, (s,), generator=gen, device=on, dtype=torch.int32)
    scale2 = torch.rand(spec["E"], generator=gen, device=on) * 1e-3 + 1e-4
    out = torch.full((s, 16), float("nan"), dtype=torch.bfloat16, device=on)
    args = [codes.to(torch.uint8), scales.to(torch.uint8), scale2]
    if spec["SKIP"]:
        counts = torch.randint(0, 4, (spec["E"],), generator=gen, device=on, dtype=torch.int32)
        counts[0] = 1
        args.append(counts)
    return [t.to(device) for t in (*args, out)]


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Int64, Uint32

    from flint_graph.kernels.toolchain import dsl_util as du

    spe, skip = spec["SPE"], spec["SKIP"]
    launch = _launch(spec)

    def scales_of(b, sc2):
        """(scale2, the sub-block's E4M3 scale) as fp32 from scale byte b and scale2 bits."""
        s2 = du.as_f32(sc2)
        ex = (b >> 3) & Uint32(15)
        man = b & Uint32(7)
        normal = du.as_f32(((ex + Uint32(120)) << 23) | (man << 20))
        sub = Float32(man) * Float32(2.0 ** -9)
        sc = cutlass.select_(ex == Uint32(0), sub, normal)
        sc = cutlass.select_((b == Uint32(0)) | (b == Uint32(0x7F)), Float32(0.0), sc)
        return s2, sc

    def store(s, w, s2, sc, mo):
        """The 16 values of sub-block s (code words w) times sc·s2, as bf16 into out row s."""
        words = []
        for i in range(8):  # value pairs (2i, 2i + 1) share byte i (unrolled at trace time)
            byte = (w[i // 4] >> (8 * (i % 4))) & Uint32(0xFF)
            pair = []
            for nib in range(2):
                c = (byte >> (4 * nib)) & Uint32(15)
                m = Float32(c & Uint32(7))
                mag = cutlass.select_(m < Float32(4.0), m * Float32(0.5),
                                      cutlass.select_(m < Float32(6.0), m - Float32(2.0),
                                                      m * Float32(2.0) - Float32(8.0)))
                v = (mag * sc) * s2  # e2m1·e4m3 is exact; one fp32 rounding, as the reference
                # code 8 is +0, as `nvfp4._tables` has it
                neg = ((c & Uint32(8)) != Uint32(0)) & (m != Float32(0.0))
                pair.append(cutlass.select_(neg, -v, v))
            words.append(du.pack_bf16(pair[0], pair[1]))
        ob = mo.iterator.toint() + Int64(s) * 32
        du.st_v4(ob, words[:4])
        du.st_v4(ob + 16, words[4:])

    def load(mc, ms, m2, s):
        """Sub-block s's weights: code words, scale byte, its expert's scale2 bits."""
        w = du.ld_weight_v2(mc.iterator.toint() + Int64(s) * 8)
        b = du.ld_weight_u8(ms.iterator.toint() + Int64(s))
        sc2 = du.ld_weight_u32(m2.iterator.toint() + Int64(s // spe) * 4)
        return w, b, sc2

    if skip:
        @cute.kernel
        def nvfp4_unpack_kernel(mc: cute.Tensor, ms: cute.Tensor, m2: cute.Tensor,
                                mn: cute.Tensor, mo: cute.Tensor):
            tid, _, _ = cute.arch.thread_idx()
            bx, _, _ = cute.arch.block_idx()
            s = bx * THREADS + tid
            # the expert's scale2 (one word per CTA) is the weight worth having in flight
            e = cutlass.min(s, mc.shape[0] - 1) // spe
            sc2 = du.ld_weight_u32(m2.iterator.toint() + Int64(e) * 4)
            du.griddepcontrol_wait_after_values([sc2])
            if s < mc.shape[0]:
                if du.ld_u32(mn.iterator.toint() + Int64(e) * 4) != Uint32(0):
                    w = du.ld_weight_v2(mc.iterator.toint() + Int64(s) * 8)
                    b = du.ld_weight_u8(ms.iterator.toint() + Int64(s))
                    s2, sc = scales_of(b, sc2)
                    store(s, w, s2, sc, mo)

        @cute.jit
        def nvfp4_unpack(mc: cute.Tensor, ms: cute.Tensor, m2: cute.Tensor, mn: cute.Tensor,
                         mo: cute.Tensor, stream: cuda.CUstream):
            nvfp4_unpack_kernel(mc, ms, m2, mn, mo).launch(
                grid=(cute.ceil_div(mc.shape[0], THREADS), 1, 1), block=list(launch.block),
                stream=stream)

        return nvfp4_unpack

    @cute.kernel
    def nvfp4_unpack_kernel(mc: cute.Tensor, ms: cute.Tensor, m2: cute.Tensor, mo: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        bx, _, _ = cute.arch.block_idx()
        s = bx * THREADS + tid
        if s < mc.shape[0]:
            w, b, sc2 = load(mc, ms, m2, s)
            s2, sc = scales_of(b, sc2)
            du.griddepcontrol_wait_after_values([w[0], w[1], b, sc2])
            store(s, w, s2, sc, mo)

    @cute.jit
    def nvfp4_unpack(mc: cute.Tensor, ms: cute.Tensor, m2: cute.Tensor, mo: cute.Tensor,
                     stream: cuda.CUstream):
        nvfp4_unpack_kernel(mc, ms, m2, mo).launch(
            grid=(cute.ceil_div(mc.shape[0], THREADS), 1, 1), block=list(launch.block),
            stream=stream)

    return nvfp4_unpack


KERNEL = KernelDef(name="nvfp4_unpack", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",))
