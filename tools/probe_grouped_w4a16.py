"""Launch the prefill's grouped W4A16 expert kernels (kernels/prefill/grouped_w4a16.py) alone,
at full size, on the schedule a chunk of --tokens tokens makes (6 uniform picks of 256
experts), so that a profiler sees them without the rest of the prefill, e.g.

    ncu -k regex:grouped_w4a16 --set full python tools/probe_grouped_w4a16.py --tokens 25

Prints each kernel's time (the median over 5 replays of one CUDA graph of --reps launches in
stream order with PDL, as in the prefill's graphs, the weights of --layers layers rotated so
each launch reads DRAM) and its bytes over the copy bandwidth measured in
the same run, and the pairs' FLOP/s. Variants: --kernel, --nt, --depth (spec D), --kinds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flint_graph.checkpoints.config import FlintConfig  # noqa: E402
from flint_graph.cli_args import plain_int_or_none, shown  # noqa: E402
from flint_graph.perf.tool_reports import count_arg  # noqa: E402
from flint_graph.kernels import registry  # noqa: E402
from flint_graph.kernels.prefill import grouped_w4a16 as gw  # noqa: E402


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device-to-device copy of `nbytes` (read + write counted)."""
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(10):
        s.record()
        b.copy_(a)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return nbytes / statistics.median(times)


# the spec values --values may change, per kernel, and what each may be
VALUES = {"grouped_w4a16_wg": {"SUB": (0, 1), "RS": (0, 1), "W0": (0, 1)},
          "grouped_w4a16": {"WS": (0, 1), "PF": (0, 2, 4, 8)}}


def gw_spec(cfg, kind: int, nt: int, values: dict, depth: int):
    """grouped_w4a16's routed spec at (KIND, NT) with `values` and D = `depth`: the model's PF
    (grouped_w4a16.PF_MODEL) unless PF is given (PF=0: none) or another form (WS, D) is."""
    v = dict(values)
    pf = v.pop("PF", None)
    if pf is None and not v.get("WS") and depth == gw.DEPTH:
        v.update(gw._pf_model(kind, nt, True))
    elif pf:
        v["PF"] = pf
    return gw.KERNEL.spec(KIND=kind, H=cfg.hidden_size, M=cfg.moe_intermediate_size,
                         E=cfg.n_routed_experts, NT=nt, D=depth, **v)


def prefill_nt(tokens: int, wg: bool) -> int:
    """The tile width (pairs) the prefill picks for a chunk of `tokens` rows: grouped_w4a16_wg
    (`wg`) or grouped_w4a16 (capture/prefill.py W4A16_WG_NT / W4A16_NT)."""
    from flint_graph.capture.prefill import (W4A16_NT, W4A16_NT_LARGE, W4A16_WG_NT,
                                             W4A16_WG_NT_LARGE)

    table, large = (W4A16_WG_NT, W4A16_WG_NT_LARGE) if wg else (W4A16_NT, W4A16_NT_LARGE)
    return next((n for r, n in table if tokens <= r), large)


def _ints(text: str) -> list[int] | None:
    """Comma-separated plain integers (`plain_int`), or None where any is not one."""
    vals = [plain_int_or_none(v) if v == v.strip() else None for v in text.split(",") if v]
    return None if not vals or None in vals else vals


def check_args(p: argparse.ArgumentParser, args) -> None:
    """Every option's values before any GPU work: p.error names the option and what it
    expected; args.values becomes a dict."""
    from flint_graph.kernels.prefill import grouped_w4a16_wg as gwg

    tokens = _ints(args.tokens)
    most = FlintConfig.preset("full").max_position_embeddings
    if tokens is None or min(tokens) < 1 or max(tokens) > most:
        p.error(f"--tokens {shown(args.tokens)}: expected chunk sizes from 1 to {most} (the full "
                "config's positions), comma-separated")
    kinds = _ints(args.kinds)
    if kinds is None or set(kinds) - {0, 1} or len(set(kinds)) != len(kinds):
        p.error(f"--kinds {shown(args.kinds)}: expected 0 (gate/up) and/or 1 (down), each once")
    nts = gwg.NTS if args.kernel == "grouped_w4a16_wg" else gw.NTS
    if args.nt and args.nt not in nts:
        p.error(f"--nt {args.nt}: {args.kernel} takes 0 (the prefill's choice) or one of "
                f"{', '.join(map(str, nts))}")
    if args.depth not in gw.DEPTHS:
        p.error(f"--depth {args.depth}: expected one of {', '.join(map(str, gw.DEPTHS))}")
    for flag, value in (("--reps", args.reps), ("--layers", args.layers)):
        if value < 1:
            p.error(f"{flag} {value}: expected 1 or more")
    known, values = VALUES[args.kernel], {}
    for kv in (kv for kv in args.values.split(",") if kv):
        key, eq, val = kv.partition("=")
        num = plain_int_or_none(val) if val == val.strip() else None
        if key in values:
            p.error(f"--values {shown(args.values)}: {key} given twice")
        if key not in known or not eq or num not in known[key]:
            p.error(f"--values {shown(kv)}: {args.kernel} takes "
                    + ", ".join(f"{k}={'|'.join(map(str, v))}" for k, v in known.items())
                    + ", each once")
        values[key] = num
    wg = args.kernel == "grouped_w4a16_wg"
    nts = [args.nt] if args.nt else sorted({prefill_nt(t, wg) for t in tokens})
    if wg:
        try:  # a combination no spec takes (e.g. SUB=0,RS=1 at NT 128): before any GPU work
            gwg.check_variant(values, nts)
        except ValueError as e:
            p.error(f"--values {shown(args.values)}: {e}")
    else:
        if values.get("WS") == 0:
            del values["WS"]  # the default form: its specs do not name WS
        cfg = FlintConfig.preset("full")
        built = {s.id for s in gw.KERNEL.specs(cfg, ()) + gw.bench_specs(cfg)}
        for nt, kind in ((nt, kind) for nt in nts for kind in (0, 1)):
            # a GPU machine without the CuTe DSL cannot build a missing one
            spec = gw_spec(cfg, kind, nt, values, args.depth)
            if spec.id not in built:
                p.error(f"--values {shown(args.values)} --depth {args.depth} at NT = {nt}: no such "
                        "grouped_w4a16 spec is built (tools/build_gpu_cache.py: the depths "
                        f"{gw.DEPTHS}, or WS=1 at depth {gw.DEPTH} and NT <= {gw.WS_MAX_NT}, "
                        f"or PF=2|4|8 at depth {gw.DEPTH} and NT in {gw.PF_NTS})")
    args.values = values


