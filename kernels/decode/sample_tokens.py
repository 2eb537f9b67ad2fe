"""Fused sampler for decode rows: bf16 logits [B, V] -> one int64 token id per row, one launch.

Replaces flint_graph.runtime.sampling.sample (sort + cumsums, ~80 graph nodes) at the end of the decode
step. Contract, exact (`_reference` is it in torch; the kernel must match it id for id). Per row b,
l_i = float32(logits[b, i]) for ids i < VLIM (ids >= VLIM are never chosen), NaN read as -inf and
-0 as +0. Rank order: descending l, ties by ascending id.
- Greedy unless temperature[b] > 0 (0, negative and NaN are greedy), and when every l_i is -inf:
  the first id in rank order (argmax, lowest id on ties; id 0 for an all -inf/NaN row).
- Weights: c = f32(log2 e) / T; for l_i = l_max, q_i = 2^40; else z = (l_i - l_max) * c, q_i = 0
  unless z >= -40.5, n = z rounded to the nearest integer (ties to even: add, then subtract
  1.5 * 2^23), f = z - n, p = sum_{k <= 7} f32((ln 2)^k / k!) f^k by Horner (one mul and one add per
  step) and q_i = floor(p * 2^(40 + n)). Every fp32 operation is one IEEE round-to-nearest op (PTX
  .rn: never fused into an FMA, subnormals kept), so torch on the CPU reproduces each q bit for bit;
  q is within ~2e-6 relative of 2^40 * exp((l_i - l_max) / T) (p ~ 2^f to 1e-7, plus z's rounding).
- top-k: k = top_k[b]; 0 < k < VLIM keeps the first k ranks, else all. Mk = sum of their q.
- top-p: p = top_p[b]; if p < 1 (not NaN): P = trunc(f64(max(p, 0)) * f64(Mk)), rank r stays iff
  r == 0 or (sum of q over ranks < r) < P, among the top-k.
- draw: u = flint_graph.runtime.sampling.counter_uniform(seed, draw_index) (splitmix64, f64 in (0, 1)),
  M = sum of the kept q, t = min(trunc(u * f64(M)), M - 1); the token is the first kept rank
  whose inclusive prefix of q exceeds t (so a q = 0 token is never drawn).
Why integers: sums of q are exact in any order, so however the row is split over CTAs and in
whatever order atomics land, the id is the same (deterministic and batch-invariant). Against
sample's f64 softmax CDF the token is the same unless u (or top-p's threshold) falls within the
fp32 weight error, ~2e-6 relative, of a CDF step.
Why no sort: equal bf16 values have equal q, so counts over the 65536 order-preserving 16-bit keys
of the logits hold the whole ranked distribution; each cut is found in 256 bins (the key's high
byte) and then in the 256 keys of one bin, and the chosen rank is (key, j-th token of that key).

Design: grid (C, B), C = min(16, ceil(VLIM / 8192)) CTAs per row of 512 threads, one id range of
the row each. Every CTA counts its tokens' keys in a shared-memory histogram (2 x u16 per word;
equal keys within a chunk or a warp are added once) and its best (key, lowest id). Sampled rows
then publish every key the CTA holds: total[key] += count (red.global.add), part[key][rank] =
count, one bit per key in bitmap[]; the best goes to ctl[1] by a 64-bit atomic max. The last CTA
of the row to arrive (counter in ctl[0], fence + atomic as moe_router) finishes alone: greedy
rows read their id from ctl[1]; sampled rows stage the totals of the first 128 live bins holding
keys (live: z >= -40.5 at the bin's top key; below, every q is 0; further live bins are read from
L2 when needed) into shared memory with cp.async, compute each bin's count and mass (q per key,
not per token), walk the cuts with warp scans over bins and then keys, find the owning CTA from
part[] and rescan that CTA's slice of the row for the j-th token of the key. It then zeroes every
word the row wrote (workspaces are zero before and after). No spin-waits: nothing can hang.
Top-k path (sampled rows with 0 < top_k <= KFAST = 64 and top_k < VLIM; Flint's default is 20):
the walk above is a chain of dependent shared-memory and L2 round trips in one CTA (measured on
an H100, 2026-12-05, `tools/probe_sampler.py`: 48.6 us with no top-k and 56.4 us with top-k 20
and top-p 0.95 at V = 151,552, against 4.4 us greedy), but top-k needs only k ranks, and every
one of the row's first k ranks is among the first k ranks of the CTA holding it. So each CTA
finds its own cut from its histogram (bin counts, then the key counts of one bin: the key at
which its descending count reaches k) and gathers its first min(k, ids) ranks as (key << 32 |
~id), whose descending order is the rank order (key desc, id asc): every id above the cut
(fewer than k, slots from a shared counter) and the cut key's ids in id order up to k (a block
scan), or every id when it holds fewer than k. One warp sorts those 64 slots (empty ones are 0,
which sorts last) in registers (bitonic, shuffles) and writes them to cand[row, CTA]. Nothing
is published to total/part/bitmap. The last CTA reads and zeroes the C x 64 slots and merges
the sorted lists pairwise, one warp a pair, keeping each pair's first 64 (max of one list and
the other reversed is bitonic and holds them; 6 shuffle stages sort it): log2(C) levels, one
barrier each. Warp 0 then finishes with lane l holding ranks 2l, 2l + 1: q of each, an
inclusive scan (Mk), top-p's prefix, the draw's first rank past t. The ids are those of the
histogram path by construction (tests/test_sample_tokens.py models both).
Why not a thread-block cluster: the DSL keeps cluster dims out of the cubin and the launcher
sets none, so a cluster launch is not available to the AOT path.
PDL: nothing is read before griddepcontrol.wait (no weights); launch_dependents follows it.
Shape legend: B batch bucket, V logits per row (LM-head rows), VLIM ids that may be chosen.
"""

import math
import struct
from types import SimpleNamespace

from flint_graph.kernels.toolchain.spec import BUCKETS, KernelDef, Launch, Spec, TensorArg

NT = 512  # threads per CTA
WARPS = NT // 32
KEYS = 1 << 16  # order-preserving keys of a bf16 value
BINS = 256  # a key's high byte
STAGED = 128  # bins whose key counts the last CTA stages in shared memory (the histogram's room)
KEY_NEG_INF = 0x007F  # key of -inf, and of NaN
Q_ONE = 1 << 40  # q of the top token
LIVE_Z = -40.5  # below: q = 0
MAGIC = 12582912.0  # 1.5 * 2^23: z + MAGIC - MAGIC is z rounded to an integer (|z| < 2^22)
# predicated global writes ($0 address, $1 value)
RED_ADD, RED_OR = "@p red.global.add.u32 [$0], $1;", "@p red.global.or.b32 [$0], $1;"
ST32 = "@p st.global.u32 [$0], $1;"
ST16 = ".reg .b16 h; cvt.u16.u32 h, $1; @p st.global.u16 [$0], h;"


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


