"""Reports of `flint-graph trace` (perf/trace.py), one decode step per kernel: totals by kind
and layer with the step time no kernel covers ("gap"), the terminal tables, the comparison of
two traces, the Chrome-trace / Perfetto timeline the trace file doubles as, and an HTML plot.
Pure Python on the trace dict, checked on the CPU by tests/test_trace_report.py.

The trace (schema "flint-graph-trace", version 1): the header of perf/machine.py (created,
command, machine, git_rev, model), engine, format, B, context, steps, source, copy_bw (bytes/s),
graph_nodes {node type: count} | None, kernels_per_step | None, step_us (median wall time of a
step, first kernel start → last kernel end, µs) and kernels: one step in launch order,
[{index, name, layer (None outside the layers), kind, start_us (from the step's first kernel
start), us (duration), bytes (to move; None when unknown), grid}], each time the median over
the steps. Kernels may overlap (PDL), so durations never simply add up to the step.
"""

from __future__ import annotations

import html
from collections import Counter
from itertools import pairwise

from rich.markup import escape
from rich.text import Text

from flint_graph.errors import InvalidRequestError, counted
from flint_graph.perf.bench_report import (bandwidth, change_text, compare_warnings,
                                           header_line, megabytes, num, pct, read_json,
                                           rel_change, rich_table, signed)
from flint_graph.perf.cli import TOP_KERNELS

SCHEMA = "flint-graph-trace"
KINDS = ("embedding", "attention", "gemv", "gemm", "moe", "norm", "lm_head", "sampling",
         "other")  # gemm: a prefill's dense projections
COLOURS = {"embedding": "#8c564b", "attention": "#1f77b4", "gemv": "#ff7f0e", "gemm": "#bcbd22",
           "moe": "#2ca02c",
           "norm": "#9467bd", "lm_head": "#d62728", "sampling": "#e377c2", "other": "#7f7f7f",
           "gap": "#d0d0d0", "floor": "#303030"}
# How an HTML plot begins
HTML_HEAD = '<!DOCTYPE html>\n<html><head><meta charset="utf-8">\n<title>flint-graph trace: '
CHROME_KEYS = ("traceEvents", "displayTimeUnit", "metadata")
KIND_COLS = ["kind", "count", "µs", "share %", "MB", "floor µs", "% BW"]
KERNEL_COLS = ["#", "name", "layer", "kind", "start µs", "µs", "MB", "% BW", "share %"]
MATCHED = ("engine", "format", "B", "context")  # a trace compared across these gets a warning
CSS = ("body{font:14px sans-serif;margin:20px}svg text{font:12px sans-serif}table{border-collapse:"
       "collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}"
       "i{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}")
KIND_CAPTION = (
    "µs: summed kernel times (each kernel's share of the step: from its start or the previous "
    "kernel's end, whichever is later, to its end; kinds and gap add up to the step); gap: step time covered by no kernel (launch latency, bubbles); share = µs / "
    "step µs; floor µs = bytes / copy BW ({bw}, measured in this run; \"-\" where a kernel's "
    "bytes are unknown); % BW = bytes / µs as a fraction of copy BW; total: the whole step.")


# -- arithmetic ----------------------------------------------------------------------------------

def _kind(k: dict) -> str:
    """A kernel's kind in the fixed vocabulary (an unknown one counts as "other")."""
    return k.get("kind") if k.get("kind") in KINDS else "other"


def _frac_bw(nbytes, us, copy_bw) -> float | None:
    """bytes / (us · 1e-6) / copy_bw: the fraction of copy bandwidth a kernel's time implies."""
    return None if nbytes is None or not us or not copy_bw else nbytes / (us * 1e-6) / copy_bw


def _floor_us(nbytes, copy_bw) -> float | None:
    return None if nbytes is None or not copy_bw else nbytes / copy_bw * 1e6


def _share(us, step_us) -> float | None:
    return None if us is None or not step_us else us / step_us


