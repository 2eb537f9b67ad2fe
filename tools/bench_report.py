"""The pure parts of the kernel microbenchmark (tools/bench_kernels.py): bytes each case moves,
buffer rotation past L2, the plan of cases, the issue's targets, and the tables and files.
No GPU and no timing here, so tests/test_bench_kernels.py checks all of it on the CPU.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

from flint_graph.kernels.toolchain.spec import DTYPES, ScalarArg, Spec, unique_specs

GEMVS = ("gemv_bf16", "gemv_nvfp4")
TARGET_SHAPES = ("lm_head", "q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj")  # --quick set
CHAIN = ("q_proj", "k_proj", "v_proj", "o_proj")
FUSED_CHAIN = ("qkv_proj", "o_proj")  # q, k and v as one GEMV over their stacked weights
FIXED = ("B", "K", "N", "H")  # spec values naming the shape; any other one is a variant
L2_FALLBACK, ROTATE_L2, MAX_SETS, MIN_LAUNCHES = 50 * 10**6, 3, 256, 32
REL_TOL, LM_FRAC, CHAIN_LIMIT, NVFP4_SPEEDUP = 1e-2, 0.85, {1: 1.5, 8: 2.0}, 2.5


def arg_shapes(kdef, spec: Spec, ext: dict):
    """[(TensorArg, concrete shape)] of a kernel's tensor arguments."""
    return [(a, tuple(ext[d] if isinstance(d, str) else d for d in a.shape))
            for a in kdef.args(spec) if not isinstance(a, ScalarArg)]


def arg_bytes(kdef, spec: Spec, ext: dict, roles=("weight", "input", "output")) -> int:
    """Bytes one launch must move: each tensor argument (of `roles`) read or written once."""
    return sum(math.prod(s) * DTYPES[a.dtype][1] for a, s in arg_shapes(kdef, spec, ext)
               if a.role in roles)


def gemv_bytes(fmt: str, n: int, k: int, b: int) -> int:
    """The same count from a GEMV's shape: bf16 W[N,K], or NVFP4 codes [N,K/2] + E4M3 scales
    [N,K/16] + fp32 scale2; plus x [B,K] and y [B,N] in bf16."""
    w = 2 * n * k if fmt == "bf16" else n * k // 2 + n * k // 16 + 4
    return w + 2 * b * k + 2 * b * n


def sets_for(weight_bytes: int, l2: int) -> int:
    """Buffer sets whose weights together exceed ROTATE_L2 x L2 (at most MAX_SETS)."""
    return max(1, min(MAX_SETS, math.ceil(ROTATE_L2 * l2 / max(1, weight_bytes))))


def launches_for(nsets: int) -> int:
    """Launches per graph: whole passes over the sets, at least MIN_LAUNCHES."""
    return nsets * max(1, math.ceil(MIN_LAUNCHES / nsets))


def variants(specs, fixed: dict) -> list[Spec]:
    """The specs that fit the shape `fixed` (B required; K/N/H where the spec has them)."""
    return [s for s in specs if "B" in s.as_dict()
            and all(s.as_dict().get(k, v) == v for k, v in fixed.items())]


def _row(impl, shape, n, k, b, nbytes, **kw) -> dict:
    return {"impl": impl, "shape": shape, "N": n, "K": k, "B": b, "variant": "-", "spec": None,
            "model_variant": None, "bytes": nbytes, "floor_us": None, "status": "PLANNED", "error": "", "rel_err": None,
            "us": None, "tbs": None, "frac_copy": None, "spread": None, "sets": None,
            "launches": None, "pdl": None, **kw}


