#!/usr/bin/env python3
"""Timed soak of one engine through the Python API (issue 26 item 8): the reference engine on
the CPU, or with --device cuda --engine graph the graph engine, whose KV slots and CUDA memory
are then checked back to their baseline as well.

S concurrent streams (threads, 8 by default) run requests against one `LLM` for `--minutes`,
drawn at random from a pool of raw and chat requests of mixed prompt and answer lengths,
greedy. A share of them is cancelled at a random point, one of MODES: closed or cancelled
before the first read, closed by the reader after a random number of deltas, or cancelled or
closed from another thread a random delay after the reader's first delta (mid-answer or after
the end). Every request of the pool first runs alone, cold (retained sequences dropped before
each), and under load:

- an answer that was not cancelled must equal its solo run: the same token ids, the same
  finish reason, exactly one delta carrying it, the deltas' ids adding up to the output;
- a cancelled one must be a prefix of its solo run (all of it when the cancel landed after
  the end), and its output must not change after its stream ended;
- no stream may raise;
- afterwards nothing waits, prefills or runs, the retained sequences are at most what the
  engine allows (`PrefixCache.capacity`, one per slot) and `drop_retained()` gives them all
  back, the engine's per-request bookkeeping (KV caches, slots, prefill progress, ring
  snapshots) is empty, and the process's anonymous resident memory (RssAnon, not VmRSS: the
  file pages of the mapped checkpoint and libraries would hide or fake a change) is back
  within `--rss-slack-mib` of its level after a concurrent warm-up round of the same load
  (threads, arenas and caches made once), glibc's live bytes within `--malloc-slack-mib`.

The RssAnon slack (32 MiB) is for the allocator: memory freed but kept by glibc in its
arenas, which fragmentation keeps from going back to the system (on the tiny model RssAnon
ended 4-21 MiB above the baseline in runs of 0.5-10 minutes while glibc's live blocks grew by
0.2 MiB and its free bytes by about as much as RssAnon). So glibc's live bytes (mallinfo2)
are checked as well, within `--malloc-slack-mib` (8 MiB: bounded caches such as re's 512
compiled patterns). A leak is per request: the report gives each slack as bytes per request
over the run, the growth of live objects by type (gc) and the RssAnon samples taken every
`--sample-seconds`, with their trend over the second half. One leaked KV cache of the tiny
model is ~150 KB.

    python tools/soak.py --minutes 10 --report docs/soak/report.json
    python tools/soak.py --minutes 0.5 --model nano --modes close-after,cancel-from-thread

Exit status 0 when every check holds, 1 when one failed (the report lists each), 2 for bad
arguments. The report is JSON: configuration, durations, request and token counts by
cancellation mode, every failure (the first examples in full), the end state and memory.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import heapq
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from flint_graph.cli_args import ValueParser

from flint_graph.perf.machine import rss_anon

ROOT = Path(__file__).resolve().parent.parent

# How a request is cancelled ("none": it runs to its end).
MODES = ("close-before-read",   # RequestStream.close() before the first next()
         "cancel-before-read",  # RequestStream.cancel() before the first next() (as another
                                # thread's cancel that lands before the reader starts)
         "close-after",         # the reader closes it after 1..len(solo) deltas
         "cancel-from-thread",  # another thread calls cancel() a random delay after the
                                # reader's first delta
         "close-from-thread")   # another thread calls close() likewise
WORDS = ("the weather is cold and the river runs fast under an old stone bridge near a quiet "
         "town where seven people count apples pears and plums every morning before the "
         "market opens what is twelve plus nine please convert ten kg to pounds list three "
         "colours tell me a short story about a robot who learns to paint").split()
EXAMPLES = 5  # failures kept in full in the report, per kind
# object types counted before and after (LLM keeps its last 16 chat requests: CHAT_HISTORY)
WATCHED = ("Request", "RequestStream", "RequestDelta", "SequenceKV", "Retained", "Tensor")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def malloc_bytes() -> dict | None:
    """glibc's own account over all arenas (mallinfo2): bytes in live blocks (`in_use`:
    uordblks + mmapped hblkhd) and free bytes it holds (`free_held`: fordblks). RssAnon growth
    with `in_use` flat is memory freed but kept by the allocator, not a leak. None without
    glibc 2.33+."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    m = fn()
    return {"in_use": m.uordblks + m.hblkhd, "free_held": m.fordblks}


