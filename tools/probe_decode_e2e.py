#!/usr/bin/env python3
"""End-to-end time per token against the decode graph's own step time, with the engine's
pipelined decode on and off (issue 24 item 4: end to end within 3% of the step).

Builds the model as `flint-graph bench` does (synthetic weights of --preset, NVFP4 by
default), then per bucket B: the captured step's replay time at the e2e context (CUDA events,
median), and `perf.measure.e2e_record` (B copies of the bench's chat prompt decoding --tokens
tokens through `Engine.step`) with EngineConfig.pipeline_decode off and on, alternating,
--reps times each, on the same engine and graphs. Prints one JSON line per bucket: medians,
and the host's share over the step (e2e / step − 1) per mode.

    python tools/probe_decode_e2e.py --preset full --formats nvfp4 --buckets 1,8 --tokens 128
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="full")
    p.add_argument("--formats", default="nvfp4")
    p.add_argument("--buckets", default="1,8")
    p.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    p.add_argument("--reps", type=int, default=3, help="e2e runs per mode and bucket")
    p.add_argument("--json", default=None, help="also write the records here")
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
                    runs[mode].append(e2e_record(llm, fmt, b, args.tokens,
                                                 prompt)["ms_per_token"])
            rec = {"format": fmt, "B": b, "step_ms": round(step, 4)}
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
