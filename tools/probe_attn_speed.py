#!/usr/bin/env python3
"""Time the prefill attention kernels alone, per layer kind, against the dense BF16 matmul peak
measured in the same run (issue 21: attention is most of a 32K or 100K prefill).

For each variant (kernel name plus spec values, as tools/bench_prefill.py's --attn-kernel) and
each case (a chunk of T query tokens after S cached ones), the kernel's full-layer (paged) and
sliding-layer (ring) specialisations of the full config run R times back to back in one CUDA
graph over L argument sets (fresh Gaussian inputs, sinks N(0, 1)); time per launch = the median
of 5 replays / R. FLOPs are the visible (query, key) pairs' 4·D·HQ (attn_prefill.flops). The
peak is perf/measure.matmul_peak_flops (8,192³ bf16, what the bench's MFU divides by).

    python tools/probe_attn_speed.py [--variants attn_prefill,attn_prefill_wg]
        [--cases 8192+0,8192+24576] [--reps 8] [--out DIR]

Needs a CUDA GPU and the kernel cache (FLINT_GRAPH_CACHE). Prints one line per (variant, kind,
case) and writes attn_speed.json under --out. `--ncu` launches each once, for ncu's
--launch-count (no graph, no timing).
"""

from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

from flint_graph.cli_args import ValueParser

from flint_graph.cli_args import plain_int_or_none, shown
from flint_graph.perf.tool_reports import count_arg


REPORT_TOOL = "tools/probe_attn_speed.py"  # attn_speed.json's "tool" (perf/tool_reports.py)
KINDS = ("full", "sliding")
MAX_TOKENS = 262_144  # the full config's positions
MAX_REPS, MAX_SETS = 10_000, 64



def parse_variants(text: str) -> list[tuple[str, dict[str, int]]]:
    """--variants: comma-separated NAME[:K=V…], NAME attn_prefill (no values) or
    attn_prefill_wg with ST, WS or FC (ASCII digits), each a spec the cache build makes for
    both layer kinds. Raises ValueError naming the item and what was expected."""
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.kernels.prefill import attn_prefill_wg as wg

    cfg = FlintConfig.preset("full")
    built = {s.id for s in wg._specs(cfg) + wg.bench_specs(cfg)}
    base = [s for s in wg._specs(cfg) if "SPLITS" not in s.as_dict()]
    out = []
    items = text.split(",")
    if not all(items):
        raise ValueError(f"{text!r}: expected comma-separated variants, none empty")
    for item in items:
        name, *pairs = item.split(":")
        if name not in ("attn_prefill", "attn_prefill_wg"):
            raise ValueError(f"{item!r}: expected attn_prefill or attn_prefill_wg[:K=V…]")
        values: dict[str, int] = {}
        for kv in pairs:
            key, eq, val = kv.partition("=")
            num = plain_int_or_none(val) if val == val.strip() else None
            if not eq or num is None or key in values:
                raise ValueError(f"{shown(item)}: {shown(kv)} is not a new K=V with V an "
                                 "integer ≥ 0")
            values[key] = num
        if name == "attn_prefill" and values:
            raise ValueError(f"{item!r}: attn_prefill takes no K=V values")
        if values and (set(values) - {"ST", "WS", "FC"}
                       or any(wg.variant(s, **values).id not in built for s in base)):
            raise ValueError(f"{item!r}: no such attn_prefill_wg spec is built (ST=3, WS=1 "
                             "or FC=0, one at a time)")
        out.append((name, values))
    return out


def parse_cases(text: str) -> list[tuple[int, int]]:
    """--cases: comma-separated T+S (T ≥ 1 query tokens after S ≥ 0 cached, ASCII digits).
    Raises ValueError naming the item."""
    out = []
    for item in text.split(","):
        t, plus, start = item.partition("+")
        if not (plus and t.isascii() and t.isdigit() and start.isascii() and start.isdigit()
                and len(t) + len(start) < 20 and 1 <= int(t) and int(t) + int(start) <= MAX_TOKENS):
            raise ValueError(f"{item!r}: expected T+S, T ≥ 1 query tokens after S ≥ 0 cached, "
                             f"T + S ≤ {MAX_TOKENS:,} (the full config's positions)")
        out.append((int(t), int(start)))
    return out