def _malloc_trim() -> bool:
    """Hand glibc's free heap pages back to the system (for the "trimmed" figures)."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


@dataclass(frozen=True)
class Spec:
    """One request of the pool: a raw prompt or a one-message chat, greedy."""

    index: int
    kind: str  # "raw" | "chat"
    text: str
    max_tokens: int
    ignore_eos: bool
    thinking: bool = True


def make_pool(n: int, seed: int, max_prompt_words: int, max_answer: int) -> list[Spec]:
    """n requests of mixed lengths: prompts of 1..max_prompt_words words (half of them 4 or
    fewer), answers of 1..max_answer tokens (half of them 8 or fewer), a quarter chats."""
    rng = random.Random(seed)
    pool = []
    for i in range(n):
        words = rng.randint(1, 4) if rng.random() < 0.5 else rng.randint(1, max_prompt_words)
        answer = rng.randint(1, min(8, max_answer)) if rng.random() < 0.5 else \
            rng.randint(1, max_answer)
        pool.append(Spec(i, "chat" if rng.random() < 0.25 else "raw",
                         " ".join(rng.choice(WORDS) for _ in range(words)), answer,
                         rng.random() < 0.5, rng.random() < 0.5))
    return pool


def open_stream(llm, spec: Spec):
    """The RequestStream of `spec` (LLM.stream or LLM.stream_chat), greedy."""
    from flint_graph import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=spec.max_tokens,
                            ignore_eos=spec.ignore_eos)
    if spec.kind == "chat":
        return llm.stream_chat([{"role": "user", "content": spec.text}], params=params,
                               enable_thinking=spec.thinking)
    return llm.stream(spec.text, params)


@dataclass
class Solo:
    ids: list[int]
    finish: str
    seconds: float


def solo_runs(llm, pool: list[Spec]) -> dict[int, Solo]:
    """Each request alone and cold: the answers the load must reproduce."""
    out = {}
    for spec in pool:
        llm.engine.drop_retained()
        t0 = time.perf_counter()
        stream = open_stream(llm, spec)
        for _ in stream:
            pass
        out[spec.index] = Solo(list(stream.token_ids), stream.output.finish_reason,
                               time.perf_counter() - t0)
    llm.engine.drop_retained()
    return out


class Canceller:
    """One thread that cancels or closes streams at their due time (cross-thread modes)."""

    def __init__(self, on_error):
        self._heap: list = []
        self._cv = threading.Condition()
        self._seq = 0
        self._stop = False
        self._on_error = on_error
        self._thread = threading.Thread(target=self._run, name="soak-canceller", daemon=True)
        self._thread.start()

    def schedule(self, delay_s: float, stream, how: str) -> None:
        with self._cv:
            self._seq += 1
            heapq.heappush(self._heap, (time.monotonic() + delay_s, self._seq, stream, how))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._stop and (not self._heap
                                          or self._heap[0][0] > time.monotonic()):
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cv.wait(wait)
                if self._stop and not self._heap:
                    return
                _, _, stream, how = heapq.heappop(self._heap)
            try:
                stream.cancel() if how == "cancel" else stream.close()
            except BaseException:  # noqa: BLE001 - counted as a failure
                self._on_error("canceller", traceback.format_exc())

    def finish(self) -> None:
        """Run what is still due now (harmless on finished requests), then stop."""
        with self._cv:
            self._heap = [(0.0, s, st, how) for _, s, st, how in self._heap]
            heapq.heapify(self._heap)
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout=60)


@dataclass
class Tally:
    """Counts and failures, shared by the stream threads (under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: Counter = field(default_factory=Counter)     # by mode
    aborted: Counter = field(default_factory=Counter)      # by mode: ended with "abort"
    after_end: Counter = field(default_factory=Counter)    # cancel landed after the end
    tokens: int = 0
    compared_tokens: int = 0
    # aborted after the first read: tokens kept / solo tokens
    kept_fraction: list[float] = field(default_factory=list)
    failures: Counter = field(default_factory=Counter)
    examples: dict[str, list] = field(default_factory=dict)

    def fail(self, kind: str, detail) -> None:
        with self.lock:
            self.failures[kind] += 1
            self.examples.setdefault(kind, [])
            if len(self.examples[kind]) < EXAMPLES:
                self.examples[kind].append(detail)


def _check(tally: Tally, spec: Spec, solo: Solo, mode: str, ids: list[int], finish: str | None,
           finishes: int, delta_ids: list[int] | None) -> None:
    """Count one request and check its output against its solo run (module docstring)."""
    where = {"request": spec.index, "kind": spec.kind, "mode": mode, "prompt": spec.text,
             "max_tokens": spec.max_tokens, "ignore_eos": spec.ignore_eos}
    with tally.lock:
        tally.requests[mode] += 1
        tally.tokens += len(ids)
    if mode.endswith("before-read"):  # cancelled before anything ran: nothing, "abort"
        if ids or finish != "abort":
            tally.fail(f"a request cancelled before its first read generated or finished "
                       f"otherwise [{mode}]",
                       {**where, "got": ids, "got_finish": finish, "solo": solo.ids})
        else:
            with tally.lock:
                tally.aborted[mode] += 1
        return
    if mode == "none" or finish != "abort":
        if mode != "none":
            with tally.lock:
                tally.after_end[mode] += 1
        if ids != solo.ids or finish != solo.finish:
            first = next((i for i, (a, b) in enumerate(zip(ids, solo.ids)) if a != b),
                         min(len(ids), len(solo.ids)))
            tally.fail("differs from its solo run", {**where, "first_difference": first,
                                                     "got": ids, "got_finish": finish,
                                                     "solo": solo.ids, "solo_finish": solo.finish})
        else:
            with tally.lock:
                tally.compared_tokens += len(ids)
        if mode == "none" and finishes != 1:
            tally.fail("finish reason not delivered once", {**where, "finishes": finishes})
        if delta_ids is not None and delta_ids != ids:
            tally.fail("deltas do not add up to the output", {**where, "deltas": delta_ids,
                                                              "output": ids})
        return
    with tally.lock:
        tally.aborted[mode] += 1
        tally.kept_fraction.append(len(ids) / max(1, len(solo.ids)))
    if len(ids) > len(solo.ids) or ids != solo.ids[:len(ids)]:
        tally.fail("cancelled output is not a prefix of its solo run",
                   {**where, "got": ids, "solo": solo.ids})


def _one(llm, spec: Spec, solo: Solo, mode: str, rng: random.Random, canceller: Canceller,
         tally: Tally, step_s: float, reader_s: float):
    """Run one request in `mode`; returns (stream, its output length) for the later check
    that a cancelled stream's output does not change after it ended."""
    stream = open_stream(llm, spec)
    finishes, delta_ids = 0, []
    if mode == "close-before-read":
        stream.close()
    elif mode == "cancel-before-read":
        stream.cancel()
    stop_after = rng.randint(1, max(1, len(solo.ids))) if mode == "close-after" else None
    seen = 0
    for delta in stream:
        if seen == 0 and mode.endswith("from-thread"):
            # from the reader's first delta (its request is in the engine: cancel-before-read
            # covers a cancel before that) to a little after the solo answer's end
            canceller.schedule(rng.uniform(0, len(solo.ids) * step_s), stream,
                               mode.split("-")[0])
        if reader_s:  # a consumer that does something with each delta (a client's socket)
            time.sleep(rng.uniform(0, reader_s))
        seen += 1
        delta_ids += delta.token_ids
        finishes += delta.finish_reason is not None
        if stop_after is not None and seen >= stop_after:
            stream.close()
            break
    ids, finish = list(stream.token_ids), stream.output.finish_reason
    _check(tally, spec, solo, mode, ids, finish, finishes, delta_ids if mode == "none" else None)
    return (stream, len(ids), spec, mode) if mode != "none" else None


def _recheck(tally: Tally, held) -> None:
    """A cancelled stream's output must not grow after its stream ended."""
    if held is None:
        return
    stream, n, spec, mode = held
    if len(stream.token_ids) != n:
        tally.fail(f"output changed after its stream ended [{mode}]",
                   {"request": spec.index, "mode": mode, "ids_at_end": n,
                    "ids_now": len(stream.token_ids), "finish": stream.output.finish_reason})


def run_load(llm, pool: list[Spec], solos: dict[int, Solo], seconds: float, streams: int,
             cancel_rate: float, modes: tuple[str, ...], seed: int, step_s: float,
             reader_s: float, tally: Tally, sample_s: float | None = None,
             samples: list | None = None) -> float:
    """`streams` threads issuing requests until `seconds` have passed (requests in flight
    then run to their end); returns the wall time. Samples RssAnon every `sample_s`."""
    canceller = Canceller(lambda where, tb: tally.fail("traceback", {"where": where, "tb": tb}))
    deadline = time.monotonic() + seconds

    def worker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        held = None
        while time.monotonic() < deadline:
            spec = rng.choice(pool)
            mode = rng.choice(modes) if modes and rng.random() < cancel_rate else "none"
            try:
                nxt = _one(llm, spec, solos[spec.index], mode, rng, canceller, tally, step_s,
                           reader_s)
            except BaseException:  # noqa: BLE001 - counted, the stream goes on
                tally.fail(f"traceback [{mode}]", {"where": f"stream {w}",
                                                   "request": spec.index, "mode": mode,
                                                   "tb": traceback.format_exc()})
                nxt = None
            _recheck(tally, held)  # the engine has stepped since `held` ended
            held = nxt
        finals.append(held)

    finals: list = []
    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(w,), name=f"soak-{w}")
               for w in range(streams)]
    for t in threads:
        t.start()
    next_sample = t0
    while any(t.is_alive() for t in threads):
        if samples is not None and sample_s and time.monotonic() >= next_sample:
            samples.append([round(time.monotonic() - t0, 1), rss_anon()])
            next_sample += sample_s
        threads[0].join(timeout=0.2) if threads[0].is_alive() else time.sleep(0.2)
    wall = time.monotonic() - t0
    canceller.finish()
    if llm.engine.has_work:
        # nothing is left to drive the engine; what it still holds would stay forever
        eng = llm.engine
        tally.fail("live requests after the load", {"waiting": len(eng.waiting),
                                                    "prefilling": len(eng.prefilling),
                                                    "running": len(eng.running)})
        while eng.has_work:  # step it out so the checks below and the next round start clean
            eng.step()
    for held in finals:
        _recheck(tally, held)
    return wall


