"""Bytes before time: the copy bandwidth a run is judged against, and the fewest bytes each
kernel of the decode step must move (the per-kernel split of `FlintConfig.decode_step_bytes`).

The floor of a step or a kernel is bytes / copy bandwidth, the copy bandwidth measured in the
same run (a device-to-device copy on CUDA, a tensor copy on the CPU): what the memory system
delivers to a kernel that only streams, so "fraction of the floor" is comparable across machines.
"""

from __future__ import annotations

import statistics
import time

import torch

from flint_graph.checkpoints.config import FlintConfig

BF16, F32, I32 = 2, 4, 4
NVFP4_BYTES_PER_PARAM = 0.5 + 1 / 16  # E2M1 codes + one E4M3 scale per 16 values


def copy_bandwidth(device: torch.device, nbytes: int | None = None, reps: int = 9) -> float:
    """Bytes/s of a buffer copy (read + write counted), median of `reps` after 2 warm-ups.
    CUDA: 2 GiB, timed with events (far past L2); CPU: 256 MiB, wall clock."""
    cuda = device.type == "cuda"
    nbytes = nbytes or ((2 << 30) if cuda else (256 << 20))
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for i in range(reps + 2):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            ms = a.elapsed_time(b)
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            ms = (time.perf_counter() - t0) * 1e3
        if i >= 2:
            times.append(ms)
    del src, dst
    if cuda:
        torch.cuda.empty_cache()
    return 2 * nbytes / (statistics.median(times) * 1e-3)


def linear_bytes(n: int, k: int, fmt: str) -> float:
    """Bytes of one [N, K] weight: 2 per value in BF16, 0.5625 in NVFP4 (+ its fp32 scale2)."""
    return n * k * 2 if fmt == "bf16" else n * k * NVFP4_BYTES_PER_PARAM + F32


def step_kernels(cfg: FlintConfig, fmt: str, batch: int, context: int,
                 fold: bool = False) -> list[dict]:
    """The graph engine's decode step as launched (capture/decode_step.py), one dict per kernel in
    launch order: {"name", "layer" (None outside the layers), "kind", "bytes"}; bytes = the
    weights it reads once + the KV it reads or writes + its activations. Routed experts count
    `expected_experts_touched(batch)` per MoE layer (uniform routing), as the step floor does;
    the LM head is BF16 in both formats. Kinds: embedding, gemv, attention, norm, moe, lm_head,
    sampling. `fold`: attention takes qk_norm_rope_kv's work (attn_decode QKN = 1: it reads
    qkv and writes the new KV entry itself). Raises ConfigError for an unknown `fmt`."""
    cfg.decode_step_bytes(batch, context, fmt)  # validates fmt
    b, h, d = batch, cfg.hidden_size, cfg.head_dim
    hq, q, kv = cfg.num_attention_heads, cfg.q_dim, cfg.kv_dim
    act = lambda n: b * n * BF16  # noqa: E731  a bf16 [B, n] activation
    out = [{"name": "embedding", "layer": None, "kind": "embedding", "bytes": 2 * act(h)}]
    touched = cfg.expected_experts_touched(b)
    m, e = cfg.moe_intermediate_size, cfg.n_routed_experts
    for i in range(cfg.num_hidden_layers):
        keys = min(context + 1, cfg.sliding_window) if cfg.is_sliding(i) else context + 1
        layer = [
            ("qkv_gemv", "gemv", linear_bytes(q + 2 * kv, h, fmt) + h * BF16 + act(h)
             + act(q + 2 * kv)),
            ("qk_norm_rope_kv", "attention", act(q + 2 * kv) + act(q) + 2 * act(kv) + 2 * d * BF16),
            ("attn_decode", "attention", b * keys * 2 * kv * BF16 + 2 * act(q) + hq * F32),
            ("o_gemv", "gemv", linear_bytes(h, q, fmt) + act(q) + act(h)),
        ]
        if fold:  # qkv in, the new entry out, the norm weights; q stays on chip
            layer[1:3] = [("attn_decode", "attention", b * keys * 2 * kv * BF16
                           + act(q + 2 * kv) + act(q) + 2 * act(kv) + 2 * d * BF16 + hq * F32)]
        if cfg.is_moe(i):
            shared = cfg.n_shared_experts * m
            layer += [
                ("moe_router", "moe", e * h * F32 + e * F32 + h * BF16 + 4 * act(h)),
                ("moe_gate_up", "moe", touched * linear_bytes(2 * m, h, fmt)
                 + linear_bytes(2 * shared, h, fmt) + act(h) + b * (cfg.num_experts_per_tok * m
                                                                    + shared) * BF16),
                ("moe_down", "moe", touched * linear_bytes(h, m, fmt) + linear_bytes(h, shared, fmt)
                 + b * (cfg.num_experts_per_tok * m + shared) * BF16 + 2 * act(h)),
            ]
        else:
            f = cfg.intermediate_size
            layer += [
                ("ffn_norm", "norm", h * BF16 + 4 * act(h)),
                ("dense_gate_up", "gemv", linear_bytes(2 * f, h, fmt) + act(h) + act(f)),
                ("dense_down", "gemv", linear_bytes(h, f, fmt) + act(f) + 2 * act(h)),
            ]
        out += [{"name": n, "layer": i, "kind": k, "bytes": float(v)} for n, k, v in layer]
    v = cfg.vocab_size
    out += [{"name": "final_norm", "layer": None, "kind": "norm", "bytes": h * BF16 + 3 * act(h)},
            {"name": "lm_head", "layer": None, "kind": "lm_head",
             "bytes": v * h * BF16 + act(h) + act(v)},
            {"name": "sample_tokens", "layer": None, "kind": "sampling", "bytes": act(v) + b * 8}]
    return out


def floor_ms(nbytes: float, copy_bw: float) -> float:
    """Milliseconds to move `nbytes` at `copy_bw` bytes/s."""
    return nbytes / copy_bw * 1e3
