#!/usr/bin/env python3
"""TTFT per chat turn with KV reuse on and off (issue 22), full-size synthetic weights in memory:
a first user message of about --history tokens, then --turns short turns (or turns of about
--new-tokens tokens each), greedy, the same conversation twice on one engine (reuse on, then off
by capacity 0). Prints and writes
reuse.json under --out: per turn the prompt tokens, cached tokens, TTFT (ms) and the ms of
Python's garbage collections during the request, per generation (`gc_ms`), and the CUDA
allocator's cudaMalloc / cudaFree calls and retries (`allocator`); `--profile-turns` runs chosen
turns under torch.profiler.

    python tools/bench_reuse.py [--preset full] [--format bf16] [--history 8000] [--turns 6]
    python tools/bench_reuse.py --model nano --device cpu     # the embedded flint-nano
    python tools/bench_reuse.py --history 8000 --new-tokens 512  # issue 22's "≤ 512 new tokens"
"""

from __future__ import annotations

import contextlib
import gc
import json
import sys
import time
from pathlib import Path

from flint_graph.cli_args import ValueParser


class GcPauses:
    """Python's cyclic-GC collections while the bench runs (`gc.callbacks`): `take()` gives
    the ms spent per generation since the last take. A full (generation 2) collection with a
    model loaded took 83-115 ms on a 2-core machine (tiny model, 187K tracked objects,
    2026-12-05): one landing inside a request would show as an outlier TTFT (the BF16 tool
    loop's step 2, 85.6 ms against 18-21 ms for its neighbours, is the suspect)."""

    def __init__(self):
        self.ms: dict[int, float] = {}
        self._t0 = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            g = info["generation"]
            self.ms[g] = self.ms.get(g, 0.0) + (time.perf_counter() - self._t0) * 1e3

    def take(self) -> dict[str, float]:
        out, self.ms = {f"gen{g}": round(v, 2) for g, v in sorted(self.ms.items())}, {}
        return out


GC = GcPauses()


class AllocatorCounts:
    """The CUDA caching allocator's counters since the last `take()` (torch.cuda.memory_stats):
    cudaMalloc and cudaFree calls, and retries (an allocation that failed, freed every cached
    block, synchronising the device, and tried again: tens of ms). A resumed turn at 85-99 ms
    against ~23 ms for its neighbours (BF16 tool loop, 2026-12-05; NVFP4 512-token turns,
    2026-12-06) showed no GC pause; this says whether the allocator is where it goes. {} on
    the CPU."""

    KEYS = {"num_device_alloc": "cuda_malloc", "num_device_free": "cuda_free",
            "num_alloc_retries": "retries"}

    def __init__(self):
        self._last = self._now()

    @staticmethod
    def _now() -> dict[str, int]:
        import torch

        if not torch.cuda.is_available():
            return {}
        stats = torch.cuda.memory_stats()
        return {k: stats.get(k, 0) for k in AllocatorCounts.KEYS}

    def take(self) -> dict[str, int]:
        now = self._now()
        out = {name: now[k] - self._last.get(k, 0) for k, name in self.KEYS.items()
               if k in now and now[k] != self._last.get(k, 0)}
        self._last = now
        return out


ALLOC: AllocatorCounts | None = None  # made in main, after torch is imported
TOKENS_PER_ITEM = 2621 / 170  # 170 log items made 2,621 tokens (perf-log)


def log_items(tokens: int, first: int = 0) -> str:
    """About `tokens` tokens of log lines ("line i: step …, value …."), numbered from `first`
    so that each turn's lines differ from every earlier turn's."""
    n = max(1, round(tokens / TOKENS_PER_ITEM))
    return " ".join(f"line {i}: step {i * 7 % 13} ok, value {i * 31 % 97}."
                    for i in range(first, first + n))