KFAST = 64  # rows with 0 < top_k <= KFAST take the top-k path (module docstring)
LOG2E = _f32(1 / math.log(2))
COEF = [1.0] + [_f32(math.log(2) ** k / math.factorial(k)) for k in range(1, 8)]
_GOLDEN, _MUL1, _MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def split(vlim: int) -> tuple[int, int, int, int, int]:
    """(CTAs per row, ids per CTA, 16-byte chunks per CTA, chunks per thread, part words per key).
    A CTA's per-key counts are u16: at most 65535 ids per CTA."""
    ctas = max(1, min(16, -(-vlim // 8192)))
    chunks = -(-vlim // (8 * ctas))
    if 8 * chunks > 0xFFFF:
        raise ValueError(f"sample_tokens: VLIM {vlim} too large (at most {16 * 0xFFF8})")
    return ctas, 8 * chunks, chunks, -(-chunks // NT), -(-ctas // 2)


def nsort(vlim: int) -> int:
    """Entries the last CTA sorts on the top-k path: CTAs x KFAST candidates, to a power of 2."""
    return 1 << (split(vlim)[0] * KFAST - 1).bit_length()


def _args(spec: Spec):
    b, v, vlim = spec["B"], spec["V"], spec["VLIM"]
    if not 1 <= vlim <= v:
        raise ValueError(f"VLIM {vlim} must be in 1..V = {v}")
    ctas, pw = split(vlim)[0], split(vlim)[4]
    return (TensorArg("logits", "bf16", (b, v), "input"),
            TensorArg("temperature", "f32", (b,), "input", align=4),
            TensorArg("top_k", "i32", (b,), "input", align=4),
            TensorArg("top_p", "f32", (b,), "input", align=4),
            TensorArg("seeds", "i64", (b,), "input", align=8),
            TensorArg("draw_index", "i64", (b,), "input", align=8),
            TensorArg("ids", "i64", (b,), "output", align=8),
            TensorArg("ctl", "i64", (b, 2), "workspace", align=8),
            TensorArg("bitmap", "i32", (b, KEYS // 32), "workspace"),
            TensorArg("total", "i32", (b, KEYS), "workspace"),
            TensorArg("part", "i32", (b, KEYS * pw), "workspace"),
            TensorArg("cand", "i64", (b, ctas * KFAST), "workspace", align=8))


def _smem_sizes(spec: Spec) -> list[int]:
    nch = split(spec["VLIM"])[3]
    # hist/stage, bitmap copy, bin slots, bin counts, bin masses, key counts, key q, scratch,
    # the top-k path's sort and candidate counter
    return [4 * KEYS // 2, 4 * KEYS // 32, 4 * BINS, 4 * BINS, 8 * BINS, 4 * NT, 8 * NT,
            4 * (nch + 2) * WARPS, 8 * 2, 8 * nsort(spec["VLIM"]), 4 * 4]


def _launch(spec: Spec) -> Launch:
    return Launch(grid=(split(spec["VLIM"])[0], spec["B"], 1), block=(NT, 1, 1),
                  smem=sum(-(-n // 16) * 16 for n in _smem_sizes(spec)))


def _specs(cfg, buckets=BUCKETS) -> list[Spec]:
    return [KERNEL.spec(B=b, V=cfg.vocab_size, VLIM=cfg.vocab_size) for b in buckets]


def bench_specs(cfg, buckets=BUCKETS) -> list[Spec]:
    """The model's specs plus VLIM = V - 229 (a tokenizer smaller than the LM head; not a multiple
    of 8, so a chunk is cut) at the smallest and largest bucket, for the GPU tests."""
    short = [KERNEL.spec(B=b, V=cfg.vocab_size, VLIM=cfg.vocab_size - 229)
             for b in sorted({min(buckets), max(buckets)})]
    return _specs(cfg, buckets) + short


def weights(l, lmax, temperature: float):
    """q (int64) of fp32 logits l (NaN already -inf) against the row max, as the kernel computes it."""
    import torch

    f32 = torch.float32

    def k(x):
        return torch.tensor(x, dtype=f32)

    z = (l - lmax) * (k(LOG2E) / k(temperature))
    n = (z + k(MAGIC)) - k(MAGIC)
    f = z - n
    p = torch.full_like(f, COEF[7])
    for ck in reversed(COEF[:7]):
        p = p * f + k(ck)  # two roundings, as mul.rn then add.rn
    q = torch.floor(p.double() * torch.exp2(40.0 + n.double()))
    q = torch.where(z >= LIVE_Z, q, 0.0)
    return torch.where(l == lmax, float(Q_ONE), q).long()


def reference_row(l, temperature: float, top_k: int, top_p: float, u: float) -> int:
    """The chosen id of one row: l fp32 [VLIM] on the CPU, u = counter_uniform's draw."""
    import torch

    l = torch.where(l.isnan(), -math.inf, l)
    lmax = l.max()
    if not temperature > 0 or lmax == -math.inf:
        return int((l == lmax).nonzero()[0, 0])
    order = torch.sort(l, descending=True, stable=True).indices
    q = weights(l, lmax, temperature)[order]
    cum = q.cumsum(0)
    n = l.numel()
    kk = top_k if 0 < top_k < n else n
    kp = kk
    if top_p < 1:
        thr = int(max(top_p, 0.0) * float(cum[kk - 1]))
        kp = max(1, int(((cum - q)[:kk] < thr).sum()))
    m = int(cum[kp - 1])
    t = min(int(u * float(m)), m - 1)
    return int(order[int(torch.searchsorted(cum, torch.tensor(t), right=True))])


def _reference(spec: Spec, logits, temperature, top_k, top_p, seeds, draw_index, *workspaces):
    """ids int64 [B] (the workspaces are not read)."""
    import torch

    from flint_graph.runtime.sampling import counter_uniform

    u = counter_uniform(seeds.long().cpu(), draw_index.long().cpu())
    ids = [reference_row(logits[b, :spec["VLIM"]].float().cpu(), float(temperature[b]),
                         int(top_k[b]), float(top_p[b]), float(u[b]))
           for b in range(logits.shape[0])]
    return torch.tensor(ids, dtype=torch.int64, device=logits.device)


def make_args(spec: Spec, *, gen, device: str = "cuda", scale: float = 3.0, temperature=None,
              top_k=None, top_p=None, seeds=None, draw_index=None) -> list:
    """Fresh arguments in declared order: logits scale * N(0, 1) bf16; per-row parameters from
    the keyword lists (defaults: temperature 1, top_k 0, top_p 1, seeds and draw_index random);
    ids poisoned with -7; workspaces zero. Drawn on `gen`'s device, moved to `device`."""
    import torch

    b, v = spec["B"], spec["V"]
    on = gen.device

    def rows(x, default, dtype):
        return torch.tensor([default] * b if x is None else x, dtype=dtype)

    def rand63():
        return torch.randint(0, 2**62, (b,), generator=gen, device=on, dtype=torch.int64)

    args = [(scale * torch.randn(b, v, generator=gen, device=on)).bfloat16(),
            rows(temperature, 1.0, torch.float32), rows(top_k, 0, torch.int32),
            rows(top_p, 1.0, torch.float32),
            rand63() if seeds is None else rows(seeds, 0, torch.int64),
            rand63() if draw_index is None else rows(draw_index, 0, torch.int64),
            torch.full((b,), -7, dtype=torch.int64)]
    args += [torch.zeros(a.shape, dtype=torch.int64 if a.dtype == "i64" else torch.int32)
             for a in _args(spec)[7:]]
    return [t.to(device) for t in args]


def bytes_moved(spec: Spec, args) -> int:
    """Least DRAM bytes of one launch: the logits, the row parameters and the ids (the
    workspaces stay in L2)."""
    return spec["B"] * (2 * spec["V"] + 4 + 4 + 4 + 8 + 8 + 8)


def _build(spec: Spec):
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Float32, Float64, Int32, Int64, Uint32, Uint64
    from cutlass._mlir.dialects import llvm
    from cutlass.cutlass_dsl import T

    from flint_graph.kernels.toolchain import dsl_util as du

    vlim = spec["VLIM"]
    row_elems = spec["V"]
    ctas, per_cta, chunks, nch, pw = split(vlim)
    vchunks = -(-vlim // 8)  # chunks holding a choosable id
    launch = _launch(spec)
    ns = nsort(vlim)

    def sel(c, a, b):  # select_ keeping a's type (select_ alone drops signedness)
        return type(a)(cutlass.select_(c, a, b))

    def asm(ret, args, text, cons, side=True):
        return llvm.inline_asm(ret, args, text, cons, has_side_effects=side, is_align_stack=False,
                               asm_dialect=llvm.AsmDialect.AD_ATT)

    def r32(x):
        return Uint32(x).ir_value()

    def r64(x):
        return Int64(x).ir_value()

    def pred(n, body):  # run `body` where operand n is nonzero
        return f"{{ .reg .pred p; setp.ne.b32 p, ${n}, 0; {body} }}"

    def fop(op, a, b):  # one IEEE fp32 op, round to nearest: ptxas never fuses .rn ops
        return Float32(asm(T.f32(), [Float32(a).ir_value(), Float32(b).ir_value()],
                           f"{op}.rn.f32 $0, $1, $2;", "=f,f,f", side=False))

    def dmul(a, b):
        return Float64(asm(T.f64(), [Float64(a).ir_value(), Float64(b).ir_value()],
                           "mul.rn.f64 $0, $1, $2;", "=d,d,d", side=False))

    def bits(x):
        return Uint32(llvm.bitcast(T.i32(), Float32(x).ir_value()))

    def ld_v4_if(a, ok):  # 16 logits bytes (plain ld.global: a predecessor wrote them), or 0
        res = asm(llvm.StructType.get_literal([T.i32()] * 4), [r64(a), r32(ok)], pred(
            5, "@p ld.global.v4.u32 {$0, $1, $2, $3}, [$4]; @!p mov.b32 $0, 0; "
               "@!p mov.b32 $1, 0; @!p mov.b32 $2, 0; @!p mov.b32 $3, 0;"), "=r,=r,=r,=r,l,r")
        return [Uint32(llvm.extractvalue(T.i32(), res, [i])) for i in range(4)]

    def ld_cg_if(a, ok):  # a word other CTAs wrote (L2, never L1), or 0
        return Uint32(asm(T.i32(), [r64(a), r32(ok)],
                          pred(2, "@p ld.global.cg.u32 $0, [$1]; @!p mov.b32 $0, 0;"), "=r,l,r"))

    def mem_if(body, a, v, ok):  # a global store or reduction `body` ($0 address, $1 value)
        asm(None, [r64(a), r32(v), r32(ok)], pred(2, body), "l,r,r,~{memory}")

    def red_smem_if(a, v, ok):
        asm(None, [r32(a), r32(v), r32(ok)], pred(2, "@p red.shared.add.u32 [$0], $1;"),
            "r,r,r,~{memory}")

    def g64(op, a, v):  # 64-bit atom.global.add (returns the old value), red.global.max, st
        if op.startswith("atom"):
            return Uint64(asm(T.i64(), [r64(a), Uint64(v).ir_value()], f"{op} $0, [$1], $2;",
                              "=l,l,l,~{memory}"))
        asm(None, [r64(a), Uint64(v).ir_value()], f"{op} [$0], $1;", "l,l,~{memory}")

    def push_if(ctr, dst, key, gid, ok):
        """Where ok: slot i = atomic add on the shared counter at ctr, then the candidate
        (key << 32 | ~gid) to shared dst[i] (u64)."""
        asm(None, [r32(ctr), r32(dst), r32(key), r32(gid), r32(ok)],
            "{ .reg .pred p; .reg .b32 i, n, a; setp.ne.b32 p, $4, 0; "
            "@p atom.shared.add.u32 i, [$0], 1; @p mad.lo.u32 a, i, 8, $1; "
            "not.b32 n, $3; @p st.shared.v2.u32 [a], {n, $2}; }", "r,r,r,r,r,~{memory}")

    def put_if(dst, key, gid, ok):
        """Where ok: the candidate (key << 32 | ~gid) to shared dst (u64)."""
        asm(None, [r32(dst), r32(key), r32(gid), r32(ok)],
            "{ .reg .pred p; .reg .b32 n; setp.ne.b32 p, $3, 0; not.b32 n, $2; "
            "@p st.shared.v2.u32 [$0], {n, $1}; }", "r,r,r,r,~{memory}")

    def bitonic64(v0, v1, lane, sizes):
        """Bitonic stages over 64 u64 values, lane l holding elements 2l and 2l + 1 (in
        registers: shuffles, no barriers); sizes (2, 4, ..., 64) sorts descending, (64,)
        merges a bitonic sequence descending."""
        e = Uint32(2 * lane)
        for size in sizes:
            stride = size // 2
            while stride >= 1:
                desc = one((e & size) == 0)
                if stride == 1:  # both elements in this lane: the lower keeps the max if desc
                    swap = sel(desc != 0, one(v1 > v0), one(v0 > v1))
                    v0, v1 = sel(swap != 0, v1, v0), sel(swap != 0, v0, v1)
                else:
                    p0 = Uint64(cute.arch.shuffle_sync_bfly(v0, offset=stride // 2))
                    p1 = Uint64(cute.arch.shuffle_sync_bfly(v1, offset=stride // 2))
                    big = one(one((e & stride) == 0) == desc)
                    v0 = sel(big != 0, sel(p0 > v0, p0, v0), sel(p0 < v0, p0, v0))
                    v1 = sel(big != 0, sel(p1 > v1, p1, v1), sel(p1 < v1, p1, v1))
                stride //= 2
        return v0, v1

    def st64_if(a, v, ok):
        asm(None, [r64(a), Uint64(v).ir_value(), r32(ok)],
            "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p st.global.u64 [$0], $1; }",
            "l,l,r,~{memory}")

    def ld64_cg_if(a, ok):  # a u64 other CTAs wrote (L2), or 0
        return Uint64(asm(T.i64(), [r64(a), r32(ok)], pred(
            2, "@p ld.global.cg.u64 $0, [$1]; @!p mov.b64 $0, 0;"), "=l,l,r"))

    def uniform(seed, draw):
        """flint_graph.runtime.sampling.counter_uniform: splitmix64, then f64 in (0, 1)."""
        hsh = Uint64(seed) + Uint64(_GOLDEN)
        for r in range(2):
            hsh = (hsh ^ (hsh >> 30)) * Uint64(_MUL1)
            hsh = (hsh ^ (hsh >> 27)) * Uint64(_MUL2)
            hsh = hsh ^ (hsh >> 31)
            if r == 0:
                hsh = hsh + (Uint64(draw) + 1) * Uint64(_GOLDEN)
        return dmul(Float64(hsh >> 12) + Float64(0.5), Float64(2.0 ** -52))

    def cp4(s, g):  # 4 bytes global -> shared, asynchronous (no register, no stall)
        asm(None, [r32(s), r64(g)], "cp.async.ca.shared.global [$0], [$1], 4;", "r,l,~{memory}")

    def one(b):  # a condition as 0 / 1 (u32), for masks and predicates
        return sel(b, Uint32(1), Uint32(0))

    def ctz(x):
        return Int32(cute.arch.popc(Uint32(x) ^ (Uint32(x) - 1))) - 1

    def key_of(h):
        """Order-preserving key of the bf16 bits in h's low half (NaN -> -inf, -0 -> +0)."""
        a = h & 0x7FFF
        h = sel(a > 0x7F80, Uint32(0xFF80), sel(a == 0, Uint32(0), h & 0xFFFF))
        return h ^ (((h >> 15) * 0x7FFF) | 0x8000)

    def l_of(key):
        b = sel(key >= 0x8000, key ^ 0x8000, key ^ 0xFFFF)
        return du.as_f32(b << 16)

    def q_of(key, kmax, lmax, c):
        """q of a key (module docstring), 0 above kmax."""
        z = fop("mul", fop("sub", l_of(key), lmax), c)
        tt = fop("add", z, MAGIC)
        f = fop("sub", z, fop("sub", tt, MAGIC))
        p = Float32(COEF[7])
        for ck in reversed(COEF[:7]):
            p = fop("add", fop("mul", p, f), ck)
        pb = bits(p)
        s = Int32(bits(tt) - bits(Float32(MAGIC))) + Int32(pb >> 23) - 110  # 40 + n + exp - 23
        m = Uint64((pb & 0x7FFFFF) | 0x800000)
        q = sel(s >= 0, m << Uint64(cutlass.min(cutlass.max(s, 0), 40)),
                m >> Uint64(cutlass.min(cutlass.max(-s, 0), 63)))
        q = sel(z >= Float32(LIVE_Z), q, Uint64(0))
        return sel(key == kmax, Uint64(Q_ONE), sel(key > kmax, Uint64(0), q))

    def scan_up(x, lane, ty):  # inclusive warp scan of a ty value
        x = ty(x)
        for d in (1, 2, 4, 8, 16):
            y = ty(cute.arch.shuffle_sync_up(x, offset=d))
            x = sel(lane >= d, x + y, x)
        return x

    def before_in_id_order(masks, s_w, lane, warp):
        """For each of this thread's chunks (a mask of matching ids, bit e = the chunk's e-th
        id), how many matches the CTA's slice holds before the chunk in id order: warp scans,
        each warp's totals through shared memory (s_w), one barrier. ([Uint32] per chunk.)"""
        cnts = [Uint32(cute.arch.popc(m)) for m in masks]
        incl = []
        for jj in range(nch):
            incl.append(scan_up(cnts[jj], lane, Uint32))
            # the warp's total, stored by every lane (one value: no branch in a helper)
            s_w[WARPS * (jj + 1) + warp] = Uint32(cute.arch.shuffle_sync(incl[jj], offset=31))
        cute.arch.sync_threads()
        run, pres = Uint32(0), []
        for jj in range(nch):
            pre = run + incl[jj] - cnts[jj]
            for w in range(WARPS):
                v = s_w[WARPS * (jj + 1) + w]
                pre = pre + v * one(warp > w)
                run = run + v
            pres.append(pre)
        return pres, cnts

    def find(lane, cnt_of, mass_of, target, by_mass):
        """First of 256 entries, in the order 255, 254, ..., 0, where the running total of counts
        (or of masses, by_mass) reaches target: (index, counts before it, mass before it, total
        count, total mass). Lane l holds entries 255 - 8l - e; every lane gets the answer."""
        idx = [Int32(255) - lane * 8 - e for e in range(8)]
        cs = [Uint32(cnt_of(i)) for i in idx]
        ms = [Uint64(mass_of(i, n)) for i, n in zip(idx, cs)]
        sc, sm = cs[0], ms[0]
        for e in range(1, 8):
            sc, sm = sc + cs[e], sm + ms[e]
        ic, im = scan_up(sc, lane, Uint32), scan_up(sm, lane, Uint64)
        rc, rm = ic - sc, im - sm
        he, bc, bm = Int32(8), rc, rm
        for e in range(8):
            nc, nm = rc + cs[e], rm + ms[e]
            hit = ((nm if by_mass else Uint64(nc)) >= target) & (he == 8)
            he, bc, bm = sel(hit, Int32(e), he), sel(hit, rc, bc), sel(hit, rm, bm)
            rc, rm = nc, nm
        ball = Uint32(cute.arch.vote_ballot_sync(he < 8))
        src = sel(ball != 0, ctz(ball), Int32(31))
        e = Int32(cute.arch.shuffle_sync(he, offset=src))
        return (Int32(255) - src * 8 - cutlass.min(e, 7),
                Uint32(cute.arch.shuffle_sync(bc, offset=src)),
                Uint64(cute.arch.shuffle_sync(bm, offset=src)),
                Uint32(cute.arch.shuffle_sync(ic, offset=31)),
                Uint64(cute.arch.shuffle_sync(im, offset=31)))

    def chunk_keys(row_addr, tid, cta, jj):
        """Chunk jj of this thread in CTA cta's slice: (chunk, 8 keys, 8 valid flags 0/1)."""
        c = tid + NT * jj
        ok = one((c < chunks) & (cta * chunks + c < vchunks))
        w = ld_v4_if(row_addr + Int64(cta * chunks + c) * 16, ok)
        keys = [key_of(w[e // 2] >> (16 * (e % 2))) for e in range(8)]
        first = cta * per_cta + 8 * c
        return c, keys, [ok & one(first + e < vlim) for e in range(8)]

    def count_at(cx, key, slot):
        """Total count of a key in the row (0 where its bitmap bit is clear): staged in shared
        memory for slot >= 0, else read from the totals."""
        on = (cx.bmp[Int32(key >> 5)] >> (key & 31)) & 1
        staged = cx.hist[cutlass.max(slot, 0) * 256 + Int32(key & 255)]
        far = ld_cg_if(cx.tot + Int64(key) * 4, on & one(slot < 0))
        return sel(slot >= 0, staged, far) * on

    def locate(cx, target, by_mass):
        """Where the running count (by_mass: mass) over ranks reaches target: (key, ranks before
        the key, mass before the key, q of the key). Bins first, then the bin's 256 keys."""
        hh, nb, mb, _, _ = find(cx.lane, lambda i: cx.bc[i], lambda i, n: cx.bm[i], target,
                                by_mass)
        key = Uint32(hh * 256 + cx.tid % 256)
        n = count_at(cx, key, cx.slot[hh])
        q = q_of(key, cx.kmax, cx.lmax, cx.c)
        cute.arch.sync_threads()  # the previous locate's readers are done
        cx.kc[cx.tid] = n
        cx.kq[cx.tid] = q
        cute.arch.sync_threads()
        x, nk, mk, _, _ = find(cx.lane, lambda i: cx.kc[i], lambda i, n: Uint64(n) * cx.kq[i],
                               target - (mb if by_mass else Uint64(nb)), by_mass)
        return Uint32(hh * 256 + x), nb + nk, mb + mk, cx.kq[x]

    @cute.kernel
    def sample_tokens_kernel(mlog: cute.Tensor, mtemp: cute.Tensor, mtopk: cute.Tensor,
                             mtopp: cute.Tensor, mseed: cute.Tensor, mdraw: cute.Tensor,
                             mids: cute.Tensor, mctl: cute.Tensor, mbits: cute.Tensor,
                             mtot: cute.Tensor, mpart: cute.Tensor, mcand: cute.Tensor):
        tid, _, _ = cute.arch.thread_idx()
        rank, row, _ = cute.arch.block_idx()
        warp, lane = tid // 32, tid % 32
        smem = cutlass.memory.SmemAllocator()
        s_hist = smem.allocate_tensor(Uint32, cute.make_layout((KEYS // 2,)), 16)
        s_bmp = smem.allocate_tensor(Uint32, cute.make_layout((KEYS // 32,)), 16)
        s_slot = smem.allocate_tensor(Int32, cute.make_layout((BINS,)), 16)
        s_bc = smem.allocate_tensor(Uint32, cute.make_layout((BINS,)), 16)
        s_bm = smem.allocate_tensor(Uint64, cute.make_layout((BINS,)), 16)
        s_kc = smem.allocate_tensor(Uint32, cute.make_layout((NT,)), 16)
        s_kq = smem.allocate_tensor(Uint64, cute.make_layout((NT,)), 16)
        s_w = smem.allocate_tensor(Uint32, cute.make_layout(((nch + 2) * WARPS,)), 16)
        s_x = smem.allocate_tensor(Uint64, cute.make_layout((2,)), 16)
        s_sort = smem.allocate_tensor(Uint64, cute.make_layout((ns,)), 16)
        s_n = smem.allocate_tensor(Uint32, cute.make_layout((4,)), 16)
        hist = Uint32(s_hist.iterator.toint())
        for i in cutlass.range_constexpr(KEYS // 8 // NT):  # zeroed under the predecessor's tail
            asm(None, [r32(hist + Uint32(tid + NT * i) * 16)], "{ .reg .b32 z; mov.b32 z, 0; "
                "st.shared.v4.u32 [$0], {z, z, z, z}; }", "r,~{memory}")
        du.griddepcontrol_wait_after_loads()
        cute.arch.griddepcontrol_launch_dependents()
        cute.arch.sync_threads()
        temp = mtemp[row]
        sampled = one(temp > Float32(0.0))  # 0 or 1; NaN is greedy
        k_row = mtopk[row]
        fast = sampled & one(k_row > 0) & one(k_row <= KFAST) & one(k_row < vlim)
        cbase = mcand.iterator.toint() + Int64(row) * (8 * ctas * KFAST)
        row_addr = mlog.iterator.toint() + Int64(row) * (2 * row_elems)
        ctl = mctl.iterator.toint() + Int64(row) * 16
        tot = mtot.iterator.toint() + Int64(row) * (4 * KEYS)
        part = mpart.iterator.toint() + Int64(row) * (4 * KEYS * pw)
        bmap = mbits.iterator.toint() + Int64(row) * (4 * KEYS // 32)

        # this CTA's keys: histogram (sampled rows) and best (key, lowest id), packed as an
        # Int32 whose signed order is that order (cutlass.max of unsigned values with a constant
        # operand lowers to a signed max: keep every max signed)
        best = Int32(-(2**31))
        for jj in cutlass.range_constexpr(nch):
            c, keys, valid = chunk_keys(row_addr, tid, rank, jj)
            uni = valid[0]
            for e in cutlass.range_constexpr(8):
                packed = Int32(((keys[e] ^ 0x8000) << 16) | Uint32(0xFFFF - 8 * c - e))
                best = cutlass.max(best, sel(valid[e] != 0, packed, Int32(-(2**31))))
                uni = uni & valid[e] & one(keys[e] == keys[0])
            if sampled != 0:  # equal keys in a chunk, or in a whole warp's chunks, add once
                cand = sel(uni != 0, keys[0], Uint32(0x10000) + Uint32(lane))
                split_ = one(cute.arch.warp_redux_sync(cand, "min")
                             != cute.arch.warp_redux_sync(cand, "max"))
                inc = sel(split_ != 0, Uint32(8), Uint32(256)) << ((keys[0] & 1) * 16)
                red_smem_if(hist + (keys[0] >> 1) * 4, inc, uni & (one(lane == 0) | split_))
                for e in cutlass.range_constexpr(8):
                    red_smem_if(hist + (keys[e] >> 1) * 4, Uint32(1) << ((keys[e] & 1) * 16),
                                valid[e] & (uni ^ 1))
        best = Int32(cute.arch.warp_redux_sync(best, "max"))
        if lane == 0:
            s_w[warp] = Uint32(best)
        cute.arch.sync_threads()
        if tid == 0:
            for w in cutlass.range_constexpr(1, WARPS):
                best = cutlass.max(best, Int32(s_w[w]))
            if best != -(2**31):
                key = (Uint32(best) >> 16) ^ 0x8000
                gid = Uint32(rank * per_cta) + Uint32(0xFFFF) - (Uint32(best) & 0xFFFF)
                g64("red.global.max.u64", ctl + 8, (Uint64(key) << 32) | Uint64(~gid))

        if fast != 0:  # top-k path: this CTA's first min(k, its ids) ranks go to cand[row, rank]
            kk = Uint32(k_row)
            for i in cutlass.range_constexpr(BINS // WARPS):  # bin counts (warp w: 16 bins)
                hb = warp * (BINS // WARPS) + i
                n = Uint32(0)
                for e in cutlass.range_constexpr(4):
                    w = s_hist[hb * 128 + lane + 32 * e]
                    n = n + (w & 0xFFFF) + (w >> 16)
                n = Uint32(cute.arch.warp_redux_sync(n, "add"))
                if lane == 0:
                    s_bc[hb] = n
            if tid == 0:
                s_n[0] = Uint32(0)
            if tid < KFAST:
                s_sort[tid] = Uint64(0)
            cute.arch.sync_threads()
            hb, nb, _, ntot, _ = find(lane, lambda i: s_bc[i], lambda i, n: Uint64(0),
                                      Uint64(kk), False)
            if tid < 256:
                w = s_hist[hb * 128 + (tid >> 1)]
                s_kc[tid] = (w >> ((tid & 1) * 16)) & 0xFFFF
            cute.arch.sync_threads()
            x, nk, _, _, _ = find(lane, lambda i: s_kc[i], lambda i, n: Uint64(0),
                                  Uint64(kk - nb), False)
            # the cut key: every id above it, then ids of the cut key in id order up to k
            # (all ids when the CTA holds fewer than k)
            every = one(ntot < kk)
            cut = sel(every != 0, Uint32(0), Uint32(hb * 256 + x))
            above = sel(every != 0, Uint32(0), nb + nk)
            quota = kk - above
            sbase = Uint32(s_sort.iterator.toint())
            ctr = Uint32(s_n.iterator.toint())
            masks = []
            for jj in cutlass.range_constexpr(nch):
                cc, keys, valid = chunk_keys(row_addr, tid, rank, jj)
                first = Uint32(rank * per_cta) + 8 * Uint32(cc)
                me = Uint32(0)
                for e in cutlass.range_constexpr(8):
                    gt = valid[e] & (one(keys[e] > cut) | every)
                    push_if(ctr, sbase, keys[e], first + e, gt)
                    me = me | ((valid[e] & one(keys[e] == cut) & (every ^ 1)) << e)
                masks.append(me)
            pres, _ = before_in_id_order(masks, s_w, lane, warp)
            for jj in cutlass.range_constexpr(nch):
                pre, me = pres[jj], masks[jj]
                first = Uint32(rank * per_cta) + 8 * Uint32(tid + NT * jj)
                for e in cutlass.range_constexpr(8):
                    j = pre + Uint32(cute.arch.popc(me & Uint32((1 << e) - 1)))
                    put_if(sbase + (above + j) * 8, cut, first + e,
                           ((me >> e) & 1) & one(j < quota))
            cute.arch.sync_threads()
            if warp == 0:  # sorted by rank, to cand[row, rank]: the last CTA only merges
                v0, v1 = bitonic64(s_sort[2 * lane], s_sort[2 * lane + 1], lane,
                                   (2, 4, 8, 16, 32, 64))
                out = cbase + Int64(rank * KFAST + 2 * lane) * 8
                st64_if(out, v0, Uint32(1))
                st64_if(out + 8, v1, Uint32(1))

        if (sampled != 0) & (fast == 0):  # publish every key this CTA holds
            for i in cutlass.range_constexpr(KEYS // 8 // NT):
                k0 = (tid + NT * i) * 8
                cnt = [(s_hist[k0 // 2 + e // 2] >> (16 * (e % 2))) & 0xFFFF for e in range(8)]
                m8 = Uint32(0)
                for e in cutlass.range_constexpr(8):
                    m8 = m8 | (one(cnt[e] != 0) << e)
                if cute.arch.vote_any_sync(m8 != 0):
                    m32 = m8 << Uint32((tid % 4) * 8)
                    m32 = m32 | Uint32(cute.arch.shuffle_sync_bfly(m32, offset=1))
                    m32 = m32 | Uint32(cute.arch.shuffle_sync_bfly(m32, offset=2))
                    mem_if(RED_OR, bmap + Int64(k0 // 32) * 4, m32,
                           one(tid % 4 == 0) & one(m32 != 0))
                    for e in cutlass.range_constexpr(8):
                        has = one(cnt[e] != 0)
                        mem_if(RED_ADD, tot + Int64(k0 + e) * 4, cnt[e], has)
                        mem_if(ST16, part + Int64((k0 + e) * 2 * pw + rank) * 2, cnt[e], has)

        # the last CTA of the row to arrive finishes it (grid-sync pattern: barrier, fence, atomic)
        cute.arch.sync_threads()
        if tid == 0:
            cute.arch.fence_acq_rel_gpu()
            old = g64("atom.global.add.u64", ctl, Uint64(1))
            s_x[0] = Uint64(0)
            if old == ctas - 1:
                cute.arch.fence_acq_rel_gpu()
                s_x[0] = Uint64(1)
                s_x[1] = Uint64(asm(T.i64(), [r64(ctl + 8)], "ld.global.cg.u64 $0, [$1];", "=l,l"))
        cute.arch.sync_threads()
        if s_x[0] != 0:
            gb = s_x[1]
            kmax = Uint32(gb >> 32)
            if ((sampled == 0) | (kmax == KEY_NEG_INF)) & (tid == 0):  # greedy: ctl[1]'s id
                mids[row] = Int64(Uint64(0xFFFFFFFF) - (gb & 0xFFFFFFFF))
            if (sampled != 0) & (fast == 0):
                for i in cutlass.range_constexpr(KEYS // 32 // NT):
                    s_bmp[tid + NT * i] = ld_cg_if(bmap + Int64(tid + NT * i) * 4, Uint32(1))
                cute.arch.sync_threads()
            if fast != 0:  # every CTA's candidates, sorted by rank (bitonic, descending)
                for i in cutlass.range_constexpr(-(-ns // NT)):
                    if tid + NT * i < ns:
                        e = tid + NT * i
                        on = one(e < ctas * KFAST)
                        s_sort[e] = ld64_cg_if(cbase + Int64(e) * 8, on)
                        st64_if(cbase + Int64(e) * 8, Uint64(0), on)  # workspaces end zero
                cute.arch.sync_threads()
                width = 1  # merge sorted lists pairwise, keeping each pair's first 64
                while width < ns // KFAST:
                    if warp < ns // KFAST // (2 * width):
                        a = warp * (2 * width * KFAST)
                        b = a + width * KFAST
                        v0 = s_sort[a + 2 * lane]
                        v1 = s_sort[a + 2 * lane + 1]
                        w0 = s_sort[b + KFAST - 1 - 2 * lane]
                        w1 = s_sort[b + KFAST - 2 - 2 * lane]
                        v0, v1 = bitonic64(sel(w0 > v0, w0, v0), sel(w1 > v1, w1, v1), lane,
                                           (64,))
                        s_sort[a + 2 * lane] = v0
                        s_sort[a + 2 * lane + 1] = v1
                    cute.arch.sync_threads()
                    width *= 2
            if (fast != 0) & (kmax != KEY_NEG_INF) & (warp == 0):
                # lane l holds ranks 2l and 2l + 1 (k <= 64): weights, top-p, the draw
                kk = Uint32(k_row)
                lmax = l_of(kmax)
                cscale = fop("div", LOG2E, temp)
                r0 = Uint32(2 * lane)
                v0, v1 = s_sort[2 * lane], s_sort[2 * lane + 1]
                q0 = sel(r0 < kk, q_of(Uint32(v0 >> 32), kmax, lmax, cscale), Uint64(0))
                q1 = sel(r0 + 1 < kk, q_of(Uint32(v1 >> 32), kmax, lmax, cscale), Uint64(0))
                c1 = scan_up(q0 + q1, lane, Uint64)  # inclusive prefix through rank 2l + 1
                c0 = c1 - q1
                keep0, keep1 = one(r0 < kk), one(r0 + 1 < kk)
                p = mtopp[row]
                if p < Float32(1.0):
                    mass_k = Uint64(cute.arch.shuffle_sync(c1, offset=31))
                    thr = Uint64(dmul(Float64(cutlass.max(p, Float32(0.0))), Float64(mass_k)))
                    keep0 = keep0 & (one(lane == 0) | one(c0 - q0 < thr))
                    keep1 = keep1 & one(c0 < thr)
                mass = q0 * Uint64(keep0) + q1 * Uint64(keep1)
                for d in cutlass.range_constexpr(5):
                    mass = mass + Uint64(cute.arch.shuffle_sync_bfly(mass, offset=16 >> d))
                u = uniform(mseed[row], mdraw[row])
                t = cutlass.min(Uint64(dmul(u, Float64(mass))), mass - 1)
                b0 = Uint32(cute.arch.vote_ballot_sync((keep0 & one(c0 > t)) != 0))
                b1 = Uint32(cute.arch.vote_ballot_sync((keep1 & one(c1 > t)) != 0))
                w0 = sel(b0 != 0, 2 * ctz(b0), Int32(64))
                w1 = sel(b1 != 0, 2 * ctz(b1) + 1, Int32(64))
                win = s_sort[cutlass.min(w0, w1)]
                if lane == 0:
                    mids[row] = Int64(Uint64(0xFFFFFFFF) - (win & 0xFFFFFFFF))
            if (sampled != 0) & (fast == 0) & (kmax != KEY_NEG_INF):
                hk = Int32(kmax >> 8)
                lmax = l_of(kmax)
                cscale = fop("div", LOG2E, temp)
                cx = SimpleNamespace(lane=lane, tid=tid, bmp=s_bmp, hist=s_hist, tot=tot, bc=s_bc,
                                     bm=s_bm, kc=s_kc, kq=s_kq, slot=s_slot, kmax=kmax,
                                     lmax=lmax, c=cscale)

                # live bins holding keys, descending: the first STAGED get a slot (else -1)
                h = BINS - 1 - (tid % BINS)
                nz = Uint32(0)
                for g in cutlass.range_constexpr(8):
                    nz = nz | s_bmp[h * 8 + g]
                z = fop("mul", fop("sub", l_of(Uint32(h * 256 + 255)), lmax), cscale)
                live = one(nz != 0) & (one(h == hk) | (one(h < hk) & one(z >= Float32(LIVE_Z))))
                ball = Uint32(cute.arch.vote_ballot_sync(live != 0))
                if (lane == 0) & (tid < BINS):
                    s_w[warp] = Uint32(cute.arch.popc(ball))
                cute.arch.sync_threads()
                before = Uint32(cute.arch.popc(ball & Uint32(cute.arch.lanemask_lt())))
                for w in cutlass.range_constexpr(BINS // 32):
                    before = before + s_w[w] * one(warp > w)
                if tid < BINS:
                    s_slot[h] = sel(live != 0, sel(before < STAGED, Int32(before), Int32(-1)),
                                    Int32(-2))
                cute.arch.sync_threads()
                # stage the totals of slotted bins (cp.async: one round trip for all of them)
                for i in cutlass.range_constexpr(KEYS // 32 // NT):
                    w = tid + NT * i
                    slot = s_slot[w // 8]
                    m = s_bmp[w] * one(slot >= 0)
                    while m != 0:
                        b = ctz(m)
                        cp4(hist + Uint32(slot * 256 + (w % 8) * 32 + b) * 4,
                            tot + Int64(w * 32 + b) * 4)
                        m = m & (m - 1)
                asm(None, [], "cp.async.wait_all;", "~{memory}")
                cute.arch.sync_threads()
                # count and mass of every bin (warp w: bins w, w + 16, ...)
                for i in cutlass.range(BINS // WARPS, unroll=1):
                    hb = warp + WARPS * i
                    slot = s_slot[hb]
                    nb, mb = Uint32(0), Uint64(0)
                    if slot >= -1:
                        for e in cutlass.range_constexpr(8):
                            key = Uint32(hb * 256 + lane * 8 + e)
                            n = count_at(cx, key, slot)
                            nb = nb + n
                            mb = mb + Uint64(n) * q_of(key, kmax, lmax, cscale)
                        nb = Uint32(cute.arch.warp_redux_sync(nb, "add"))
                        for d in cutlass.range_constexpr(5):
                            mb = mb + Uint64(cute.arch.shuffle_sync_bfly(mb, offset=16 >> d))
                    if lane == 0:
                        s_bc[hb] = nb
                        s_bm[hb] = mb
                cute.arch.sync_threads()

                # the cuts: top-k by count, top-p by mass, then the draw by mass
                _, _, _, n_live, mass_k = find(lane, lambda i: s_bc[i], lambda i, n: s_bm[i],
                                               Uint64(1), False)
                k = mtopk[row]
                kk = Uint32(sel((k > 0) & (k < vlim), Uint32(k), Uint32(vlim)))
                if kk < n_live:
                    _, nb, mb, q = locate(cx, Uint64(kk), False)
                    mass_k = Uint64(mb + Uint64(kk - nb) * q)
                kp, mass = Uint32(kk), Uint64(mass_k)
                p = mtopp[row]
                if p < Float32(1.0):
                    thr = Uint64(dmul(Float64(cutlass.max(p, Float32(0.0))), Float64(mass_k)))
                    kp = Uint32(1)
                    if thr > 0:
                        _, nb, mb, q = locate(cx, thr, True)
                        kp = Uint32(nb + Uint32((thr - mb + q - 1) // q))
                    if kp != kk:
                        _, nb, mb, q = locate(cx, Uint64(kp), False)
                        mass = Uint64(mb + Uint64(kp - nb) * q)
                u = uniform(mseed[row], mdraw[row])
                t = cutlass.min(Uint64(dmul(u, Float64(mass))), mass - 1)
                kstar, nb, mb, q = locate(cx, t + 1, True)
                j = Uint32((t - mb) // q)
                # the CTA holding the j-th token of kstar (id order), then that token in its slice
                owner, jl, run, found = Int32(0), j, Uint32(0), Uint32(0)
                for r in cutlass.range_constexpr(ctas):
                    n = (ld_cg_if(part + Int64(kstar * pw + r // 2) * 4, Uint32(1))
                         >> (16 * (r % 2))) & 0xFFFF
                    hit = (found ^ 1) & one(j < run + n)
                    owner, jl, found = sel(hit != 0, Int32(r), owner), sel(hit != 0, j - run, jl), \
                        found | hit
                    run = run + n
                ccs, masks = [], []
                for jj in cutlass.range_constexpr(nch):
                    cc, keys, valid = chunk_keys(row_addr, tid, owner, jj)
                    mm = Uint32(0)
                    for e in cutlass.range_constexpr(8):
                        mm = mm | ((valid[e] & one(keys[e] == kstar)) << e)
                    ccs.append(cc)
                    masks.append(mm)
                pres, cnts = before_in_id_order(masks, s_w, lane, warp)
                for jj in cutlass.range_constexpr(nch):
                    pre, cc, mm = pres[jj], ccs[jj], masks[jj]
                    if (jl >= pre) & (jl < pre + cnts[jj]):
                        for _ in cutlass.range_constexpr(7):  # drop the matches before the j-th
                            mm = sel(jl > pre, mm & (mm - 1), mm)
                            pre = pre + one(jl > pre)
                        mids[row] = Int64(owner * per_cta + 8 * cc + ctz(mm))
            if (sampled != 0) & (fast == 0):  # zero every word the row wrote
                for i in cutlass.range_constexpr(KEYS // 32 // NT):
                    w = tid + NT * i
                    m = s_bmp[w]
                    mem_if(ST32, bmap + Int64(w) * 4, Uint32(0), one(m != 0))
                    while m != 0:
                        key = w * 32 + ctz(m)
                        mem_if(ST32, tot + Int64(key) * 4, Uint32(0), Uint32(1))
                        for x in cutlass.range_constexpr(pw):
                            mem_if(ST32, part + Int64(key * pw + x) * 4, Uint32(0), Uint32(1))
                        m = m & (m - 1)
            if tid == 0:
                g64("st.global.u64", ctl, Uint64(0))
                g64("st.global.u64", ctl + 8, Uint64(0))

    @cute.jit
    def sample_tokens(mlog: cute.Tensor, mtemp: cute.Tensor, mtopk: cute.Tensor,
                      mtopp: cute.Tensor, mseed: cute.Tensor, mdraw: cute.Tensor,
                      mids: cute.Tensor, mctl: cute.Tensor, mbits: cute.Tensor,
                      mtot: cute.Tensor, mpart: cute.Tensor, mcand: cute.Tensor,
                      stream: cuda.CUstream):
        sample_tokens_kernel(mlog, mtemp, mtopk, mtopp, mseed, mdraw, mids, mctl, mbits, mtot,
                             mpart, mcand).launch(grid=launch.grid, block=launch.block, smem=launch.smem,
                                           stream=stream, use_pdl=True)

    return sample_tokens


KERNEL = KernelDef(name="sample_tokens", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference, source_files=("toolchain/dsl_util.py",))