def _merged(kernels) -> list[list[float]]:
    """The union of the kernels' [start_us, start_us + us] as disjoint sorted intervals."""
    out: list[list[float]] = []
    for s, e in sorted((k["start_us"], k["start_us"] + (k.get("us") or 0.0)) for k in kernels):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _gap(kernels, step_us: float) -> tuple[float, int]:
    """(µs of the step covered by no kernel, clamped at 0; number of uncovered stretches)."""
    merged = _merged(kernels)
    covered = sum(e - s for s, e in merged)
    edges = [0.0, *(x for iv in merged for x in iv), step_us]
    holes = sum(1 for lo, hi in zip(edges[::2], edges[1::2]) if hi > lo)
    return max(0.0, step_us - covered), holes


def family(name: str | None) -> str:
    """A kernel's family for grouping, from its name: our cubins by their kernel
    ("kernel_cutlass_grouped_w4a16_kernel_…" -> "grouped_w4a16"), cuBLAS's nvjet kernels as
    "cuBLAS", torch's by their template ("void at::native::…vectorized_elementwise_kernel<…"
    -> "torch vectorized_elementwise_kernel"); a plain name (a decode trace's) as it is."""
    name = name or "?"
    if name.startswith("kernel_cutlass_"):
        return name[len("kernel_cutlass_"):].split("_kernel")[0]
    if name.startswith(("nvjet", "sm90_xmma", "cutlass_")):
        return "cuBLAS"
    if "at::native::" in name:
        inner = name.split("at::native::", 1)[1].split("<")[0].split("::")[-1]
        return "torch " + inner.split("(")[0]
    return name[:40]


def gap_boundaries(trace: dict, top: int = 5) -> list[dict]:
    """Where the step's uncovered time lies: each stretch no kernel covers, charged to the
    boundary it sits on (the family of the kernel that ended last before it → the family of
    the kernel that starts it), summed per boundary, the `top` largest: [{"before", "after",
    "count", "us", "share", "largest_us", "at_us"}] (µs; share of the step; the boundary's
    largest stretch and where it starts, from the first kernel's start). Needs each kernel's
    raw start and duration (launch_us, span_us; start_us / us where absent). Why: a 512-token
    prefill had 10% of its time in 490 gaps and no way to tell which launches left them
    (thirty-fifth session); then one stretch of 749 µs before its graph's first kernel (the
    launch, under the profiler) made most of that, which a sum per boundary hid (thirty-sixth
    session)."""
    ks = trace.get("kernels") or []
    step = trace.get("step_us") or 0.0
    spans = sorted((k.get("launch_us", k.get("start_us", 0.0)),
                    k.get("span_us", k.get("us") or 0.0), family(k.get("name"))) for k in ks)
    totals: dict[tuple[str, str], list[float]] = {}
    done, last = None, None
    first = spans[0][0] if spans else 0.0
    for start, dur, fam in spans:
        if done is not None and start > done:
            t = totals.setdefault((last, fam), [0, 0.0, 0.0, 0.0])
            t[0] += 1
            t[1] += start - done
            if start - done > t[2]:
                t[2], t[3] = start - done, done - first
        if done is None or start + dur > done:
            done, last = start + dur, fam
    rows = [{"before": b, "after": a, "count": n, "us": us, "share": _share(us, step),
             "largest_us": big, "at_us": at}
            for (b, a), (n, us, big, at) in totals.items()]
    return sorted(rows, key=lambda r: -r["us"])[:top]


def kernel_rows(trace: dict) -> list[dict]:
    """Each kernel (a copy) plus "frac_bw" (bytes / µs as a fraction of copy_bw; None when
    bytes is None or us is 0) and "share" (us / step_us)."""
    bw, step = trace.get("copy_bw"), trace.get("step_us")
    return [{**k, "frac_bw": _frac_bw(k.get("bytes"), k.get("us"), bw),
             "share": _share(k.get("us"), step)} for k in trace.get("kernels") or []]


