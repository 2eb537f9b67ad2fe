#!/usr/bin/env python3
"""Load test of `flint-graph serve` against any checkpoint (issue 23 item 4): the server runs
in this process on a free local port; C concurrent streaming clients (the official `openai`
package) send R requests each, every tenth closed after its first chunk. Before the load, each
completed request also runs alone (cold, no KV reuse from another request), so every answer
under load is compared with its solo answer (greedy). Reports TTFT and TPOT percentiles as the
clients see them (ms), requests/s, the answers that differ, and the engine's state after.

    python tools/load_serve.py MODEL [--clients 8] [--requests 50] [--max-tokens 32] [--out DIR]
    python tools/load_serve.py            # the embedded flint-nano, on this machine's device
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import time
from pathlib import Path

from flint_graph.cli_args import ValueParser

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", default=None, help="a checkpoint (default: flint-nano)")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--requests", type=int, default=50, help="per client")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--out", default="out")
    p.add_argument("--no-gc-freeze", action="store_true",
                   help="leave start-up's objects to the cyclic GC (the serve command freezes "
                        "them: flint_graph/runtime/gc_policy.py)")
    args = p.parse_args()
    import openai

    from flint_graph import LLM
    from test_server import KEY, _serving

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    llm = LLM(args.model, progress=False)
    if not args.no_gc_freeze:  # as `flint-graph serve` does after start-up
        from flint_graph.runtime.gc_policy import freeze_startup_objects

        freeze_startup_objects()
    print(f"loaded in {time.perf_counter() - t0:.1f} s ({llm.engine.name} engine)", flush=True)
    eng = llm.engine

    def body(c: int, j: int) -> dict:
        return {"model": "m", "temperature": 0, "max_tokens": args.max_tokens,
                "messages": [{"role": "user",
                              "content": f"Client {c}, question {j}: what is {c * 37 + j} plus "
                                         f"{j * 11 + 5}?"}]}

    def cancelled(j: int) -> bool:
        return j % 10 == 3

    with _serving(llm, "m") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        solo = {}
        for c in range(args.clients):
            for j in range(args.requests):
                if not cancelled(j):
                    eng.drop_retained()
                    m = client.chat.completions.create(**body(c, j)).choices[0].message
                    solo[c, j] = (getattr(m, "reasoning_content", None) or "") + "|" + \
                        (m.content or "")
        eng.drop_retained()
        print(f"{len(solo)} solo answers", flush=True)
        got, ttft, tpot, errors = {}, [], [], []
        lock = threading.Lock()

        def run(c: int) -> None:
            try:
                for j in range(args.requests):
                    start = time.perf_counter()
                    stream = client.chat.completions.create(**body(c, j), stream=True,
                                                            stream_options={"include_usage": True})
                    if cancelled(j):
                        next(iter(stream))
                        stream.close()
                        continue
                    first, parts, n = None, [], 0
                    for chunk in stream:
                        if chunk.usage is not None:
                            n = chunk.usage.completion_tokens
                        for ch in chunk.choices:
                            r = getattr(ch.delta, "reasoning_content", None) or ""
                            if (r or ch.delta.content) and first is None:
                                first = time.perf_counter()
                            parts.append((r, ch.delta.content or ""))
                    end = time.perf_counter()
                    text = "".join(r for r, _ in parts) + "|" + "".join(x for _, x in parts)
                    with lock:
                        got[c, j] = text
                        if first is not None:
                            ttft.append((first - start) * 1e3)
                            if n > 1:
                                tpot.append((end - first) * 1e3 / (n - 1))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(f"client {c}: {type(e).__name__}: {e}")

        t1 = time.perf_counter()
        threads = [threading.Thread(target=run, args=(c,)) for c in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t1
        time.sleep(0.5)
        differ = sorted(k for k in solo if got.get(k) != solo[k])
        res = {"engine": eng.name, "model": args.model or "flint-nano", "clients": args.clients,
               "requests_per_client": args.requests, "max_tokens": args.max_tokens,
               "completed": len(got), "cancelled": args.clients * args.requests - len(solo),
               "wall_s": wall, "requests_per_s": args.clients * args.requests / wall,
               "ttft_ms": {"p50": _pct(ttft, 0.5), "p90": _pct(ttft, 0.9),
                           "p99": _pct(ttft, 0.99), "max": max(ttft, default=None)},
               "tpot_ms": {"p50": _pct(tpot, 0.5), "p90": _pct(tpot, 0.9),
                           "p99": _pct(tpot, 0.99), "max": max(tpot, default=None)},
               "differ_from_solo": [list(k) for k in differ], "errors": errors,
               "after": {"running": len(eng.running), "waiting": len(eng.waiting),
                         "prefilling": len(eng.prefilling)},
               "mean_ttft_ms": statistics.fmean(ttft) if ttft else None}
    (out / "load.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return 1 if errors or differ else 0


if __name__ == "__main__":
    sys.exit(main())
