#!/usr/bin/env python3
"""Greedy identity with KV reuse on and off, on flint-nano (issue 22): a 5-step chat over a
4,645-token log (tool results or follow-up questions appended each step), once with reuse on and
2,048-token prefill chunks, once with reuse off and 97-token chunks. Prints each step's prompt
and cached tokens and exits 1 unless every step's tokens and log-probabilities are identical.
The reference engine on the CPU (the check docs/kv-reuse.md describes; about 100 s on 2 cores).

    python tools/reuse_identity.py
"""

import json
import sys
import time
from pathlib import Path

from flint_graph import LLM, SamplingParams
from flint_graph.runtime.engine_config import EngineConfig

TOOLS = json.loads((Path(__file__).parent.parent / "examples/tools.json").read_text())
LOG = "\n".join(f"line {i}: service s{i % 7} status {'ok' if i % 5 else 'error'} code "
                f"{1000 + 37 * i}" for i in range(180))


def run(engine: EngineConfig) -> list[tuple[list[int], list[float]]]:
    llm = LLM(device="cpu", progress=False, engine=engine)
    msgs = [{"role": "user", "content": "Here is a log:\n" + LOG + "\nLook up the orders table "
                                        "where status is error, 5 rows."}]
    out = []
    for step in range(5):
        m = llm.chat(msgs, tools=TOOLS, params=SamplingParams(temperature=0.0, max_tokens=48,
                                                              logprobs=True))
        out.append((m.output.token_ids, m.output.logprobs))
        print(f"  step {step}: prompt {len(m.output.prompt_token_ids)} tokens, "
              f"{m.output.cached_tokens} from the cache", flush=True)
        msgs.append(m.to_dict())
        msgs.append({"role": "tool", "content": json.dumps({"rows": step + 1})} if m.tool_calls
                    else {"role": "user", "content": f"And step {step}?"})
    return out


def main() -> int:
    runs = {}
    for name, cfg in (("reuse on, chunks of 2048", EngineConfig(prefill_chunk_tokens=2048)),
                      ("reuse off, chunks of 97", EngineConfig(prefill_chunk_tokens=97,
                                                              kv_reuse=False))):
        print(name, flush=True)
        t0 = time.perf_counter()
        runs[name] = run(cfg)
        print(f"  {time.perf_counter() - t0:.1f} s", flush=True)
    a, b = runs.values()
    same = [x == y for x, y in zip(a, b)]
    print("identical tokens and log-probabilities per step:", same)
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
