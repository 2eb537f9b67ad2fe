#!/usr/bin/env python3
"""Kernel microbenchmark (issue 7 item 5): the AOT kernels against copy bandwidth and torch.

Measures, in one run on one GPU (../.library/device/METHOD.md):
  * the ceiling: a 2 GiB device-to-device copy, bytes read + written, median of 15;
  * rmsnorm at H = hidden, gemv_bf16 and gemv_nvfp4 at every (N, K) of dense_linear_shapes(),
    B in {1, 2, 4, 8}, every variant (spec values besides B/K/N/H, e.g. V) that the kernel
    declares, its module's bench_specs() lists or the cache holds (* marks its spec_for()
    pick). Bytes come first, from the declared arguments (weights + inputs read once, outputs
    written once); each floor (bytes / copy BW) is printed before any timing;
  * torch on the same shape and rotation: F.linear in bf16 (also the NVFP4 GEMV's baseline:
    its time depends only on the shape), the reference ops' residual add + RMSNorm;
  * one layer's q, k, v, o GEMVs (o reads q's output), every layer with its own weights, back
    to back in one graph, PDL on and off, B = 1 and 8 (best variant of each);
  * layers x 6 dependent rmsnorm B=1 launches (ping-pong buffers), PDL on and off: the cost
    of a kernel boundary.
How: each case is checked once against its KernelDef reference (fresh random inputs, NaN-
poisoned outputs, rel. err <= 1e-2, else BAD and no time). Then R launches, rotating over
enough buffer sets that their weights exceed 3x L2, are captured in one CUDA graph, warmed up
and replayed; each replay is timed with CUDA events; time per launch = median replay / R.
A failing case is recorded and the run goes on; past --budget-s the rest is SKIPPED.
Output: progress lines, a compact table printed last, DIR/bench_kernels.json (every figure),
DIR/bench_kernels.md (the table for docs/perf-log.md), DIR/bench_kernels_rows.md (every row).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

from flint_graph.cli_args import ValueParser

import torch
import torch.nn.functional as F

from flint_graph import reference
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import kernel_module, registry
from flint_graph.kernels.toolchain.examples import example_args, example_tensor
from flint_graph.kernels.toolchain.spec import BUCKETS, ScalarArg, Spec, unique_specs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ is not a package
import bench_report  # noqa: E402
from bench_report import *  # noqa: E402,F401,F403  (the pure parts, re-exported for the tests)
from bench_report import _num, _onoff  # noqa: E402

DEVICE = "cuda"  # the CPU tests set "cpu" and stub the timing
MIN_REPLAYS, MAX_REPLAYS, REPLAY_BUDGET_S = 10, 200, 0.05
NORM_CHAIN = 6  # launches per layer in the boundary-cost chain
# Kernels fed plain random tensors; the decode-step kernels are benchmarked by bench_layer.py.
GENERIC_KERNELS = ("rmsnorm", "gemv_bf16", "gemv_nvfp4")


def log(msg: str) -> None:
    print(msg, flush=True)


class Bad(Exception):
    """Wrong or incomplete output: no time is reported."""


class Missing(Exception):
    """Kernel or specialisation absent (not declared, not in the cache, stale), or no budget."""


# -- GPU parts -------------------------------------------------------------------------------

class Ctx:
    """What every measurement needs: kernels, config, ceiling, RNG, weight cache, deadline."""

    def __init__(self, kset, kset_error, cfg, copy_bw: float, l2: int, budget_s: float):
        self.kset, self.kset_error, self.cfg, self.copy_bw, self.l2 = kset, kset_error, cfg, \
            copy_bw, l2
        self.eps, self.wcache = cfg.rms_norm_eps, {}
        self.gen = torch.Generator(device=DEVICE).manual_seed(7)
        self.deadline, self.done = time.time() + budget_s, 0


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _events(n: int):
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(n)]


def copy_bandwidth() -> float:
    """Bytes/s of a 2 GiB device-to-device copy (flint_graph.perf.roofline, shared with
    `flint-graph bench` and `trace`)."""
    from flint_graph.perf.roofline import copy_bandwidth as measure

    return measure(torch.device(DEVICE))


def time_graph(body, reset=None) -> list[float]:
    """Run `body` once eagerly on a side stream (warm-up; host-side errors surface outside
    capture), capture it in one CUDA graph, call `reset` (re-poison the outputs, so that what
    is checked afterwards was written by the replays), replay 3 times, then time
    MIN..MAX_REPLAYS single replays with events (about REPLAY_BUDGET_S in all): ms each."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        body()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        body()
    if reset:
        reset()
    times = []
    for n in (3, 1, None):  # warm-up, a probe to size the run, the timed replays
        n = n or int(min(MAX_REPLAYS, max(MIN_REPLAYS,
                                          REPLAY_BUDGET_S * 1e3 / max(times[-1], 1e-3))))
        ev = _events(n)
        for a, b in ev:
            a.record()
            g.replay()
            b.record()
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) for a, b in ev]
    del g
    return times


