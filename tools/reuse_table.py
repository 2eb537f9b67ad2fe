#!/usr/bin/env python3
"""One line per turn from `tools/bench_reuse.py`'s log on stdin (its JSON lines: the turns with
reuse on, then the same turns off): [label] turn, prompt tokens, cached tokens, TTFT on (ms),
its prefill phase (ms), TTFT off (ms), on / off. The device scripts print it after each run.

    python3 tools/bench_reuse.py ... | python3 tools/reuse_table.py [LABEL]
"""

import json
import sys


def main() -> int:
    label = sys.argv[1:2]
    rows = [json.loads(line) for line in sys.stdin if line.startswith("{")]
    rows = [r for r in rows if "ttft_ms" in r]
    half = len(rows) // 2  # reuse on, then the same turns off
    for on, off in zip(rows[:half], rows[half:]):
        print(*label, on.get("turn", on.get("step")), on["prompt_tokens"], on["cached_tokens"],
              round(on["ttft_ms"], 2), round(on.get("phases_ms", {}).get("prefill", 0), 2),
              round(off["ttft_ms"], 2), round(on["ttft_ms"] / off["ttft_ms"], 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
