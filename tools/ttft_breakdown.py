"""Where a short prompt's time to first token goes on the graph engine, outside the prefill's
kernels (issue 21: `flint-graph bench` reported 25-token TTFTs ~3 ms above the prefill that
tools/bench_prefill.py times alone).

Builds the engine as `flint-graph bench` does (synthetic weights of --preset, NVFP4 by
default), then for each prompt length times `LLM.generate(max_tokens=1)` (the bench's prefill
figure) and, inside it, each engine phase: admission (KV-reuse lookup, slot), the prefill
call, the synchronize after it, the ring snapshot for KV reuse, sampling the first token;
medians over --reps cold requests, and the first request's own figures (first_ttft_ms,
first_<phase>: for the first length, the process's first request). Prints a table; --json
writes it.

With --history H each timed request resumes from a retained H-token conversation (issue 22's
turn after 8K of history): before every rep the engine is emptied and the H-token prompt run
untimed, so the timed prompt (those H ids, then N more) reuses H tokens' KV and prefills N.

    python tools/ttft_breakdown.py --preset full --tokens 16,25,512 --reps 10 [--history 8192]
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import statistics
import sys
import time
from pathlib import Path

from flint_graph.cli_args import ValueParser

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flint_graph.perf.bench import BenchOptions, sources  # noqa: E402
from flint_graph.perf.measure import cold  # noqa: E402


def _timed(times: dict, name: str, fn):
    """fn wrapped to add its wall time (ms, GPU work synchronised after) to times[name]."""
    @functools.wraps(fn)
    def run(*a, **k):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e3)
    return run


def _profiler():
    """torch.profiler over CPU ops and CUDA kernels, for one request."""
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def _print_profile(prof, title: str, rows: int) -> None:
    """The costliest ops of one profiled request: by self CPU time (host work paid once, such
    as module loading or a library's first-call set-up), then by CUDA time."""
    avg = prof.key_averages()
    print(f"== {title}: by self CPU time", flush=True)
    print(avg.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=70),
          flush=True)
    print(f"== {title}: by CUDA time", flush=True)
    print(avg.table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70),
          flush=True)


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="full")
    p.add_argument("--formats", default="nvfp4")
    p.add_argument("--tokens", default="16,25,512")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--json", default=None)
    p.add_argument("--history", type=int, default=0,
                   help="tokens of retained history each timed prompt resumes from (0: cold)")
    p.add_argument("--profile", type=int, default=0,
                   help="also print cProfile's 30 costliest calls (cumulative) of one "
                        "generate of this many tokens per format (0: off)")
    p.add_argument("--profile-first", type=int, default=0, metavar="ROWS",
                   help="run the process's first timed request and its last under "
                        "torch.profiler and print each one's ROWS costliest ops by self CPU "
                        "time and by CUDA time (what the first request pays on first use)")
    args = p.parse_args()
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    from flint_graph.runtime.sampling import SamplingParams

    lengths = [int(v) for v in args.tokens.split(",")]
    o = BenchOptions(preset=args.preset, formats=args.formats.split(","), buckets=[1],
                     progress=False)
    out = {}
    for fmt, llm in sources(o, args.history + max(lengths) + 64):
        eng = llm.engine
        times = collections.defaultdict(list)
        for name in ("_admit", "_prefill_part", "_save_rings", "_sample_and_append"):
            setattr(eng, name, _timed(times, name, getattr(eng, name)))
        for n in lengths:
            hist = [(11 * i) % (llm.tokenizer.vocab_size - 1) + 1 for i in range(args.history)]
            ids = [(7 * i) % (llm.tokenizer.vocab_size - 1) + 1 for i in range(n)]
            ttft, wall, cached = [], [], []
            timed = collections.defaultdict(list)  # the timed requests' phases only
            for _ in range(args.reps + 1):
                cold(llm)
                if hist:  # retained: its KV and the ring snapshot at its end
                    llm.generate([hist], SamplingParams(max_tokens=1, ignore_eos=True))
                times.clear()
                prof = _profiler() if args.profile_first and n == lengths[0] and (
                    not ttft or len(ttft) == args.reps) else contextlib.nullcontext()
                with prof:
                    t0 = time.perf_counter()
                    res = llm.generate([hist + ids],
                                       SamplingParams(max_tokens=1, ignore_eos=True))[0]
                    wall.append((time.perf_counter() - t0) * 1e3)
                if not isinstance(prof, contextlib.nullcontext):
                    _print_profile(prof, f"{fmt} {n} request {len(ttft)}", args.profile_first)
                ttft.append(res.ttft_ms)
                cached.append(res.cached_tokens)
                for k, v in times.items():
                    timed[k].append(sum(v))
            row = {"ttft_ms": statistics.median(ttft[1:]), "generate_ms": statistics.median(wall[1:]),
                   "cached_tokens": cached[-1]}
            row.update({k: statistics.median(v[1:] if len(v) > 1 else v) for k, v in timed.items()})
            # the first request of this length (of the process, for the first length): what
            # it pays beyond the medians is work done on first use
            row["first_ttft_ms"] = ttft[0]
            row.update({f"first{k}": v[0] for k, v in timed.items()})
            if hist:
                out[f"{fmt} {n} after {len(hist)}"] = row
                print(fmt, n, "after", len(hist), json.dumps({k: round(v, 3) for k, v in row.items()}),
                      flush=True)
                continue
            # the prefill alone, on the same runner and slot machinery
            runner = eng.runner
            cold(llm)  # the last generate's sequence is retained in the only slot
            slot = runner.alloc_slot()
            part = torch.tensor(ids, device="cuda")
            alone = []
            for _ in range(args.reps + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                runner.prefill(slot, part, eng.prefill_chunk_tokens)
                torch.cuda.synchronize()
                alone.append((time.perf_counter() - t0) * 1e3)
            runner.free_slot(slot)
            row["runner_prefill_ms"] = statistics.median(alone[1:])
            out[f"{fmt} {n}"] = row
            print(fmt, n, json.dumps({k: round(v, 3) for k, v in row.items()}), flush=True)
        if args.profile:
            import cProfile
            import pstats

            ids = [(7 * i) % (llm.tokenizer.vocab_size - 1) + 1 for i in range(args.profile)]
            cold(llm)
            llm.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True))
            cold(llm)
            prof = cProfile.Profile()
            prof.enable()
            llm.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True))
            prof.disable()
            print(f"{fmt}, {args.profile} tokens: cProfile of one generate (ms, cumulative)")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        del llm, eng
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