def per_launch(rec: dict, times: list[float], launches: int) -> float:
    """Median µs per launch; records the replay spread (p90 - p10) / median."""
    med, q = statistics.median(times), statistics.quantiles(times + times[:1], n=10)
    rec["spread"] = (q[-1] - q[0]) / med
    return med * 1e3 / launches


def _role(a) -> str:
    return "scalar" if isinstance(a, ScalarArg) else a.role


def _poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan") if t.is_floating_point() else -1)


def base_args(ctx: Ctx, kdef, spec: Spec, ext: dict) -> list:
    """Fresh random args (kernels/toolchain/examples.py). The weights are drawn once per shape and kept
    for the other B and variants (drawing the LM head on the host takes seconds)."""
    decls, shapes = list(kdef.args(spec)), {a.name: s for a, s in arg_shapes(kdef, spec, ext)}
    key = (kdef.name, tuple((a.name, shapes[a.name]) for a in decls if _role(a) == "weight"))
    scalars = {"eps": ctx.eps}
    if key not in ctx.wcache:
        ctx.wcache.clear()
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        args = example_args(kdef, spec, ext, gen=ctx.gen, device=DEVICE, scalars=scalars)
        ctx.wcache[key] = {a.name: v for a, v in zip(decls, args) if _role(a) == "weight"}
        return args
    w = ctx.wcache[key]
    return [scalars.get(a.name, 0) if _role(a) == "scalar" else w[a.name]
            if a.role == "weight" else example_tensor(a, shapes[a.name], ctx.gen, DEVICE)
            for a in decls]


def clone_set(decls, args) -> list:
    """Another buffer set at new addresses: weights and inputs copied, outputs NaN-poisoned."""
    return [v if _role(a) == "scalar" else _poison(torch.empty_like(v))
            if a.role == "output" else v.clone() for a, v in zip(decls, args)]


def check_outputs(kdef, spec: Spec, args) -> float:
    """Worst rel. error of the outputs against the KernelDef's reference; raises Bad on a NaN
    (an unwritten element) or an error above REL_TOL."""
    decls = list(kdef.args(spec))
    refs = kdef.reference(spec, *[v for a, v in zip(decls, args) if _role(a) != "output"])
    refs = refs if isinstance(refs, (tuple, list)) else (refs,)
    outs = [v for a, v in zip(decls, args) if _role(a) == "output"]
    if len(refs) != len(outs):
        raise Bad(f"the reference gave {len(refs)} tensors for {len(outs)} outputs")
    no_nan(decls, [args])
    worst = max(((o.double() - r.double()).norm() / r.double().norm()).item()
                for o, r in zip(outs, refs))
    if not worst <= REL_TOL:
        raise Bad(f"rel err {worst:.2e} > {REL_TOL}")
    return worst


def poison_outputs(decls, sets) -> None:
    for args in sets:
        for a, v in zip(decls, args):
            if _role(a) == "output":
                _poison(v)


