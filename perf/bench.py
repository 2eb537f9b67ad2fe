"""`flint-graph bench`: decode, end-to-end, prefill and cold-start figures of one model in one
process, with the eager reference (and on request a `torch.compile`d one) timed on the same work.

What is timed, per weight format:
- decode step, per (bucket B, context): the graph engine's captured step replayed `steps` times
  (CUDA events around each replay; median and p90), and the reference model's step on the same
  (B, context) `baseline_steps` times (synchronised wall clock). The KV cache holds random values
  (a synthetic fill, not a prefill: the kernels read the same bytes; timing only). The step
  includes sampling (even rows sampled, odd rows greedy).
- end to end: B copies of a short chat prompt, `e2e_tokens` tokens each with EOS ignored,
  through the engine's own loop: TPOT once all B rows decode (the host loop, sampling,
  detokenizer and stop checks included) and TTFT.
- prefill: TTFT of one prompt per `prefill_tokens` length (chunked prefill plus the first
  token), with tokens/s and, on CUDA, TFLOP/s and MFU against the dense BF16 matmul rate measured
  in the same run; on the graph engine the torch-ops baseline (the same prefill with torch's
  SDPA for attention) beside each.
- cold start (a checkpoint path only): CLI entry → first token, split into the start-up report's
  phases. Synthetic weights (`--preset`) are made in memory: no checkpoint read to time.
The floor of a step is `FlintConfig.decode_step_bytes` / the copy bandwidth measured in this run.
Output: the dict documented in perf/bench_report.py (schema "flint-graph-bench").
"""

from __future__ import annotations

import gc
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import InvalidRequestError
from flint_graph.perf.machine import header, machine_info, note_no_gpu, note_unused_fold
from flint_graph.perf.measure import (e2e_record, graph_nodes_per_bucket, graph_steps,
                                      interleave_record, matmul_peak_flops,
                                      prefill_baseline_record, prefill_record, reference_fits,
                                      reference_steps)
from flint_graph.perf.roofline import copy_bandwidth, floor_ms

DEFAULT_CONTEXTS = (1024, 8192, 32768, 100000)
DEFAULT_PREFILL = 8192
KV_FILL = "synthetic: random KV values (not a prefill), timing only"
PROMPT = "Explain why a decode step is bound by memory bandwidth."


@dataclass
class BenchOptions:
    """What `run_bench` measures. model: a checkpoint path, else `preset` synthetic weights in
    `formats`; contexts: None = DEFAULT_CONTEXTS below the model's limit; prefill_tokens: None =
    DEFAULT_PREFILL (half the model's limit when smaller); t_entry: perf_counter at CLI entry
    (cold start is measured from it)."""

    model: str | None = None
    preset: str = "tiny"
    formats: tuple[str, ...] = ("bf16", "nvfp4")
    device: str | None = None
    engine: str = "auto"
    buckets: tuple[int, ...] = (1, 2, 4, 8)
    contexts: tuple[int, ...] | None = None
    steps: int = 50
    baseline_steps: int = 3
    compiled: bool = False
    e2e_tokens: int = 64
    prefill_tokens: tuple[int, ...] | None = None
    interleave: tuple[int, ...] | None = None  # prompt lengths arriving while a stream decodes
    seed: int = 0
    progress: bool = True
    t_entry: float | None = None
    command: str = "flint-graph bench"
    log: object = field(default=print)
    nvfp4_flag: str = "--formats nvfp4"  # how this command asks for NVFP4 alone (trace: --format)
    attn_fold: bool | None = None  # EngineConfig.decode_attn_fold (None: the model's default)