def main() -> int:
    p = ValueParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--variants", default="attn_prefill_wg,attn_prefill_wg:ST=3",
                   help="comma-separated NAME[:K=V…] (default: attn_prefill_wg at 2 and 3 stages)")
    p.add_argument("--cases", default="8192+0,8192+24576",
                   help="comma-separated T+S: T query tokens after S cached (default: an 8K "
                        "prefill and the last 8K chunk of a 32K one)")
    p.add_argument("--kinds", default="full,sliding", help="layer kinds to time")
    p.add_argument("--reps", type=count_arg, default=8, help="launches per graph replay")
    p.add_argument("--sets", type=count_arg, default=2,
                   help="argument sets the launches rotate over")
    p.add_argument("--ncu", action="store_true", help="launch each once, untimed (for ncu)")
    p.add_argument("--out", default=None, help="directory for attn_speed.json")
    args = p.parse_args()
    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        p.error(f"--variants {e}")
    try:
        cases = parse_cases(args.cases)
    except ValueError as e:
        p.error(f"--cases {e}")
    kinds = args.kinds.split(",")
    if not kinds or not set(kinds) <= set(KINDS) or len(set(kinds)) < len(kinds):
        p.error(f"--kinds {args.kinds!r}: expected comma-separated layer kinds among "
                f"{', '.join(KINDS)}, each once")
    for flag, value, most in (("--reps", args.reps, MAX_REPS), ("--sets", args.sets, MAX_SETS)):
        if not 1 <= value <= most:
            p.error(f"{flag} {value}: expected 1 to {most:,}")
    if args.out is not None:
        from flint_graph.perf.tool_reports import out_problem

        if not args.out.strip():
            p.error(f"--out {args.out!r}: expected a folder (it holds attn_speed.json)")
        if problem := out_problem(Path(args.out), {"attn_speed.json": _own_report}):
            p.error(f"--out {args.out!r}: {problem}")

    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (and the kernel cache, FLINT_GRAPH_CACHE)")
    from flint_graph.capture.launcher import KernelSet, capture_graph
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.kernels import registry
    from flint_graph.kernels.prefill import attn_prefill as ap
    from flint_graph.kernels.prefill import attn_prefill_wg as wg
    from flint_graph.perf.measure import matmul_peak_flops

    cfg = FlintConfig.preset("full")
    kset = KernelSet(kernels=registry(("attn_prefill", "attn_prefill_wg")))
    specs = {("sliding" if s["RING"] else "full"): s for s in wg._specs(cfg)
             if "SPLITS" not in s.as_dict()}
    peak = None if args.ncu else matmul_peak_flops("cuda")
    if peak:
        print(f"dense BF16 matmul peak {peak / 1e12:.0f} TFLOP/s", flush=True)
    rows = []
    for (name, values), variant in zip(variants, args.variants.split(",")):
        for kind in kinds:
            base = specs[kind].as_dict()
            spec = (wg.variant(specs[kind], **values) if name == "attn_prefill_wg" else
                    ap.KERNEL.spec(**{k: v for k, v in {**base, **values}.items()
                                      if k not in ("ST", "V", "FC")}))
            k = kset.get(name, **spec.as_dict())
            for t, start in cases:
                gen = torch.Generator(device="cuda").manual_seed(t + start)
                mod = wg if name == "attn_prefill_wg" else ap
                sets = [mod.make_args(spec, gen=gen, tokens=t, start=start, poison_unseen=False)
                        for _ in range(args.sets)]
                k.launch(*sets[0])
                torch.cuda.synchronize()
                if args.ncu:
                    continue
                graph = torch.cuda.CUDAGraph()
                with capture_graph(graph):
                    for r in range(args.reps):
                        k.launch(*sets[r % len(sets)])
                graph.replay()
                times = []
                for _ in range(5):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    graph.replay()
                    e.record()
                    e.synchronize()
                    times.append(s.elapsed_time(e) / 1e3 / args.reps)
                sec = statistics.median(times)
                fl = ap.flops(spec, t, start)
                # the launch's CTAs (grid x · y · z): one an SM or two tells how much of the
                # kernel's overlap a case can have (attn_prefill_wg is laid out for two)
                ctas = math.prod(mod.KERNEL.launch(spec).grid_for({"T": t}))
                row = {"variant": variant, "kind": kind, "tokens": t, "start": start,
                       "ctas": ctas, "us": sec * 1e6, "tflops": fl / sec / 1e12,
                       "of_peak": fl / sec / peak}
                rows.append(row)
                print(f"{variant:28s} {kind:7s} T={t:6d} S={start:6d} {ctas:5d} CTAs: "
                      f"{sec * 1e6:9.1f} us {row['tflops']:6.1f} TFLOP/s ({row['of_peak']:.0%} "
                      "of the matmul peak)", flush=True)
                del graph, sets
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        from flint_graph.perf.tool_reports import sealed_json

        Path(args.out, "attn_speed.json").write_text(
            sealed_json({"peak_flops": peak, "rows": rows}, REPORT_TOOL))
    return 0


def _own_report(path: Path) -> bool:
    """Whether `path` is an attn_speed.json this tool wrote, unchanged since."""
    from flint_graph.perf.tool_reports import is_own_json

    return is_own_json(path, REPORT_TOOL)


if __name__ == "__main__":
    sys.exit(main())