def engine_state(eng) -> dict:
    """What the engine holds: live requests, retained sequences and (internal) per-request
    bookkeeping, where a leaked KV cache or slot would show."""
    internal = {name: len(getattr(eng, attr)) for name, attr in (
        ("kv_caches", "_kv"), ("slots", "_slot"), ("prefill_progress", "_prefilled"),
        ("ring_snapshots", "_snapshots")) if hasattr(eng, attr)}
    state = {"waiting": len(eng.waiting), "prefilling": len(eng.prefilling),
             "running": len(eng.running), "retained": len(eng.prefix_cache),
             "retained_capacity": eng.prefix_cache.capacity, "max_slots": eng.max_slots,
             "internal": internal}
    if eng.runner is not None:
        state["free_slots"] = len(eng.runner.free_slots)
    return state


def _settle() -> tuple[int, int, dict | None, Counter]:
    """(RssAnon, RssAnon after malloc_trim, glibc's malloc_bytes, live objects the collector
    tracks by type), after a full collection: a leak of requests, deltas or tensors shows in
    the census as well."""
    gc.collect()
    raw = rss_anon()
    _malloc_trim()
    trimmed = rss_anon()
    census = Counter(type(o).__name__ for o in gc.get_objects())
    return raw, trimmed, malloc_bytes(), census


