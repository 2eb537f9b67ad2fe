#!/usr/bin/env python3
"""End-to-end time per token against the decode graph's own step time, with the engine's
pipelined decode on and off (issue 24 item 4: end to end within 3% of the step).

Builds the model as `flint-graph bench` does (synthetic weights of --preset, NVFP4 by
default), then per bucket B: the captured step's replay time at the e2e context (CUDA events,
median), and `perf.measure.e2e_record` (B copies of the bench's chat prompt decoding --tokens
tokens through `Engine.step`, fixed seeds: the same tokens and experts in every run) with
EngineConfig.pipeline_decode off and on, alternating,
--reps times each, on the same engine and graphs. Prints one JSON line per bucket: medians,
and the host's share over the step (e2e / step − 1) per mode.

    python tools/probe_decode_e2e.py --preset full --formats nvfp4 --buckets 1,8 --tokens 128
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from flint_graph.cli_args import ValueParser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _phases(llm, fmt, b, tokens, prompt) -> dict:
    """One e2e run with the runner's launch, PendingStep.result and Request.append timed."""
    import time

    import torch

    from flint_graph.capture import runner as runner_mod
    from flint_graph.perf.measure import e2e_record
    from flint_graph.runtime.request import Request

    run = llm.engine.runner
    t = {"gpu": [], "blocked": [], "to_launch": [], "launch": [], "appends": []}
    last = {"ready": None, "events": []}
    launch, result, append = run.launch, runner_mod.PendingStep.result, Request.append

    def timed_launch(rows):
        t0 = time.perf_counter()
        if last["ready"] is not None:
            t["to_launch"].append(t0 - last["ready"])
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        p = launch(rows)
        e.record()
        last["events"].append((a, e))
        t["launch"].append(time.perf_counter() - t0)
        last["ready"] = None
        return p

    def timed_result(self):
        t0 = time.perf_counter()
        out = result(self)
        last["ready"] = time.perf_counter()
        t["blocked"].append(last["ready"] - t0)
        return out

    def timed_append(self, token_id):
        t0 = time.perf_counter()
        try:
            return append(self, token_id)
        finally:
            t["appends"].append(time.perf_counter() - t0)

    run.launch = timed_launch
    runner_mod.PendingStep.result = timed_result
    Request.append = timed_append
    try:
        e2e_record(llm, fmt, b, tokens, prompt, seed=1000)
        torch.cuda.synchronize()
    finally:
        del run.launch
        runner_mod.PendingStep.result = result
        Request.append = append
    t["gpu"] = [a.elapsed_time(e) * 1e-3 for a, e in last["events"]]
    out = {k: round(statistics.median(v) * 1e6, 1) for k, v in t.items() if v}
    out["appends"] = round(out.get("appends", 0) * b, 1)  # per step, all rows
    return out


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="full")
    p.add_argument("--formats", default="nvfp4")
    p.add_argument("--buckets", default="1,8")
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    p.add_argument("--reps", type=int, default=3, help="e2e runs per mode and bucket")
    p.add_argument("--json", default=None, help="also write the records here")
    p.add_argument("--phases", action="store_true",
                   help="also time one more run per mode phase by phase (µs per step, "
                        "medians): the GPU's time per launched step (CUDA events around the "
                        "input upload and the replay), the host blocked on a step's ids, "
                        "from the ids to the next launch, the launch call, the appends")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    from flint_graph.chat.chat_template import render_chat
    from flint_graph.perf.bench import PROMPT, BenchOptions, sources
    from flint_graph.perf.measure import e2e_record, graph_steps

    buckets = [int(b) for b in args.buckets.split(",")]
    o = BenchOptions(preset=args.preset, formats=args.formats.split(","), buckets=buckets,
                     progress=False)
    out = []
    for fmt, llm in sources(o, 512 + args.tokens):
        eng = llm.engine
        prompt = llm.tokenizer.encode(render_chat(llm.tokenizer.chat_template,
                                                  [{"role": "user", "content": PROMPT}]))
        e2e_record(llm, fmt, 1, 8, prompt)  # first-use costs out of the way
        for b in buckets:
            step = statistics.median(graph_steps(eng.runner, b, len(prompt) + args.tokens // 2,
                                                 50))
            runs = {False: [], True: []}
            for _ in range(args.reps):
                for mode in (False, True):
                    eng.pipeline = mode
                    runs[mode].append(e2e_record(llm, fmt, b, args.tokens, prompt,
                                                 seed=1000)["ms_per_token"])
            rec = {"format": fmt, "B": b, "step_ms": round(step, 4)}
            if args.phases:
                for mode in (False, True):
                    eng.pipeline = mode
                    rec[f"phases_{'pipelined' if mode else 'one_at_a_time'}"] = _phases(
                        llm, fmt, b, args.tokens, prompt)
            for mode, name in ((False, "one_at_a_time"), (True, "pipelined")):
                ms = statistics.median(runs[mode])
                rec[name] = {"ms_per_token": round(ms, 4), "runs": [round(v, 4) for v in runs[mode]],
                             "over_step": round(ms / step - 1, 4)}
            print(json.dumps(rec), flush=True)
            out.append(rec)
        eng.pipeline = True
        del llm, eng
        torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
