#!/usr/bin/env python3
"""Time the sample_tokens kernel alone (issue 24 item 2): µs per launch by vocabulary, bucket and
sampling parameters, so the decode trace's 49.5 µs can be placed (fixed cost or per-key work).

Each case: NSETS logits buffers (3·N(0, 1) bf16, the kernel's bench distribution; together > 2×
L2, so each launch reads its logits from DRAM) share one set of workspaces; one CUDA graph
launches the kernel once per set (PDL on, as in the decode graph), and the replay's median over
--reps, divided by NSETS, is the time per launch. The first set's ids are checked against the
kernel's reference before timing (a wrong id marks the case BAD). With --plain N the chosen
case is launched N times outside a graph instead (for `ncu -k regex:sample_tokens`).
Parameters per row: greedy (T = 0), plain (T = 1, no top-k / top-p), defaults (Flint's
generation_config: T = 1, top-k 20, top-p 0.95), topp (T = 1, top-p 0.95 only).
Output: a table on stdout and --out DIR/probe_sampler.json.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from flint_graph.cli_args import ValueParser

import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import registry
from flint_graph.kernels.decode.sample_tokens import KERNEL, make_args
from flint_graph.perf.measure import replay_times_ms

PARAMS = {"greedy": (0.0, 0, 1.0), "plain": (1.0, 0, 1.0), "defaults": (1.0, 20, 0.95),
          "topp": (1.0, 0, 0.95)}
L2_BYTES = 50 * 2**20


def _args(spec, mode: str, seed: int):
    t, k, p = PARAMS[mode]
    b = spec["B"]
    gen = torch.Generator().manual_seed(seed)
    return make_args(spec, gen=gen, temperature=[t] * b, top_k=[k] * b, top_p=[p] * b)


def time_case(kset, preset: str, b: int, mode: str, reps: int) -> dict:
    cfg = FlintConfig.preset(preset)
    spec = KERNEL.spec(B=b, V=cfg.vocab_size, VLIM=cfg.vocab_size)
    kernel = kset.get("sample_tokens", **spec.as_dict())
    base = _args(spec, mode, 1)
    want = KERNEL.reference(spec, *base[:6])
    kernel.launch(*base)
    torch.cuda.synchronize()
    ok = torch.equal(base[6].cpu(), want.cpu()) and not any(a.any() for a in base[7:])
    nsets = max(8, min(512, -(-2 * L2_BYTES // base[0].numel() // 2)))
    logits = [torch.randn_like(base[0], dtype=torch.float32).mul_(3).bfloat16()
              for _ in range(nsets)]
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        kernel.launch(*base)  # warm the stream before capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for x in logits:
                kernel.launch(x, *base[1:])
    times = [ms * 1000 / nsets for ms in replay_times_ms(graph.replay, reps)]
    clean = not any(a.any() for a in base[7:])
    return {"preset": preset, "V": cfg.vocab_size, "B": b, "mode": mode, "ok": ok and clean,
            "launches": nsets, "us_median": statistics.median(times), "us_min": min(times)}


def main() -> None:
    ap = ValueParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="directory for probe_sampler.json")
    ap.add_argument("--presets", default="tiny,full")
    ap.add_argument("--buckets", default="1,8")
    ap.add_argument("--modes", default=",".join(PARAMS))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--plain", type=int, default=0,
                    help="launch the first case N times outside a graph (for ncu) and stop")
    o = ap.parse_args()
    from flint_graph.capture.launcher import KernelSet

    kset = KernelSet(kernels=registry(("sample_tokens",)))
    cases = [(p, int(b), m) for p in o.presets.split(",") for b in o.buckets.split(",")
             for m in o.modes.split(",")]
    if o.plain:
        p, b, m = cases[0]
        cfg = FlintConfig.preset(p)
        spec = KERNEL.spec(B=b, V=cfg.vocab_size, VLIM=cfg.vocab_size)
        kernel = kset.get("sample_tokens", **spec.as_dict())
        args = _args(spec, m, 1)
        for _ in range(o.plain):
            kernel.launch(*args, pdl=False)
        torch.cuda.synchronize()
        print(f"{o.plain} plain launches of {p} B={b} {m}: ids {args[6].tolist()}")
        return
    rows = []
    print(f"{'preset':6} {'B':>2} {'mode':9} {'µs':>8} {'min':>8}  ok")
    for p, b, m in cases:
        r = time_case(kset, p, b, m, o.reps)
        rows.append(r)
        print(f"{p:6} {b:>2} {m:9} {r['us_median']:8.2f} {r['us_min']:8.2f}  {r['ok']}",
              flush=True)
    if o.out:
        o.out.mkdir(parents=True, exist_ok=True)
        (o.out / "probe_sampler.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
