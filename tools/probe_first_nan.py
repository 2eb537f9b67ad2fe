#!/usr/bin/env python3
"""Where the BF16 tool loop's first request turns non-finite (issue 22, docs/device-queue.md
item 1): on the H200 (2026-12-05) step 0 of `tools/bench_reuse.py --format bf16 --tool-loop`
ended with "logits are not finite at output token 3", while the same prompt with reuse off
(no preamble stop) and every later request ran. One process per --mode:

    split     reuse on, the prefill cut at the preamble's end as before 2026-12-05's in-chunk
              snapshots (the preamble through the 512-token graph, the rest as one chunk)
    on        reuse on, as the bench: the step, then the same request again
    off       reuse off from the start (no preamble stop): the same first request
    no-warm   reuse on, without start-up's eager warm-up chunk

On a decode step whose logits are not finite it reports, for the failing row's slot: every
layer's KV entries at positions 0 … p that are not finite, and the step rerun eagerly with each
layer's buffers checked (the first layer and buffer that turn non-finite). The reference model
reruns the tokens (`Engine._origin`, limit lifted): "kernel fault" when it stays finite.
Prints JSON lines; full size needs ~90 GB of GPU memory (BF16 weights).

    python tools/probe_first_nan.py --mode on [--history 8192]
"""

from __future__ import annotations

import json
import sys

from flint_graph.cli_args import ValueParser


def _kv_report(runner, slot: int, position: int) -> list[dict]:
    """Per layer, the KV entries of `slot` at positions 0 … position that are not finite."""
    import torch

    out = []
    pages = runner.kv.page_table(slot).to("cuda").long()
    w = runner.cfg.sliding_window
    for i, kv in enumerate(runner.kv.layers):
        for name in ("k", "v"):
            x = getattr(kv, name)
            if kv.ring:
                ring = x[slot]  # [HKV, W, D]; ring index = position % W
                keep = torch.arange(max(0, position - w + 1), position + 1, device="cuda") % w
                bad = (~torch.isfinite(ring[:, keep])).any(dim=(0, 2))
                where = [int(position - len(keep) + 1 + j) for j in bad.nonzero().flatten()[:8]]
            else:
                flat = x[pages].transpose(1, 2).reshape(-1, x.shape[1], x.shape[-1])
                bad = (~torch.isfinite(flat[:position + 1])).any(dim=(1, 2))
                where = [int(j) for j in bad.nonzero().flatten()[:8]]
            n = int(bad.sum())
            if n:
                out.append({"layer": i, "kv": name, "ring": kv.ring, "bad_positions": n,
                            "first": where})
    return out


def _eager_report(runner, rows) -> list[dict]:
    """Rerun the step eagerly (same kernels, same rows) checking each layer's buffers."""
    import torch

    b = min(b for b in runner.graphs if b >= len(rows))
    g = runner.graphs[b]
    g.set_rows(rows)
    names = ("qkv", "q_out", "attn", "o", "residual2", "h", "stream")
    seen = []

    def after(i, bf):
        seen.append((i, {n: torch.isfinite(getattr(bf, n)[:len(rows)]).all().clone()
                         for n in names},
                     {n: getattr(bf, n)[:len(rows)].float().abs().nan_to_num(0, 0, 0).max()
                      for n in ("stream", "attn")}))

    g.run_eager(after)
    torch.cuda.synchronize()
    out = []
    for i, ok, mx in seen:
        bad = [n for n, v in ok.items() if not bool(v)]
        out.append({"layer": i, "non_finite": bad,
                    "max_abs": {n: float(v) for n, v in mx.items()}})
        if bad and len([o for o in out if o["non_finite"]]) >= 3:
            break
    return [o for o in out if o["non_finite"]][:3] + [{"layers_checked": len(out),
                                                       "last_max": out[-1]["max_abs"]}]


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("split", "on", "off", "no-warm"), required=True)
    p.add_argument("--preset", default="full")
    p.add_argument("--format", default="bf16", choices=("bf16", "nvfp4"))
    p.add_argument("--history", type=int, default=8192)
    p.add_argument("--max-tokens", type=int, default=16)
    args = p.parse_args()
    import torch

    import flint_graph.capture.runner as runner_mod
    import flint_graph.runtime.engine as engine_mod
    from flint_graph.perf.bench import BenchOptions, sources

    sys.path.insert(0, "tools")
    from bench_reuse import TOOLS

    from flint_graph.runtime.sampling import SamplingParams

    if args.mode == "no-warm":
        runner_mod.EAGER_WARM_UP_TOKENS = 0
    engine_mod.DIAGNOSE_TOKENS = (1 << 20, 1 << 20)  # let _origin rerun the reference model
    items = max(1, args.history * 170 // 2621)
    first = "Summarize this log. " + " ".join(
        f"line {i}: step {i * 7 % 13} ok, value {i * 31 % 97}." for i in range(items))
    o = BenchOptions(preset=args.preset, formats=(args.format,), progress=False, buckets=(1,))
    for fmt, llm in sources(o, args.history + 4096):
        if fmt != args.format:
            continue
        eng = llm.engine
        if args.mode == "off":
            eng.prefix_cache.capacity = 0
        if args.mode == "split":
            part = eng._prefill_part

            def split_part(req, done, n, snapshot_at=None):
                if snapshot_at is None:
                    return part(req, done, n)
                part(req, done, snapshot_at - done)
                return part(req, snapshot_at, done + n - snapshot_at)

            eng._prefill_part = split_part
        runner = eng.runner
        plain = runner.decode

        def decode(rows):
            ids, logits = plain(rows)
            # ids at or above the tokenizer's size are the LM head's -inf padding
            fin = torch.isfinite(logits[:, :eng.tokenizer_vocab].float()).all(dim=-1).tolist()
            for r, ok in zip(rows, fin):
                if not ok:
                    print(json.dumps({"non_finite_step": {"slot": r.slot, "position": r.position,
                                                          "token": r.token}}), flush=True)
                    print(json.dumps({"kv": _kv_report(runner, r.slot, r.position)}),
                          flush=True)
                    print(json.dumps({"eager": _eager_report(runner, rows)}), flush=True)
            return ids, logits

        runner.decode = decode
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
        msgs = [{"role": "user", "content": first}]
        for attempt in range(2 if args.mode == "on" else 1):
            # cudaMallocs during the request (the caching allocator's new segments): the
            # first request's extra TTFT, if they are its cause
            before = torch.cuda.memory_stats()["segment.all.allocated"]
            msg = llm.chat(msgs, tools=TOOLS, params=params)
            out = msg.output
            print(json.dumps({"mode": args.mode, "attempt": attempt,
                              "prompt_tokens": len(out.prompt_token_ids),
                              "cached_tokens": out.cached_tokens, "ttft_ms": out.ttft_ms,
                              "new_segments": torch.cuda.memory_stats()[
                                  "segment.all.allocated"] - before,
                              "finish": out.finish_reason, "ids": list(out.token_ids),
                              "errors": out.errors}), flush=True)
        break
    return 0


if __name__ == "__main__":
    sys.exit(main())
