#!/usr/bin/env python3
"""The prefill pacer's step budget swept on one engine (issue 21 item 2): a running stream's
time per token (p50, p99, max) while long prompts arrive together, and their TTFT, per
`PrefillPacer.step_ms` (`perf.measure.interleave_record`, as `flint-graph bench --interleave`
runs it at the default only). One JSON line per budget, in the order given, after one untimed
warm-up pass at the first budget.

    python tools/probe_pacing.py --preset full --format nvfp4 --step-ms 50,100,200 --prompts 8k,32k
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flint_graph.cli_args import ValueParser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _tokens(text: str) -> int:
    return int(text[:-1]) * 1024 if text.lower().endswith("k") else int(text)


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="full")
    p.add_argument("--format", default="nvfp4", choices=("nvfp4", "bf16"))
    p.add_argument("--step-ms", default="50,100,200",
                   help="budgets in ms of prefill a step; 'none' for one chunk a step")
    p.add_argument("--prompts", default="8k,32k", help="prompt lengths arriving together")
    p.add_argument("--json", default=None, help="also write the records here")
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    from flint_graph.perf.bench import BenchOptions, sources
    from flint_graph.perf.measure import interleave_record

    budgets = [None if v.strip() == "none" else float(v) for v in args.step_ms.split(",")]
    lengths = [_tokens(v) for v in args.prompts.split(",")]
    if len(lengths) > 7:
        p.error(f"--prompts: {len(lengths)} prompts; at most 7 (beside the stream, 8 rows)")
    # the stream and every arriving prompt decode together: all buckets (up to 8 rows)
    o = BenchOptions(preset=args.preset, formats=(args.format,), buckets=(1, 2, 4, 8),
                     progress=False)
    out = []
    for fmt, llm in sources(o, max(lengths) + 256):
        interleave_record(llm, fmt, lengths, budgets[0])  # first-use costs out of the way
        for ms in budgets:
            rec = interleave_record(llm, fmt, lengths, ms)
            print(json.dumps(rec), flush=True)
            out.append(rec)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
