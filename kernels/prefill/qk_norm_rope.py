"""Per-head Q/K RMSNorm and RoPE of a prefill chunk, one pass over the fused QKV projection.

The prefill twin of the decode kernel `kernels/decode/qk_norm_rope_kv.py` (same math, same
code: its `build(spec, prefill=True)`): for each of the chunk's T rows at position
positions[t], every query and key head is RMS-normed over D in fp32 and rounded once to bf16
(`reference.rms_norm` per head), then, when ROPE = 1, rotated (`reference.apply_rope`, fp64
angles reduced exactly as the decode kernel does, the rotation in fp32 from the bf16 value,
rounded once). Queries go to q_out [T, HQ, D], keys to k_out [T, HKV, D] and the values,
unchanged, to v_out [T, HKV, D]: contiguous tensors for `attn_prefill`, which reads the chunk's
own keys from them. The cache write stays outside (capture/prefill.py stores the chunk into
the ring after attention: its later queries still need the ring entries it overwrites).

Replaces, per layer of an 8K chunk, about ten torch passes over the 64 MB query tensor (a
strided RMSNorm, an fp32 copy, the rotate-half negation and concatenation, two products, a sum
and a rounding) with one read of qkv and one write of q, k and v.

Design and PDL: as the decode kernel (one warp per head and row), PREFILL_WARPS heads of a
row per CTA (grid (⌈(HQ + 2·HKV) / 8⌉, T): one warp per CTA was latency-bound); the
norm weights and the inv_freq table are loaded before griddepcontrol.wait, qkv and positions
only after it, in every thread. With RoPE the CTA first computes its row's D/2 (cos, sin)
once into shared memory (thread i: frequency i, after the wait: the position is an input) and
every head's warp reads its lanes' pairs from there (2026-12-07). Why: the decode kernel's
fp64 angle reduction is ~96 fp64 instructions a lane for each head, so a row's 36 rotated
heads cost ~110K fp64 lane-operations: at the H100's 64 fp64 lanes a clock per SM that is ~58
µs of a sliding layer's ~94 µs at 8K tokens (the NoPE full layers' copy-bound launches: ~55
µs; perf log, thirtieth session's 8K profile). The table has the same values (the same
function on the same inputs), so no output bit changes; fp64 work per row drops 7.2× (5 CTAs
× 64 angles instead of 36 heads × 64). Prediction: sliding layers at 8K ~94 → ~55-60 µs on
the H100 (−1.2 to −1.4 ms an 8K prefill, −5 ms at 32K, −15 ms at 100K), full layers
unchanged.

Shape legend: T chunk rows (dynamic), HQ query heads, HKV KV heads, D head dim.

Tolerance (GPU test): as the decode kernel's: q_out and k_out within rel. 1e-2 of the
reference and at most 1% of their elements different at all (fp32 sum-of-squares order, the
hardware rsqrt and fma contraction in the rotation flip rare bf16 roundings); v_out bit-exact.
"""

import math

import torch

from flint_graph.kernels.decode import qk_norm_rope_kv as decode
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, ScalarArg, Spec, TensorArg


def _args(spec: Spec):
    hq, hkv, d = spec["HQ"], spec["HKV"], spec["D"]
    decode.lane_split(d)
    return (TensorArg("qkv", "bf16", ("T", (hq + 2 * hkv) * d), "input"),
            TensorArg("positions", "i32", ("T",), "input", align=4),
            TensorArg("q_norm", "bf16", (d,), "weight"),
            TensorArg("k_norm", "bf16", (d,), "weight"),
            TensorArg("inv_freq", "f64", (d // 2,), "weight"),
            TensorArg("q_out", "bf16", ("T", hq, d), "output"),
            TensorArg("k_out", "bf16", ("T", hkv, d), "output"),
            TensorArg("v_out", "bf16", ("T", hkv, d), "output"),
            ScalarArg("eps", "f32"))


def _launch(spec: Spec) -> Launch:
    """With RoPE, the row's (cos, sin) table: D fp32 of dynamic shared memory (the DSL's
    allocator takes it from the dynamic block, which the launch must size: without it the
    first H200 run faulted, 2026-12-07)."""
    heads = spec["HQ"] + 2 * spec["HKV"]
    return Launch(grid=(decode.ceil_div(heads, decode.PREFILL_WARPS), ("T", 1), 1),
                  block=(32, decode.PREFILL_WARPS, 1), smem=4 * spec["D"] if spec["ROPE"] else 0)


def _specs(cfg, buckets=()) -> list[Spec]:
    """One specialisation per RoPE kind the config's layers have (sliding layers rotate, full
    NoPE layers do not); none when the config has no Q/K norm (the prefill then keeps its
    torch ops)."""
    if not cfg.qk_norm:
        return []
    ropes = sorted({int(cfg.uses_rope(i)) for i in range(cfg.num_hidden_layers)})
    return [KERNEL.spec(HQ=cfg.num_attention_heads, HKV=cfg.num_key_value_heads,
                        D=cfg.head_dim, ROPE=r) for r in ropes]


def _reference(spec: Spec, qkv, positions, q_norm, k_norm, inv_freq, q_out, k_out, v_out,
               eps: float):
    """(q_out, k_out, v_out) bf16 as `reference` computes them (the decode kernel's reference
    on T rows)."""
    return decode._reference({**spec.as_dict(), "B": qkv.shape[0]}, qkv, positions, None,
                             q_norm, k_norm, inv_freq, eps)


def make_args(spec: Spec, *, gen: torch.Generator, tokens: int = 77, start: int = 0,
              theta: float = 10000.0, eps: float = 1e-5, device: str = "cuda") -> list:
    """One fresh argument list for `tokens` rows at positions start … start + tokens − 1:
    qkv ~ N(0, 1), norm weights as the synthetic checkpoints (√2·(1 + 0.05·N(0, 1))),
    inv_freq for `theta`, outputs NaN."""
    hq, hkv, d = spec["HQ"], spec["HKV"], spec["D"]
    on = gen.device

    def norm_w():
        w = math.sqrt(2.0) * (1.0 + 0.05 * torch.randn(d, generator=gen, device=on))
        return w.to(torch.bfloat16).to(device)

    def nan(*shape):
        return torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)

    qkv = torch.randn(tokens, (hq + 2 * hkv) * d, generator=gen, device=on).to(torch.bfloat16)
    pos = torch.arange(start, start + tokens, dtype=torch.int32)
    return [qkv.to(device), pos.to(device), norm_w(), norm_w(),
            decode.rope_inv_freq(d, theta, device), nan(tokens, hq, d), nan(tokens, hkv, d),
            nan(tokens, hkv, d), eps]


def _build(spec: Spec):
    return decode.build(spec, prefill=True)


KERNEL = KernelDef(name="qk_norm_rope", args=_args, launch=_launch, specs=_specs, build=_build,
                   reference=_reference,
                   source_files=("toolchain/dsl_util.py", "decode/qk_norm_rope_kv.py"))
