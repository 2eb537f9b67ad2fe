"""Prefill on the GPU: a prompt, chunk by chunk, through the whole model, writing the KV layout
the decode graph reads (capture/kv_cache.py) and returning the last token's logits (DESIGN §3
"Prefill", issue 21).

One chunk of T tokens at positions n … n+T−1 runs per layer:
  attention norm → [q; k; v] as one GEMM → Q/K RMSNorm → RoPE (RoPE layers) → attention over
  the slot's cached keys (positions < n) and the chunk's own → KV write → o GEMM → residual →
  FFN norm → dense SwiGLU, or router + grouped expert GEMMs + shared expert → residual;
then the final norm and the LM head on the last token only.

Attention has three implementations (`ATTENTION`):
  * "kernel": `kernels/prefill/attn_prefill.py`, the CuTe DSL flash-attention prefill (AOT cubin).
    It reads the prefix from the ring or the pages and the chunk's keys from the chunk's own
    K/V, so the ring is written after it: a chunk never overwrites ring entries its own later
    queries still need, whatever its size (the ring stays W entries; no chunk is split).
  * "sdpa": torch's memory-efficient SDPA with a mask and its log-sum-exp, the sink applied
    as out·sigmoid(lse − sink): the torch-ops baseline the bench compares with.
  * "reference": `reference.attention` on the gathered keys (CPU tests; the oracle).
The projections are cuBLAS GEMMs through torch (bf16 in, fp32 accumulate, one rounding; the
issue allows cuBLAS for BF16 where it is faster than ours); the experts run as
`torch._grouped_mm` over the tokens sorted by expert with offsets computed on the device (no
host synchronisation), or, for chunks up to ROW_MOE_MAX rows, on the decode kernels in groups
of 8 rows (capture/prefill_row_moe.py). NVFP4 experts, on the kernel path, run on the grouped
W4A16 kernels (`kernels/prefill/grouped_w4a16.py`: codes read as they are and decoded in
registers, scale2 in the fp32 epilogue, SwiGLU fused into gate/up); elsewhere, and for configs
those kernels do not fit, NVFP4 weights are decoded per layer into a BF16 scratch (the experts:
those the chunk touches, by `kernels/prefill/nvfp4_unpack.py` on the kernel path; never the
whole model at once): e2m1·e4m3 is exact in BF16. Dense projections apply scale2 to the fp32
sums before the one rounding, as the reference (on CUDA as the GEMM's alpha); for
scratch-decoded experts (`torch._grouped_mm` has only a bf16 output) scale2 is folded into the
decoded weights, one bf16 rounding per weight (≤ 2^-9).

Chunks of up to 4096 tokens replay CUDA graphs captured per bucket (`Prefill.capture`): every
per-chunk fact the body reads is a device tensor, so one graph serves every request.

Numerics follow `reference.py` op for op (DESIGN §4): every GEMM accumulates in fp32 and rounds
once to bf16; norms, router logits (fp32, `route`), the SwiGLU product and the MoE combine
(fp32, experts added in ascending id, then the shared expert) round where the reference does.
So only summation order differs (and attention's bf16 P in the kernel, see attn_prefill.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flint_graph import reference

from flint_graph.checkpoints import nvfp4
from flint_graph.capture.decode_layer import _nvfp4_args, fuse_qkv
from flint_graph.capture.kv_cache import KVCache
from flint_graph.capture.prefill_row_moe import GROUP, RowGroupMoE
from flint_graph.capture.side_stream import SideStream
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import ConfigError, ContextLengthError, InvalidRequestError
from flint_graph.kernels.prefill import (attn_prefill, attn_prefill_wg, grouped_w4a16,
                                         grouped_w4a16_wg)
from flint_graph.kernels.toolchain.spec import KV_PAGE
from flint_graph.checkpoints.weights import FlintWeights, LayerWeights, Linear, MoEWeights, NVFP4Weight

BF16 = torch.bfloat16
ATTENTION = ("kernel", "sdpa", "reference")
# The attention kernel of the "kernel" path: attn_prefill (mma.sync) or attn_prefill_wg (wgmma,
# sm_90a). Measured on the H200 (2026-12-02, sixth session, NVFP4 at 8K tokens, CUDA time of the
# 14 full layers' attention): 30.3 ms on attn_prefill, 20.5 ms on attn_prefill_wg with two
# stages (two CTAs per SM), 23.5 ms with three (one CTA); whole prefills 8K 156.8 -> 145.2 ms,
# 32K 1000.6 -> 834.1 ms.
ATTN_KERNELS = ("attn_prefill", "attn_prefill_wg")
ATTN_KERNEL = "attn_prefill_wg"
LM_HEAD_ROWS = 16384  # vocabulary rows of an NVFP4 LM head decoded at a time
DEQUANT_EXPERTS = 16  # experts decoded per torch op pass (bounds the int32 index temporaries)
# Chunk sizes captured as CUDA graphs (kernel path): a chunk runs as the smallest bucket that
# holds it, padded (steps of 1.5× above 512: padding 2,621 tokens to 4,096 cost more than the
# launches it saved, 226 vs 243 ms end to end on the H200). Eager launches cost ~80 per
# layer, ~4,000 per chunk at full size (about 80 ms of host time on the H200 whatever the
# chunk's size); a replay costs one. Above 4096
# tokens a chunk's GPU time (8K: ~276 ms) is far above its launches, which overlap it, so
# larger chunks run eagerly and hold no graph memory.
# Above 4,096 rows a chunk launched eagerly is paced by the host's ~4,000 launches: on the H100
# (2026-12-06, NVFP4) 4,700 tokens took 79.9 ms eager against 73.7 replayed on the 5,120 bucket,
# 6,000 tokens 135.4 against 93.5 (6,144), 8,192 122.9 against 121.4, with less memory reserved
GRAPH_BUCKETS = (16, 32, 64, 128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096, 5120, 6144, 7168,
                 8192)
# MoE layers of chunks up to this many rows run on the decode kernels in groups of 8
# (capture/prefill_row_moe.py; NVFP4: W4A16, no BF16 decode of the experts); larger chunks
# run grouped GEMMs. Per weight format, from the crossover measured on the H200
# (docs/perf-log.md): NVFP4 at 25 tokens 44.9 -> 14.2 ms, at 256 91.0 -> 79.3 ms, at 512 the
# grouped path wins; BF16 at 25 tokens 26.4 -> 18.1 ms, equal at 64, worse at 128.
ROW_MOE_MAX = {"nvfp4": 256, "bf16": 32}
# With the grouped W4A16 kernels (kernels/prefill/grouped_w4a16.py) NVFP4 experts are read as
# they are at every chunk size, and the decode-kernel groups pay only for the shortest chunks:
# on the H200 (2026-12-03, tools/bench_prefill.py --row-moe-max 0,32, whole NVFP4 prefills on the
# graphs, grouped vs groups of 8): 8 tokens 9.0 vs 6.5 ms, 16 tokens 10.1 vs 7.9, 25 tokens
# (the 32-row graph) 10.9 vs 11.3, 32 tokens 11.7 vs 12.5 (since moe_route replaced the ~50
# torch ops of routing glue; 2026-12-02: 25 tokens 18.2 vs 12.8). BF16 keeps the groups up to
# 32 rows (25 tokens 15.2 vs 17.6 ms).
ROW_MOE_MAX_W4A16 = 16
# Pairs per tile of the grouped W4A16 kernels by chunk rows (--nt 16,32,64 on the H200,
# 2026-12-02): 512 tokens 29.7 / 35.1 / 56.7 ms, 2K 60.4 / 58.5 / 74.4, 8K 219.8 / 194.0 / 204.7.
W4A16_NT = ((512, 16),)  # (up to this many rows, NT); above: W4A16_NT_LARGE
W4A16_NT_LARGE = 32
# Chunks of more rows than these run NVFP4 experts from a per-layer BF16 scratch instead of the
# grouped W4A16 kernels: the routed experts decoded by nvfp4_unpack (the touched ones) and run
# by torch._grouped_mm, the shared expert decoded whole and run by cuBLAS with scale2 as alpha
# (None: the W4A16 kernels at every size). Measured on the H200 (2026-12-02, fifth session,
# tools/bench_prefill.py --w4a16-max, whole NVFP4 prefills, ms): the shared expert on cuBLAS
# at 256 / 512 / 1K / 1.5K / 2K / 4K / 8K / 16K tokens 16.4 / 19.0 / 24.6 / 34.4 / 42.2 / 75.3 /
# 156.7 / 382.5 against 15.7 / 18.4 / 25.6 / 35.2 / 44.0 / 77.6 / 162.5 / 394.8 on W4A16 (one
# chunk of the shared expert's 2,048 × 1,024 weights is decoded once, while W4A16 decodes them
# again for every tile of NT rows on mma.sync); the routed experts from the scratch lose at
# every size measured (2K 85.1, 8K 172.3, 16K 411.6: decoding 256 experts' stacks costs more
# than the GEMMs save).
W4A16_ROUTED_MAX: int | None = None
W4A16_SHARED_MAX: int | None = 512
# Chunks of more rows than this run the routed NVFP4 experts on grouped_w4a16_wg (wgmma, weights
# decoded once per 64-k step into shared memory for tiles of 64 or 128 pairs:
# kernels/prefill/grouped_w4a16_wg.py) instead of grouped_w4a16 (None: never). Measured on the
# H200 (2026-12-02, sixth session, tools/bench_prefill.py --w4a16-wg=-,0, whole NVFP4 prefills
# with attn_prefill_wg, ms): 2K 40.4 -> 39.3, 8K 145.2 -> 127.4, 32K 834.1 -> 760.4; but below
# 2K it loses (seventh session, same tool: 64 / 256 / 512 / 1K tokens 13.8 / 16.3 / 18.5 / 23.8
# on grouped_w4a16 against 21.7 / 27.1 / 28.5 / 30.9 on wg: with few pairs per expert a 64- or
# 128-pair tile is mostly empty, while the decode into shared memory is paid in full).
W4A16_WG_MIN: int | None = 1536
# The NVFP4 shared expert as one more group (expert E) of the routed grouped_w4a16 launches
# where both run on that kernel (chunks up to W4A16_SHARED_MAX rows), instead of launches of
# its own on the side stream. Why: alone it is 8 + 16 CTAs of latency-bound work a layer that
# shares the SMs with the routed launches; on the H200 (2026-12-03, tools/bench_prefill.py
# --shared 0,1) replacing it by zeros took a whole NVFP4 prefill from 9.81 to 9.32 ms at 25
# tokens and from 17.57 to 16.22 ms at 512. Measured with the fold: perf-log, tenth session.
FOLD_SHARED = True
# Chunks above this many rows run their side-stream work in place (Prefill.set_side_max_rows).
# Why: a big chunk fills the GPU by itself and the fork and join only cost. H100, NVFP4
# (tools/bench_prefill.py --side-max-rows=-,4096,2048, perf log twenty-sixth session): 4,096
# tokens 62.1 ms with the side stream, 60.8 ms with it off above 2,048 rows; 8,192 tokens
# 127.2 / 125.3 ms; 2,048 and 512 tokens within 0.4 ms either way (the chunk is on the side).
SIDE_MAX_ROWS: int | None = 2048
# A BF16 checkpoint's experts of chunks up to this many rows (at most 512: the NT = 16 range of
# W4A16_NT) can run on grouped_w4a16's WB = 16 kernels: each touched expert read once, the
# shared expert folded in, where torch._grouped_mm and cuBLAS serve them now (and the decode
# kernels in groups of 8 up to ROW_MOE_MAX["bf16"] rows, which read an expert again for every
# group that picks it). Written in the fourteenth session (no device; its prediction in the
# perf log). With it on, chunks up to ROW_MOE_MAX_BF16_GROUPED rows keep the decode kernels.
# Measured 2026-12-05 (H200, `tools/bench_prefill.py --formats bf16 --paths graph --tokens
# 8,…,512 --chunk 512 --moe w4a16,unpack --row-moe-max 0,16,32`): against the default before
# (row MoE ≤ 32 rows, else unpack + torch._grouped_mm) 48 tokens 22.7 → 17.6 ms, 64 25.1 →
# 19.1, 128 29.4 → 23.3, 512 32.9 → 28.9, 25 14.8 → 14.7 (with row MoE ≤ 16); its GPU tests
# passed the same day. On up to 512 rows.
BF16_GROUPED_MAX: int | None = 512
ROW_MOE_MAX_BF16_GROUPED = 16
W4A16_WG_NT = ((2048, 64),)  # (up to this many rows, NT) on grouped_w4a16_wg; above: 128
W4A16_WG_NT_LARGE = 128
# A chunk above the largest prefill graph runs eagerly, and cuBLAS does host work the first
# time it sees a GEMM shape (its heuristics, per M): on the H100 the first 8,570-token NVFP4
# request spent 7.7 ms more host time in `addmm` and 2.2 ms more in `mm` than the same request
# later (2026-12-05, perf log), while the GPU waited at the chunk's start; and since prompts
# rarely repeat a length, a long prompt would pay it nearly every time. So an eager chunk of
# more than EAGER_GEMM_ROWS rows runs each cuBLAS GEMM in row windows of the GEMM_WINDOWS sizes
# (largest first) and one last window of a graph bucket's size (`gemm_row_windows`): every M
# cuBLAS sees is one the prefill graphs' capture or the start-up warm-up (16K tokens: two 8K
# windows) already ran, whatever the prompt's length.
EAGER_GEMM_ROWS = 4096
GEMM_WINDOWS = (8192, 4096)


def gemm_row_windows(t: int) -> list[tuple[int, int]]:
    """Row windows (start, end) covering rows 0 … t−1 of an eager chunk's GEMMs: [(0, t)] up
    to EAGER_GEMM_ROWS rows, else as many windows of each GEMM_WINDOWS size as fit (largest
    first) and, for the rest, one window of the smallest GRAPH_BUCKETS size that holds it,
    ending at row t (it overlaps the window before by fewer rows than that bucket; those rows
    are computed twice, alike). Raises ValueError for t < 1."""
    if t < 1:
        raise ValueError(f"t = {t}: expected a row count >= 1")
    if t <= EAGER_GEMM_ROWS:
        return [(0, t)]
    wins, r = [], 0
    for size in GEMM_WINDOWS:
        while t - r >= size:
            wins.append((r, r + size))
            r += size
    if r < t:
        b = next(b for b in GRAPH_BUCKETS if b >= t - r)
        wins.append((max(0, t - b), t))
    return wins


def linear_rows(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """`F.linear(x, w)` (x bf16 [T, K], w bf16 [N, K] -> bf16 [T, N]) as one GEMM per
    `gemm_row_windows(T)` window: the same rows, each summed by cuBLAS at a row count it has
    seen before (EAGER_GEMM_ROWS)."""
    wins = gemm_row_windows(x.shape[0])
    if len(wins) == 1:
        return F.linear(x, w)
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    for r0, r1 in wins:
        torch.mm(x[r0:r1], w.t(), out=out[r0:r1])
    return out


# -- NVFP4 into BF16 scratch ---------------------------------------------------------------------


def dense_bf16_bytes(weights: FlintWeights) -> int:
    """GPU memory `Prefill.set_dense_bf16(True)` keeps, in bytes: 2 per element of every
    NVFP4 dense projection (q, k, v, o, the dense MLPs and the shared experts; ~2.4 GB at full
    size), 0 for a BF16 checkpoint. What capture/runner.py sets aside before it sizes the KV
    cache, when the Prefill does not exist yet."""
    return sum(2 * math.prod(w.shape) for lw in weights.layers
               for w in [lw.q_proj, lw.k_proj, lw.v_proj] + _dense_after_attention(lw)
               if isinstance(w, NVFP4Weight))


def _dense_after_attention(lw: LayerWeights) -> list[NVFP4Weight]:
    """Layer `lw`'s NVFP4 o projection and dense MLP (or shared expert) matrices: what
    `set_dense_bf16` keeps besides [q; k; v]."""
    mlp = lw.ffn.shared if isinstance(lw.ffn, MoEWeights) else lw.ffn
    ws = [lw.o_proj] + ([mlp.gate, mlp.up, mlp.down] if mlp is not None else [])
    return [w for w in ws if isinstance(w, NVFP4Weight)]


class NVFP4Decoder:
    """Decodes NVIDIA-layout NVFP4 (weights.NVFP4Weight) into BF16 with two table lookups.

    `pairs[byte]` is the bf16 pair (low nibble, high nibble) of one code byte and `scale[byte]`
    the bf16 value of one E4M3 scale byte; both products are exact in bf16 (≤ 6 significant
    bits). scale2 (per tensor, per expert or per row) multiplies last, one bf16 rounding."""

    def __init__(self, device: torch.device, kernel=None):
        self.kernel = kernel  # nvfp4_unpack at E = 1 (the kernel path), else the tables below
        self._alphas: dict[tuple, tuple] = {}  # `prime`: (scale2 tensors, runs) by address
        # `keep`: codes address -> (codes, its `unscaled` bf16), decoded once instead of per
        # chunk; the codes stay referenced, so their address (the key) is never reused
        self.kept: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.one = torch.ones(1, device=device)
        e4m3, e2m1 = nvfp4._tables(device)
        b = torch.arange(256, device=device)
        self.pairs = torch.stack([e2m1[b & 0xF], e2m1[b >> 4]], dim=-1).to(BF16)  # [256, 2]
        self.scale = e4m3.to(BF16)  # [256]; every E4M3 value is a bf16 value

    def into(self, out: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
             scale2: torch.Tensor | None) -> torch.Tensor:
        """Write bf16 [..., N, K] of codes uint8 [..., N, K/2], scales uint8 [..., N, K/16] and
        scale2 fp32 broadcastable to [..., N, 1] (None: no scale2) into `out`; returns `out`."""
        *lead, n, half = codes.shape
        vals = self.pairs[codes.int()].view(*lead, n, half // 8, 16)
        vals.mul_(self.scale[scales.int()].unsqueeze(-1))
        out.copy_(vals.view(*lead, n, 2 * half))
        return out if scale2 is None else out.mul_(scale2.to(BF16))

    def unscaled(self, w: NVFP4Weight) -> torch.Tensor:
        """e2m1·e4m3 of `w` as bf16 [N, K] (exact), scale2 left out: the copy `keep` made, or
        decoded now."""
        if self.has(w):
            return self.kept[w.codes.data_ptr()][1]
        out = torch.empty(w.shape, dtype=BF16, device=w.device)
        if self.kernel is not None and w.codes.is_contiguous() and w.scales.is_contiguous():
            self.kernel.launch(w.codes.view(-1, 8), w.scales.view(-1), self.one,
                               out.view(-1, 16))
            return out
        return self.into(out, w.codes, w.scales, None)

    def keep(self, ws: list[NVFP4Weight]) -> int:
        """Decode each of `ws` once and keep its `unscaled` bf16 copy, so later chunks read it
        instead of decoding again (bit for bit the same: the decode is exact); returns the
        bytes kept. `kept.clear()` drops them."""
        total = 0
        for w in ws:
            if not self.has(w):
                self.kept[w.codes.data_ptr()] = (w.codes, self.unscaled(w))
            total += self.kept[w.codes.data_ptr()][1].nbytes
        return total

    def has(self, w: NVFP4Weight) -> bool:
        """Whether `keep` holds `w`'s decoded copy."""
        hit = self.kept.get(w.codes.data_ptr())
        return hit is not None and hit[0].shape == w.codes.shape

    def linear(self, x: torch.Tensor, w: Linear, row_scale2: torch.Tensor | None = None,
               wu: torch.Tensor | None = None) -> torch.Tensor:
        """x bf16 [T, K] @ wᵀ -> bf16 [T, N], rounded once as `reference.linear`: BF16 weights
        by a cuBLAS GEMM; NVFP4 decoded without scale2 (exact in bf16), multiplied in fp32 and
        scaled by scale2 (or `row_scale2` fp32 [N], per output row, for stacked projections)
        before the one rounding. On CUDA scale2 is the GEMM's alpha (cuBLAS scales the fp32
        sums in its epilogue and rounds once), one GEMM per run of equal row scales, so no fp32
        [T, N] product is written and re-read; the alphas are host floats read once per
        weight (`prime`, which a CUDA-graph capture needs to have run first). `wu`: `w`
        already decoded by `unscaled` (the prefill decodes ahead on its side stream). The
        GEMMs of a chunk above EAGER_GEMM_ROWS rows run in `gemm_row_windows`."""
        if not isinstance(w, NVFP4Weight):
            return linear_rows(x, w)
        if x.is_cuda:
            out = torch.empty(x.shape[0], w.shape[0], dtype=BF16, device=x.device)
            wu = self.unscaled(w) if wu is None else wu
            for t0, t1 in gemm_row_windows(x.shape[0]):
                for r0, r1, alpha in self.prime(w, row_scale2):
                    o = out[t0:t1, r0:r1]
                    torch.addmm(o, x[t0:t1], wu[r0:r1].t(), beta=0, alpha=alpha, out=o)
            return out
        s2 = row_scale2 if row_scale2 is not None else w.scale2.float().reshape(())
        return (_matmul_f32(x, self.unscaled(w)) * s2).to(BF16)

    def prime(self, w: NVFP4Weight, row_scale2: torch.Tensor | None = None
              ) -> list[tuple[int, int, float]]:
        """`linear`'s alphas for `w` (and `row_scale2`): runs (first row, end row, scale2) of
        equal per-row scale2 over the N output rows, read to the host once per weight (a
        device sync, so call it before capturing a graph) and cached."""
        key = (w.scale2.data_ptr(), None if row_scale2 is None else row_scale2.data_ptr())
        hit = self._alphas.get(key)
        if hit is not None:
            return hit[1]
        n = w.shape[0]
        vals = (row_scale2.float().tolist() if row_scale2 is not None
                else [float(w.scale2.float().reshape(()))] * n)
        runs, r0 = [], 0
        for r in range(1, n + 1):
            if r == n or vals[r] != vals[r0]:
                runs.append((r0, r, vals[r0]))
                r0 = r
        # the tensors stay referenced, so their addresses (the key) are never reused
        self._alphas[key] = ((w.scale2, row_scale2), runs)
        return runs

    def experts(self, out: torch.Tensor, w: NVFP4Weight) -> torch.Tensor:
        """An expert stack [E, N, K/2] decoded into `out` bf16 [E, N, K], DEQUANT_EXPERTS
        experts per pass."""
        e_total = w.codes.shape[0]
        s2 = w.scale2.float().reshape(-1)
        s2 = s2.expand(e_total) if s2.numel() == 1 else s2
        for e0 in range(0, e_total, DEQUANT_EXPERTS):
            e1 = min(e_total, e0 + DEQUANT_EXPERTS)
            self.into(out[e0:e1], w.codes[e0:e1], w.scales[e0:e1], s2[e0:e1, None, None])
        return out


