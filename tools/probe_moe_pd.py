#!/usr/bin/env python3
"""moe_gate_up's PD (prefetch moe_down's routed weights into L2) measured in the whole decode
step: one engine, each bucket's captured step re-captured with every MoE layer's moe_gate_up at
each PD of --pd (all in the kernel cache: one is the model spec, the others bench specs), in
turn, --rounds times; per round the median of --steps replays (CUDA events, every row at
--context). Also checks that every PD gives the same logits bit for bit (the prefetch is a
hint: it changes no value). One JSON line per bucket and context (delta_us: each PD against
the first), then a summary line.

    python tools/probe_moe_pd.py --preset full --format nvfp4 --buckets 1,2,4 --contexts 1024 \
        --pd 0,1,2

With --axis fold the values of --pd are attention's fold instead (0: qk_norm_rope_kv then
attn_decode, 1: attn_decode QKN = 1 alone; `DecodeLayer(fold=...)`): each layer rebuilt and
the step re-captured. The two forms round the Q/K norm's sum in another order, so their
logits are compared by ‖a − b‖/‖b‖ (`logits_rel`), not bit for bit.

    python tools/probe_moe_pd.py --axis fold --pd 0,1 --buckets 1,8 --contexts 1024,100000
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from flint_graph.cli_args import ValueParser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _set_pd(graph, kset, pd: int) -> None:
    """Point every MoE layer of `graph` at moe_gate_up with PD = pd and re-capture it."""
    for layer in graph.layers:
        if layer.moe:
            spec = {**layer.gate_up.spec.as_dict(), "PD": pd}
            layer.gate_up = kset.get("moe_gate_up", **spec)
    graph.capture()


def _set_fold(graph, kset, fold: int) -> None:
    """Rebuild every layer of `graph` with attention's fold on or off and re-capture it."""
    from flint_graph.capture.decode_layer import DecodeLayer

    graph.layers = [DecodeLayer(kset, graph.cfg, i, lw, graph.batch, bool(fold))
                    for i, lw in enumerate(graph.weights.layers)]
    graph.capture()


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="full")
    p.add_argument("--format", default="nvfp4", choices=("nvfp4", "bf16"))
    p.add_argument("--buckets", default="1,2,4")
    p.add_argument("--contexts", default="1024")
    p.add_argument("--steps", type=int, default=200, help="replays timed per round")
    p.add_argument("--rounds", type=int, default=4, help="rounds over the PD values")
    p.add_argument("--pd", default="0,1", help="PD values, the first the baseline")
    p.add_argument("--axis", default="pd", choices=("pd", "fold"),
                   help="what --pd's values set: moe_gate_up's PD, or attention's fold")
    p.add_argument("--json", default=None, help="also write the records here")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    from flint_graph.perf.bench import BenchOptions, sources
    from flint_graph.perf.measure import graph_steps

    buckets = [int(b) for b in args.buckets.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    o = BenchOptions(preset=args.preset, formats=(args.format,), buckets=tuple(buckets),
                     progress=False)
    out = []
    for fmt, llm in sources(o, max(contexts) + 64):
        runner = llm.engine.runner
        for layer in runner.kv.layers:  # random history, as bench fills it (not unset memory)
            layer.k.normal_()
            layer.v.normal_()
        for b in buckets:
            g = runner.graphs[b]
            for ctx in contexts:
                pds = [int(v) for v in args.pd.split(",")]
                times = {pd: [] for pd in pds}
                logits = {}
                for _ in range(args.rounds):
                    for pd in pds:
                        (_set_fold if args.axis == "fold" else _set_pd)(g, runner.kset, pd)
                        times[pd].append(statistics.median(graph_steps(runner, b, ctx,
                                                                       args.steps)))
                        logits[pd] = g.logits_bf16.clone()
                # over the vocabulary's real columns: the LM head's padding columns are −inf
                # in every form, and −inf − −inf would make the norm NaN
                first = logits[pds[0]]
                real = torch.arange(first.shape[-1], device=first.device) < g.vocab_limit
                base = logits[pds[0]].float()[:, real]
                rec = {"format": fmt, "B": b, "context": ctx, "axis": args.axis,
                       "bitwise_equal": all(torch.equal(logits[pds[0]], v)
                                            for v in logits.values()),
                       "logits_rel": {pd: round(((v.float()[:, real] - base).norm()
                                                 / base.norm()).item(), 6)
                                      for pd, v in logits.items()},
                       "kernels_per_step": g.kernels_per_step,
                       **{f"pd{pd}_ms": round(statistics.median(v), 4) for pd, v in times.items()},
                       **{f"pd{pd}_rounds": [round(t, 4) for t in v] for pd, v in times.items()}}
                rec["delta_us"] = {pd: round((rec[f"pd{pd}_ms"] - rec[f"pd{pds[0]}_ms"]) * 1e3, 1)
                                   for pd in pds[1:]}
                print(json.dumps(rec), flush=True)
                out.append(rec)
            # leave the graph as the engine builds it
            from flint_graph.kernels.decode import attn_decode, moe_gate_up
            if args.axis == "fold":
                _set_fold(g, runner.kset, attn_decode.uses_fold(g.cfg))
            else:
                _set_pd(g, runner.kset, moe_gate_up.pd_for(b))
        del llm, runner
        torch.cuda.empty_cache()
    print(json.dumps({"summary": [(r["B"], r["context"], r["delta_us"], r["bitwise_equal"])
                                  for r in out]}))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