def row(key: str, t: int, out) -> dict:
    """One turn's figures: prompt and cached tokens, TTFT (ms), and how it ended (finish
    reason, output tokens, errors): a request that failed is never retained, so the next turn
    runs cold, and the figures alone did not say why (2026-12-05: step 1 of the BF16 tool loop,
    after a step 0 whose reply came back empty)."""
    r = {key: t, "prompt_tokens": len(out.prompt_token_ids), "cached_tokens": out.cached_tokens,
         "ttft_ms": out.ttft_ms, "finish": out.finish_reason, "output_tokens": len(out.token_ids),
         "phases_ms": out.ttft_phases_ms,  # where the TTFT went (queued, admit, prefill, ...)
         "gc_ms": GC.take()}  # collections during this request (and its template rendering)
    if ALLOC is not None:
        r["allocator"] = ALLOC.take()
    if out.errors:
        r["errors"] = out.errors
    print(json.dumps(r), flush=True)
    return r


def extra(llm, t: int, new_tokens: int) -> str:
    """Turn t's added log lines when --new-tokens asks for long turns ("" otherwise): as many
    as keep them within new_tokens − 64 tokens of the model's tokenizer, the rest of the
    budget left to the turn's template, its short question and the previous reply."""
    if new_tokens <= 0:
        return ""
    budget, n = max(1, new_tokens - 64), 1
    lines = []
    while True:
        more = log_items(1, 1000 * (t + 1) + n - 1)
        if len(llm.tokenizer.encode_text(" ".join(lines + [more]))) > budget:
            break
        lines.append(more)
        n += 1
    return " More log: " + " ".join(lines)


def conversation(llm, first: str, turns: int, max_tokens: int,
                 new_tokens: int = 0) -> list[dict]:
    from flint_graph.runtime.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    msgs, rows = [{"role": "user", "content": first}], []
    for t in range(turns):
        with PROFILE.turn(t):
            msg = llm.chat(msgs, params=params)
        rows.append(row("turn", t, msg.output))
        msgs += [{"role": "assistant", "content": msg.content or ""},
                 {"role": "user", "content": f"and what about item {t * 11}? answer "
                                             f"briefly.{extra(llm, t, new_tokens)}"}]
    return rows


class TurnProfile:
    """`--profile-turns`: the named turns (or steps) of the first run (reuse on) under
    torch.profiler, host and device; each table (self CPU time by op, top 25) is written to
    `<out>/profile-turn<N>.txt` and its first lines printed."""

    def __init__(self, turns=(), out: Path | None = None):
        self.turns, self.out, self.on = set(turns), out, True

    @contextlib.contextmanager
    def turn(self, t: int):
        if not self.on or t not in self.turns:
            yield
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        kinds = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available()
                                          else [])
        with profile(activities=kinds) as prof:
            yield
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"profile-turn{t}.txt").write_text(table)
        print("\n".join(table.splitlines()[:12]), flush=True)


PROFILE = TurnProfile()

TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look up the value of a key in the log.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}]


def tool_loop(llm, first: str, steps: int, max_tokens: int, new_tokens: int = 0) -> list[dict]:
    """An agent loop: after each reply, the reply with a lookup call and the call's result go
    back in (the call is scripted, so the loop runs whatever the model writes); with
    new_tokens the result carries about that many tokens of log lines."""
    from flint_graph.runtime.sampling import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    msgs, rows = [{"role": "user", "content": first}], []
    for t in range(steps):
        with PROFILE.turn(t):
            msg = llm.chat(msgs, tools=TOOLS, params=params)
        rows.append(row("step", t, msg.output))
        msgs += [{"role": "assistant", "content": msg.content or "",
                  "reasoning_content": msg.reasoning_content,
                  "tool_calls": [{"type": "function", "function": {
                      "name": "lookup", "arguments": {"key": f"line {t * 7}"}}}]},
                 {"role": "tool", "content": f"line {t * 7}: value {t * 31 % 97}"
                                             f"{extra(llm, t, new_tokens)}"}]
    return rows


