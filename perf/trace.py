"""`flint-graph trace`: one decode step (the median-length one of N) broken down per kernel.

Where the times come from:
- graph engine (CUDA): CUPTI kernel records, through `torch.profiler`, of N replays of the
  bucket's captured CUDA graph — the step exactly as it runs, PDL overlap included. Each record
  is matched, in launch order, to the step's launch plan (`DecodeGraph`'s kernels and the
  byte counts of `roofline.step_kernels`), which names its layer and kind. A kernel's "us" is
  its exclusive share of the step (see `exclusive`); its raw duration is "span_us".
- reference engine (CPU or CUDA): the reference model's step with each top-level op
  (`reference.embed`, `rms_norm`, `linear`, `apply_rope`, `attention`, `moe`, `swiglu`,
  `residual_add`, `lm_head`, then `sampling.sample`) timed by wall clock, synchronised on CUDA;
  bytes = the op's tensor arguments and result (MoE: the experts the step's routing is expected
  to touch). Time outside these ops (KV-cache updates, Python) shows up as "gap".
The KV cache holds random values (a synthetic fill, timing only). Output: the
"flint-graph-trace" dict documented in perf/trace_report.py.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
from pathlib import Path

import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import ConfigError, InvalidRequestError
from flint_graph.perf.machine import header, note_no_gpu, note_unused_fold
from flint_graph.perf.roofline import copy_bandwidth, step_kernels

KV_FILL = "synthetic: random KV values (not a prefill), timing only"


def _graph_plan(runner, b: int, fmt: str, context: int) -> list[dict]:
    """Launch plan of bucket b's step: roofline.step_kernels with each of our kernels' cubin
    symbol (what the profiler reports) attached."""
    g = runner.graphs[b]
    plan = step_kernels(runner.cfg, fmt, b, context, fold=g.layers[0].fold)
    ours = []
    for layer in g.layers:
        ffn = [layer.router] if layer.moe else [layer.norm]
        prep = [] if layer.fold else [layer.prep]
        ours += [layer.qkv[0], *prep, layer.attn, layer.o[0], *ffn, layer.gate_up, layer.down]
    ours += [g.norm, g.head, g.sampler]
    for p, k in zip(plan[1:], ours):  # plan[0] is the embedding lookup (a torch op)
        p["symbol"], p["spec"] = k.meta.get("symbol"), k.spec.id
    return plan


def _profile_replays(g, steps: int) -> list[dict]:
    """Kernel records {name, ts, dur} (µs) of `steps` replays, from torch.profiler's trace."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            g.replay()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    return sorted(({"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])}
                   for e in events if e.get("cat") == "kernel" and "dur" in e),
                  key=lambda e: e["ts"])


def _match(plan: list[dict], records: list[dict]) -> list[dict]:
    """Name one step's kernel records (sorted by start) from the plan: our kernels in order by
    symbol; a torch kernel before the first of ours is the embedding lookup, any other is
    "other" (e.g. the vocabulary mask of padded LM-head rows)."""
    ours = [p for p in plan if p.get("symbol")]
    out, j = [], 0
    for r in records:
        if j < len(ours) and r["name"] == ours[j]["symbol"]:
            p = ours[j]
            j += 1
            out.append({"name": p["name"], "layer": p["layer"], "kind": p["kind"],
                        "bytes": p["bytes"], "grid": p.get("spec")})
        elif j == 0:
            out.append({"name": "embedding", "layer": None, "kind": "embedding",
                        "bytes": plan[0]["bytes"], "grid": r["name"][:80]})
        else:
            out.append({"name": r["name"][:80], "layer": None, "kind": "other", "bytes": None,
                        "grid": None})
    if j != len(ours):
        raise RuntimeError(f"profiler records matched {j} of the step's {len(ours)} kernels "
                           "(were some kernels not recorded?)")
    return out