def no_nan(decls, sets) -> None:
    """Every output of every set written (none left NaN)."""
    for args in sets:
        for a, v in zip(decls, args):
            if _role(a) == "output" and v.is_floating_point() and torch.isnan(v).any():
                raise Bad(f"unwritten (NaN) elements in output {a.name}")


def get_kernel(ctx: Ctx, spec: Spec):
    if ctx.kset is None:
        raise Missing(ctx.kset_error)
    try:
        return ctx.kset.get(spec.kernel, **spec.as_dict())
    except Exception as e:  # KernelCacheError (missing, stale), LaunchError (module load)
        raise Missing(f"{type(e).__name__}: {e}") from None


def kernel_row(row: dict, ctx: Ctx) -> float:
    """Check once against the reference, then time R launches over rotating buffer sets."""
    spec, ext = row["_spec"], row["_ext"]
    kern = get_kernel(ctx, spec)
    decls = list(kern.kdef.args(spec))
    args = base_args(ctx, kern.kdef, spec, ext)
    kern.launch(*args)
    _sync()
    row["rel_err"] = check_outputs(kern.kdef, spec, args)
    nsets = sets_for(arg_bytes(kern.kdef, spec, ext, roles=("weight",)), ctx.l2)
    sets = [args] + [clone_set(decls, args) for _ in range(nsets - 1)]
    r = launches_for(nsets)
    row.update(sets=nsets, launches=r, pdl=kern.waits)
    times = time_graph(lambda: [kern.launch(*sets[i % nsets]) for i in range(r)],
                       lambda: poison_outputs(decls, sets))
    no_nan(decls, sets)
    return per_launch(row, times, r)


def torch_row(row: dict, ctx: Ctx) -> float:
    """torch on the same shape and rotation: F.linear in bf16, or the reference ops' residual
    add + RMSNorm (fp32 math, bf16 out)."""
    n, k, b, bf = row["N"], row["K"], row["B"], torch.bfloat16
    g = torch.Generator(device=DEVICE).manual_seed(1000 + b)
    rnd = lambda *s: torch.randn(*s, device=DEVICE, generator=g)  # noqa: E731
    if row["impl"] == "torch_bf16":
        w, nsets = (rnd(n, k) / math.sqrt(k)).to(bf), sets_for(2 * n * k, ctx.l2)
        sets = [(rnd(b, k).to(bf), w if i == 0 else w.clone()) for i in range(nsets)]
        fn = F.linear
    else:
        nsets = sets_for(2 * k, ctx.l2)
        sets = [(rnd(b, k).to(bf), rnd(b, k).to(bf), (1 + 0.1 * rnd(k)).to(bf))
                for _ in range(nsets)]
        fn = lambda x, r, w: reference.rms_norm(reference.residual_add(r, x), w, ctx.eps)  # noqa
    r = launches_for(nsets)
    row.update(sets=nsets, launches=r)
    times = time_graph(lambda: [fn(*sets[i % nsets]) for i in range(r)])
    return per_launch(row, times, r)


def _status(e: Exception) -> str:
    return {Bad: "BAD", Missing: "MISSING"}.get(type(e), "ERROR")


def run_rows(rows, ctx: Ctx, shapes=None) -> None:
    """Measure each planned row (of `shapes`); a failure is recorded on its row, the run goes
    on."""
    for row in (r for r in rows if r["status"] == "PLANNED" and r["shape"] in (shapes or
                                                                                 [r["shape"]])):
        t0, ctx.done = time.time(), ctx.done + 1
        try:
            if t0 > ctx.deadline:
                raise Missing("time budget spent")
            us = (torch_row if row["impl"].startswith("torch") else kernel_row)(row, ctx)
            finish(row, us, ctx.copy_bw)
        except Exception as e:
            row.update(status="SKIPPED" if t0 > ctx.deadline else _status(e),
                       error=f"{type(e).__name__}: {e}"[:400])
        log(f"[{ctx.done}/{len(rows)}] {row['impl']} {row['shape']} B={row['B']} "
            f"{row['variant']}: " + (
                f"{row['us']:.2f} µs {row['tbs']:.2f} TB/s {100 * row['frac_copy']:.0f}% of "
                f"copy (floor {_num(row['floor_us'])}, rel {_num(row['rel_err'], 4)}, spread "
                f"{row['spread']:.0%})" if row["status"] == "OK"
                else f"{row['status']} {row['error'][:200]}") + f" [{time.time() - t0:.1f}s]")