def main() -> int:
    from flint_graph.cli_args import ValueParser

    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", default="25,512", help="chunk sizes (tokens), comma-separated")
    p.add_argument("--kernel", default="grouped_w4a16",
                   choices=("grouped_w4a16", "grouped_w4a16_wg"),
                   help="the routed experts' kernel (grouped_w4a16_wg: the wgmma one, chunks "
                        "above 1,536 rows in the prefill)")
    p.add_argument("--nt", type=count_arg, default=0, help="pairs per tile (0: the prefill's choice)")
    p.add_argument("--depth", type=count_arg, default=gw.DEPTH,
                   help=f"grouped_w4a16's weight steps in registers ({gw.DEPTHS})")
    p.add_argument("--kinds", default="0,1", help="0 gate/up, 1 down, comma-separated")
    p.add_argument("--values", default="",
                   help="more spec values, K=V[,K=V…]: grouped_w4a16_wg's SUB, RS and W0 "
                        "(0, 1; W0=1 needs RS=1), grouped_w4a16's WS (0, 1) and PF (0, 2, 4, "
                        "8: L2 prefetch steps ahead, NT 16 and 32)")
    p.add_argument("--reps", type=count_arg, default=20, help="launches per CUDA graph")
    p.add_argument("--layers", type=count_arg, default=8,
                   help="weight sets rotated so each launch reads DRAM")
    args = p.parse_args()
    check_args(p, args)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU (this machine has none)")
    from flint_graph.capture.launcher import KernelSet, capture_graph
    from flint_graph.kernels.prefill import grouped_w4a16_wg as gwg

    cfg = FlintConfig.preset("full")
    kset = KernelSet(kernels=registry((args.kernel,)))
    wg = args.kernel == "grouped_w4a16_wg"
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw / 1e12:.2f} TB/s")
    shown = ",".join(f"{k}={v}" for k, v in args.values.items())
    for t in [int(v) for v in args.tokens.split(",") if v]:
        nt = args.nt or prefill_nt(t, wg)
        for kind in [int(v) for v in args.kinds.split(",") if v]:
            values = dict(KIND=kind, H=cfg.hidden_size, M=cfg.moe_intermediate_size,
                          E=cfg.n_routed_experts, NT=nt)
            if wg:  # the model's SUB (every spec names it), RS and W0 at this NT
                values.update(SUB=gwg.SUB[nt], RS=gwg.RS[nt], W0=gwg.W0[nt])
            spec = (gwg.variant(gwg.KERNEL.spec(**gwg.spec_values(**values)), **args.values)
                    if wg else gw_spec(cfg, kind, nt, args.values, args.depth))
            k = kset.get(args.kernel, **spec.as_dict())
            gen = torch.Generator(device="cuda").manual_seed(t)
            sets = [(gwg if wg else gw).make_args(spec, gen=gen, tokens=t, experts_used=256)
                    for _ in range(args.layers)]
            tiles = sets[0][2 if kind == 0 else 1]
            live = tiles[tiles[:, 0] >= 0]
            experts = int(live[:, 0].unique().numel())
            per_w = (cfg.hidden_size * cfg.moe_intermediate_size * (2 if kind == 0 else 1)
                     * (0.5 + 1 / 16))
            nbytes = experts * per_w
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            k.launch(*sets[0])  # warm-up (module load)
            torch.cuda.synchronize()
            # one CUDA graph of --reps launches (host launch time, ~tens of µs a launch from
            # Python, would otherwise be what is timed), each after the one before (PDL)
            graph = torch.cuda.CUDAGraph()
            with capture_graph(graph):
                for r in range(args.reps):
                    k.launch(*sets[r % len(sets)])
            graph.replay()
            times = []
            for _ in range(5):
                s.record()
                graph.replay()
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e) * 1e3 / args.reps)
            us = statistics.median(times)
            fl = t * 6 * 2 * cfg.hidden_size * cfg.moe_intermediate_size * (2 - kind)
            print(f"{args.kernel}{'/' + shown if shown else ''} T={t} KIND={kind} NT={nt}"
                  f"{'' if wg else f' D={args.depth}'}"
                  f"{' PF=%d' % spec['PF'] if 'PF' in spec.as_dict() else ''}"
                  f": {len(live)} tiles, {experts} "
                  f"experts, {nbytes / 1e6:.1f} MB of weights, {us:.1f} us "
                  f"({nbytes / (us * 1e-6) / bw:.0%} of copy BW, {fl / us / 1e6:.0f} TFLOP/s)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