def main() -> int:
    from flint_graph.perf.bench import BenchOptions, sources

    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="full")
    p.add_argument("--model", help="a checkpoint path, or 'nano' for the embedded flint-nano "
                                   "(default: --preset's synthetic weights)")
    p.add_argument("--device", default=None)
    p.add_argument("--format", default="bf16", choices=("bf16", "nvfp4"))
    p.add_argument("--history", type=int, default=8000, help="approximate tokens of turn 1")
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--tool-loop", action="store_true",
                   help="an agent loop (a scripted tool call and its result per step) instead "
                        "of chat turns")
    p.add_argument("--new-tokens", type=int, default=0,
                   help="about this many tokens of log lines added to every later turn's user "
                        "message or tool result (issue 22's target: 8K of history and up to "
                        "512 new tokens); default 0: short turns")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--out", default="out")
    p.add_argument("--log-reuse", action="store_true",
                   help="print each KV-reuse decision (logger flint_graph.reuse at DEBUG): "
                        "where each prompt resumed, or why it ran cold")
    p.add_argument("--profile-turns", default="",
                   help="comma-separated turn (or step) numbers of the reuse-on run to run "
                        "under torch.profiler (tables in --out); default none")
    p.add_argument("--no-gc-freeze", action="store_true",
                   help="leave start-up's objects to the cyclic GC (the flint-graph commands "
                        "freeze them once loaded: flint_graph/runtime/gc_policy.py)")
    p.add_argument("--split-ctas", type=int, default=None,
                   help="attn_prefill_wg.SPLIT_CTAS for this run: a chunk after a long prefix "
                        "splits its full layers' keys while it has fewer CTAs than this")
    p.add_argument("--split-picks", default=None,
                   help="attn_prefill_wg.SPLIT_PICKS for this run, comma-separated (each one of "
                        "SPLIT_CHOICES, the SPLITS built)")
    args = p.parse_args()
    if args.split_ctas is not None or args.split_picks:
        from flint_graph.kernels.prefill import attn_prefill_wg as awg

        if args.split_ctas is not None:
            awg.SPLIT_CTAS = args.split_ctas
        if args.split_picks:
            picks = tuple(int(v) for v in args.split_picks.split(","))
            if not set(picks) <= set(awg.SPLIT_CHOICES):
                p.error(f"--split-picks {args.split_picks}: expected values among "
                        f"{awg.SPLIT_CHOICES}")
            awg.SPLIT_PICKS = picks
    if args.log_reuse:
        import logging

        logging.basicConfig(format="reuse: %(message)s")
        logging.getLogger("flint_graph.reuse").setLevel(logging.DEBUG)
    if args.new_tokens < 0:
        p.error(f"--new-tokens {args.new_tokens}: expected a count >= 0")
    global PROFILE, ALLOC
    try:
        PROFILE = TurnProfile([int(v) for v in args.profile_turns.split(",") if v],
                              Path(args.out))
    except ValueError:
        p.error(f"--profile-turns {args.profile_turns!r}: expected comma-separated numbers")
    first = "Summarize this log. " + log_items(args.history)
    model = args.model
    if model == "nano":
        from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint

        model = str(ensure_default_checkpoint())
    o = BenchOptions(preset=args.preset, formats=(args.format,), progress=False, buckets=(1,),
                     model=model, device=args.device)
    res = {}
    for fmt, llm in sources(o, args.history + 4096 + args.turns * args.new_tokens):
        if fmt != args.format and model is None:
            continue
        # start-up's phases (s): whether the eager warm-up ran, and what it cost
        print(json.dumps({"startup": {k: v for k, v in llm.startup.items()
                                      if k.endswith("_s")}}), flush=True)
        run = tool_loop if args.tool_loop else conversation
        if not args.no_gc_freeze:  # as the flint-graph commands do after start-up
            from flint_graph.runtime.gc_policy import freeze_startup_objects

            freeze_startup_objects()
        GC.take()  # start-up's collections are not the first request's
        ALLOC = AllocatorCounts()
        res["on"] = run(llm, first, args.turns, args.max_tokens, args.new_tokens)
        PROFILE.on = False
        llm.engine.drop_retained()
        llm.engine.prefix_cache.capacity = 0  # reuse off, same engine and weights
        GC.take()
        res["off"] = run(llm, first, args.turns, args.max_tokens, args.new_tokens)
        break
    Path(args.out).mkdir(parents=True, exist_ok=True)
    name = ("reuse-tool-loop" if args.tool_loop else "reuse") + (
        f"-new{args.new_tokens}" if args.new_tokens else "") + ".json"
    (Path(args.out) / name).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