def layer_chain(ctx: Ctx, rows, impl: str, b: int, pdl: bool, chain=CHAIN) -> dict:
    """The attention GEMVs of every layer (`chain`: q, k, v, o, or the fused qkv then o; own
    weights each; o reads q's output where the shapes allow) in one graph, each GEMV the
    fastest correct variant of its isolated rows."""
    picks = {s: best(rows, impl, s, b) for s in chain}
    if not all(picks.values()):
        raise Missing(f"no correct isolated row for {[s for s, p in picks.items() if not p]}")
    kerns = {s: get_kernel(ctx, p["_spec"]) for s, p in picks.items()}
    decls = {s: list(kerns[s].kdef.args(p["_spec"])) for s, p in picks.items()}
    base = {s: base_args(ctx, kerns[s].kdef, p["_spec"], p["_ext"]) for s, p in picks.items()}
    layers = [{s: clone_set(decls[s], base[s]) for s in chain}
              for _ in range(ctx.cfg.num_hidden_layers)]
    qo = next(i for i, a in enumerate(decls[chain[0]]) if _role(a) == "output")
    oi = next(i for i, a in enumerate(decls[chain[-1]]) if _role(a) == "input")
    for lay in layers:
        if lay[chain[0]][qo].shape == lay[chain[-1]][oi].shape:
            lay[chain[-1]][oi] = lay[chain[0]][qo]
    times = time_graph(lambda: [kerns[s].launch(*lay[s], pdl=pdl) for lay in layers
                                for s in chain],
                       lambda: [poison_outputs(decls[s], [lay[s] for lay in layers])
                                for s in chain])
    for s in chain:
        no_nan(decls[s], [lay[s] for lay in layers])
        check_outputs(kerns[s].kdef, picks[s]["_spec"], layers[0][s])
    c = {"launches": len(chain) * len(layers), "bytes": sum(p["bytes"] for p in picks.values()),
         "variants": {s: p["variant"] for s, p in picks.items()}}
    c["us"] = per_launch(c, times, len(layers))
    c.update(us_per_launch=c["us"] / len(chain), floor_us=c["bytes"] / ctx.copy_bw * 1e6)
    return {**c, "ratio": c["us"] / c["floor_us"]}


def norm_chain(ctx: Ctx, rows, pdl: bool) -> dict:
    """layers x NORM_CHAIN dependent rmsnorm B=1 launches, each reading what the one before
    wrote (two buffer pairs, ping-pong): the cost of a kernel boundary."""
    r = best(rows, "rmsnorm", "rmsnorm", 1)
    if r is None:
        raise Missing("no correct rmsnorm B=1 row")
    n, kern = ctx.cfg.num_hidden_layers * NORM_CHAIN, get_kernel(ctx, r["_spec"])
    names = [a.name for a in kern.kdef.args(r["_spec"])]
    by = dict(zip(names, base_args(ctx, kern.kdef, r["_spec"], r["_ext"])))
    pairs = [(by["x"], by["residual"]), (by["y"], by["residual_out"])]
    seq = []
    for i in range(n):
        (x, res), (y, ro) = pairs[i % 2], pairs[1 - i % 2]
        vals = {**by, "x": x, "residual": res, "y": y, "residual_out": ro}
        seq.append([vals[a] for a in names])
    times = time_graph(lambda: [kern.launch(*a, pdl=pdl) for a in seq])
    if any(torch.isnan(t).any() for p in pairs for t in p):
        raise Bad("NaN in the ping-pong buffers after the replays")
    c = {"launches": n, "bytes": r["bytes"], "floor_us": r["floor_us"]}
    c["us"] = c["us_per_launch"] = per_launch(c, times, n)
    return {**c, "ratio": c["us"] / c["floor_us"] if c["floor_us"] else None}