_ID_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _one_expert(w: NVFP4Weight) -> list[torch.Tensor]:
    """codes, scales, scale2 of an NVFP4 matrix as a one-expert stack ([1, N, K/2], [1, N,
    K/16], [1]): the grouped W4A16 kernels' arguments for the shared expert."""
    codes, scales, s2 = _nvfp4_args(w)
    return [codes[None], scales[None], s2.reshape(1)]


def _matmul_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x bf16 [T, K] @ w bf16 [N, K]ᵀ with fp32 products, sums and output, float32 [T, N];
    on CUDA in `gemm_row_windows`."""
    if not x.is_cuda:
        return x.float() @ w.float().t()
    wins = gemm_row_windows(x.shape[0])
    if len(wins) == 1:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    for r0, r1 in wins:
        torch.mm(x[r0:r1], w.t(), out_dtype=torch.float32, out=out[r0:r1])
    return out


# -- MoE as grouped GEMMs ------------------------------------------------------------------------


def moe_grouped(h: torch.Tensor, w: MoEWeights, cfg: FlintConfig, experts, shared,
                valid: torch.Tensor | None = None, *, router_split: torch.Tensor | None = None,
                combine=None, act=None) -> torch.Tensor:
    """Routed experts + shared expert of `reference.moe` as grouped GEMMs: h bf16 [T, H] ->
    bf16 [T, H].

    experts: a function of the per-expert pair counts int32 [E] (on the device) returning the
    stacks gate, up bf16 [E, M, H] and down bf16 [E, H, M]: the checkpoint's, or an NVFP4
    decode that may skip experts with no pair (their groups are empty: nothing reads them);
    shared: the shared expert as a function bf16 [T, H] -> bf16 [T, H], or None; valid: bool
    [T], False for a bucket's padding rows, which select no expert (their pairs get the
    virtual id E, sort after every real pair and fall outside every group) and a zero MoE
    output. Routing is `reference.route` (fp32 logits, the correction bias only in the
    pick). The T·K (token, expert) pairs are sorted by expert id; per-expert counts become
    int32 offsets on the device and `torch._grouped_mm` runs each expert's rows (no host
    synchronisation). Each token then adds its experts' outputs in ascending id, in fp32 (one
    batched product; the reference adds them one by one).

    router_split: bf16 [3E, H], the fp32 router as three bf16 parts (`split_router`): the
    logits are then three tensor-core GEMMs with fp32 output, summed (exact products; only the
    fp32 summation order differs from x·routerᵀ). combine: the `moe_combine` kernel's step as a
    function (y_sorted bf16 [T·K, H], pos int32 [T, K], weights fp32 [T, K], shared bf16 [T, H]
    or None) -> its result, which moe_grouped then returns (the caller's residual add folded
    in); it replaces the scatter, the fp32 product and the roundings below. act: SwiGLU's
    activation as `silu_mul` (default: it). The kernel path (`Prefill`) routes and groups
    with the moe_route kernels instead (`Prefill._moe`)."""
    t, k = h.shape[0], cfg.num_experts_per_tok
    e_total = w.router.shape[0]
    logits = None
    if router_split is not None:
        parts = _matmul_f32(h, router_split).view(t, 3, e_total)
        logits = (parts[:, 2] + parts[:, 1]) + parts[:, 0]  # smallest first
    ids, weights = reference.route(h, w.router, w.router_bias, k, cfg.routed_scaling_factor,
                                   cfg.norm_topk_prob, logits=logits)
    if valid is not None:
        ids = torch.where(valid[:, None], ids, e_total)
        weights = weights * valid[:, None]
    ids, order = ids.sort(dim=-1)  # ascending expert id per token: the reference's add order
    weights = weights.gather(-1, order)
    perm, counts = group_pairs(ids.reshape(-1), e_total + 1)
    counts = counts[:e_total]
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    gate, up, down = experts(counts)
    xs = h.index_select(0, perm // k)  # [T·K, H], gathered rows
    g = torch._grouped_mm(xs, gate.transpose(1, 2), offs=offs)
    u = torch._grouped_mm(xs, up.transpose(1, 2), offs=offs)
    a = (act or silu_mul)(g, u)
    y_sorted = torch._grouped_mm(a, down.transpose(1, 2), offs=offs)  # [T·K, H] bf16
    if combine is not None:  # rows of padding pairs are never read: no masking needed
        pos = torch.empty_like(perm).scatter_(0, perm, torch.arange(t * k, device=h.device))
        return combine(y_sorted, pos.view(t, k).int(), weights.contiguous(),
                       shared(h) if shared is not None else None)
    if valid is not None:  # the GEMMs leave rows past the last group unwritten
        real = torch.arange(t * k, device=h.device) < offs[-1]
        y_sorted = torch.where(real[:, None], y_sorted, 0.0)
    y = torch.empty_like(y_sorted).index_copy_(0, perm, y_sorted).view(t, k, -1)
    acc = torch.bmm(weights[:, None, :], y.float())[:, 0]  # [T, H] fp32
    if shared is not None:
        acc += shared(h).float()
    return acc.to(BF16)


def split_router(router: torch.Tensor) -> torch.Tensor:
    """An fp32 router [E, H] as bf16 [3E, H]: hi, mid and lo parts whose fp32 sum is the
    router to ~2^-24 relative (three 8-bit significands), stacked for one GEMM. bf16 × bf16
    products are exact in fp32, so x·partᵀ summed over the parts gives x·routerᵀ up to fp32
    summation order (`moe_grouped`)."""
    r = router.float()
    hi = r.to(BF16)
    mid = (r - hi.float()).to(BF16)
    lo = (r - hi.float() - mid.float()).to(BF16)
    return torch.cat([hi, mid, lo]).contiguous()


COUNTING_PAIRS = 4096  # group_pairs counts (one-hot) up to this many pairs, sorts above


def group_pairs(flat: torch.Tensor, bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair indices grouped by id, in pair order within an id, and the count per id:
    flat int64 [P] with values in 0 … bins − 1 -> (perm int64 [P], counts int32 [bins]); perm
    is `torch.argsort(flat, stable=True)`. Up to COUNTING_PAIRS pairs by counting (a one-hot
    [bins, P] and its running sum along P: a few small kernels where a radix sort of a few
    hundred keys took ~27 µs on the H200), else by that sort and a scatter-add (torch.bincount
    would read the largest id back to the host). The one-hot is [bins, P], so the running sum
    runs along the contiguous dimension: as [P, bins], summed along dim 0, torch's scan took
    545 µs per MoE layer at 3,072 pairs on the H200 (2026-12-02), half of a 512-token prefill."""
    p = flat.numel()
    if p > COUNTING_PAIRS:
        counts = torch.zeros(bins, dtype=torch.int32, device=flat.device)
        counts.index_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
        return torch.argsort(flat, stable=True), counts
    onehot = (flat[None, :] == torch.arange(bins, device=flat.device)[:, None]).int()
    running = onehot.cumsum(1, dtype=torch.int32)  # [bins, P]
    counts = running[:, -1].contiguous()  # a kernel input (nvfp4_unpack SKIP)
    rank = running.gather(0, flat[None, :])[0] - 1  # earlier pairs with the same id
    dest = (torch.cumsum(counts, 0, dtype=torch.int32) - counts)[flat] + rank
    perm = torch.empty_like(flat).scatter_(0, dest.long(), torch.arange(p, device=flat.device))
    return perm, counts


def silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation bf16(silu(g)·u), in fp32 rounded once (`reference.swiglu`):
    g, u bf16 [R, M] -> bf16 [R, M]. The torch ops; the kernel path uses `swiglu`'s kernel."""
    return (F.silu(g.float()) * u.float()).to(BF16)


def swiglu(x: torch.Tensor, gate: Linear, up: Linear, down: Linear,
           linear=F.linear, act=silu_mul) -> torch.Tensor:
    """`reference.swiglu` with `linear` (x bf16 [T, K], weight) -> bf16 [T, N] for each
    projection and `act` (as `silu_mul`) between them: x bf16 [T, H] -> bf16 [T, H]."""
    return linear(act(linear(x, gate), linear(x, up)), down)


# -- norm and residual (reference.py's math, fewer passes) ------------------------------------


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """`reference.rms_norm` through torch's fused RMSNorm: x bf16 [..., N], w bf16 [N] ->
    bf16 [..., N]. On CUDA the kernel computes in fp32 and rounds its output once, as the
    reference; on the CPU torch's bf16 path would round between steps, so it runs in fp32."""
    if x.is_cuda and x.dtype == BF16 and w.dtype == BF16:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps).to(BF16)


def residual_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`reference.residual_add` (bf16 + bf16 added in fp32, rounded once) in one kernel: torch
    adds bf16 tensors in fp32 and rounds once."""
    return x + y


# -- attention -------------------------------------------------------------------------------


def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                   k_pos: torch.Tensor, sinks: torch.Tensor | None,
                   window: int | None, block: int = 2048) -> torch.Tensor:
    """The torch-ops baseline of `reference.attention` (same arguments and result, bf16
    [T, Hq, D]) on CUDA: torch's memory-efficient SDPA kernel with an additive mask for the
    causal window and its log-sum-exp, the sink applied as out·sigmoid(lse − sink). K/V heads
    are repeated for GQA; queries go in blocks of `block`, each with only the keys its window
    can reach."""
    t, hq, d = q.shape
    g = hq // k.shape[1]
    kh = k.repeat_interleave(g, dim=1).transpose(0, 1)[None]  # [1, Hq, S, D]
    vh = v.repeat_interleave(g, dim=1).transpose(0, 1)[None]
    out = []
    for b0 in range(0, t, block):
        qp = q_pos[b0:b0 + block]
        keep = k_pos <= qp.max()
        if window is not None:
            keep &= k_pos > qp.min() - window
        idx = keep.nonzero().squeeze(1)
        kp = k_pos[idx]
        s = idx.numel()
        visible = kp[None, :] <= qp[:, None]
        if window is not None:
            visible &= kp[None, :] > qp[:, None] - window
        pad = -(-s // 16) * 16  # the kernel wants the mask's rows 16-element aligned
        bias = torch.full((qp.numel(), pad), float("-inf"), dtype=q.dtype, device=q.device)
        bias[:, :s].masked_fill_(visible, 0.0)
        qh = q[b0:b0 + block].transpose(0, 1)[None]
        o, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            qh, kh[:, :, idx], vh[:, :, idx], bias[:, :s][None, None].expand(1, hq, -1, -1),
            True, 0.0, False, scale=d ** -0.5)[:2]
        o = o[0].transpose(0, 1)  # [Tb, Hq, D]
        if sinks is not None:
            lse = lse[0, :, :qp.numel()].transpose(0, 1)  # [Tb, Hq], natural log
            o = (o.float() * torch.sigmoid(lse - sinks.float())[..., None]).to(q.dtype)
        out.append(o)
    return torch.cat(out)


# -- the prefill ---------------------------------------------------------------------------------


class Prefill:
    """Chunked prefill of one slot of a `KVCache` on the GPU (module docstring).

    cfg, weights: the model (on the cache's device; weights as `GraphRunner` holds them);
    attention: one of ATTENTION; kset: the KernelSet whose `attn_prefill` cubins run attention
    when attention == "kernel"; row_moe_max: the longest chunk (rows) whose MoE runs on the
    decode kernels (None: by format); w4a16: the experts on grouped_w4a16 (NVFP4 as W4A16,
    BF16 on its WB = 16 kernels up to 512 rows; True, False, or None: NVFP4 yes, BF16 as
    BF16_GROUPED_MAX says); attn_kernel: one of ATTN_KERNELS. Raises ValueError for an unknown
    attention or a w4a16=True the model cannot take, and LaunchError / KernelCacheError when
    the kernel path lacks its cubins.

    A chunk's per-chunk facts live in device tensors (start, valid tokens, slot, page table),
    and every KV write goes through device-computed destinations, so one chunk body serves
    eager runs and CUDA-graph replays alike (`capture`): a chunk padded to a bucket sends its
    padding rows' keys to the scratch slot, and the LM head reads row valid − 1."""

    def __init__(self, cfg: FlintConfig, weights: FlintWeights, kv: KVCache,
                 attention: str = "kernel", kset=None, row_moe_max: int | None = None,
                 w4a16: bool | None = None, attn_kernel: str | None = None):
        if attention not in ATTENTION:
            raise ValueError(f"attention {attention!r}: expected one of {', '.join(ATTENTION)}")
        if attention != "reference" and kv.layers[0].k.device.type != "cuda":
            raise ValueError(f"attention {attention!r} runs on CUDA only; this KV cache is on "
                             f"{kv.layers[0].k.device} (use attention='reference')")
        self.cfg, self.w, self.kv, self.attention = cfg, weights, kv, attention
        # cuBLAS may otherwise reduce split-K partials in bf16; DESIGN §4 rounds once
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        dev = weights.final_norm.device
        self.device = dev
        self.dec = NVFP4Decoder(dev)
        self.qkv = [fuse_qkv(lw) for lw in weights.layers]  # [q; k; v] rows, held once
        # work the next kernel does not need runs beside it (capture/side_stream.py)
        self.side = SideStream(dev if attention == "kernel" and dev.type == "cuda" else None)
        # chunks above this many rows run their side work in place (None: every chunk uses
        # the side stream); set_side_max_rows
        self.side_max_rows: int | None = SIDE_MAX_ROWS
        self._side_off = SideStream(None)
        self._qkv_next: tuple[int, torch.Tensor] | None = None  # (layer, decoded [q; k; v])
        self._scratch: dict[str, torch.Tensor] = {}
        hq = cfg.num_attention_heads
        self.sinks = [lw.sinks.float().contiguous() if cfg.attention_sinks
                      else torch.full((hq,), float("-inf"), device=dev)
                      for lw in weights.layers]
        self.specs = {spec["RING"]: spec for spec in attn_prefill.KERNEL.specs(cfg, ())}
        # the chunk's description, read by the body on the device (static for graph replays)
        self._start = torch.zeros(1, dtype=torch.int32, device=dev)  # tokens already cached
        self._valid = torch.ones(1, dtype=torch.int64, device=dev)  # real tokens in the chunk
        self._slot = torch.zeros(1, dtype=torch.int32, device=dev)  # a ring's table
        # a position inside the chunk whose rings go to the snapshot slot as they stand there
        # (`prefill(snapshot_at=)`); -1: none (a graph replay reads it like _start)
        self._snap_at = torch.full((1,), -1, dtype=torch.int64, device=dev)
        self._pages = torch.zeros(kv.pages_per_slot, dtype=torch.int32, device=dev)
        # every slot's page table on the device, so choosing a slot is a device copy: a copy
        # from pageable host memory syncs the stream first, so the host waited there for all
        # work queued before the prefill (decode steps in flight too)
        # (the scratch slot's too: capture and padding rows write there)
        self._page_tables = torch.stack([kv.page_table(s)
                                         for s in range(kv.scratch + 1)]).to(dev)
        # prompt ids reach the device through this pinned buffer, for the same reason
        # (`_ids_to_device`); _stage_done: the copy out of it last issued
        self._stage: torch.Tensor | None = None
        self._stage_done: torch.cuda.Event | None = None
        self._rows = torch.arange(max(GRAPH_BUCKETS), device=dev)
        self._h_last = torch.zeros(1, cfg.hidden_size, dtype=BF16, device=dev)
        self._start_host = 0  # the same start for the host-side gathers of "sdpa"/"reference"
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        # the chunk sizes `capture` may capture (tokens), GRAPH_BUCKETS; a bench may add others
        # (tools/bench_prefill.py --graph-buckets)
        self.graph_buckets: tuple[int, ...] = GRAPH_BUCKETS
        # the buckets that split full layers' keys (attn_prefill_wg SPLITS), captured again
        # with the split: replayed for a chunk after SPLIT_MIN_START cached tokens
        self.split_graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._split_now = False  # this chunk's full layers split their keys (describe_chunk)
        self.head_graph: tuple[torch.cuda.CUDAGraph, torch.Tensor] | None = None
        self.kernels, self.unpack, self.row_moe = {}, None, None
        self.split_kernels: dict[int, object] = {}  # attn_prefill_wg SPLITS -> kernel
        self._split_ws = None  # their partials (O, lse) and counters (set_attn_kernel)
        self.attn_kernel: str | None = None  # the kernel path's attention kernel (ATTN_KERNELS)
        # the kernel path's fused elementwise steps (kernels/prefill/): Q/K norm + RoPE per
        # RoPE kind, and the MoE combine + residual; None/{} on the torch-ops paths
        self.qk_norm_rope: dict[int, object] = {}
        self.combine = None
        # moe_combine NORM = 1 (the next layer's attention norm in the same launch; None where
        # the config has no such spec or `set_combine_norm(False)`), and the (layer, residual,
        # normed) it left for that layer's `_layer_body`
        self.combine_norm = self._combine_norm_kernel = None
        self._h_ahead: tuple[int, torch.Tensor, torch.Tensor] | None = None
        # the layer norms on rmsnorm_rows by RES (1: with the residual add before it); {}:
        # torch's ops (`rms_norm`, `residual_add`) off the kernel path
        self.norm_rows: dict[int, object] = {}
        # the KV write (kernels/prefill/kv_write.py) by ring (True) or pages; {}: the indexed
        # assignment (torch-ops paths, and `set_kv_write(False)` for comparisons)
        self.kv_write: dict[bool, object] = {}
        self._kv_write_off: dict[bool, object] = {}
        # the kernel path's routing (moe_route: pick, and place per NT) and its per-expert
        # counts, zero between layers (place resets them; each chunk zeroes them first)
        self.pick, self.place = None, {}
        # pick's counts [E], then place's CTA counter (kernels/prefill/moe_route.py)
        self._counts = torch.zeros((cfg.n_routed_experts or 1) + 1, dtype=torch.int32,
                                   device=dev)
        self.router_bias = [lw.ffn.router_bias.float().contiguous()
                            if isinstance(lw.ffn, MoEWeights) else None for lw in weights.layers]
        self.act = silu_mul
        self._valid32 = torch.ones(1, dtype=torch.int32, device=dev)
        self.routers: list[torch.Tensor | None] = [None] * len(weights.layers)
        moe = [lw.ffn for lw in weights.layers if isinstance(lw.ffn, MoEWeights)]
        fmt = "nvfp4" if moe and isinstance(moe[0].gate, NVFP4Weight) else "bf16"
        # NVFP4 experts by the grouped W4A16 kernels (kernel path, a config they fit); else
        # decoded into a BF16 scratch for torch._grouped_mm
        self.w4a16: dict[tuple[int, int], object] = {}
        self.w4a16_args: dict[int, tuple[list, list]] = {}
        self.w4a16_shared: dict[int, tuple[list, list]] = {}  # the shared expert, E = 1
        self._shared_scheds: dict[int, tuple[int, torch.Tensor, torch.Tensor]] = {}
        # the shared expert as one more group of the routed W4A16 launches (SH = 1 kernels,
        # by (KIND, NT)), where both run on grouped_w4a16 (`_folds`); {}: off
        self.w4a16_fold: dict[tuple[int, int], object] = {}
        self._fold_scheds: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}
        self._fold_shared: dict[int, tuple[list, list]] = {}  # `set_fold_shared`
        self.w4a16_nt: int | None = None  # a fixed NT (benchmarks); None: by W4A16_NT
        # the largest chunks (rows) on the W4A16 kernels, routed and shared (benchmarks set
        # them); None: every size
        self.w4a16_routed_max, self.w4a16_shared_max = W4A16_ROUTED_MAX, W4A16_SHARED_MAX
        self.w4a16_wg: dict[tuple[int, int], object] = {}  # grouped_w4a16_wg by (KIND, NT)
        self.w4a16_wg_min: int | None = None  # chunks above this many rows use them
        self.w4a16_wg_rs: dict[int, int] = {}  # their RS value by NT (1: x in pair order)
        use_w4a16 = (attention == "kernel" and fmt == "nvfp4" and w4a16 is not False
                      and grouped_w4a16.fits(cfg))
        # BF16 experts of short chunks on grouped_w4a16's WB = 16 kernels, the shared expert
        # folded in (they need it at the routed width)
        use_bf16 = (attention == "kernel" and fmt == "bf16" and bool(w4a16 if w4a16 is not None
                                                                    else BF16_GROUPED_MAX)
                    and grouped_w4a16.fits(cfg)
                    and grouped_w4a16.shared_width(cfg) == cfg.moe_intermediate_size
                    and all(f.shared is not None for f in moe))
        if w4a16 and not (use_w4a16 or use_bf16):
            raise ValueError("w4a16=True needs attention='kernel' and expert shapes "
                             "grouped_w4a16 fits (BF16: a shared expert of the routed width)")
        default_rows = ROW_MOE_MAX_W4A16 if use_w4a16 else (
            ROW_MOE_MAX_BF16_GROUPED if use_bf16 else ROW_MOE_MAX[fmt])
        self.row_moe_max = default_rows if row_moe_max is None else row_moe_max
        if attention == "kernel":
            from flint_graph.capture.launcher import KernelSet
            from flint_graph.kernels.prefill import nvfp4_unpack

            kset = kset or KernelSet()
            self._kset = kset
            self.set_attn_kernel(attn_kernel or ATTN_KERNEL)
            dense, *stacks = nvfp4_unpack.KERNEL.specs(cfg, ())  # the E = 1 matrix one first
            if isinstance(weights.layers[0].q_proj, NVFP4Weight) or isinstance(
                    weights.lm_head, NVFP4Weight):
                self.dec.kernel = kset.get("nvfp4_unpack", **dense.as_dict())
            if fmt == "nvfp4":
                self.unpack = kset.get("nvfp4_unpack", **stacks[0].as_dict())
            if moe and self.row_moe_max >= GROUP:
                self.row_moe = RowGroupMoE(kset, cfg, weights.layers)
            from flint_graph.kernels.prefill import moe_combine, moe_route, qk_norm_rope

            for spec in qk_norm_rope.KERNEL.specs(cfg, ()):
                self.qk_norm_rope[spec["ROPE"]] = kset.get("qk_norm_rope", **spec.as_dict())
            self.inv_freq = qk_norm_rope.decode.rope_inv_freq(cfg.head_dim, cfg.rope_theta, dev)
            from flint_graph.kernels.prefill import swiglu as swiglu_kernel

            (spec,) = swiglu_kernel.KERNEL.specs(cfg, ())
            self._swiglu = kset.get("swiglu", **spec.as_dict())
            self.act = self._silu_mul
            for spec in moe_combine.KERNEL.specs(cfg, ()):
                kernel = kset.get("moe_combine", **spec.as_dict())
                if moe_combine.norm_of(spec):
                    self.combine_norm = self._combine_norm_kernel = kernel
                else:
                    self.combine = kernel
            from flint_graph.kernels.prefill import rmsnorm_rows

            self.norm_rows = {s["RES"]: kset.get("rmsnorm_rows", **s.as_dict())
                              for s in rmsnorm_rows.KERNEL.specs(cfg, ())}
            from flint_graph.kernels.prefill import kv_write

            for spec in kv_write.KERNEL.specs(cfg, ()):  # keyed by ring (P is the window)
                self.kv_write[spec["P"] != KV_PAGE] = kset.get("kv_write", **spec.as_dict())
            for spec in moe_route.KERNEL.specs(cfg, ()):
                if spec["KIND"] == 0:
                    self.pick = kset.get("moe_route", **spec.as_dict())
                else:
                    self.place[spec["NT"]] = kset.get("moe_route", **spec.as_dict())
            self.routers = [split_router(lw.ffn.router) if isinstance(lw.ffn, MoEWeights)
                            else None for lw in weights.layers]
            if use_w4a16:
                self.set_w4a16_variant()
                e = cfg.n_routed_experts
                for i, lw in enumerate(weights.layers):
                    if isinstance(lw.ffn, MoEWeights):
                        f = lw.ffn
                        self.w4a16_args[i] = (_nvfp4_args(f.gate, e) + _nvfp4_args(f.up, e),
                                              _nvfp4_args(f.down, e))
                        sh = f.shared
                        if (grouped_w4a16.shared_width(cfg) and sh is not None
                                and isinstance(sh.gate, NVFP4Weight)):
                            one = [_one_expert(sh.gate), _one_expert(sh.up)]
                            self.w4a16_shared[i] = (one[0] + one[1], _one_expert(sh.down))
                if FOLD_SHARED and self.w4a16_shared and any(
                        s.as_dict().get("SH") for s in grouped_w4a16.KERNEL.specs(cfg, ())):
                    self.set_fold_shared(True)
                if W4A16_WG_MIN is not None and grouped_w4a16_wg.fits(cfg):
                    self.set_w4a16_wg(W4A16_WG_MIN)
            if use_bf16:
                self.set_bf16_grouped(BF16_GROUPED_MAX or W4A16_NT[0][0])
        if dev.type == "cuda":
            self._prime_alphas()

    def set_combine_norm(self, on: bool) -> None:
        """Fold each MoE layer's next attention norm into its moe_combine launch (on: the
        default where the config has moe_combine NORM = 1, H a multiple of 256) or run it as
        its own rmsnorm_rows launch (off; for comparisons and benchmarks). Raises ValueError
        when on is asked of a prefill without the NORM = 1 kernel. Graphs captured before keep
        what they captured: call `drop_graphs` after."""
        kernel = self._combine_norm_kernel
        if on and kernel is None:
            raise ValueError("the combine's norm needs the kernel path and moe_combine NORM = 1 "
                             "(a hidden size that is a multiple of 256)")
        self.combine_norm = kernel if on else None

    def set_kv_write(self, on: bool) -> None:
        """The KV write by the kv_write kernel (on, the kernel path's default) or by torch's
        indexed assignment (off: the comparison baseline; the cache is bit for bit the same).
        Raises ValueError for on when the prefill has no kernel path. Recapture the graphs
        after a change (their destinations' dtype differs)."""
        if not on:
            self._kv_write_off, self.kv_write = self.kv_write or self._kv_write_off, {}
        elif not self.kv_write:
            if not self._kv_write_off:
                raise ValueError("set_kv_write(True): the kv_write kernel runs only on the "
                                 "kernel path (attention='kernel')")
            self.kv_write = self._kv_write_off

    def set_overlap(self, on: bool) -> None:
        """Run the side work (weight decodes ahead, the shared expert, KV writes) on a second
        stream (on, the default on the kernel path) or in place on one stream (benchmarks;
        capture/side_stream.py). Raises ValueError for `on` off the CUDA kernel path."""
        if on and (self.attention != "kernel" or self.device.type != "cuda"):
            raise ValueError("the side stream needs attention='kernel' on CUDA")
        self.side = SideStream(self.device if on else None)

    def set_side_max_rows(self, rows: int | None) -> None:
        """Use the side stream only for chunks of at most `rows` rows (None: for every chunk;
        default SIDE_MAX_ROWS = 2048). Why: at 8K rows the GPU is full without it and the side
        stream cost 1.0-1.6 ms in every pair measured (H100, perf log, twenty-fifth session)
        and ~1.2 ms at 4K (twenty-sixth), while below 512 rows it gains 0.5-1.7 ms (ninth
        session) and at 2K it is even. The choice is made per chunk (and per
        graph bucket at capture), so call this before `capture`. Either way the results are
        bitwise the same (tests/test_prefill_gpu.py, side_stream). Raises ValueError for a
        `rows` that is not None or an int ≥ 1."""
        if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int)
                                 or rows < 1):
            raise ValueError(f"side_max_rows {rows!r}: expected None or an int >= 1")
        self.side_max_rows = rows

    def set_attn_kernel(self, name: str, **values: int) -> None:
        """Run attention on kernel `name` (ATTN_KERNELS; attn_prefill_wg falls back to
        attn_prefill where it does not fit the config), with other spec values (`values`, e.g.
        ST=3 for attn_prefill_wg: benchmark variants, built by tools/build_gpu_cache.py).
        Raises ValueError for an unknown name, KernelCacheError when the cache lacks it."""
        if name not in ATTN_KERNELS:
            raise ValueError(f"attn_kernel {name!r}: expected one of {', '.join(ATTN_KERNELS)}")
        if name == "attn_prefill_wg" and not attn_prefill_wg.fits(self.cfg):
            name, values = "attn_prefill", {}  # its head dims: the tiny config keeps mma.sync
        specs = self.specs if name == "attn_prefill" else {
            s["RING"]: s for s in attn_prefill_wg.KERNEL.specs(self.cfg, ())
            if "SPLITS" not in s.as_dict()}
        for ring, spec in specs.items():
            chosen = (attn_prefill_wg.variant(spec, **values).as_dict()  # FC=0, WS=1 drop keys
                      if name == "attn_prefill_wg" else {**spec.as_dict(), **values})
            self.kernels[ring] = self._kset.get(name, **chosen)
        self.attn_kernel = name
        # short chunks on full layers split their keys over more CTAs (attn_prefill_wg
        # SPLITS): the partials and counters allocated once, outside any graph capture; the
        # model's specs and the FC=0 variant have split forms
        self.split_kernels, self._split_ws = {}, None
        if name == "attn_prefill_wg" and set(values) <= {"FC"}:
            full = attn_prefill_wg.variant(specs[0], **values).as_dict()
            self.split_kernels = {n: self._kset.get(name, **full, SPLITS=n)
                                  for n in attn_prefill_wg.SPLIT_CHOICES}
            rows, most = attn_prefill_wg.split_rows(self.cfg)
            hq, hkv = self.cfg.num_attention_heads, self.cfg.num_key_value_heads
            dev = self.device
            self._split_ws = (torch.empty(rows * hq * self.cfg.head_dim, device=dev),
                              torch.empty(rows * hq, device=dev),
                              torch.zeros(most, hkv, dtype=torch.int32, device=dev))

    def _prime_alphas(self) -> None:
        """Read every NVFP4 projection's scale2 that `dec.linear` scales by to the host now
        (NVFP4Decoder.prime), not on a first use inside a graph capture."""
        for i, lw in enumerate(self.w.layers):
            if len(self.qkv[i]) == 3:
                codes, scales, row_s2 = self.qkv[i]
                self.dec.prime(NVFP4Weight(codes, scales, row_s2[:1]), row_s2)
            mlps = [lw.ffn] if not isinstance(lw.ffn, MoEWeights) else [lw.ffn.shared]
            for w in [lw.o_proj] + [getattr(m, n) for m in mlps if m is not None
                                    for n in ("gate", "up", "down")]:
                if isinstance(w, NVFP4Weight):
                    self.dec.prime(w)

    # -- CUDA graphs -----------------------------------------------------------------------

    @torch.inference_mode()
    def capture(self, max_tokens: int) -> list[int]:
        """Capture the chunk body as one CUDA graph per bucket of GRAPH_BUCKETS below
        `max_tokens` (the largest chunk the engine sends, capped at the largest of
        `graph_buckets` and the slot's capacity; itself a bucket), and the final norm + LM
        head as one more; returns the buckets. Kernel attention only (the others gather on the host): raises
        RuntimeError otherwise. Warm-up and capture write only the scratch slot. All graphs
        share one memory pool: they never run at once."""
        from flint_graph.capture.launcher import capture_graph

        if self.attention != "kernel":
            raise RuntimeError(f"prefill graphs need attention='kernel', not "
                               f"{self.attention!r}")
        top = min(max_tokens, max(self.graph_buckets), self.kv.max_tokens)
        buckets = sorted({b for b in self.graph_buckets if b < top} | {top})
        pool = torch.cuda.graph_pool_handle()
        self._set_slot(self.kv.scratch)
        side = torch.cuda.Stream()
        for tb in reversed(buckets):  # the largest first: the pool then fits every later one
            ids = torch.zeros(tb, dtype=torch.int64, device=self.device)
            self.describe_chunk(0, tb)
            if self.w4a16_shared:  # host-built, outside the capture, and kept for replays
                self._shared_scheds[tb] = self._shared_schedule(tb)
            if self._folds(tb):
                self._fold_scheds[tb] = self._fold_schedule(tb)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._body(ids)
                self._head()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with capture_graph(g, pool=pool):
                self._body(ids)
            self.graphs[tb] = (g, ids)
            if self.split_kernels and attn_prefill_wg.splits_for(self.cfg, tb) > 1:
                # the same bucket with split-KV full layers, for chunks after a long prefix
                self._split_now = True
                with torch.cuda.stream(side):
                    self._body(ids)
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with capture_graph(g, pool=pool):
                    self._body(ids)
                self.split_graphs[tb] = (g, ids)
                self._split_now = False
        g = torch.cuda.CUDAGraph()
        with capture_graph(g, pool=pool):
            logits = self._head()
        self.head_graph = (g, logits)
        # a graph's first launch also uploads it to the device (tens of ms at this size): do
        # it now, on the scratch slot, so the first request runs at full speed
        for tb, (graph, _) in [*self.graphs.items(), *self.split_graphs.items()]:
            self.describe_chunk(0, tb)
            graph.replay()
        g.replay()
        torch.cuda.synchronize()
        return buckets

    def drop_graphs(self) -> None:
        """Forget every captured graph (a capture that ran out of memory part way leaves the
        largest buckets' graphs behind), so `capture` can run again; their pool is freed with
        them."""
        self.graphs.clear()
        self.split_graphs.clear()
        self.head_graph = None

    def _bucket(self, n: int) -> int | None:
        fits = [b for b in self.graphs if b >= n]
        return min(fits) if fits else None

    # -- the prefill ---------------------------------------------------------------------

    @torch.inference_mode()
    def prefill(self, slot: int, tokens: torch.Tensor, chunk_tokens: int,
                start: int = 0, snapshot_at: int | None = None) -> torch.Tensor:
        """Write int tokens [T] into `slot` at positions start … start+T−1, `chunk_tokens` at a
        time; float32 logits [V] of the last one (the LM head runs for it only). `start` must be
        the number of tokens the slot already holds (the engine's bookkeeping: the cache does
        not record it). A chunk no larger than a captured bucket replays that bucket's graph.

        `snapshot_at` (start ≤ it < start + T): the sliding layers' rings as they stand once
        the positions before it are written are left in the cache's snapshot slot
        (`KVCache.snapshot_slot`, read with `GraphRunner.snapshot_rings`), with no chunk
        boundary there: the chunk's rows before it that its own ring does not keep are sent
        to the snapshot slot instead of the scratch slot, the others copied from the slot's
        ring before and after the chunk. A KV-reuse resume point (the end of a chat's
        preamble) then costs ~1 ms of copies instead of one more pass over the weights (a
        chunk of its own: ~17-25 ms on the H200 at full size, docs/perf-log.md).

        Raises InvalidRequestError (before any work) for a slot outside 0 … num_slots − 1 (the
        scratch slot included), a prompt that is not a non-empty 1-D tensor of an integer dtype
        or has ids outside the vocabulary, a start that is not an int ≥ 0, a chunk_tokens that
        is not an int ≥ 1, a snapshot_at outside start … start + T − 1; ContextLengthError
        when start + T passes the slot's KV capacity; ConfigError naming --prefill-chunk when a
        chunk runs out of GPU memory."""
        if not _is_int(slot) or not 0 <= slot < self.kv.num_slots:
            raise InvalidRequestError(f"slot {slot!r}: expected an int in 0 … "
                                      f"{self.kv.num_slots - 1}")
        if not _is_int(chunk_tokens) or chunk_tokens < 1:
            raise InvalidRequestError(f"chunk_tokens = {chunk_tokens!r}; expected an int >= 1")
        if not _is_int(start) or start < 0:
            raise InvalidRequestError(f"start = {start!r}; expected an int >= 0 (the tokens "
                                      "already in the slot)")
        if (not isinstance(tokens, torch.Tensor) or tokens.dim() != 1 or tokens.numel() == 0
                or tokens.dtype not in _ID_DTYPES):
            what = (f"{tokens.dtype} {tuple(tokens.shape)}" if isinstance(tokens, torch.Tensor)
                    else type(tokens).__name__)
            raise InvalidRequestError(f"prompt: expected a non-empty 1-D integer tensor, found "
                                      f"{what}")
        t = tokens.numel()
        if snapshot_at is not None and (not _is_int(snapshot_at)
                                        or not start <= snapshot_at < start + t):
            raise InvalidRequestError(f"snapshot_at = {snapshot_at!r}; expected an int in "
                                      f"{start} … {start + t - 1} (the prompt's positions)")
        cap = min(self.kv.max_tokens, self.cfg.max_position_embeddings)
        if start + t > cap:
            raise ContextLengthError(f"prompt: {start} cached + {t} new tokens exceed the "
                                     f"KV cache's {cap} tokens per slot")
        lo, hi = torch.stack(list(torch.aminmax(tokens))).tolist()  # one transfer for both
        tokens = self._ids_to_device(tokens)
        if lo < 0 or hi >= self.cfg.vocab_size:
            raise InvalidRequestError(f"prompt: ids span [{lo}, {hi}]; expected [0, vocab_size "
                                      f"= {self.cfg.vocab_size})")
        self._set_slot(slot)
        for b in range(0, t, chunk_tokens):
            part = tokens[b:b + chunk_tokens]
            at = snapshot_at if snapshot_at is not None and 0 <= snapshot_at - start - b < \
                part.numel() else None
            try:
                if at is None:
                    self.run_chunk(part, start + b)
                else:
                    self._chunk_with_snapshot(slot, part, start + b, at)
            except torch.OutOfMemoryError as e:
                raise ConfigError(
                    f"out of GPU memory prefilling a {part.numel()}-token chunk; lower "
                    f"--prefill-chunk (EngineConfig.prefill_chunk_tokens, now "
                    f"{chunk_tokens})") from e
        if self.head_graph is not None:
            self.head_graph[0].replay()
            return self.head_graph[1][0].clone()
        return self._head()[0]

    def _chunk_with_snapshot(self, slot: int, ids: torch.Tensor, start: int, at: int,
                             pad_to: int | None = None) -> None:
        """`run_chunk` leaving the rings as they stand at position `at` (start ≤ at < start +
        len(ids)) in the snapshot slot (`prefill`'s snapshot_at)."""
        rings = [kv for kv in self.kv.layers if kv.ring]
        snap, w = self.kv.snapshot_slot, self.cfg.sliding_window
        if not rings:
            self.run_chunk(ids, start, pad_to)
            return
        # positions at − w … start − 1 come from the ring as the previous chunks left it (none
        # for a preamble in a prompt's first chunk: no copy then)
        if max(0, at - w) < start:
            torch._foreach_copy_([x[snap] for kv in rings for x in (kv.k, kv.v)],
                                 [x[slot] for kv in rings for x in (kv.k, kv.v)])
        self._snap_at.fill_(at)
        try:
            self.run_chunk(ids, start, pad_to)
        finally:
            self._snap_at.fill_(-1)
        # the chunk's rows from `end − w` on went to the slot's own ring: those before `at`
        end = start + ids.numel()
        lo = max(start, end - w, at - w)
        if lo < at:
            idx = torch.arange(lo, at, device=self.device) % w
            for kv in rings:
                for x in (kv.k, kv.v):
                    x[snap].index_copy_(1, idx, x[slot].index_select(1, idx))

    @torch.inference_mode()
    def run_chunk(self, ids: torch.Tensor, start: int, pad_to: int | None = None) -> None:
        """One chunk, ids int64 [n] on the device at positions start …, of the slot last set by
        `prefill`; leaves its last token's final-normed state for the LM head. A captured bucket
        that holds n replays its graph; else the body runs eagerly, padded to `pad_to` tokens
        when given (what a replay does, for the CPU tests)."""
        n = ids.numel()
        self.describe_chunk(start, n)
        tb = self._bucket(n)
        if tb is not None:
            g, static = (self.split_graphs if self._split_now and tb in self.split_graphs
                         else self.graphs)[tb]
            static[:n].copy_(ids)
            static[n:].zero_()
            g.replay()
            return
        if pad_to is not None and pad_to > n:
            ids = torch.cat([ids, ids.new_zeros(pad_to - n)])
        self._body(ids)

    def describe_chunk(self, start: int, tokens: int) -> None:
        """Set the next chunk's start (tokens already cached) and real token count in the
        device tensors the body reads (`run_chunk` does it; tests driving `_layer` call it)."""
        self._start.fill_(start)
        self._start_host = start
        self._split_now = start >= attn_prefill_wg.SPLIT_MIN_START
        self._valid.fill_(tokens)
        self._valid32.fill_(tokens)

    def _set_slot(self, slot: int) -> None:
        self._slot.fill_(slot)
        self._pages.copy_(self._page_tables[slot])

    def _ids_to_device(self, tokens: torch.Tensor) -> torch.Tensor:
        """Prompt ids int [T] as int64 [T] on the device. From host memory on CUDA they go
        through a pinned buffer and an asynchronous copy: a copy from pageable memory syncs
        the stream first, stalling the host until every step queued before it has run."""
        if tokens.device == self.device or self.device.type != "cuda":
            return tokens.to(self.device, torch.int64)
        n = tokens.numel()
        if self._stage is None or self._stage.numel() < n:
            self._stage = torch.empty(max(n, 4096), dtype=torch.int64, pin_memory=True)
            self._stage_done = None
        if self._stage_done is not None:
            self._stage_done.synchronize()  # the last copy out of the buffer has run
        self._stage[:n].copy_(tokens)
        out = self._stage[:n].to(self.device, non_blocking=True)
        self._stage_done = torch.cuda.Event()
        self._stage_done.record()
        return out

    def _body(self, ids: torch.Tensor) -> None:
        """Every layer for ids int64 [Tb] (rows ≥ valid are padding), then the final norm of
        row valid − 1 into `_h_last`."""
        if self.pick is not None:
            self._counts.zero_()  # a chunk that failed half-way may have left counts behind
        self._qkv_next = None  # a decode ahead lives only within one body (graph pool memory)
        self._h_ahead = None
        configured = self.side
        if self.side_max_rows is not None and ids.numel() > self.side_max_rows:
            self.side = self._side_off  # this chunk's side work in place (set_side_max_rows)
        try:
            x = reference.embed(self.w.embed, ids)
            pos = self._prepare(ids.numel())
            for i, lw in enumerate(self.w.layers):
                x = self._layer(i, lw, x, pos)
        finally:
            self.side = configured
        last = x.index_select(0, self._valid - 1)
        self._h_last.copy_(reference.rms_norm(last, self.w.final_norm, self.cfg.rms_norm_eps))

    def _head(self) -> torch.Tensor:
        return self._lm_head(self._h_last)

    def _prepare(self, tb: int) -> torch.Tensor:
        """What every layer of a chunk of `tb` rows shares, from the device-side start / valid
        / slot / page table: positions int64 [Tb] (returned), the RoPE tables of the torch-ops
        paths (`reference.rope_cos_sin`, fp32 [Tb, 1, D]) and the KV write destinations. A
        sliding layer keeps the last W real tokens (earlier ones would share their ring
        entries); the others, and padding rows, go to the scratch slot."""
        rows = self._rows[:tb] if tb <= self._rows.numel() else torch.arange(
            tb, device=self.device)
        pos = self._start.long() + rows
        self._pos32 = pos.int()
        if not self.qk_norm_rope:  # the kernel takes its angles from inv_freq itself
            cos, sin = reference.rope_cos_sin(pos, self.cfg.head_dim, self.cfg.rope_theta)
            self._rope = cos[:, None, :], sin[:, None, :]
        valid = self._row_valid = rows < self._valid
        self._row_mask = valid.int()
        if self._folds(tb):
            self._fold_sched = self._fold_schedule(tb)
        elif self.w4a16_shared and self._fits(tb, self.w4a16_shared_max):
            self._shared_sched = self._shared_schedule(tb)
        pps, scratch = self.kv.pages_per_slot, self.kv.scratch
        page = self._pages.long()[(pos // KV_PAGE).clamp_(max=pps - 1)]
        self._dst = {False: (torch.where(valid, page, scratch * pps), pos % KV_PAGE)}
        w = self.cfg.sliding_window
        if w:
            keep = valid & (rows >= self._valid - w)
            # rows a snapshot position still needs (`_chunk_with_snapshot`) and this slot's
            # ring does not keep go to the snapshot slot (scratch + 1), the rest to scratch
            at = self._snap_at
            snap = valid & ~keep & (pos < at) & (pos >= at - w)
            other = scratch + snap.long() * (self.kv.snapshot_slot - scratch)
            self._dst[True] = (torch.where(keep, self._slot.long(), other), pos % w)
        if self.kv_write:  # the kernel takes int32 destinations
            self._dst = {ring: (where.int(), entry.int())
                         for ring, (where, entry) in self._dst.items()}
        return pos

    def _layer(self, i: int, lw: LayerWeights, x: torch.Tensor,
               pos: torch.Tensor) -> torch.Tensor:
        """Layer i on the chunk's residual stream x bf16 [T, H] -> bf16 [T, H]. With the side
        stream on, the NVFP4 o projection (and a dense MLP's weights) are decoded beside the
        attention, the KV write and the shared expert run beside the next kernels, and the
        next layer's [q; k; v] is decoded beside this layer's FFN; the layer ends joined."""
        out = self._layer_body(i, lw, x, pos)
        self.side.join()
        return out

    def _decode_ahead(self, lw: LayerWeights) -> dict[int, torch.Tensor]:
        """With the side stream on: lw's NVFP4 o projection and dense-MLP weights decoded
        (`NVFP4Decoder.unscaled`) on it, by id of the weight, event "dense" after them; {}
        when off or nothing is NVFP4 (a torch-table decode stays in place)."""
        ws = [lw.o_proj] + ([] if isinstance(lw.ffn, MoEWeights)
                            else [lw.ffn.gate, lw.ffn.up, lw.ffn.down])
        ws = [w for w in ws if isinstance(w, NVFP4Weight) and not self.dec.has(w)]
        if not self.side.on or not ws or self.dec.kernel is None:
            return {}
        with self.side.fork():
            out = {id(w): self.dec.unscaled(w) for w in ws}
            self.side.mark("dense")
        return out

    def _layer_body(self, i: int, lw: LayerWeights, x: torch.Tensor,
                    pos: torch.Tensor) -> torch.Tensor:
        cfg, eps = self.cfg, self.cfg.rms_norm_eps
        hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        t = x.shape[0]
        ahead = self._decode_ahead(lw)

        def linear(a: torch.Tensor, w: Linear) -> torch.Tensor:
            return self.dec.linear(a, w, wu=ahead.get(id(w)))

        ahead_h, self._h_ahead = self._h_ahead, None
        # the previous layer's combine normed x already (moe_combine NORM = 1) with this
        # layer's gain, unless x is another tensor or this is another layer (a caller that
        # feeds layers its own inputs, or not in order)
        fresh = ahead_h is not None and ahead_h[0] == i and ahead_h[1] is x
        h = ahead_h[2] if fresh else self._norm(x, lw.attn_norm)
        y = self._qkv(i, h)
        if self.qk_norm_rope:
            q = torch.empty(t, hq, d, dtype=BF16, device=self.device)
            k, v = torch.empty(2, t, hkv, d, dtype=BF16, device=self.device).unbind(0)
            self.qk_norm_rope[int(cfg.uses_rope(i))].launch(
                y, self._pos32, lw.q_norm, lw.k_norm, self.inv_freq, q, k, v, eps)
        else:
            q, k, v = y.split([hq * d, hkv * d, hkv * d], dim=-1)
            q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.reshape(t, hkv, d)
            if cfg.qk_norm:
                q = rms_norm(q, lw.q_norm, eps)
                k = rms_norm(k, lw.k_norm, eps)
            if cfg.uses_rope(i):
                q, k = reference.rotate(q, *self._rope), reference.rotate(k, *self._rope)
        a = self._attention(i, q, k.contiguous(), v.contiguous(), pos)
        if ahead:
            self.side.wait("dense")
        o = linear(a, lw.o_proj)
        self._qkv_ahead(i + 1)
        if (self.row_moe is not None and isinstance(lw.ffn, MoEWeights) and t % GROUP == 0
                and t <= self.row_moe_max):
            return self.row_moe.run(i, lw, x, o, self._row_mask)
        x, h = self._add_norm(x, o, lw.ffn_norm)
        if isinstance(lw.ffn, MoEWeights):
            if self.pick is not None:
                return self._moe(i, lw, x, h)  # the residual add is in the combine kernel
            y = moe_grouped(h, lw.ffn, cfg, lambda counts: self._experts(lw.ffn, counts),
                            self._shared(lw.ffn), self._row_valid)
        else:
            f = lw.ffn
            y = swiglu(h, f.gate, f.up, f.down, linear, self.act)
        return residual_add(x, y)

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """`reference.rms_norm` of x bf16 [T, H] with gain w bf16 [H] -> bf16 [T, H], on
        rmsnorm_rows (RES 0) on the kernel path, else torch's."""
        kernel = self.norm_rows.get(0)
        if kernel is None:
            return rms_norm(x, w, self.cfg.rms_norm_eps)
        y = torch.empty_like(x)
        kernel.launch(x, w, y, self.cfg.rms_norm_eps)
        return y

    def _add_norm(self, x: torch.Tensor, o: torch.Tensor,
                  w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream x bf16 [T, H] plus o bf16 [T, H] (`reference.residual_add`) and
        that sum's `reference.rms_norm` with gain w: (new x, normed), both bf16 [T, H]; one
        rmsnorm_rows (RES 1) launch on the kernel path, else torch's ops."""
        kernel = self.norm_rows.get(1)
        if kernel is None:
            x = residual_add(x, o)
            return x, rms_norm(x, w, self.cfg.rms_norm_eps)
        r, y = torch.empty_like(x), torch.empty_like(x)
        kernel.launch(o, x, w, r, y, self.cfg.rms_norm_eps)
        return r, y

    def _qkv_ahead(self, i: int) -> None:
        """With the side stream on: decode layer i's NVFP4 [q; k; v] on it now, for `_qkv` of
        the next layer (the layer's end joins the side stream first)."""
        parts = self.qkv[i] if i < len(self.qkv) else ()
        if not self.side.on or len(parts) != 3 or self.dec.kernel is None:
            return
        codes, scales, row_s2 = parts
        w = NVFP4Weight(codes, scales, row_s2[:1])
        if self.dec.has(w):  # kept decoded (`set_dense_bf16`): nothing to do ahead
            return
        with self.side.fork():
            self._qkv_next = (i, self.dec.unscaled(w))

    def _qkv(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """h bf16 [T, H] through layer i's stacked [q; k; v] -> bf16 [T, Q + 2·KV]."""
        parts = self.qkv[i]
        if len(parts) == 1:
            return linear_rows(h, parts[0])
        codes, scales, row_s2 = parts
        ahead, self._qkv_next = self._qkv_next, None
        wu = ahead[1] if ahead is not None and ahead[0] == i else None
        return self.dec.linear(h, NVFP4Weight(codes, scales, row_s2[:1]), row_scale2=row_s2,
                               wu=wu)

    def _experts(self, w: MoEWeights, counts: torch.Tensor | None):
        """The layer's expert stacks bf16 (gate, up [E, M, H], down [E, H, M]): BF16 as held;
        NVFP4 decoded into the per-layer scratch, on the kernel path only the experts whose
        pair count int32 [E] is nonzero (nvfp4_unpack's SKIP; counts may be None for BF16)."""
        if not isinstance(w.gate, NVFP4Weight):
            return w.gate, w.up, w.down
        out = []
        for name, m in (("gate", w.gate), ("up", w.up), ("down", w.down)):
            buf = self._buffer(name, m.shape)
            if self.unpack is None:
                out.append(self.dec.experts(buf, m))
                continue
            e = m.codes.shape[0]
            s2 = m.scale2.float().reshape(-1).expand(e).contiguous()
            self.unpack.launch(m.codes.view(-1, 8), m.scales.view(-1), s2, counts,
                               buf.view(-1, 16))
            out.append(buf)
        return tuple(out)

    def _nt(self, rows: int, routed: bool = True) -> int:
        """Pairs per tile of the grouped W4A16 kernels (and the moe_route schedule) for a chunk
        of `rows` rows: by W4A16_WG_NT where grouped_w4a16_wg runs the routed experts (`_wg`),
        else `w4a16_nt` when set, else by W4A16_NT (the shared expert: `routed` False)."""
        if routed and self._wg(rows):
            return next((n for r, n in W4A16_WG_NT if rows <= r), W4A16_WG_NT_LARGE)
        return self.w4a16_nt or next((n for r, n in W4A16_NT if rows <= r), W4A16_NT_LARGE)

    def _wg(self, rows: int) -> bool:
        """Whether a chunk of `rows` rows runs the routed experts on grouped_w4a16_wg."""
        return bool(self.w4a16_wg) and self.w4a16_wg_min is not None \
            and rows > self.w4a16_wg_min and self._fits(rows, self.w4a16_routed_max)

    def set_bf16_grouped(self, most: int | None) -> None:
        """Run a BF16 checkpoint's experts of chunks up to `most` rows on grouped_w4a16's
        WB = 16 kernels: one gate/up and one down launch a layer, each touched expert read
        once, the shared expert one more group (SH = 1); longer chunks (None: every chunk)
        on torch._grouped_mm and cuBLAS. Raises ValueError for NVFP4 experts or a model
        without a shared expert of the routed width, KernelCacheError when the cache lacks
        the kernels."""
        if most is not None and most > W4A16_NT[0][0]:
            raise ValueError(f"set_bf16_grouped: most = {most}; the WB = 16 kernels take NT = "
                             f"16, which W4A16_NT gives up to {W4A16_NT[0][0]} rows")
        self.w4a16_args, self.w4a16_shared, self.w4a16_fold = {}, {}, {}
        if most is None:
            self.w4a16_routed_max = self.w4a16_shared_max = W4A16_ROUTED_MAX
            return
        moe = {i: lw.ffn for i, lw in enumerate(self.w.layers)
               if isinstance(lw.ffn, MoEWeights)}
        specs = [s for s in grouped_w4a16.KERNEL.specs(self.cfg, ()) if s.as_dict().get("WB")
                 == 16]
        if not specs or any(isinstance(f.gate, NVFP4Weight) or f.shared is None
                            for f in moe.values()):
            raise ValueError("set_bf16_grouped needs BF16 experts with a shared expert that "
                             "grouped_w4a16's WB = 16 kernels fit")
        for i, f in moe.items():
            self.w4a16_args[i] = ([f.gate, f.up], [f.down])
            self.w4a16_shared[i] = ([f.shared.gate, f.shared.up], [f.shared.down])
        self.w4a16_fold = {(s["KIND"], s["NT"]): self._kset.get("grouped_w4a16", **s.as_dict())
                           for s in specs}
        self._fold_shared = self.w4a16_shared
        self.w4a16_routed_max = self.w4a16_shared_max = most

    def set_fold_shared(self, on: bool) -> None:
        """Run the NVFP4 shared expert as one more group of the routed experts' grouped W4A16
        launches (on: grouped_w4a16's SH = 1 kernels, where the routed and the shared expert
        both run on grouped_w4a16) or on launches of its own beside them (off; benchmarks).
        Raises ValueError for `on` where the W4A16 kernels do not run the shared expert, and
        KernelCacheError when the cache lacks the SH kernels."""
        if not on:
            self.w4a16_fold = {}
            return
        specs = [s for s in grouped_w4a16.KERNEL.specs(self.cfg, ()) if s.as_dict().get("SH")
                 and s.as_dict().get("WB", 4) == 4]
        if not self.w4a16 or not self.w4a16_shared or not specs:
            raise ValueError("folding the shared expert needs it and the routed experts on the "
                             "grouped W4A16 kernels, at one width")
        self.w4a16_fold = {(s["KIND"], s["NT"]): self._kset.get("grouped_w4a16", **s.as_dict())
                           for s in specs}
        # the shared expert's matrices as the SH kernels take them: one expert's, without the
        # E = 1 stack dimension of its own launches (views, made once)
        self._fold_shared = {i: tuple([a[0] if a.dim() == 3 else a for a in part]
                                      for part in args)
                             for i, args in self.w4a16_shared.items()}

    def _folds(self, rows: int) -> bool:
        """Whether a chunk of `rows` rows runs the shared expert inside the routed launches."""
        return bool(self.w4a16_fold) and self._fits(rows, self.w4a16_shared_max) \
            and self._fits(rows, self.w4a16_routed_max) and not self._wg(rows)

    def _fold_schedule(self, tb: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(tiles int32 [S + NTILES, 4], tok int32 [P + tb], S) of a folded chunk of tb rows
        (P = tb · top-k pairs): the shared expert's S tiles first (expert E, every row once as
        pairs P …, `grouped_w4a16.shared_tiles`), then room for the routed tiles that
        moe_route's place writes each layer; tok's tail is 0 … tb − 1, its head place's. Built
        on the host and kept for the graph buckets, as `_shared_schedule`."""
        got = self._fold_scheds.get(tb)
        if got is None:
            cfg = self.cfg
            e, p, nt = cfg.n_routed_experts, tb * cfg.num_experts_per_tok, self._nt(tb)
            head = grouped_w4a16.shared_tiles(tb, p, e, nt)
            tiles = torch.full((head.shape[0] + grouped_w4a16.max_tiles(p, e, nt), 4), -1,
                               dtype=torch.int32)
            tiles[:head.shape[0]] = head
            tok = torch.cat([torch.zeros(p, dtype=torch.int32),
                             torch.arange(tb, dtype=torch.int32)])
            got = (tiles.to(self.device), tok.to(self.device), head.shape[0])
            if tb in self.graph_buckets:
                self._fold_scheds[tb] = got
        return got

    def set_w4a16_wg(self, min_rows: int | None, **values: int) -> None:
        """Run the routed NVFP4 experts of chunks above `min_rows` rows on grouped_w4a16_wg
        (None: never), with other spec values than the model's (`values`, e.g. SUB=0, RS=0 or
        RS=1: benchmark variants, built by tools/build_gpu_cache.py). Where a kernel has RS = 1
        (the default at NT = 64) the layer copies x into its pair order first.
        Needs the grouped W4A16 path (NVFP4 experts, the kernel
        path, a config both kernels fit); raises ValueError otherwise, KernelCacheError when
        the cache lacks the kernels."""
        if min_rows is None:
            self.w4a16_wg, self.w4a16_wg_min = {}, None
            return
        if not self.w4a16_args or not grouped_w4a16_wg.fits(self.cfg):
            raise ValueError("grouped_w4a16_wg needs NVFP4 experts on the grouped W4A16 path "
                             "and expert shapes it fits")
        specs = [grouped_w4a16_wg.variant(s, **values).as_dict()
                 for s in grouped_w4a16_wg.KERNEL.specs(self.cfg, ())]
        self.w4a16_wg = {(v["KIND"], v["NT"]): self._kset.get("grouped_w4a16_wg", **v)
                         for v in specs}
        self.w4a16_wg_rs = {v["NT"]: v.get("RS", 0) for v in specs}
        self.w4a16_wg_min = min_rows

    def set_dense_bf16(self, on: bool) -> int:
        """Keep the NVFP4 dense projections ([q; k; v], o, the dense MLPs and the shared
        expert's matrices) decoded in BF16 for every chunk (on), or decode them per chunk and
        layer on the side stream (off, this object's default; the graph engine turns it on,
        EngineConfig.prefill_dense_bf16). The decode is exact (e2m1·e4m3, scale2 stays the
        GEMM's alpha), so the output is bit for bit the same; on trades GPU memory
        (`dense_bf16_bytes`: ~2.4 GB at full size) for the per-chunk decode (H100, twenty-ninth
        session: a 25-token prefill 10.5 → 9.55 ms, 512 tokens 17.9 → 17.4 ms). Call before
        `capture`. Returns the bytes kept; raises torch.OutOfMemoryError when they do not
        fit."""
        if not on:
            self.dec.kept.clear()
            return 0
        ws = []
        for i, lw in enumerate(self.w.layers):
            if len(self.qkv[i]) == 3:
                codes, scales, row_s2 = self.qkv[i]
                ws.append(NVFP4Weight(codes, scales, row_s2[:1]))
            ws += _dense_after_attention(lw)
        return self.dec.keep(ws)

    def set_w4a16_variant(self, **values: int) -> None:
        """Run the grouped W4A16 kernels with other spec values (D weight steps in registers,
        WS = 1 weights through shared memory for NT ≤ WS_MAX_NT, both without PF; PF = 0, 2,
        4, 8 L2 prefetches for NT in PF_NTS: benchmark variants, whose cubins come from
        tools/build_gpu_cache.py; none given: the model's specs). PF alone keeps the shared
        expert folded in (its SH kernels are built with each PF); D or WS runs the shared
        expert on its own kernels. Raises KernelCacheError when the cache lacks them."""
        values = {k: v for k, v in values.items()  # WS = 0 and D = DEPTH: the defaults
                  if (k, v) not in (("WS", 0), ("D", grouped_w4a16.DEPTH))}
        pf = values.pop("PF", None)
        if values:  # the SH kernels are built with the defaults only: the shared expert
            self.w4a16_fold = {}  # then runs on its own kernels, with the variant
        for spec in grouped_w4a16.KERNEL.specs(self.cfg, ()):
            sh, routed = spec.as_dict().get("SH"), spec["E"] > 1
            d = spec.as_dict()
            if values:  # D and WS variants are built without PF
                d = {**grouped_w4a16.without_pf(spec), **values}
                if spec["NT"] > grouped_w4a16.WS_MAX_NT:
                    d.pop("WS", None)  # not built for tiles this large: the default serves
            if pf is not None and spec["NT"] in grouped_w4a16.PF_NTS and (routed or sh):
                d = {**{k: v for k, v in d.items() if k != "PF"}, **({"PF": pf} if pf else {})}
            if sh:
                if not values and self.w4a16_fold and spec.as_dict().get("WB", 4) == 4:
                    self.w4a16_fold[(spec["KIND"], spec["NT"])] = self._kset.get(
                        "grouped_w4a16", **d)
                continue
            key = (spec["KIND"], spec["NT"]) if routed else ("shared", spec["KIND"],
                                                              spec["NT"])
            self.w4a16[key] = self._kset.get("grouped_w4a16", **d)

    def _moe(self, i: int, lw: LayerWeights, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """Layer i's MoE block on the kernel path: the residual stream x and its FFN norm h,
        bf16 [T, H] -> bf16 [T, H], x + moe(h). The router's logits as three tensor-core GEMMs
        (`split_router`); routing and the grouping of the (token, expert) pairs by the
        moe_route kernels (pick, place: no torch ops, no host synchronisation); the experts on
        the grouped W4A16 kernels (NVFP4) or torch._grouped_mm (BF16, and NVFP4 decoded into
        the BF16 scratch where grouped_w4a16 does not fit); the combine, the shared expert and
        the residual add in moe_combine, which (NORM = 1, `set_combine_norm`) also writes the
        next layer's attention norm of its output for that layer's `_layer_body`."""
        cfg, f = self.cfg, lw.ffn
        t, k, e = h.shape[0], cfg.num_experts_per_tok, cfg.n_routed_experts
        dev, i32 = self.device, torch.int32
        fold = i in self.w4a16_args and i in self.w4a16_shared and self._folds(t)
        if not fold:
            with self.side.fork():  # the shared expert reads only h: beside the routing
                if self.w4a16 and i in self.w4a16_shared and self._fits(
                        t, self.w4a16_shared_max):
                    shared = [self._shared_w4a16(i, h)]
                else:
                    run = self._shared(f)
                    shared = [] if run is None else [run(h)]
        parts = _matmul_f32(h, self.routers[i])  # [T, 3E]
        ids, rank = torch.empty(2, t, k, dtype=i32, device=dev).unbind(0)
        weights = torch.empty(t, k, dtype=torch.float32, device=dev)
        self.pick.launch(parts, self.router_bias[i], self._valid32, self._counts[:e], ids,
                         weights, rank, cfg.routed_scaling_factor)
        nt = self._nt(t)
        p = t * k
        if fold:  # place fills the routed part of the chunk's folded schedule
            tiles_all, tok_all, s_tiles = self._fold_sched
            tiles, tok = tiles_all[s_tiles:], tok_all[:p]
        else:
            tiles = torch.empty(grouped_w4a16.max_tiles(p, e, nt), 4, dtype=i32, device=dev)
            tok = torch.empty(p, dtype=i32, device=dev)
        offs = torch.empty(e, dtype=i32, device=dev)
        pos = torch.empty(t, k, dtype=i32, device=dev)
        self.place[nt].launch(ids, rank, self._valid32, self._counts, tiles, offs, tok, pos)
        if fold:
            # the shared expert is expert E of the same launches: its rows are pairs P … P+T−1
            gate_up, down = self.w4a16_args[i]
            s_gate_up, s_down = self._fold_shared[i]
            act = torch.empty(p + t, cfg.moe_intermediate_size, dtype=BF16, device=dev)
            y_all = torch.empty(p + t, cfg.hidden_size, dtype=BF16, device=dev)
            self.w4a16_fold[0, nt].launch(h, tok_all, tiles_all, *gate_up, *s_gate_up, act)
            self.w4a16_fold[1, nt].launch(act, tiles_all, *down, *s_down, y_all)
            y, shared = y_all[:p], [y_all[p:]]
        elif self.w4a16 and i in self.w4a16_args and self._fits(t, self.w4a16_routed_max):
            gate_up, down = self.w4a16_args[i]
            act = torch.empty(p, cfg.moe_intermediate_size, dtype=BF16, device=dev)
            y = torch.empty(p, cfg.hidden_size, dtype=BF16, device=dev)
            wg = self._wg(t)
            kernels = self.w4a16_wg if wg else self.w4a16
            # RS = 1 reads x in pair order (and writes act in it)
            rs = wg and self.w4a16_wg_rs.get(nt)
            xin = grouped_w4a16_wg.pair_order(h).contiguous() if rs else h
            kernels[0, nt].launch(xin, tok, tiles, *gate_up, act)
            kernels[1, nt].launch(act, tiles, *down, y)
        else:
            # the per-expert counts only an NVFP4 decode reads (it skips untouched experts)
            counts = offs.diff(prepend=offs.new_zeros(1)) if isinstance(f.gate, NVFP4Weight) \
                else None
            gate, up, down = self._experts(f, counts)
            xs = h.index_select(0, tok)
            g = torch._grouped_mm(xs, gate.transpose(1, 2), offs=offs)
            u = torch._grouped_mm(xs, up.transpose(1, 2), offs=offs)
            y = torch._grouped_mm(self.act(g, u), down.transpose(1, 2), offs=offs)
        self.side.join()  # the shared expert
        out = torch.empty_like(x)
        if self.combine_norm is not None and i + 1 < len(self.w.layers):
            # the next layer's attention norm in the same launch (`_layer_body` takes it)
            hn = torch.empty_like(x)
            self.combine_norm.launch(y, pos, weights, *shared, x, self._valid32,
                                     self.w.layers[i + 1].attn_norm, out, hn,
                                     self.cfg.rms_norm_eps)
            self._h_ahead = (i + 1, out, hn)
        else:
            self.combine.launch(y, pos, weights, *shared, x, self._valid32, out)
        return out

    @staticmethod
    def _fits(rows: int, most: int | None) -> bool:
        """Whether a chunk of `rows` rows runs on the W4A16 kernels under the limit `most`."""
        return most is None or rows <= most

    def _shared_schedule(self, tb: int) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(NT, tiles int32 [NTILES, 4], tok int32 [tb]) of the shared expert as one expert
        holding all tb rows, built on the host; kept for the graph buckets (`capture` makes each
        bucket's before capturing it, so a graph holds no schedule arithmetic)."""
        got = self._shared_scheds.get(tb)
        if got is None:
            nt = self._nt(tb, routed=False)
            tiles = grouped_w4a16.tile_schedule(torch.tensor([tb], dtype=torch.int32), nt,
                                                grouped_w4a16.max_tiles(tb, 1, nt))
            got = (nt, tiles.to(self.device), torch.arange(tb, dtype=torch.int32).to(self.device))
            if tb in self.graph_buckets:  # not every eager size: they would pile up
                self._shared_scheds[tb] = got
        return got

    def _shared_w4a16(self, i: int, h: torch.Tensor) -> torch.Tensor:
        """Layer i's NVFP4 shared expert on the grouped W4A16 kernels as one expert holding
        every row of the chunk (padding rows too: the combine never reads them): h bf16 [T, H]
        -> bf16 [T, H]. Its schedule and token list depend only on T, so they are made once per
        chunk (`_prepare`)."""
        t, cfg = h.shape[0], self.cfg
        nt, tiles, tok = self._shared_sched
        gate_up, down = self.w4a16_shared[i]
        act = torch.empty(t, grouped_w4a16.shared_width(cfg), dtype=BF16, device=self.device)
        y = torch.empty(t, cfg.hidden_size, dtype=BF16, device=self.device)
        self.w4a16["shared", 0, nt].launch(h, tok, tiles, *gate_up, act)
        self.w4a16["shared", 1, nt].launch(act, tiles, *down, y)
        return y

    def _shared(self, w: MoEWeights):
        s = w.shared
        if s is None:
            return None
        return lambda h: swiglu(h, s.gate, s.up, s.down, self.dec.linear, self.act)

    def _silu_mul(self, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """`silu_mul` by the swiglu kernel (kernels/prefill/swiglu.py)."""
        a = torch.empty_like(g)
        self._swiglu.launch(g.reshape(-1), u.reshape(-1), a.view(-1))
        return a

    def _buffer(self, name: str, shape) -> torch.Tensor:
        """A bf16 scratch of `shape`, allocated once per name (the per-layer NVFP4 decode)."""
        buf = self._scratch.get(name)
        if buf is None or tuple(buf.shape) != tuple(shape):
            buf = self._scratch[name] = torch.empty(shape, dtype=BF16, device=self.device)
        return buf

    def _attention(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   pos: torch.Tensor) -> torch.Tensor:
        """Attention of the chunk's queries bf16 [T, Hq, D] -> bf16 [T, Hq·D]; then stores the
        chunk's k, v bf16 [T, Hkv, D] in the slot's ring or pages (after: the queries still
        read the ring entries the chunk overwrites)."""
        cfg, kv = self.cfg, self.kv.layers[i]
        spec = self.specs[int(kv.ring)]
        table = self._slot if kv.ring else self._pages
        if self.attention == "kernel":
            t, hq, d = q.shape
            out = torch.empty(t, hq * d, dtype=BF16, device=self.device)
            args = (q.contiguous(), k, v, kv.k, kv.v, table, self._start, self.sinks[i], out)
            n = (attn_prefill_wg.splits_for(cfg, t)
                 if self.split_kernels and self._split_now and not kv.ring else 1)
            if n > 1:  # a short chunk: its keys split over n times the CTAs, then combined
                o, lse, counters = self._split_ws
                self.split_kernels[n].launch(*args, o[:n * t * hq * d].view(n, t, hq, d),
                                             lse[:n * t * hq].view(n, t, hq), counters[:t])
            else:
                self.kernels[int(kv.ring)].launch(*args)
        else:
            k_all, v_all, k_pos = attn_prefill.gather_keys(spec, k, v, kv.k, kv.v, table,
                                                           self._start_host)
            window = cfg.sliding_window if cfg.is_sliding(i) else None
            sinks = self.w.layers[i].sinks if cfg.attention_sinks else None
            fn = sdpa_attention if self.attention == "sdpa" else reference.attention
            out = fn(q, k_all, v_all, pos, k_pos, sinks, window).reshape(q.shape[0], -1)
        where, entry = self._dst[bool(kv.ring)]
        with self.side.fork():  # nothing before the next chunk reads it
            if self.kv_write:
                self.kv_write[bool(kv.ring)].launch(k, v, kv.k, kv.v, where, entry)
            else:
                kv.k[where, :, entry] = k
                kv.v[where, :, entry] = v
        return out

    def _lm_head(self, h: torch.Tensor) -> torch.Tensor:
        """float32 logits [R, V] of the final-normed rows h bf16 [R, H]: a bf16 GEMM (the graph
        engine's LM head also rounds logits to bf16), NVFP4 decoded LM_HEAD_ROWS rows at a
        time and scaled by scale2 after the GEMM."""
        w = self.w.lm_head
        if not isinstance(w, NVFP4Weight):
            return F.linear(h, w).float()
        out = []
        for r0 in range(0, w.shape[0], LM_HEAD_ROWS):
            part = NVFP4Weight(w.codes[r0:r0 + LM_HEAD_ROWS], w.scales[r0:r0 + LM_HEAD_ROWS],
                               w.scale2)
            out.append(F.linear(h, self.dec.unscaled(part)).float() * w.scale2.float())
        return torch.cat(out, dim=-1)