def _totals(kernels, step_us, copy_bw) -> dict:
    """count, µs (summed durations), bytes (None if any is unknown), share, frac_bw, floor_us."""
    us = sum(k.get("us") or 0.0 for k in kernels)
    known = [k.get("bytes") for k in kernels]
    nbytes = None if None in known else sum(known)
    return {"count": len(kernels), "us": us, "bytes": nbytes, "share": _share(us, step_us),
            "frac_bw": _frac_bw(nbytes, us, copy_bw), "floor_us": _floor_us(nbytes, copy_bw)}


def kind_totals(trace: dict) -> list[dict]:
    """Per kind in KINDS order (absent kinds left out), then "gap" (the step time covered by no
    kernel: step_us − the union of the kernels' intervals, clamped at 0; count = uncovered
    stretches) and "total" (us = step_us, bytes = the sum of the known bytes). Each row:
    {"kind", "count", "us", "bytes", "share", "frac_bw", "floor_us"}; times in µs."""
    ks, bw, step = trace.get("kernels") or [], trace.get("copy_bw"), trace.get("step_us") or 0.0
    out = [{"kind": kind, **_totals(mine, step, bw)} for kind in KINDS
           if (mine := [k for k in ks if _kind(k) == kind])]
    gap_us, holes = _gap(ks, step)
    out.append({"kind": "gap", "count": holes, "us": gap_us, "bytes": None,
                "share": _share(gap_us, step), "frac_bw": None, "floor_us": None})
    known = sum(k["bytes"] for k in ks if k.get("bytes") is not None)
    out.append({"kind": "total", "count": len(ks), "us": step, "bytes": known,
                "share": 1.0 if step else None, "frac_bw": _frac_bw(known, step, bw),
                "floor_us": _floor_us(known, bw)})
    return out


def layer_totals(trace: dict) -> list[dict]:
    """Per layer in order, then "step" (kernels outside the layers: embedding, final norm, LM
    head, sampler): {"layer", "count", "us", "bytes", "share", "frac_bw", "floor_us"}."""
    ks, bw, step = trace.get("kernels") or [], trace.get("copy_bw"), trace.get("step_us")
    layers = sorted({k.get("layer") for k in ks} - {None})
    groups = [(i, [k for k in ks if k.get("layer") == i]) for i in layers]
    groups.append(("step", [k for k in ks if k.get("layer") is None]))
    return [{"layer": i, **_totals(mine, step, bw)} for i, mine in groups if mine]


def _time_by_kind(kernels) -> dict[str, float]:
    """Each kind's part of the covered step time (µs): where kernels overlap, the overlap is
    split evenly among them, so the parts add up to the covered time (for the stacked bar)."""
    ivs = [(k["start_us"], k["start_us"] + (k.get("us") or 0.0), _kind(k)) for k in kernels]
    edges = sorted({t for s, e, _ in ivs for t in (s, e)})
    out = dict.fromkeys(KINDS, 0.0)
    for lo, hi in pairwise(edges):
        live = [kind for s, e, kind in ivs if s <= lo and e >= hi]
        for kind in live:
            out[kind] += (hi - lo) / len(live)
    return out


# -- terminal ------------------------------------------------------------------------------------

def _step_floor(trace: dict) -> float | None:
    return kind_totals(trace)[-1]["floor_us"]


def _title(trace: dict) -> str:
    if trace.get("prefill_tokens"):
        return (f"{trace.get('engine')} engine, {trace.get('format')}, a prefill of "
                f"{trace['prefill_tokens']} tokens (the step: the whole prefill)")
    return (f"{trace.get('engine')} engine, {trace.get('format')}, B={trace.get('B')}, "
            f"context {trace.get('context')} tokens")


def _header_lines(trace: dict) -> list[str]:
    step, floor = trace.get("step_us"), _step_floor(trace)
    nodes = ", ".join(f"{k} {v}" for k, v in (trace.get("graph_nodes") or {}).items()) or "-"
    what = f"{_title(trace)}; the median-length step of {num(trace.get('steps'))}"
    count = f"graph nodes: {nodes}; kernels per step: {num(trace.get('kernels_per_step'))}"
    return [header_line(trace), f"{what}; times: {trace.get('source') or '-'}",
            f"{count}; copy BW {bandwidth(trace.get('copy_bw'))}; KV cache: "
            + (trace.get("kv_fill") or "-"),
            f"step {num(step, 1, ' µs')}; floor {num(floor, 1, ' µs')} (bytes / copy BW) = "
            + f"{pct(_share(floor, step))}% of the step"]