def host_launch_us(ctx: Ctx, rows, n: int = 500) -> float | None:
    """Median host time of one Kernel.launch (argument check, packing, cuLaunchKernelEx), eager
    rmsnorm B=1: what each launch costs at capture time (replays do not pay it)."""
    r = best(rows, "rmsnorm", "rmsnorm", 1)
    if r is None:
        return None
    kern = get_kernel(ctx, r["_spec"])
    args = base_args(ctx, kern.kdef, r["_spec"], r["_ext"])
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        kern.launch(*args)
        times.append((time.perf_counter() - t0) * 1e6)
    _sync()
    return statistics.median(times)


def run_chains(ctx: Ctx, rows, buckets) -> list[dict]:
    """Every chain, PDL on and off; a failure is recorded and the next chain runs."""
    out = []
    jobs = [("layer", f"{','.join(s[0] for s in ch) if ch == CHAIN else 'qkv,o'} {impl}", impl,
             b, pdl, ch) for ch in (CHAIN, FUSED_CHAIN) for impl in GEMVS
            for b in CHAIN_LIMIT if b in buckets for pdl in (True, False)]
    jobs += [("norm", f"rmsnorm x{NORM_CHAIN}/layer", "rmsnorm", 1, pdl, None)
             for pdl in (True, False)]
    for kind, name, impl, b, pdl, chain in jobs:
        c, t0 = {"kind": kind, "name": name, "impl": impl, "B": b, "pdl": pdl, "error": ""}, \
            time.time()
        try:
            if t0 > ctx.deadline:
                raise Missing("time budget spent")
            c.update(status="OK", **(layer_chain(ctx, rows, impl, b, pdl, chain)
                                     if kind == "layer" else norm_chain(ctx, rows, pdl)))
        except Exception as e:
            c.update(status=_status(e), error=f"{type(e).__name__}: {e}"[:400])
        out.append(c)
        log(f"chain {name} B={b} PDL {_onoff(pdl)}: " + (
            f"{c['us']:.2f} µs per {'layer' if kind == 'layer' else 'launch'}, floor "
            f"{_num(c['floor_us'])}, {_num(c['ratio'])}x" if c["status"] == "OK"
            else f"{c['status']} {c['error'][:200]}") + f" [{time.time() - t0:.1f}s]")
    return out


def _plain_gemv(spec: Spec) -> bool:
    """False for the fused, normed QKV specs (NORM / ROWSCALE: other arguments and bytes than a
    plain GEMV of the shape); the kernels' own GPU tests and bench_layer time those."""
    return not any(spec.as_dict().get(f, 0) for f in ("NORM", "ROWSCALE"))


def load_kernels(cfg, buckets, cache_dir):
    """(KernelSet or None, defs, specs, picks, error). specs[name]: what the kernel declares
    for `cfg`, its module's `bench_specs(cfg, buckets)` (every variant) where it has one, and
    valid cache entries besides. picks[name]: its module's `spec_for(b, k, n)`, the variant the
    model launches, where it has one."""
    defs, specs, picks = {}, {}, {}
    for name in GENERIC_KERNELS:
        try:
            defs[name] = registry((name,))[0]
            mod = kernel_module(name)
            extra = getattr(mod, "bench_specs", lambda c, b: [])(cfg, buckets)
            specs[name] = unique_specs([s for s in [*defs[name].specs(cfg, buckets), *extra]
                                        if _plain_gemv(s)])
            picks[name] = getattr(mod, "spec_for", None)
        except Exception as e:
            log(f"kernel {name}: not usable ({type(e).__name__}: {e})")
            defs.pop(name, None)
    try:
        from flint_graph.capture.launcher import KernelSet
        from flint_graph.kernels.toolchain.cache import KernelCache

        kset = KernelSet(cache=KernelCache(cache_dir) if cache_dir else None,
                         kernels=list(defs.values()) or None)
    except Exception as e:
        return None, defs, specs, picks, f"no kernel set ({type(e).__name__}: {e})"
    for meta in kset.cache.manifest.values():
        name, values = meta.get("kernel"), meta.get("values")
        if name in defs and meta.get("arch") == kset.arch and isinstance(values, dict):
            s = Spec.of(name, **values)
            if s not in specs[name] and _plain_gemv(s) and kset.cache.problem(defs[name], s, kset.arch) is None:
                specs[name].append(s)
    return kset, defs, specs, picks, None


