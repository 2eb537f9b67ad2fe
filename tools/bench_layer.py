#!/usr/bin/env python3
"""Microbenchmark of the decode-step kernels and of whole decoder layers (issue 8), on the GPU.

In one run, on the full config (or --preset tiny):
  * the ceiling: a 2 GiB device-to-device copy (bytes read + written), as bench_kernels.py;
  * each decode kernel (qk_norm_rope_kv, attn_decode, moe_router, moe_gate_up, moe_down) at
    its model specialisation for chosen cases (bucket, context, format): arguments from the
    kernel module's make_args, bytes from its bytes_moved (the least DRAM traffic: counted
    before timing), the floor bytes / copy BW, the measured time, the fraction of copy BW;
    and the kernel's plain-PyTorch reference on the same arguments, timed eagerly;
  * one decoder layer of each kind (sliding+MoE, full+MoE, dense) in each weight format from
    capture/decode_layer.py at B = 1 and 8 and contexts 1K and 100K, captured in a CUDA graph
    with PDL, against `reference.decoder_layer` eager.
Timing: R launches, rotating over argument sets until their distinct bytes exceed 3x L2
(different experts per set for the MoE kernels), captured in one graph; median replay / R.
Each kernel case is first checked against its reference (rel <= 2e-2 for bf16 outputs) and
reported BAD without a time otherwise. Output: DIR/bench_layer.json and DIR/bench_layer.md.

    python tools/bench_layer.py --out DIR [--preset full] [--quick]
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import traceback
from pathlib import Path

from flint_graph.cli_args import ValueParser

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import copy_bandwidth, time_graph  # noqa: E402

from flint_graph import reference  # noqa: E402
from flint_graph.capture.decode_layer import model_spec  # noqa: E402
from flint_graph.checkpoints.config import FlintConfig  # noqa: E402
from flint_graph.kernels import kernel_module, registry  # noqa: E402
from flint_graph.kernels.toolchain.spec import KV_PAGE  # noqa: E402

KERNELS = ("rmsnorm", "gemv_bf16", "gemv_nvfp4", "qk_norm_rope_kv", "attn_decode",
           "moe_router", "moe_gate_up", "moe_down")
MAX_SETS = 64
CHECK_TOL = 2e-2


def log(msg: str) -> None:
    print(msg, flush=True)


def _module(name: str):
    return kernel_module(name)


def _rel(out, ref) -> float:
    return ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _ms_eager(fn, reps: int = 5) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernel_cases(cfg: FlintConfig, quick: bool) -> list[tuple[str, dict, dict, str]]:
    """(kernel, spec selector, make_args keywords, label) per benchmarked case."""
    w, out = cfg.sliding_window, []
    ctxs = (1024, 8192, 32768, 100_000) if not quick else (1024, 100_000)
    for b in (1, 8):
        for ring in (1, 0):
            kind = "sliding" if ring else "full"
            out.append(("qk_norm_rope_kv", {"B": b, "RING": ring}, {"positions": [4095] * b},
                        f"{kind} B={b}"))
        for ctx in ctxs if b == 1 else ctxs[1:]:
            out.append(("attn_decode", {"B": b, "RING": 0}, {"positions": [ctx - 1] * b},
                        f"full B={b} ctx={ctx}"))
        out.append(("attn_decode", {"B": b, "RING": 1}, {"positions": [100_000 + w] * b},
                    f"sliding B={b} ctx>={w}"))
        out.append(("moe_router", {"B": b}, {}, f"B={b}"))
        for kname in ("moe_gate_up", "moe_down"):
            for fmt in (1, 0):
                for topk, what in ((cfg.num_experts_per_tok, "MoE"), (0, "dense")):
                    out.append((kname, {"B": b, "FMT": fmt, "TOPK": topk}, {},
                                f"{what} {'NVFP4' if fmt else 'BF16'} B={b}"))
    return out


def _reroute(name: str, spec, args, gen):
    """Another argument set sharing the weights, with new inputs (and new experts)."""
    mod, kdef = _module(name), registry((name,))[0]
    decls = list(kdef.args(spec))
    kw = {}
    if name == "moe_gate_up" and spec["TOPK"]:
        s = mod.slots(spec)
        kw["experts"] = sorted(torch.randperm(spec["E"], generator=gen,
                                              device=gen.device)[:s].tolist())
    fresh = mod.make_args(spec, gen=gen, device="cuda", **kw) if name != "moe_down" \
        else mod.make_args(spec, gen=gen, device="cuda")
    return [v if getattr(a, "role", "") == "weight" and name in ("moe_gate_up", "moe_down")
            else f for a, v, f in zip(decls, args, fresh)]


def bench_kernel(kset, cfg, name, want, kw, label, l2: int, copy_bw: float, gen) -> dict:
    mod, kdef = _module(name), registry((name,))[0]
    spec = model_spec(kdef, cfg, want["B"], **{k: v for k, v in want.items() if k != "B"})
    rec = {"kernel": name, "case": label, "spec": spec.key}
    kern = kset.get(name, **spec.as_dict())
    decls = list(kdef.args(spec))
    args = mod.make_args(spec, gen=gen, device="cuda", **kw)
    nbytes = mod.bytes_moved(spec, args)
    rec.update(bytes=nbytes, floor_us=nbytes / copy_bw * 1e6)
    kern.launch(*args)
    torch.cuda.synchronize()
    inputs = [v for a, v in zip(decls, args) if getattr(a, "role", "scalar") != "output"]
    ref = kdef.reference(spec, *inputs)
    ref = ref if isinstance(ref, (tuple, list)) else (ref,)
    outs = [v for a, v in zip(decls, args) if getattr(a, "role", "") == "output"]
    worst = 0.0
    for o, r in zip(outs, ref):
        if o.is_floating_point() and o.dtype == torch.bfloat16 and o.shape == r.shape:
            keep = ~r.isnan()
            worst = max(worst, _rel(o[keep], r[keep]))
    rec["check_rel"] = worst
    if not worst <= CHECK_TOL:
        rec["status"] = f"BAD (rel {worst:.2e})"
        return rec
    rec["torch_us"] = _ms_eager(lambda: kdef.reference(spec, *inputs)) * 1e3
    sets = [args]
    heavy = max(nbytes, 1)
    while len(sets) < MAX_SETS and heavy * len(sets) < 3 * l2:
        sets.append(_reroute(name, spec, args, gen) if name in ("moe_gate_up", "moe_down")
                    else mod.make_args(spec, gen=gen, device="cuda", **kw))

    def body():
        for s in sets:
            kern.launch(*s)

    times = time_graph(body)
    us = statistics.median(times) * 1e3 / len(sets)
    rec.update(status="ok", us=us, sets=len(sets), frac_copy=rec["floor_us"] / us,
               speedup_vs_torch=rec["torch_us"] / us)
    return rec


def bench_layers(kset, cfg, preset: str, quick: bool, copy_bw: float) -> list[dict]:
    """Whole decoder layers from the kernels (graph + PDL) against the eager reference."""
    import types

    from flint_graph.checkpoints.make_checkpoint import quantize_weights
    from flint_graph.checkpoints.synthetic import make_layer_weights

    picks, seen = [], set()
    for i in range(cfg.num_hidden_layers):
        key = (cfg.is_sliding(i), cfg.is_moe(i))
        if key not in seen:
            seen.add(key)
            picks.append(i)
    out = []
    for layer in picks:
        kind = ("sliding" if cfg.is_sliding(layer) else "full") + \
            ("+MoE" if cfg.is_moe(layer) else "+dense")
        for fmt in ("nvfp4", "bf16"):
            lw = make_layer_weights(cfg, 3, layer, "cuda")
            if fmt == "nvfp4":
                quantize_weights(types.SimpleNamespace(layers=[lw]), progress=False)
            for b in (1, 8):
                for ctx in ((1024, 100_000) if not cfg.is_sliding(layer) else (100_000,)):
                    rec = {"layer": layer, "kind": kind, "format": fmt, "B": b, "ctx": ctx}
                    try:
                        rec.update(_layer_case(cfg, lw, layer, b, ctx, kset, copy_bw))
                    except Exception as e:  # recorded; the run goes on
                        rec["status"] = f"FAILED ({type(e).__name__}: {e})"[:300]
                        traceback.print_exc()
                    log(f"layer {json.dumps(rec)}")
                    out.append(rec)
            del lw
            torch.cuda.empty_cache()
    return out


def _layer_case(cfg, lw, layer, b, ctx, kset, copy_bw) -> dict:
    from flint_graph.capture.decode_layer import DecodeLayer, StepBuffers, allocate_kv

    pages = math.ceil((ctx + 1) / KV_PAGE)
    bufs = StepBuffers.allocate(cfg, b, pages)
    kv = allocate_kv(cfg, layer, num_pages=b * pages + 1, num_slots=b + 1)
    kv.k.normal_()
    kv.v.normal_()
    bufs.positions.fill_(ctx - 1)
    bufs.ring_table[:, 0] = torch.arange(b, dtype=torch.int32, device="cuda")
    bufs.page_table.copy_(torch.arange(b * pages, dtype=torch.int32,
                                       device="cuda").view(b, pages))
    x = (torch.randn(b, cfg.hidden_size, device="cuda") * 0.05).bfloat16()
    dl = DecodeLayer(kset, cfg, layer, lw, b)

    def body():
        bufs.stream.copy_(x)
        dl.launch(bufs, kv)

    times = time_graph(body)
    us = statistics.median(times) * 1e3
    # torch: the reference layer, eager, on a reference cache of the same length
    windows = [cfg.sliding_window if cfg.is_sliding(i) else None
               for i in range(cfg.num_hidden_layers)]
    hkv, d = cfg.num_key_value_heads, cfg.head_dim
    seqs = []
    for _ in range(b):
        s = reference.SequenceKV(windows, hkv, d, "cuda")
        n = ctx - 1
        if not cfg.is_sliding(layer):
            s.k[layer] = torch.randn(n, hkv, d, device="cuda").bfloat16()
            s.v[layer] = torch.randn(n, hkv, d, device="cuda").bfloat16()
        s.num_tokens = n
        seqs.append(s)

    def ref():
        for s in seqs:
            s.num_tokens = ctx - 1
        reference.decoder_layer(cfg, lw, layer, x, seqs, [1] * b)

    torch_us = _ms_eager(ref, reps=3) * 1e3
    return {"status": "ok", "us": us, "torch_us": torch_us, "speedup_vs_torch": torch_us / us,
            "kernels": dl.kernels_per_launch}


def table(recs: list[dict], layers: list[dict], copy_bw: float) -> str:
    lines = [f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)", "",
             "| kernel | case | bytes | floor µs | µs | % copy BW | torch µs | × torch | rel err |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in recs:
        if r.get("status") != "ok":
            lines.append(f"| {r['kernel']} | {r['case']} | {r.get('bytes', '')} | | "
                         f"{r.get('status')} | | | | |")
            continue
        lines.append(f"| {r['kernel']} | {r['case']} | {r['bytes'] / 1e6:.3f} MB | "
                     f"{r['floor_us']:.2f} | {r['us']:.2f} | {100 * r['frac_copy']:.0f}% | "
                     f"{r['torch_us']:.0f} | {r['speedup_vs_torch']:.0f} | "
                     f"{r['check_rel']:.1e} |")
    lines += ["", "| layer | kind | format | B | context | kernels | µs (graph, PDL) | "
              "torch eager µs | × torch |", "|---|---|---|---|---|---|---|---|---|"]
    for r in layers:
        if r.get("status") != "ok":
            lines.append(f"| {r['layer']} | {r['kind']} | {r['format']} | {r['B']} | "
                         f"{r['ctx']} | | {r.get('status')} | | |")
            continue
        lines.append(f"| {r['layer']} | {r['kind']} | {r['format']} | {r['B']} | {r['ctx']} | "
                     f"{r['kernels']} | {r['us']:.1f} | {r['torch_us']:.0f} | "
                     f"{r['speedup_vs_torch']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = ValueParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for the JSON and table")
    ap.add_argument("--preset", choices=("tiny", "full"), default="full")
    ap.add_argument("--quick", action="store_true", help="fewer contexts")
    ap.add_argument("--no-layers", dest="layers", action="store_false",
                    help="skip the whole-layer benchmark")
    ap.add_argument("--only", metavar="K1,K2", help="benchmark only these decode kernels")
    args = ap.parse_args(argv)
    from flint_graph.capture.launcher import KernelSet

    torch.backends.cuda.matmul.allow_tf32 = False
    cfg = FlintConfig.preset(args.preset)
    kset = KernelSet(kernels=registry(KERNELS))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    copy_bw = copy_bandwidth()
    log(f"copy bandwidth {copy_bw / 1e12:.3f} TB/s, L2 {l2 >> 20} MiB")
    gen = torch.Generator(device="cuda").manual_seed(11)
    recs = []
    for name, want, kw, label in kernel_cases(cfg, args.quick):
        if args.only and name not in args.only.split(","):
            continue
        t0 = time.time()
        try:
            rec = bench_kernel(kset, cfg, name, want, kw, label, l2, copy_bw, gen)
        except Exception as e:
            rec = {"kernel": name, "case": label, "status": f"FAILED ({type(e).__name__}: {e})"
                   [:300]}
            traceback.print_exc()
        rec["wall_s"] = round(time.time() - t0, 2)
        log(json.dumps(rec))
        recs.append(rec)
        torch.cuda.empty_cache()
    layers = bench_layers(kset, cfg, args.preset, args.quick, copy_bw) if args.layers else []
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench_layer.json").write_text(json.dumps(
        {"copy_bw": copy_bw, "preset": args.preset, "kernels": recs, "layers": layers,
         "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}, indent=1))
    text = table(recs, layers, copy_bw)
    (args.out / "bench_layer.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