def _kind_grid(trace: dict) -> list[list]:
    return [[r["kind"], r["count"], num(r["us"], 1), pct(r["share"]), megabytes(r["bytes"]),
             num(r["floor_us"], 1), pct(r["frac_bw"])] for r in kind_totals(trace)]


def _kernel_grid(trace: dict, top: int) -> list[list]:
    """The `top` slowest kernels (launch order among equals), one row each."""
    slow = sorted(kernel_rows(trace), key=lambda k: -(k.get("us") or 0.0))[:top]
    return [[k.get("index", "-"), k.get("name") or "-",
             "step" if k.get("layer") is None else k["layer"], k.get("kind") or "-",
             num(k.get("start_us"), 1), num(k.get("us"), 2), megabytes(k.get("bytes")),
             pct(k["frac_bw"]), pct(k["share"])] for k in slow]


def print_trace(trace: dict, console, top: int = TOP_KERNELS) -> None:
    """Header (engine, format, B, context, steps, source, graph nodes / kernels per step, step
    and floor µs), the kind totals, the `top` slowest kernels and where the rest are."""
    for line in _header_lines(trace):
        console.print(escape(line))
    console.print(rich_table("step by kind", KIND_COLS, _kind_grid(trace),
                             KIND_CAPTION.format(bw=bandwidth(trace.get("copy_bw")))))
    gaps = gap_boundaries(trace)
    if gaps:
        console.print(rich_table(
            "where the gap is: the largest boundaries", ("kernel before", "kernel after",
                                                          "count", "µs", "share %",
                                                          "largest µs", "at µs"),
            [[g["before"], g["after"], str(g["count"]), f"{g['us']:.1f}",
              "-" if g["share"] is None else f"{100 * g['share']:.1f}",
              f"{g['largest_us']:.1f}", f"{g['at_us']:.1f}"] for g in gaps],
            "each stretch no kernel covers, charged to the kernels on either side of it (by "
            "family: our kernels by name, cuBLAS, torch's by template), summed per pair; "
            "largest: the pair's longest stretch, at: where it starts (from the step's first "
            "kernel). A trace runs under the profiler, which slows a graph's launch: a long "
            "stretch at the start of a graph replay is mostly that", left=2))
    slow = _kernel_grid(trace, top)
    console.print(rich_table(_slowest(len(slow)), KERNEL_COLS, slow,
                             "start µs: from the step's first kernel start; % BW = bytes / µs "
                             "as a fraction of copy BW; share = µs / step µs; layer \"step\": "
                             "outside the layers.", left=4))
    console.print(f"all {len(trace.get('kernels') or [])} kernels are in the trace JSON (--out) "
                  "and on its timeline (open the file at ui.perfetto.dev or chrome://tracing)",
                  style="dim")


# -- timeline and file ---------------------------------------------------------------------------