def _git() -> str | None:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, text=True, capture_output=True, timeout=10).stdout
        return head + (" (with uncommitted changes)" if dirty.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _trend(samples: list) -> float | None:
    """Least-squares slope of RssAnon over the second half of the samples, MiB per minute."""
    half = samples[len(samples) // 2:]
    if len(half) < 3:
        return None
    ts, ys = [t for t, _ in half], [r / 2**20 for _, r in half]
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    return None if var == 0 else 60 * sum((t - mt) * (y - my) for t, y in zip(ts, ys)) / var


def _load(model: str, max_slots: int | None, kv_reuse: bool, device: str = "cpu",
          engine: str = "reference"):
    from flint_graph import LLM
    from flint_graph.runtime.engine_config import EngineConfig

    if model == "tiny":
        from flint_graph.checkpoints.make_checkpoint import ensure_tiny_checkpoint

        path = ensure_tiny_checkpoint(progress=False)
    elif model == "nano":
        path = None  # the embedded flint-nano
    else:
        path = model
    cfg = EngineConfig(engine=engine, kv_reuse=kv_reuse,
                       **({"max_slots": max_slots} if max_slots else {}))
    return LLM(path, device=device, progress=False, engine=cfg)


def _gpu_bytes(device) -> int | None:
    """CUDA memory the process's tensors hold (allocated, after the cache is emptied), or None
    off CUDA. The graph engine's KV cache and workspaces are allocated at start-up, so this
    stays flat unless a request leaks a tensor."""
    import torch

    if getattr(device, "type", str(device)) != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def soak(args: argparse.Namespace, llm=None, command: str | None = None) -> dict:
    """Run the whole soak; returns the report (report["passed"] says whether it held)."""
    import torch

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.perf_counter()
    if llm is None:
        llm = _load(args.model, args.max_slots, not args.no_kv_reuse,
                    getattr(args, "device", "cpu"), getattr(args, "engine", "reference"))
    eng = llm.engine
    loaded = time.perf_counter()
    pool = make_pool(args.pool, args.seed, args.max_prompt_words, args.max_answer)
    solos = solo_runs(llm, pool)
    solo_done = time.perf_counter()
    solo_tokens = sum(len(s.ids) for s in solos.values())
    prompts = _prompt_lengths(llm, pool)
    # the time a stream waits per token under the load, which spreads the cross-thread
    # cancellations over a request's life: for the warm-up a guess (the solo time per token
    # times the streams), then what the warm-up measured
    step_s = max(1e-4, sum(s.seconds for s in solos.values()) / max(1, solo_tokens)) \
        * args.streams
    modes = tuple(args.modes)

    warm = Tally()
    warm_wall = run_load(llm, pool, solos, args.warmup_seconds, args.streams, args.cancel_rate,
                         modes, args.seed + 1, step_s, args.reader_ms / 1e3, warm)
    if warm.tokens:
        step_s = warm_wall * args.streams / warm.tokens
    retained_warm = eng.drop_retained()
    base_raw, base_trim, base_malloc, base_census = _settle()
    base_gpu = _gpu_bytes(llm.device)

    tally, samples = Tally(), []
    wall = run_load(llm, pool, solos, args.minutes * 60, args.streams, args.cancel_rate, modes,
                    args.seed, step_s, args.reader_ms / 1e3, tally, args.sample_seconds,
                    samples)
    state = engine_state(eng)
    dropped = eng.drop_retained()
    state_after_drop = engine_state(eng)
    after_raw, after_trim, after_malloc, after_census = _settle()
    after_gpu = _gpu_bytes(llm.device)
    grown = after_census.copy()
    grown.subtract(base_census)

    slack = args.rss_slack_mib << 20
    total = sum(tally.requests.values())
    failures = dict(tally.failures)
    for name, value in (("waiting", state["waiting"]), ("prefilling", state["prefilling"]),
                        ("running", state["running"]),
                        *state_after_drop["internal"].items(),
                        ("retained after drop_retained()", state_after_drop["retained"])):
        if value:
            failures[f"engine holds {name}: {value}"] = 1
    if state["retained"] > state["retained_capacity"]:
        failures[f"retained {state['retained']} > capacity {state['retained_capacity']}"] = 1
    if eng.runner is not None and state_after_drop["free_slots"] != eng.max_slots:
        failures[f"free slots {state_after_drop['free_slots']} of {eng.max_slots}"] = 1
    if after_raw - base_raw > slack:
        failures[f"RssAnon grew {(after_raw - base_raw) / 2**20:.1f} MiB "
                 f"(slack {args.rss_slack_mib} MiB)"] = 1
    live_growth = after_malloc["in_use"] - base_malloc["in_use"] if base_malloc else None
    if live_growth is not None and live_growth > args.malloc_slack_mib << 20:
        failures[f"live malloc blocks grew {live_growth / 2**20:.1f} MiB "
                 f"(slack {args.malloc_slack_mib} MiB)"] = 1
    gpu_slack = getattr(args, "gpu_slack_mib", 64) << 20
    if base_gpu is not None and after_gpu - base_gpu > gpu_slack:
        failures[f"CUDA memory grew {(after_gpu - base_gpu) / 2**20:.1f} MiB "
                 f"(slack {gpu_slack >> 20} MiB)"] = 1
    if warm.failures:
        failures.update({f"warm-up: {k}": v for k, v in warm.failures.items()})
    cancelled = total - tally.requests["none"]
    report = {
        "passed": not failures,
        "failures": failures,
        "failure_examples": {**tally.examples,
                             **{f"warm-up: {k}": v for k, v in warm.examples.items()}},
        "command": command,
        "started_utc": started,
        "git": _git(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()},
        "model": {"name": args.model, "hidden_size": llm.cfg.hidden_size,
                  "layers": llm.cfg.num_hidden_layers, "vocab_size": llm.cfg.vocab_size},
        "engine": {"name": eng.name, "device": str(llm.device), "max_slots": eng.max_slots,
                   "kv_reuse": bool(eng.prefix_cache.capacity),
                   "retained_capacity": eng.prefix_cache.capacity},
        "config": {"minutes": args.minutes, "streams": args.streams, "pool": args.pool,
                   "seed": args.seed, "cancel_rate": args.cancel_rate, "modes": list(modes),
                   "max_prompt_words": args.max_prompt_words, "max_answer": args.max_answer,
                   "warmup_seconds": args.warmup_seconds, "reader_ms": args.reader_ms,
                   "rss_slack_mib": args.rss_slack_mib,
                   "malloc_slack_mib": args.malloc_slack_mib,
                   "cancel_delay_step_s": round(step_s, 5)},
        "durations_s": {"load": round(loaded - t0, 2), "solo_runs": round(solo_done - loaded, 2),
                        "warm_up": round(warm_wall, 2), "soak": round(wall, 2),
                        "total": round(time.perf_counter() - t0, 2)},
        "solo": {"requests": len(pool), "raw": sum(s.kind == "raw" for s in pool),
                 "chat": sum(s.kind == "chat" for s in pool), "tokens": solo_tokens,
                 "answer_tokens_min_mean_max": [
                     min(len(s.ids) for s in solos.values()),
                     round(solo_tokens / len(pool), 1), max(len(s.ids) for s in solos.values())],
                 "prompt_tokens_min_max": [min(prompts), max(prompts)],
                 "finish_reasons": dict(Counter(s.finish for s in solos.values()))},
        "requests": {
            "total": total, "run_to_end": tally.requests["none"], "cancelled": cancelled,
            "by_mode": dict(tally.requests), "ended_aborted": dict(tally.aborted),
            "cancel_landed_after_end": dict(tally.after_end),
            "aborted_after_first_read_kept_of_solo_quartiles": _quartiles(tally.kept_fraction),
            "tokens_generated": tally.tokens,
            "tokens_compared_equal": tally.compared_tokens,
            "requests_per_s": round(total / wall, 2) if wall else None,
            "tokens_per_s": round(tally.tokens / wall, 1) if wall else None,
            "warm_up_requests": sum(warm.requests.values()),
            "warm_up_retained_dropped": retained_warm},
        "end_state": {"before_drop": state, "dropped_by_drop_retained": dropped,
                      "after_drop": state_after_drop},
        "memory": {
            "measure": "RssAnon from /proc/self/status after gc.collect(); 'trimmed' after "
                       "glibc malloc_trim(0) as well",
            "baseline_bytes": base_raw, "after_bytes": after_raw,
            "growth_bytes": after_raw - base_raw,
            "baseline_trimmed_bytes": base_trim, "after_trimmed_bytes": after_trim,
            "growth_trimmed_bytes": after_trim - base_trim,
            "slack_bytes": slack,
            "slack_bytes_per_request": round(slack / total) if total else None,
            "malloc_slack_bytes_per_request": round((args.malloc_slack_mib << 20) / total)
            if total else None,
            "cuda_allocated_baseline_bytes": base_gpu, "cuda_allocated_after_bytes": after_gpu,
            "cuda_slack_bytes": gpu_slack if base_gpu is not None else None,
            "malloc_baseline": base_malloc, "malloc_after": after_malloc,
            "malloc_in_use_growth_bytes": live_growth,
            "malloc_slack_bytes": args.malloc_slack_mib << 20,
            "objects_baseline": sum(base_census.values()),
            "objects_after": sum(after_census.values()),
            "objects_grown_most": dict(grown.most_common(8)),
            "objects_of_interest_before_after": {
                t: [base_census[t], after_census[t]] for t in WATCHED},
            "samples_s_bytes": samples,
            "peak_sample_bytes": max((r for _, r in samples), default=None),
            "trend_second_half_mib_per_min": _trend(samples)},
    }
    return report


def _prompt_lengths(llm, pool: list[Spec]) -> list[int]:
    """Prompt tokens of each request (a chat's as its template renders it)."""
    return [len(llm.tokenizer.encode(llm.render([{"role": "user", "content": s.text}],
                                                enable_thinking=s.thinking)
                                     if s.kind == "chat" else s.text)) for s in pool]


def _quartiles(xs: list[float]) -> list[float] | None:
    if not xs:
        return None
    s = sorted(xs)
    return [round(s[min(len(s) - 1, int(q * len(s)))], 3) for q in (0, 0.25, 0.5, 0.75, 1)]


def _modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown mode {bad[0]!r}; expected some of "
                                         f"{', '.join(MODES)}")
    return modes


def parser() -> argparse.ArgumentParser:
    p = ValueParser(
        prog="tools/soak.py", description=__doc__.split("\n\n")[0],
        epilog="Modes of cancellation: " + ", ".join(MODES) + ". Exit 0: every check held; "
               "1: a check failed (see the report's 'failures'); 2: bad arguments.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0,
                   help="how long the streams keep starting requests (then those in flight end)")
    p.add_argument("--model", default="tiny",
                   help="'tiny' (the synthetic tiny checkpoint), 'nano' (the embedded "
                        "flint-nano) or a checkpoint path")
    p.add_argument("--device", default="cpu", help="torch device: cpu, or cuda for the GPU soak")
    p.add_argument("--engine", choices=("reference", "graph"), default="reference",
                   help="graph: the CUDA-graph engine (needs --device cuda and the kernel "
                        "cache); its slots and CUDA memory are checked back to baseline too")
    p.add_argument("--gpu-slack-mib", type=int, default=64,
                   help="CUDA memory (allocated tensors) the load may leave above the "
                        "baseline")
    p.add_argument("--streams", type=int, default=8, help="concurrent streams (threads)")
    p.add_argument("--max-slots", type=int, default=None,
                   help="EngineConfig.max_slots (None: the engine's default, 8)")
    p.add_argument("--no-kv-reuse", action="store_true",
                   help="EngineConfig(kv_reuse=False): no retained sequences")
    p.add_argument("--pool", type=int, default=256, help="distinct requests, each run alone first")
    p.add_argument("--max-prompt-words", type=int, default=16, help="longest prompt, in words")
    p.add_argument("--max-answer", type=int, default=24, help="largest max_tokens of a request")
    p.add_argument("--cancel-rate", type=float, default=0.3,
                   help="share of requests cancelled (mode drawn uniformly from --modes)")
    p.add_argument("--modes", type=_modes, default=",".join(MODES),
                   help="comma-separated cancellation modes")
    p.add_argument("--reader-ms", type=float, default=2.0,
                   help="a reader spends 0 to this many ms on each delta it reads")
    p.add_argument("--seed", type=int, default=0, help="pool and stream choices")
    p.add_argument("--warmup-seconds", type=float, default=20.0,
                   help="a concurrent round of the same load before the memory baseline")
    p.add_argument("--rss-slack-mib", type=int, default=32,
                   help="RssAnon the load may leave above the baseline (allocator caches)")
    p.add_argument("--malloc-slack-mib", type=int, default=8,
                   help="growth of glibc's live blocks (mallinfo2 in-use bytes) allowed: "
                        "bounded caches such as re's 512 compiled patterns")
    p.add_argument("--sample-seconds", type=float, default=10.0,
                   help="RssAnon sampling period during the soak")
    p.add_argument("--report", default="soak-report.json", help="where the JSON report goes")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.streams < 1 or args.pool < 1 or args.max_answer < 1 \
            or args.max_prompt_words < 1 or not 0 <= args.cancel_rate <= 1:
        p.error("--minutes must be > 0, --streams, --pool, --max-answer and "
                "--max-prompt-words >= 1, --cancel-rate in [0, 1]")
    if args.engine == "graph" and not args.device.startswith("cuda"):
        p.error(f"--engine graph runs on CUDA only; found --device {args.device}")
    report = soak(args, command="python tools/soak.py " + " ".join(
        sys.argv[1:] if argv is None else argv))
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    r, m = report["requests"], report["memory"]
    print(f"{'PASS' if report['passed'] else 'FAIL'}: {r['total']} requests in "
          f"{report['durations_s']['soak']:.0f} s ({r['run_to_end']} to the end, "
          f"{r['cancelled']} cancelled), {r['tokens_generated']} tokens; RssAnon "
          f"{m['baseline_bytes'] / 2**20:.1f} -> {m['after_bytes'] / 2**20:.1f} MiB; "
          f"report {args.report}")
    for what, n in report["failures"].items():
        print(f"  failed: {what} ({n})")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