def run_meta(args) -> dict:
    """Versions and run settings (no GPU needed)."""
    def version(dist):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
            "cuda_bindings": version("cuda-bindings") or version("cuda-python"),
            "preset": args.preset, "quick": args.quick, "date": time.strftime("%Y-%m-%d %H:%M"),
            "method": f"one CUDA graph of >= {MIN_LAUNCHES} launches over <= {MAX_SETS} buffer "
                      f"sets whose weights exceed {ROTATE_L2}x L2; median of {MIN_REPLAYS}.."
                      f"{MAX_REPLAYS} event-timed replays; rel err <= {REL_TOL} first"}


def gpu_props() -> dict:
    p = torch.cuda.get_device_properties(0)
    return {"gpu": p.name, "sms": p.multi_processor_count, "capability": f"{p.major}.{p.minor}",
            "l2_bytes": getattr(p, "L2_cache_size", 0) or L2_FALLBACK}


def main(argv=None) -> int:
    ap = ValueParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for the json/md results")
    ap.add_argument("--preset", default="full", choices=("full", "tiny"))
    ap.add_argument("--quick", action="store_true", help="B in {1, 8}; LM head + q/k/v/o only")
    ap.add_argument("--cache", default=None, help="kernel cache dir (default: the user cache)")
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="cases not started after this many seconds are skipped")
    args = ap.parse_args(argv)
    cfg, meta, rows, chains = FlintConfig.preset(args.preset), run_meta(args), [], []
    buckets = (1, 8) if args.quick else BUCKETS
    try:
        torch.backends.cuda.matmul.allow_tf32 = False  # references in true fp32
        kset, defs, specs, picks, err = load_kernels(cfg, buckets, args.cache)
        rows = plan(cfg, defs, specs, buckets,
                    TARGET_SHAPES if args.quick else tuple(cfg.dense_linear_shapes()), picks)
        meta.update(gpu_props(), arch=kset and kset.arch, cache=kset and str(kset.cache.root),
                    kset_error=err)
        meta["copy_bw"] = copy_bandwidth()
        log(f"copy bandwidth {meta['copy_bw'] / 1e12:.3f} TB/s (2 GiB D2D, read + write)")
        for line in predictions(rows, meta["copy_bw"]):
            log(line)
        ctx = Ctx(kset, err, cfg, meta["copy_bw"], meta["l2_bytes"], args.budget_s)
        run_rows(rows, ctx, TARGET_SHAPES + ("rmsnorm",))
        meta["host_launch_us"] = host_launch_us(ctx, rows) if DEVICE == "cuda" else None
        write_outputs(args.out, meta, rows, chains, targets(rows, chains))  # partial results
        chains = run_chains(ctx, rows, buckets)
        run_rows(rows, ctx)
    except Exception as e:  # the GPU or the setup failed: still write what there is
        meta["fatal"] = f"{type(e).__name__}: {e}"
        log(f"FATAL {meta['fatal']}")
        for r in (r for r in rows if r["status"] == "PLANNED"):
            r.update(status="NOT RUN", error="the run stopped early")
    lines = write_outputs(args.out, meta, rows, chains, targets(rows, chains))
    log("\n" + "\n".join(lines))
    return 1 if "fatal" in meta else 0


if __name__ == "__main__":
    raise SystemExit(main())