def _track(tid: int, name: str, sort: int) -> list[dict]:
    return [{"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}},
            {"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid,
             "args": {"sort_index": sort}}]


def chrome_trace(trace: dict) -> dict:
    """The step in the Chrome trace event format (Perfetto, chrome://tracing): one complete
    ("X") event per kernel, ts / dur in µs, on a track per kind (tid = index in KINDS) named by
    thread_name metadata; one event for the whole step on its own track (tid len(KINDS))."""
    step_tid = len(KINDS)
    title = (f"flint-graph decode step ({trace.get('engine')}, {trace.get('format')}, "
             f"B={trace.get('B')}, ctx={trace.get('context')})")
    events = [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": title}},
              *_track(step_tid, "step", -1)]
    for kind in dict.fromkeys(map(_kind, trace.get("kernels") or [])):  # the tracks in use
        events += _track(KINDS.index(kind), kind, KINDS.index(kind))
    events.append({"ph": "X", "name": "decode step", "cat": "step", "pid": 1, "tid": step_tid,
                   "ts": 0.0, "dur": trace.get("step_us") or 0.0,
                   "args": {"step_us": trace.get("step_us"), "floor_us": _step_floor(trace),
                            "kernels": len(trace.get("kernels") or [])}})
    for k in kernel_rows(trace):
        events.append({"ph": "X", "name": k.get("name"), "cat": _kind(k), "pid": 1,
                       "tid": KINDS.index(_kind(k)), "ts": k["start_us"], "dur": k.get("us") or 0.0,
                       "args": {"layer": k.get("layer"), "kind": k.get("kind"),
                                "bytes": k.get("bytes"), "frac_bw": k["frac_bw"],
                                "index": k.get("index")}})
    meta = {"schema": SCHEMA, "gpu": (trace.get("machine") or {}).get("gpu"),
            "config_hash": (trace.get("model") or {}).get("config_hash"),
            **{k: trace.get(k) for k in ("git_rev", "copy_bw", "source")}}
    return {"traceEvents": events, "displayTimeUnit": "ns", "metadata": meta}


def to_file_json(trace: dict) -> dict:
    """What `flint-graph trace --out FILE` writes: the trace's own keys and the Chrome-trace
    keys in one object (the viewers ignore unknown top-level keys; `load` ignores theirs)."""
    return {**{k: v for k, v in trace.items() if k not in CHROME_KEYS}, **chrome_trace(trace)}


def load(path) -> dict:
    """A saved trace (`flint-graph trace --out FILE`) without its Chrome-trace keys. Raises
    InvalidRequestError naming the path when it is missing, not JSON, not a
    "flint-graph-trace" file (e.g. a bench result), another version, or a kernel longer than
    the step."""
    trace = {k: v for k, v in read_json(path, SCHEMA).items() if k not in CHROME_KEYS}
    # a kernel's µs is its share of the step, so none can exceed it: a file claiming one
    # 1e308 µs kernel in a 10,040 µs step was compared as if true (a bad-input trial)
    step = trace["step_us"]
    for i, k in enumerate(trace["kernels"]):
        if k["us"] > step * (1 + 1e-6) + 1e-3:
            raise InvalidRequestError(f"{path}: field kernels[{i}].us is {num(k['us'])}; "
                                      f"expected at most the step's {num(step)} µs (step_us): "
                                      "a kernel's µs is its share of the step")
    return trace


# -- comparing two traces ------------------------------------------------------------------------

def _by_occurrence(trace: dict) -> dict:
    """Kernels keyed by (layer, name, occurrence of that name within the layer)."""
    seen, out = Counter(), {}
    for k in trace.get("kernels") or []:
        key = (k.get("layer"), k.get("name"))
        out[(*key, seen[key])] = k
        seen[key] += 1
    return out


def compare(a: dict, b: dict) -> dict:
    """{"step": {"a_us", "b_us", "change"}, "kinds": [{"kind", "a_us", "b_us", "change"}] (gap
    included), "kernels": [{"name", "layer", "kind", "a_us", "b_us", "delta_us"}] matched by
    (layer, name, occurrence within the layer), largest |delta_us| first, unmatched (one side
    None) last}. change = b / a − 1; delta_us = b − a."""
    ka, kb = ({r["kind"]: r["us"] for r in kind_totals(t)} for t in (a, b))
    kinds = [{"kind": k, "a_us": ka.get(k), "b_us": kb.get(k),
              "change": rel_change(ka.get(k), kb.get(k))}
             for k in (*KINDS, "gap") if k in ka or k in kb]
    pa, pb = _by_occurrence(a), _by_occurrence(b)
    kernels = []
    for key in dict.fromkeys([*pa, *pb]):
        x, y = pa.get(key), pb.get(key)
        au, bu = x and x.get("us"), y and y.get("us")
        kernels.append({"name": key[1], "layer": key[0], "kind": (x or y).get("kind"),
                        "a_us": au, "b_us": bu,
                        "delta_us": None if au is None or bu is None else bu - au})
    kernels.sort(key=lambda r: (r["delta_us"] is None, -abs(r["delta_us"] or 0.0)))
    step = {"a_us": a.get("step_us"), "b_us": b.get("step_us"),
            "change": rel_change(a.get("step_us"), b.get("step_us"))}
    return {"step": step, "kinds": kinds, "kernels": kernels}


def _delta_table(kernels: list[dict], what: str, sign: int, top: int):
    """The `top` matched kernels that moved most towards `what` (sign +1: slower, −1: faster);
    `kernels` sorted by |delta_us| as compare() returns them."""
    rows = [r for r in kernels if r["delta_us"] is not None and sign * r["delta_us"] > 0][:top]
    if not rows:
        return f"no matched kernel got {what}"
    cells = [[r["name"] or "-", "step" if r["layer"] is None else r["layer"], r["kind"] or "-",
              num(r["a_us"], 2), num(r["b_us"], 2),
              Text(signed(r["delta_us"]), style="green" if r["delta_us"] < 0 else "red")]
             for r in rows]
    return rich_table(f"the {len(rows)} kernels that got {what} most" if len(rows) > 1
                      else f"the kernel that got {what} most",
                      ["name", "layer", "kind", "A µs", "B µs", "Δ µs"], cells,
                      "Δ = B − A; matched by layer, name and occurrence in the layer.", left=3)


def print_compare(a: dict, b: dict, console, top: int = 15, threshold: float = 0.02) -> None:
    """Warnings (different GPU, config, copy BW, engine / format / B / context: still
    compared), the step, the kinds, then the `top` kernels that got slower and faster."""
    console.print(escape(f"A: {_title(a)}; {header_line(a)}"))
    console.print(escape(f"B: {_title(b)}; {header_line(b)}"))
    mismatch = [f"different {f}: A {a.get(f)}, B {b.get(f)}: compared anyway" for f in MATCHED
                if a.get(f) != b.get(f)]
    for w in compare_warnings(a, b) + mismatch:
        console.print(escape(f"warning: {w}"), style="yellow")
    c = compare(a, b)
    s = c["step"]
    line = Text(f"step: A {num(s['a_us'], 1, ' µs')} → B {num(s['b_us'], 1, ' µs')}, ")
    console.print(line + change_text(s["change"], "lower", threshold))
    rows = [[r["kind"], num(r["a_us"], 1), num(r["b_us"], 1),
             change_text(r["change"], "lower", threshold)] for r in c["kinds"]]
    console.print(rich_table("µs by kind", ["kind", "A µs", "B µs", "change"], rows,
                             f"change = B / A − 1; green: faster, red: slower, dim: below "
                             f"{threshold:.0%}; gap: step time covered by no kernel."))
    for what, sign in (("slower", 1), ("faster", -1)):
        console.print(_delta_table(c["kernels"], what, sign, top))
    only = Counter("B" if r["a_us"] is None else "A" for r in c["kernels"] if r["delta_us"] is None)
    if only:
        console.print(f"unmatched: {counted(only['A'], 'kernel')} only in A, {only['B']} only "
                      "in B",
                      style="yellow")


# -- HTML plot -----------------------------------------------------------------------------------

def _e(x) -> str:
    return html.escape(str(x))


def _rect(x, y, w, h, colour, tip) -> str:
    w = max(w, 1.0) if w > 0 else 0.0  # a tiny floor still shows
    return (f'<rect x="{x:.2f}" y="{y}" width="{w:.2f}" height="{h}" fill="{colour}">'
            f"<title>{_e(tip)}</title></rect>")


def _step_svg(trace: dict, width: int = 760) -> str:
    """Two horizontal bars on one scale: the step split by kind (overlaps shared, gap last) and
    the floor (all bytes / copy BW)."""
    step, floor = trace.get("step_us") or 0.0, _step_floor(trace) or 0.0
    parts = {k: v for k, v in _time_by_kind(trace.get("kernels") or []).items() if v > 0}
    parts["gap"] = _gap(trace.get("kernels") or [], step)[0]
    scale = (width - 260) / max(step, sum(parts.values()), floor, 1e-9)  # room for labels
    out, x = [], 90.0
    for kind, us in parts.items():
        out.append(_rect(x, 10, us * scale, 26, COLOURS.get(kind, COLOURS["other"]),
                         f"{kind}: {us:.1f} µs"))
        x += us * scale
    out.append(_rect(90, 46, floor * scale, 26, COLOURS["floor"], f"floor: {floor:.1f} µs"))
    pct = f" ({100 * floor / step:.1f}% of the step)" if step else ""
    out += [f'<text x="0" y="28">step</text><text x="{x + 6:.2f}" y="28">{step:.1f} µs</text>',
            f'<text x="0" y="64">floor</text><text x="{90 + floor * scale + 6:.2f}" y="64">'
            + f"{floor:.1f} µs{_e(pct)}</text>"]
    return f'<svg width="{width}" height="82" role="img">{"".join(out)}</svg>'


def _kinds_svg(totals: list[dict], width: int = 760) -> str:
    """Per kind, µs (its colour) above floor µs (dark): how far each kind is from its floor."""
    rows = [r for r in totals if r["kind"] != "total"]
    scale = (width - 190) / max([1e-9, *(r["us"] for r in rows),
                                 *(r["floor_us"] or 0.0 for r in rows)])
    out = []
    for i, r in enumerate(rows):
        y, fl = 6 + 34 * i, r["floor_us"]
        out += [f'<text x="0" y="{y + 16}">{_e(r["kind"])}</text>',
                _rect(90, y, r["us"] * scale, 14, COLOURS.get(r["kind"], COLOURS["other"]),
                      f"{r['kind']}: {r['us']:.1f} µs"),
                f'<text x="{96 + r["us"] * scale:.2f}" y="{y + 12}">{r["us"]:.1f} µs</text>']
        if fl is not None:
            out += [_rect(90, y + 16, fl * scale, 10, COLOURS["floor"], f"floor: {fl:.1f} µs"),
                    f'<text x="{96 + fl * scale:.2f}" y="{y + 26}">floor {fl:.1f} µs</text>']
    return f'<svg width="{width}" height="{12 + 34 * len(rows)}" role="img">{"".join(out)}</svg>'


def _html_table(cols, rows) -> str:
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_e(x)}</td>" for x in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _slowest(n: int) -> str:
    return f"the {n} slowest kernels" if n != 1 else "the slowest kernel"