def exclusive(records: list[dict]) -> list[dict]:
    """Each kernel's share of one step's time (records sorted by start, µs): from its start or
    the end of every earlier kernel, whichever is later, to its end. Under PDL a kernel starts
    while its predecessor runs and waits at griddepcontrol.wait; that wait is the
    predecessor's time, not its own. The intervals are disjoint, so with the gaps they add up
    to the step. Also launch_us / span_us: its raw start and start-to-end duration."""
    t0, done, out = records[0]["ts"], records[0]["ts"], []
    for r in records:
        end = r["ts"] + r["dur"]
        start = max(r["ts"], done)
        out.append({"start_us": start - t0, "us": max(0.0, end - start),
                    "launch_us": r["ts"] - t0, "span_us": r["dur"]})
        done = max(done, end)
    return out


def median_step(runs: list[list[dict]]) -> tuple[list[dict], float, list[float]]:
    """The step of median length among `runs` (each: records {ts, dur} in µs, sorted by ts):
    its kernels' `exclusive` spans, its length (first start to last end) and every run's length.
    One real step rather than per-kernel medians, so its kernels tile it exactly."""
    lengths = [max(r["ts"] + r["dur"] for r in run) - run[0]["ts"] for run in runs]
    mid = sorted(range(len(runs)), key=lambda i: lengths[i])[(len(runs) - 1) // 2]
    return exclusive(runs[mid]), lengths[mid], lengths


def trace_graph(runner, fmt: str, b: int, context: int, steps: int) -> dict:
    """Per-kernel times of bucket b's captured step at `context` (every row at that position)."""
    from flint_graph.capture.decode_step import Row

    for layer in runner.kv.layers:
        layer.k.normal_()
        layer.v.normal_()
    g = runner.graphs[b]
    g.set_rows([Row(slot=i, token=1 + i, position=context, temperature=1.0 - i % 2, top_k=20,
                    top_p=0.95, seed=i, draw_index=context) for i in range(b)])
    records = _profile_replays(g, steps)
    if not records or len(records) % steps:
        raise RuntimeError(f"torch.profiler returned {len(records)} kernel records for {steps} "
                           "replays (CUPTI may not see kernels inside CUDA graphs here)")
    per = len(records) // steps
    runs = [records[i * per:(i + 1) * per] for i in range(steps)]
    named = _match(_graph_plan(runner, b, fmt, context), runs[0])
    spans, step_us, all_us = median_step(runs)
    kernels = [{"index": i, **k, **sp} for i, (k, sp) in enumerate(zip(named, spans))]
    try:
        nodes = g.graph_nodes()
    except RuntimeError:
        nodes = None
    return {"source": "CUPTI kernel records (torch.profiler) of CUDA-graph replays",
            "attn_fold": g.layers[0].fold, "graph_nodes": nodes, "kernels_per_step": (nodes or {}).get("kernel", len(named)),
            "step_us": step_us, "step_us_all": all_us, "kernels": kernels}


# -- a prefill ---------------------------------------------------------------------------------

def prefill_kind(name: str) -> str:
    """The kind of one kernel of a prefill, from its name: our cubins by family, cuBLAS and
    CUTLASS GEMMs (dense: "gemm"; torch's grouped GEMM over the experts: "moe"), torch's norm,
    routing and sort kernels."""
    n = name.lower()
    if "attn_prefill" in n or "qk_norm_rope" in n or "flash" in n:
        return "attention"
    if any(k in n for k in ("moe_", "nvfp4_unpack", "swiglu", "grouped", "topk", "sort",
                            "enable_3x_kernel")):
        return "moe"
    if "nvjet" in n or "gemm" in n or "cublas" in n:
        return "gemm"
    if "norm" in n:
        return "norm"
    return "other"


def trace_prefill(runner, cfg, n: int, chunk: int, steps: int) -> dict:
    """Per-kernel times of one n-token prefill on the graph engine's prefill (`chunk` tokens a
    chunk, as the engine runs it: bucket graphs up to 4,096, eager above), into a free slot,
    after a warm-up; the prefill of median length among `steps`. Kernels are named and kinded
    from their symbols (`prefill_kind`); bytes are not counted per kernel (None)."""
    from torch.profiler import ProfilerActivity, profile

    ids = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(0))
    slot = runner.alloc_slot()
    try:
        runner.prefiller.prefill(slot, ids, chunk)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                runner.prefiller.prefill(slot, ids, chunk)
                torch.cuda.synchronize()
    finally:
        runner.free_slot(slot)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    records = sorted(({"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])}
                      for e in events if e.get("cat") == "kernel" and "dur" in e),
                     key=lambda e: e["ts"])
    if not records or len(records) % steps:
        raise RuntimeError(f"torch.profiler returned {len(records)} kernel records for "
                           f"{steps} prefills")
    per = len(records) // steps
    runs = [records[i * per:(i + 1) * per] for i in range(steps)]
    spans, step_us, all_us = median_step(runs)
    kernels = [{"index": i, "name": r["name"][:80], "layer": None,
                "kind": prefill_kind(r["name"]), "bytes": None, "grid": None, **sp}
               for i, (r, sp) in enumerate(zip(runs[0], spans))]
    return {"source": f"CUPTI kernel records (torch.profiler) of {steps} whole {n}-token "
                      f"prefills ({chunk}-token chunks)",
            "graph_nodes": None, "kernels_per_step": per, "step_us": step_us,
            "step_us_all": all_us, "kernels": kernels, "prefill_tokens": n}


# -- the reference model's step ----------------------------------------------------------------

_KINDS = {"embed": "embedding", "rms_norm": "norm", "linear": "gemv", "apply_rope": "attention",
          "attention": "attention", "moe": "moe", "swiglu": "gemv", "residual_add": "other",
          "lm_head": "lm_head"}


def _nbytes(v) -> int:
    from flint_graph.checkpoints.weights import NVFP4Weight

    if isinstance(v, NVFP4Weight):
        return v.nbytes
    return v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0


@contextlib.contextmanager
def _timed_ops(dev: torch.device, moe_bytes: float, events: list, clock: list):
    """Wrap the reference module's top-level ops so each call appends an event."""
    from flint_graph import reference

    saved = {n: getattr(reference, n) for n in (*_KINDS, "decoder_layer")}
    state = {"depth": 0, "layer": None}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    def wrap(name, fn):
        def run(*args, **kw):
            if state["depth"]:
                return fn(*args, **kw)
            state["depth"] += 1
            try:
                sync()
                t0 = time.perf_counter()
                out = fn(*args, **kw)
                sync()
                t1 = time.perf_counter()
            finally:
                state["depth"] -= 1
            # the embedding reads rows, not its table; MoE the experts it is expected to touch
            nbytes = (moe_bytes if name == "moe" else 2 * _nbytes(out) if name == "embed" else
                      sum(_nbytes(a) for a in args) + _nbytes(out))
            events.append({"name": name, "layer": state["layer"], "kind": _KINDS[name],
                           "bytes": float(nbytes), "grid": None,
                           "start_us": (t0 - clock[0]) * 1e6, "us": (t1 - t0) * 1e6})
            return out
        return run

    def layer_fn(cfg, lw, layer, *args, **kw):
        state["layer"] = layer
        try:
            return saved["decoder_layer"](cfg, lw, layer, *args, **kw)
        finally:
            state["layer"] = None

    try:
        for n in _KINDS:
            setattr(reference, n, wrap(n, saved[n]))
        reference.decoder_layer = layer_fn
        yield
    finally:
        for n, fn in saved.items():
            setattr(reference, n, fn)


def trace_reference(model, fmt: str, b: int, context: int, steps: int) -> dict:
    """Per-op times of the reference model's decode step (b rows at `context`): the
    median-length step of N."""
    from flint_graph.perf.measure import reference_kv
    from flint_graph.runtime.sampling import sample

    cfg, dev = model.cfg, model.device
    n_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    moe_bytes = sum(k["bytes"] for k in step_kernels(cfg, fmt, b, context)
                    if k["kind"] == "moe") / max(1, n_moe)
    seqs = reference_kv(model, b, context)
    tokens = [torch.tensor([1 + i], device=dev) for i in range(b)]
    params = (torch.tensor([1.0 - i % 2 for i in range(b)], device=dev),
              torch.full((b,), 20, device=dev), torch.full((b,), 0.95, device=dev),
              torch.arange(b, device=dev), torch.full((b,), context, device=dev))
    runs = []
    with torch.inference_mode():
        for i in range(steps + 1):  # the first is a warm-up
            for s in seqs:
                s.num_tokens = context
            events, clock = [], [0.0]
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            with _timed_ops(dev, moe_bytes, events, clock):
                clock[0] = time.perf_counter()
                logits = torch.cat(model.forward(seqs, tokens))
                t0 = time.perf_counter()
                sample(logits, *params)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                t1 = time.perf_counter()
            events.append({"name": "sample", "layer": None, "kind": "sampling",
                           "bytes": float(logits.numel() * 4), "grid": None,
                           "start_us": (t0 - clock[0]) * 1e6, "us": (t1 - t0) * 1e6})
            if i:
                runs.append(events)
    spans, step_us, all_us = median_step(
        [[{"ts": e["start_us"], "dur": e["us"]} for e in r] for r in runs])
    kernels = [{"index": i, **{k: v for k, v in e.items() if k not in ("start_us", "us")}, **sp}
               for i, (e, sp) in enumerate(zip(runs[all_us.index(step_us)], spans))]
    where = "synchronised after each op" if dev.type == "cuda" else "CPU"
    return {"source": f"wall clock around each top-level op of the reference model ({where})",
            "graph_nodes": None, "kernels_per_step": None,
            "step_us": step_us, "step_us_all": all_us, "kernels": kernels}


def run_trace(o) -> dict:
    """One trace as the "flint-graph-trace" dict. `o`: BenchOptions (model / preset / formats[0]
    / device / engine) plus the batch `o.buckets[0]`, `o.contexts[0]` and `o.steps`. Raises
    InvalidRequestError for a context beyond the model or a bucket above what the engine holds,
    ConfigError when engine "graph" cannot run here."""
    from flint_graph.perf.bench import cfg_of, sources

    cfg: FlintConfig = cfg_of(o)
    b, ctx = o.buckets[0], o.contexts[0]
    prefill = getattr(o, "trace_prefill", None)
    if prefill and not 1 <= prefill < cfg.max_position_embeddings:
        # the CLI widens the context to the prompt: name the flag the user gave
        raise InvalidRequestError(f"--prefill {prefill}: expected 1 to "
                                  f"{cfg.max_position_embeddings - 1} tokens (the model's limit)")
    if not 1 <= ctx < cfg.max_position_embeddings:
        raise InvalidRequestError(f"--context {ctx}: expected 1 to "
                                  f"{cfg.max_position_embeddings - 1} (the model's limit)")
    from flint_graph.runtime.engine_config import pick_device

    dev = pick_device(o.device)
    if o.engine == "graph" and dev.type != "cuda":
        # before the note that the trace is the reference engine's, which it would not be (a
        # bad-input trial, 2026-12-07: the note, then this error, in one run)
        raise ConfigError(f"engine=graph (--engine graph): the graph engine needs CUDA; this "
                          f"run is on {dev}")
    note_no_gpu(dev, "the trace")
    bw = copy_bandwidth(dev)  # before the weights, as bench measures it
    fmt, llm = next(sources(o, ctx + 1))
    dev = llm.device
    res = header("flint-graph-trace", cfg,
                 o.model or f"preset {o.preset} (synthetic, seed {o.seed}, in memory)",
                 dev, o.command)
    runner = llm.engine.runner
    res.update(engine=llm.engine.name, format=fmt, B=b, context=ctx, steps=o.steps,
               copy_bw=bw, kv_fill=KV_FILL)
    prefill = getattr(o, "trace_prefill", None)
    if prefill:
        if runner is None or runner.prefiller is None:
            raise ConfigError("--prefill traces the graph engine's GPU prefill; this run has "
                              f"the {llm.engine.name} engine (a CUDA GPU and the kernel cache "
                              "are needed)")
        res.update(B=1, context=prefill, kv_fill="written by the prefill itself")
        note_unused_fold(dev, o.engine, o.attn_fold, prefill=True)
        res.update(trace_prefill(runner, cfg, prefill, llm.engine.prefill_chunk_tokens,
                                 o.steps))
    elif runner is not None:
        res.update(trace_graph(runner, fmt, b, ctx, o.steps))
    else:
        note_unused_fold(dev, "reference", o.attn_fold)
        res.update(trace_reference(llm.engine.model, fmt, b, ctx, o.steps))
    return res