def _kernel_rows(defs, specs, impl, shape, fixed, n, k, b, pick=None) -> list[dict]:
    kdef, ext = defs.get(impl), {"N": n, "K": k, "B": b, "H": k}
    try:
        model = pick(b, k, n) if pick else None
    except Exception:
        model = None
    fits = variants(specs.get(impl, []), fixed) if kdef else []
    if not fits:
        why = "not in the registry" if kdef is None else f"no specialisation for {fixed}"
        return [_row(impl, shape, n, k, b, gemv_bytes(impl[5:], n, k, b) if n else None,
                     status="MISSING", error=f"{impl}: {why}")]
    out = []
    for s in fits:
        try:
            nbytes, bad = arg_bytes(kdef, s, ext), {}
        except Exception as e:  # e.g. a dynamic extent named other than N/K/B/H
            nbytes, bad = None, {"status": "ERROR", "error": f"{type(e).__name__}: {e}"}
        out.append(_row(impl, shape, n, k, b, nbytes, spec=s.id, _spec=s, _ext=ext,
                        model_variant=s == model,
                        variant=",".join(f"{x}={v}" for x, v in s.values if x not in FIXED)
                        or "-", **bad))
    return out


def plan(cfg, defs: dict, specs: dict, buckets, shape_names, picks=None) -> list[dict]:
    """Every row to time, bytes counted; target shapes first (they run first). picks: per
    kernel, spec_for(b, k, n), to mark the variant the model launches."""
    rows, h, lin = [], cfg.hidden_size, cfg.dense_linear_shapes()
    for b in buckets:
        rows += _kernel_rows(defs, specs, "rmsnorm", "rmsnorm", {"B": b, "H": h}, None, h, b)
        rows.append(_row("torch_rmsnorm", "rmsnorm", None, h, b, 8 * b * h + 2 * h))
    for name in sorted(shape_names, key=lambda s: (s not in TARGET_SHAPES, list(lin).index(s))):
        n, k = lin[name]
        for impl in GEMVS:
            for b in buckets:
                rows += _kernel_rows(defs, specs, impl, name, {"B": b, "K": k, "N": n}, n, k,
                                     b, (picks or {}).get(impl))
        rows += [_row("torch_bf16", name, n, k, b, gemv_bytes("bf16", n, k, b)) for b in buckets]
    return rows


def predictions(rows, copy_bw: float) -> list[str]:
    """Set each row's floor (bytes / copy BW) and say it, and each layer chain's floor."""
    out = []
    for r in rows:
        r["floor_us"] = r["bytes"] / copy_bw * 1e6 if r["bytes"] else None
        out.append(f"predict {r['impl']:<13} {r['shape']:<9} B={r['B']} {r['variant']:<6} "
                   f"{(r['bytes'] or 0) / 1e6:10.3f} MB  floor {_num(r['floor_us']):>9} µs")
    for impl in GEMVS:
        for b, lim in CHAIN_LIMIT.items():
            got = [next((r for r in rows if (r["impl"], r["shape"], r["B"]) == (impl, s, b)
                         and r["bytes"]), None) for s in CHAIN]
            if all(got):
                fl = sum(g["bytes"] for g in got) / copy_bw * 1e6
                out.append(f"predict layer chain {impl} B={b}: floor {fl:.2f} µs per layer, "
                           f"target <= {lim}x = {lim * fl:.2f} µs")
    return out


def finish(row: dict, us: float, copy_bw: float) -> dict:
    """Record a time (µs per launch) and the bandwidth it implies."""
    bw = row["bytes"] / (us * 1e-6)
    row.update(us=us, status="OK", tbs=bw / 1e12, frac_copy=bw / copy_bw)
    return row


def best(rows, impl: str, shape: str, b: int, any_status: bool = False):
    """The fastest correct row (over variants), else (any_status) the first row, else None."""
    mine = [r for r in rows if (r["impl"], r["shape"], r["B"]) == (impl, shape, b)]
    ok = min((r for r in mine if r["status"] == "OK"), key=lambda r: r["us"], default=None)
    return ok or (mine[0] if any_status and mine else None)


def _target(name, value, limit: str, ok) -> dict:
    res = "N/A" if value is None else ("PASS" if ok(value) else "MISS")
    text = f"{res:<4} {name}: {'no data' if value is None else f'{value:.2f}'} (limit {limit})"
    return {"target": name, "value": value, "limit": limit, "result": res, "text": text}