def html_plot(trace: dict, top: int = TOP_KERNELS) -> str:
    """A self-contained HTML page (inline SVG and CSS; no scripts, fonts or links): the title
    line, the step by kind beside the floor, µs vs floor µs per kind, the kind totals and the
    `top` slowest kernels. Every string from the trace is HTML-escaped."""
    title = f"{_title(trace)} — {header_line(trace)}"
    legend = "".join(f'<span><i style="background:{c}"></i>{_e(k)}</span>'
                     for k, c in COLOURS.items())
    slow = _kernel_grid(trace, top)
    bw = bandwidth(trace.get("copy_bw"))
    head = (f"{HTML_HEAD}{_e(_title(trace))}</title><style>{CSS}</style>"
            f"</head><body><h3>{_e(title)}</h3><p>{_e(trace.get('source') or '')}; copy BW "
            f"{_e(bw)}</p>")
    return "\n".join([
        head,
        "<h4>the step by kind (overlapping kernels share their overlap) and its floor (bytes / "
        + "copy BW)</h4>", _step_svg(trace), f"<p>{legend}</p>",
        "<h4>µs per kind (summed durations) and floor µs per kind</h4>",
        _kinds_svg(kind_totals(trace)),
        f"<h4>kinds</h4>{_html_table(KIND_COLS, _kind_grid(trace))}",
        f"<p>{_e(KIND_CAPTION.format(bw=bw))}</p><h4>{_slowest(len(slow))}</h4>",
        _html_table(KERNEL_COLS, slow), "</body></html>", ""])