def plan_contexts(cfg: FlintConfig, contexts, prefill_tokens) -> tuple[list[int], list[int]]:
    """(contexts, prefill lengths) that fit the model: each context + 1 token ≤ the model's
    limit. Raises InvalidRequestError naming --contexts / --prefill-tokens and the limit."""
    limit = cfg.max_position_embeddings
    if contexts is None:
        contexts = [c for c in DEFAULT_CONTEXTS if c < limit] or [limit // 2]
    bad = [c for c in contexts if not 1 <= c < limit]
    if bad:
        raise InvalidRequestError(f"--contexts {bad[0]}: expected 1 to {limit - 1} (the model "
                                  f"holds {limit} tokens)")
    if prefill_tokens is None:
        prefill_tokens = [min(DEFAULT_PREFILL, limit // 2)]
    if isinstance(prefill_tokens, int):
        prefill_tokens = [prefill_tokens]
    bad = [n for n in prefill_tokens if not 1 <= n < limit]
    if bad:
        raise InvalidRequestError(f"--prefill-tokens {bad[0]}: expected 1 to "
                                  f"{limit - 1} (the model holds {limit} tokens)")
    return sorted(set(contexts)), sorted(set(prefill_tokens))


E2E_PROMPT_ROOM = 64  # the e2e chat prompt's tokens, with a margin


def step_record(engine: str, fmt: str, b: int, ctx: int, times_ms: list[float], cfg, copy_bw):
    """One decode record: median / p90 ms, tokens/s, bytes, floor and fraction of it."""
    med = statistics.median(times_ms)
    p90 = statistics.quantiles(times_ms, n=10)[-1] if len(times_ms) > 1 else med
    nbytes = cfg.decode_step_bytes(b, ctx, fmt)["total"]
    fl = floor_ms(nbytes, copy_bw)
    return {"engine": engine, "format": fmt, "B": b, "context": ctx, "median_ms": med,
            "p90_ms": p90, "steps": len(times_ms), "tokens_per_s": b / med * 1e3,
            "bytes": nbytes, "floor_ms": fl, "fraction": fl / med}


# -- the model under test --------------------------------------------------------------------

def _default(name: str):
    """BenchOptions' default for field `name`."""
    return next(f.default for f in fields(BenchOptions) if f.name == name)


def _side_files(cfg: FlintConfig, seed: int) -> Path:
    """config.json, tokenizer and generation_config for synthetic in-memory weights, in a new
    temporary directory (the caller removes it). Raises ConfigError naming the directory and
    the reason when they cannot be written there (a full disk, `ulimit -f`: "internal error:
    Exception: File too large" from the tokenizer's save, a bad-input trial)."""
    from flint_graph.checkpoints.make_checkpoint import _disk_full, write_side_files
    from flint_graph.errors import ConfigError

    try:
        d = Path(tempfile.mkdtemp(prefix="flint-bench-"))
    except OSError as e:
        raise ConfigError(f"cannot make a temporary directory for the synthetic weights' "
                          f"tokenizer ({e.strerror or e}; TMPDIR sets where)") from None
    try:
        write_side_files(cfg, d, seed)
    except BaseException as e:  # Ctrl-C and SIGTERM too: nothing is left in /tmp (a trial)
        shutil.rmtree(d, ignore_errors=True)
        if not isinstance(e, Exception) or not (isinstance(e, OSError) or _disk_full(e)):
            raise
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"{d}: cannot write the synthetic weights' tokenizer and config "
                          f"({why}; TMPDIR sets where, and `ulimit -f` must allow a few "
                          "MB)") from None
    return d


def _engine_config(o: BenchOptions, kv_tokens: int):
    from flint_graph.runtime.engine_config import EngineConfig

    return EngineConfig(engine=o.engine, max_slots=max(o.buckets), max_context=kv_tokens,
                        decode_attn_fold=o.attn_fold)


def sources(o: BenchOptions, kv_tokens: int):
    """Yields (format, LLM) per weight format: the checkpoint's one, or the preset's synthetic
    weights (BF16, then the same snapped to NVFP4 in place; NVFP4 alone is made layer by layer,
    so the full preset fits an 80 GB GPU). Raises ConfigError when the weights cannot fit."""
    from flint_graph.api import LLM
    from flint_graph.runtime.engine_config import pick_device

    if o.model is not None:
        llm = LLM(o.model, device=o.device, progress=o.progress,
                  engine=_engine_config(o, kv_tokens))
        yield llm.checkpoint.format.value, llm
        return
    cfg, dev = FlintConfig.preset(o.preset), pick_device(o.device)
    side = None
    try:
        side = _side_files(cfg, o.seed)
        yield from _synthetic_sources(o, kv_tokens, cfg, dev, side)
    finally:  # each LLM has read the files by the time it is yielded; nothing is left in /tmp
        if side is not None:
            shutil.rmtree(side, ignore_errors=True)


def _synthetic_sources(o: BenchOptions, kv_tokens: int, cfg: FlintConfig, dev, side: Path):
    """`sources` for the preset's synthetic weights, their side files in `side`."""
    from flint_graph.api import LLM
    from flint_graph.checkpoints.checkpoint import LoadedCheckpoint, WeightFormat, read_generation_config
    from flint_graph.checkpoints.make_checkpoint import (check_memory, make_nvfp4_weights,
                                                         quantize_weights)
    from flint_graph.checkpoints.synthetic import make_weights

    if "bf16" in o.formats:
        # the full preset's BF16 weights need ~80 GB: refuse up front
        check_memory(cfg, dev, nvfp4_flag=o.nvfp4_flag)
        weights = make_weights(cfg, o.seed, dev, progress=o.progress)
    else:  # NVFP4 alone: snapped layer by layer, the same tensors without the BF16 model
        check_memory(cfg, dev, "nvfp4")
        weights = make_nvfp4_weights(cfg, o.seed, dev, progress=o.progress)
    for fmt in ("bf16", "nvfp4"):
        if fmt == "nvfp4" and "bf16" in o.formats:
            quantize_weights(weights, progress=False)  # the LM head and embedding stay BF16
        if fmt not in o.formats:
            continue
        ckpt = LoadedCheckpoint(cfg, weights, WeightFormat(fmt), side,
                                read_generation_config(side))
        yield fmt, LLM.from_checkpoint(ckpt, dev, _engine_config(o, kv_tokens))


def cfg_of(o: BenchOptions) -> FlintConfig:
    """The config the run will use, read before any weights (to check the flags early)."""
    if o.model is None:
        return FlintConfig.preset(o.preset)
    path = Path(o.model)
    if not path.exists():
        raise InvalidRequestError(f"{path}: no such checkpoint (expected a BF16 checkpoint "
                                  "directory or an NVFP4 .gguf file)")
    config = (path if path.is_dir() else path.parent) / "config.json"
    if not config.is_file():
        kind = "directory" if path.is_dir() else "file"
        raise InvalidRequestError(f"{path}: not a checkpoint ({kind} without a config.json "
                                  f"beside it: {config} not found)")
    return FlintConfig.from_json(config)


# -- the run -----------------------------------------------------------------------------------

def run_bench(o: BenchOptions) -> dict:
    """Every figure of one bench run as the "flint-graph-bench" dict. Raises
    InvalidRequestError / ConfigError / CheckpointError for bad flags or models (before the
    long work where it can)."""
    from flint_graph.runtime.engine_config import pick_device
    from flint_graph.terminal.progress import progress_bar

    cfg = cfg_of(o)
    contexts, prefill_n = plan_contexts(cfg, o.contexts, o.prefill_tokens)
    limit = cfg.max_position_embeddings
    if o.e2e_tokens + E2E_PROMPT_ROOM > limit:
        raise InvalidRequestError(f"--e2e-tokens {o.e2e_tokens}: expected at most "
                                  f"{limit - E2E_PROMPT_ROOM} (the model holds {limit} tokens, "
                                  "prompt included)")
    o.buckets = tuple(sorted(set(o.buckets)))
    inter = list(o.interleave or ())
    if inter and max(o.buckets) < 1 + len(inter):
        raise InvalidRequestError(f"--interleave {','.join(map(str, inter))}: needs "
                                  f"{1 + len(inter)} sequences at once (the stream and each "
                                  f"prompt); --buckets goes up to {max(o.buckets)}")
    bad = [n for n in inter if not 1 <= n < limit - 64]
    if bad:
        raise InvalidRequestError(f"--interleave {bad[0]}: expected 1 to {limit - 65} (the "
                                  f"model's {limit} tokens)")
    dev = pick_device(o.device)
    if o.engine == "graph" and dev.type != "cuda":
        raise InvalidRequestError(f"--engine graph: needs CUDA, this run is on {dev}")
    # what the run leaves out, said before it starts (a new user's trial, 2026-12-07: the
    # 8K-100K contexts vanished from a tiny-preset table without a word, and nothing said why
    # every row was the reference engine)
    dropped = [c for c in DEFAULT_CONTEXTS if c >= limit] if o.contexts is None else []
    if dropped:
        print(f"flint-graph: note: contexts {', '.join(f'{c:,}' for c in dropped)} do not fit "
              f"this model's {limit:,}-token limit and are skipped (--preset full has them)",
              file=sys.stderr)
    note_no_gpu(dev, "every row")
    note_unused_fold(dev, o.engine, o.attn_fold)
    if (dev.type != "cuda" or o.engine == "reference") and o.steps != _default("steps"):
        # `--steps N` on the CPU was accepted, unused and saved in the settings (a trial)
        print(f"flint-graph: note: --steps {o.steps} times the graph engine, which does not "
              f"run here; the reference engine's rows take --baseline-steps "
              f"({o.baseline_steps})", file=sys.stderr)
    source = o.model or f"preset {o.preset} (synthetic, seed {o.seed}, in memory)"
    res = header("flint-graph-bench", cfg, str(source), dev, o.command)
    res.update(copy_bw=copy_bandwidth(dev), kv_fill=KV_FILL, cold_start=None,
               kernels_per_step={}, decode=[], e2e=[], prefill=[], interleave=[], errors=[],
               settings={"buckets": list(o.buckets), "contexts": contexts, "steps": o.steps,
                         "baseline_steps": o.baseline_steps, "e2e_tokens": o.e2e_tokens,
                         "prefill_tokens": prefill_n, "interleave": inter})
    kv_tokens = min(cfg.max_position_embeddings,
                    max(max(contexts) + 1, max(prefill_n) + 1, 512 + o.e2e_tokens,
                        max(inter, default=0) + 1))
    res["matmul_peak_flops"] = matmul_peak_flops(dev)
    n_formats = 1 if o.model else len(o.formats)
    cells = n_formats * (len(o.buckets) * len(contexts) * (2 + o.compiled) + len(o.buckets) + 2
                         + len(prefill_n) - 1 + bool(inter))
    with progress_bar(o.progress, "bench", cells, unit="steps") as advance:
        for fmt, llm in sources(o, kv_tokens):
            res["machine"] = machine_info(dev)  # the engine may have set torch's threads
            _bench_one(o, res, fmt, llm, contexts, prefill_n, advance)
            del llm
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return res


def _bench_one(o, res, fmt, llm, contexts, prefill_n, advance) -> None:
    from flint_graph.chat.chat_template import render_chat

    cfg, runner, dev = llm.cfg, llm.engine.runner, llm.device
    prompt = llm.tokenizer.encode(render_chat(llm.tokenizer.chat_template,
                                              [{"role": "user", "content": PROMPT}]))
    first = e2e_record(llm, fmt, 1, 1, prompt)  # the first token after start-up (cold start)
    if res["cold_start"] is None:
        res["cold_start"] = _cold_start(o, llm, fmt, first["ttft_ms"] / 1e3)
    if runner is None and dev.type == "cuda":
        res["errors"].append(f"graph engine not running ({fmt}): {llm.engine.fallback_reason}")
    if runner is not None:
        res["kernels_per_step"][fmt] = graph_nodes_per_bucket(runner)
        res.setdefault("attn_fold", {})[fmt] = next(iter(runner.graphs.values())).layers[0].fold
    for b in o.buckets:
        res["e2e"].append(e2e_record(llm, fmt, b, o.e2e_tokens, prompt))
        advance(1)
    if runner is not None:  # the same request on the reference engine: the baseline
        ref = _reference_llm(llm)
        res["e2e"].append(e2e_record(ref, fmt, 1, max(4, o.baseline_steps + 1), prompt))
        del ref
    advance(1)
    for n in prefill_n:
        res["prefill"].append(prefill_record(llm, fmt, n, res.get("matmul_peak_flops")))
        base = prefill_baseline_record(llm, fmt, n, res.get("matmul_peak_flops"))
        if base is not None:
            res["prefill"].append(base)
        advance(1)
    if o.interleave:
        for step_ms in (llm.engine.pacer.step_ms, None):
            res["interleave"].append(interleave_record(llm, fmt, list(o.interleave), step_ms))
        advance(1)
    if runner is not None:
        for layer in runner.kv.layers:
            layer.k.normal_()
            layer.v.normal_()
        for b in o.buckets:
            for ctx in contexts:
                res["decode"].append(step_record("graph", fmt, b, ctx,
                                                 graph_steps(runner, b, ctx, o.steps), cfg,
                                                 res["copy_bw"]))
                advance(1)
    model = llm.engine.model
    baselines = [("reference", None)]
    if o.compiled:
        baselines.append(("compiled", _compiled_forward(model, res)))
    for name, fwd in baselines:
        for b in o.buckets:
            for ctx in contexts:
                advance(1)
                if name == "compiled" and fwd is None:
                    continue
                if not reference_fits(model, b, ctx):
                    res["errors"].append(f"{name} {fmt} B={b} context {ctx}: its KV cache "
                                         "does not fit beside the graph engine's; skipped")
                    continue
                try:
                    times = reference_steps(model, b, ctx, o.baseline_steps, fwd)
                except Exception as e:  # noqa: BLE001  a baseline failing must not end the run
                    res["errors"].append(f"{name} {fmt} B={b} context {ctx}: "
                                         f"{type(e).__name__}: {str(e)[:200]}")
                    if name == "compiled":  # it would fail (slowly) the same way again
                        res["errors"].append(f"compiled {fmt}: remaining cells skipped")
                        fwd = None
                    continue
                finally:
                    gc.collect()
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
                res["decode"].append(step_record(name, fmt, b, ctx, times, cfg, res["copy_bw"]))
    if runner is None:
        advance(len(o.buckets) * len(contexts))


def _reference_llm(llm):
    """The same weights behind the reference engine (no copy: same device)."""
    from flint_graph.api import LLM
    from flint_graph.runtime.engine_config import EngineConfig

    return LLM.from_checkpoint(llm.checkpoint, llm.device, EngineConfig(engine="reference"))


def _compiled_forward(model, res):
    """model.forward under torch.compile (CUDA graphs via mode "reduce-overhead" on CUDA);
    None, with the reason in res["errors"], when it cannot compile."""
    try:
        mode = "reduce-overhead" if model.device.type == "cuda" else "default"
        return torch.compile(model.forward, mode=mode, dynamic=False)
    except Exception as e:  # noqa: BLE001
        res["errors"].append(f"compiled reference: torch.compile failed: {type(e).__name__}: "
                             f"{str(e)[:200]}")
        return None


def _cold_start(o: BenchOptions, llm, fmt: str, first_token_s: float) -> dict:
    """Start-up phases (seconds) and the total from the CLI's entry to the first token."""
    s = llm.startup
    phases = {k: s[k] for k in ("checkpoint_read_s", "repack_s", "kv_alloc_s",
                                "kernel_cache_s") if k in s}
    captures = [v for k, v in s.items() if k.startswith("capture_B")]
    phases["capture_s"] = round(sum(captures), 3) if captures else None  # no graph engine
    phases["first_token_s"] = round(first_token_s, 3)
    now = time.perf_counter()
    total = now - o.t_entry if o.t_entry is not None else None
    if total is not None:  # imports, tokenizer, (synthetic) weights: what the phases miss
        phases["other_s"] = round(total - sum(v for v in phases.values() if v), 3)
    note = ("from the CLI's entry (imports included) to the first token of a short chat prompt"
            if o.model else "synthetic weights made in memory: no checkpoint read or repack; "
            "pass a checkpoint path for the real cold start (total includes making the weights)")
    return {"format": fmt, "total_s": total and round(total, 3), "phases": phases,
            "note": note}