def targets(rows, chains) -> list[dict]:
    """The issue's targets, each PASS / MISS / N/A with its number."""
    out = []
    for impl in GEMVS:
        r = best(rows, impl, "lm_head", 1)
        out.append(_target(f"{impl} lm_head B=1 fraction of copy BW", r and r["frac_copy"],
                           f">= {LM_FRAC}", lambda v: v >= LM_FRAC))
    for c in (c for c in chains if c["kind"] == "layer"):
        lim = CHAIN_LIMIT.get(c["B"], 2.0)
        out.append(_target(f"{c['impl']} {c['name'].split()[0]} layer B={c['B']} PDL "
                           f"{_onoff(c['pdl'])} "
                           f"time / floor", c.get("ratio"), f"<= {lim}", lambda v: v <= lim))
    for shape in dict.fromkeys(r["shape"] for r in rows if r["impl"] == "gemv_nvfp4"):
        for b in sorted({r["B"] for r in rows if r["shape"] == shape} & {1, 8}):
            nv, tb = best(rows, "gemv_nvfp4", shape, b), best(rows, "torch_bf16", shape, b)
            out.append(_target(f"gemv_nvfp4 {shape} B={b} speed-up over torch bf16",
                               tb["us"] / nv["us"] if nv and tb else None,
                               f">= {NVFP4_SPEEDUP}", lambda v: v >= NVFP4_SPEEDUP))
    return out


def _onoff(pdl) -> str:
    return "on" if pdl else "off"


def _num(v, p: int = 2, unit: str = "") -> str:
    return "-" if v is None else f"{v:.{p}f}{unit}" if abs(v) >= 1 else f"{v:.3g}{unit}"


def _cell(r) -> str:
    if r is None or r["status"] != "OK":
        return r["status"] if r else "-"
    return f"{r['us']:.2f} ({100 * r['frac_copy']:.0f}%)"


def _table_row(rows, shape: str, b: int) -> str:
    impls = GEMVS + ("torch_bf16",) if shape != "rmsnorm" else ("rmsnorm", "-", "torch_rmsnorm")
    bf, nv, tb = (best(rows, i, shape, b, any_status=True) for i in impls)
    ref = next(r for r in rows if r["shape"] == shape and r["B"] == b)
    x = tb["us"] / nv["us"] if nv and tb and nv["status"] == tb["status"] == "OK" else None
    dims = f"{ref['N']}×{ref['K']}" if ref["N"] else f"H={ref['K']}"
    return (f"| {shape} | {dims} | {b} | " + " | ".join(
        f"{_num(r and r['floor_us'])} | {_cell(r)} | "
        f"{r['variant'] + '*' * bool(r.get('model_variant')) if r else '-'}"
        for r in (bf, nv)) + f" | {_cell(tb)} | {_num(x, 2, '×')} |")


def boundary_lines(chains) -> list[str]:
    """Per-kernel boundary cost of each chain: time per launch with PDL off minus on."""
    out = []
    for name, b in dict.fromkeys((c["name"], c["B"]) for c in chains):
        t = {c["pdl"]: c["us_per_launch"] for c in chains
             if (c["name"], c["B"], c["status"]) == (name, b, "OK")}
        if True in t and False in t:
            out.append(f"{name} B={b}: {t[False]:.3f} µs per launch with PDL off, {t[True]:.3f}"
                       f" on: PDL saves {t[False] - t[True]:.3f} µs per kernel boundary")
    return out


