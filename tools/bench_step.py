#!/usr/bin/env python3
"""Whole decode-step time on the GPU: the captured graph of capture/decode_step.py at full size.

For each weight format (BF16 first, then the same weights snapped to NVFP4 in place), each
bucket B and each context length: B rows at position context−1 (synthetic KV: the cache is
filled with random values, not a real prefill — timing only), the step captured once per
bucket (positions and tables are buffers, so one graph serves every context), replayed;
median and p90 ms per step over the replays, next to the roofline floor
(FlintConfig.decode_step_bytes / the copy bandwidth measured in the same run). With --reference,
the eager reference model's step at the first context, B = 1, for comparison.
The LM head stays BF16 in both formats. Output: DIR/bench_step.json and DIR/bench_step.md.

    python tools/bench_step.py --out DIR [--preset full] [--contexts 1024,8192,32768,100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import copy_bandwidth  # noqa: E402

from flint_graph.config import FlintConfig  # noqa: E402


def log(msg: str) -> None:
    print(msg, flush=True)


def _replays(graph, n: int) -> list[float]:
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    out = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return out


def _rows(b: int, ctx: int):
    """B rows at position ctx − 1: even rows sampled with Flint's defaults (temperature 1,
    top-k 20, top-p 0.95), odd rows greedy (B = 1: one sampled row, the default request)."""
    from flint_graph.capture.decode_step import Row

    return [Row(slot=i, token=1 + i, position=ctx - 1, temperature=1.0 - i % 2, top_k=20,
                top_p=0.95, seed=i, draw_index=ctx) for i in range(b)]


def run_format(kset, cfg, weights, fmt, buckets, contexts, copy_bw, replays) -> list[dict]:
    from flint_graph.capture.decode_step import DecodeGraph, KVCache

    kv = KVCache(cfg, num_slots=max(buckets), max_tokens=max(contexts))
    for layer in kv.layers:
        layer.k.normal_()
        layer.v.normal_()
    out = []
    for b in buckets:
        t0 = time.perf_counter()
        graph = DecodeGraph(kset, cfg, weights, kv, b)
        graph.set_rows(_rows(b, contexts[0]))
        graph.capture()
        capture_s = time.perf_counter() - t0
        try:  # what one replay launches, torch's ops included
            nodes = graph.graph_nodes()
        except RuntimeError as e:
            nodes = {"unknown": str(e)}
        log(f"B={b}: graph nodes {nodes}")
        for ctx in contexts:
            graph.set_rows(_rows(b, ctx))
            times = _replays(graph, replays)
            floor = cfg.decode_step_bytes(b, ctx, fmt)["total"] / copy_bw * 1e3
            med = statistics.median(times)
            rec = {"format": fmt, "B": b, "context": ctx, "ms": med,
                   "p90_ms": statistics.quantiles(times, n=10)[-1], "floor_ms": floor,
                   "frac_floor": floor / med, "kernels": graph.kernels_per_step,
                   "graph_nodes": nodes,
                   "capture_s": capture_s}
            log(json.dumps(rec))
            out.append(rec)
        del graph
        torch.cuda.empty_cache()
    del kv
    torch.cuda.empty_cache()
    return out


def reference_step_ms(cfg, weights, ctx: int) -> float:
    """The eager reference model's decode step at B = 1 after `ctx` − 1 cached tokens of
    random KV (median of 3)."""
    from flint_graph.reference import ReferenceModel

    ref = ReferenceModel(cfg, weights, "cuda")
    seq = ref.new_sequence()
    n = ctx - 1
    hkv, d = cfg.num_key_value_heads, cfg.head_dim
    for i in range(cfg.num_hidden_layers):
        if not cfg.is_sliding(i):
            seq.k[i] = torch.randn(n, hkv, d, device="cuda").bfloat16()
            seq.v[i] = torch.randn(n, hkv, d, device="cuda").bfloat16()
    times = []
    for _ in range(4):
        seq.num_tokens = n
        for i in range(cfg.num_hidden_layers):
            if not cfg.is_sliding(i):
                seq.k[i], seq.v[i] = seq.k[i][:n], seq.v[i][:n]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ref.forward([seq], [torch.tensor([1])])
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def table(recs: list[dict], refs: dict, copy_bw: float) -> str:
    lines = [f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; synthetic KV fill (timing only)", "",
             "| format | B | context | ms / step (median) | p90 | floor ms | % of floor | "
             "kernels | graph kernel nodes |", "|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        lines.append(f"| {r['format']} | {r['B']} | {r['context']} | {r['ms']:.3f} | "
                     f"{r['p90_ms']:.3f} | {r['floor_ms']:.3f} | "
                     f"{100 * r['frac_floor']:.0f}% | {r['kernels']} | "
                     f"{r['graph_nodes'].get('kernel', '?')} |")
    for fmt, (ctx, ms) in refs.items():
        lines.append(f"\neager reference, {fmt}, B = 1, context {ctx}: {ms:.1f} ms / step")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--preset", choices=("tiny", "full"), default="full")
    ap.add_argument("--buckets", default="1,2,4,8")
    ap.add_argument("--contexts", default="1024,8192,32768,100000")
    ap.add_argument("--formats", default="bf16,nvfp4")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--reference", action="store_true", help="also time the eager reference")
    args = ap.parse_args(argv)
    from flint_graph.capture.launcher import KernelSet
    from flint_graph.make_checkpoint import quantize_weights
    from flint_graph.synthetic import make_weights

    cfg = FlintConfig.preset(args.preset)
    buckets = [int(x) for x in args.buckets.split(",")]
    contexts = [int(x) for x in args.contexts.split(",")]
    kset = KernelSet()
    copy_bw = copy_bandwidth()
    log(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s")
    t0 = time.perf_counter()
    weights = make_weights(cfg, 0, "cuda")
    log(f"weights made in {time.perf_counter() - t0:.1f} s")
    recs, refs = [], {}
    for fmt in args.formats.split(","):
        if fmt == "nvfp4":
            t0 = time.perf_counter()
            quantize_weights(weights, progress=False)  # embedding and LM head stay BF16
            log(f"snapped to NVFP4 in {time.perf_counter() - t0:.1f} s")
        recs += run_format(kset, cfg, weights, fmt, buckets, contexts, copy_bw, args.replays)
        if args.reference:
            refs[fmt] = (contexts[0], reference_step_ms(cfg, weights, contexts[0]))
            log(f"reference {fmt}: {refs[fmt][1]:.1f} ms")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_step.json").write_text(json.dumps(
        {"copy_bw": copy_bw, "preset": args.preset, "steps": recs,
         "reference_ms": {k: {"context": c, "ms": m} for k, (c, m) in refs.items()},
         "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}, indent=1))
    text = table(recs, refs, copy_bw)
    (args.out / "bench_step.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