def summary_lines(meta, rows, chains, tgts) -> list[str]:
    """The compact markdown report (printed last, and DIR/bench_kernels.md)."""
    bw = meta.get("copy_bw")
    out = [f"Kernel bench, {meta.get('date')}: {meta.get('gpu')}, torch {meta.get('torch')}, "
           f"cuda-bindings {meta.get('cuda_bindings')}, preset {meta.get('preset')}"
           f"{' --quick' if meta.get('quick') else ''}. Copy BW {_num(bw and bw / 1e12)} TB/s; "
           f"floor = bytes / copy BW; µs per launch of the best variant (% of copy BW); "
           f"var: the best variant (* = the one the model launches); rmsnorm rows: the "
           f"kernel in the bf16 columns, the torch composite last.", "",
           "| shape | N×K | B | bf16 floor | bf16 µs | var | nvfp4 floor | nvfp4 µs | var "
           "| torch bf16 µs | nvfp4 speed-up |", "|" + "---|" * 11]
    for shape in dict.fromkeys(r["shape"] for r in rows):
        out += [_table_row(rows, shape, b) for b in dict.fromkeys(
            r["B"] for r in rows if r["shape"] == shape)]
    out += ["", "| chain | B | PDL | launches | µs per layer (launch) | floor µs | ratio | "
            "status |", "|---|---|---|---|---|---|---|---|"]
    out += [f"| {c['name']} | {c['B']} | {_onoff(c['pdl'])} | {c.get('launches', '-')} | "
            f"{_num(c.get('us'))} | {_num(c.get('floor_us'))} | {_num(c.get('ratio'), 2, '×')}"
            f" | {c['status']} {c['error'][:80]} |" for c in chains]
    out += ["", *(f"- {x}" for x in boundary_lines(chains)), *(f"- {t['text']}" for t in tgts)]
    if meta.get("host_launch_us"):
        out.append(f"- host cost of one Kernel.launch (Python: check, pack, cuLaunchKernelEx), "
                   f"median of 500 eager rmsnorm launches: {meta['host_launch_us']:.1f} µs")
    bad = [r for r in rows if r["status"] not in ("OK", "PLANNED")]
    if bad or meta.get("fatal"):
        out.append(f"- {len(bad)} rows not OK (all in bench_kernels.json); "
                   f"{'FATAL ' + meta['fatal'] if meta.get('fatal') else ''}"
                   + "".join(f"; {r['impl']} {r['shape']} B={r['B']} {r['variant']}: "
                             f"{r['status']} {r['error'][:70]}" for r in bad[:3]))
    return out


def rows_table(rows) -> list[str]:
    """Every row, variants included, as a markdown table."""
    out = ["| impl | shape | N | K | B | variant | bytes | floor µs | µs | TB/s | % copy | "
           "torch µs | spread | sets×launches | PDL | status |", "|" + "---|" * 16]
    for r in rows:
        t = best(rows, "torch_rmsnorm" if r["shape"] == "rmsnorm" else "torch_bf16",
                 r["shape"], r["B"])
        out.append(f"| {r['impl']} | {r['shape']} | {r['N'] or '-'} | {r['K']} | {r['B']} | "
                   f"{r['variant']} | {r['bytes'] or '-'} | {_num(r['floor_us'])} | "
                   f"{_num(r['us'])} | {_num(r['tbs'])} | "
                   f"{_num(r['frac_copy'] and 100 * r['frac_copy'], 0)} | "
                   f"{_num(t and t['us'])} | {_num(r['spread'])} | {r['sets']}×{r['launches']} | "
                   f"{r['pdl']} | {r['status']} {r['error'][:80]} |")
    return out


def write_outputs(out: Path, meta, rows, chains, tgts) -> list[str]:
    """bench_kernels.json (everything), .md (summary) and _rows.md; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    clean = lambda d: {k: v for k, v in d.items() if not k.startswith("_")}  # noqa: E731
    body = {"meta": meta, "rows": [clean(r) for r in rows], "chains": [clean(c) for c in chains],
            "targets": tgts}
    (out / "bench_kernels.json").write_text(json.dumps(body, indent=1, default=str) + "\n")
    lines = summary_lines(meta, rows, chains, tgts)
    (out / "bench_kernels.md").write_text("\n".join(lines) + "\n")
    (out / "bench_kernels_rows.md").write_text("\n".join(rows_table(rows)) + "\n")
    return lines
