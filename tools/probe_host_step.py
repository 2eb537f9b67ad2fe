#!/usr/bin/env python3
"""The engine's host time per decode step, measured on any machine (issue 24 item 4).

    python tools/probe_host_step.py [CKPT] [--batch 1,8] [--steps 300] [--profile] [--gpu-us 1650]

The graph engine's step is one CUDA graph replay plus Python: admission, the prefill budget,
the rows' inputs, then per row the detokenizer, stop strings and output parser
(`Engine._step`, `Request.append`). Here the engine's graph runner is replaced by one that
answers at once (its decode returns the next ids without touching a GPU), so what is timed is
that Python alone: B chat requests decode greedily, and the median (and p90) wall time of
`Engine.step()` is printed per batch size. On the H200 the same code adds to the replay's time
(end to end 1.75 against a 1.69 ms step at B = 1, 2026-12-01); a faster host CPU shrinks it.
CKPT defaults to a tiny synthetic checkpoint made in a temporary directory.
"""

from __future__ import annotations

import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from flint_graph.cli_args import ValueParser

import torch


class InstantRunner:
    """Stands in for capture.runner.GraphRunner: slots, rings and prefill as no-ops, decode
    returning fixed ids at once (what the engine calls of the runner)."""

    prefill_path = "kernel"

    def __init__(self, vocab: int, slots: int = 8, limit: int = 4096):
        self.free_slots = list(range(slots))
        self.context_limit = limit
        self._logits = torch.zeros(slots, vocab, dtype=torch.bfloat16)
        self._vocab = vocab
        self._k = 0

    def alloc_slot(self) -> int:
        return self.free_slots.pop()

    def free_slot(self, slot: int) -> None:
        self.free_slots.append(slot)

    def prefill(self, slot, part, chunk, start=0, snapshot_at=None):
        return torch.zeros(self._vocab)

    def save_rings(self, slot):
        return []

    def snapshot_rings(self):
        return []

    def load_rings(self, slot, rings) -> None:
        pass

    def decode(self, rows):
        return self.launch(rows).result()

    def launch(self, rows):
        """A step "on the GPU" for `gpu_us` (set by --gpu-us): it starts when the previous one
        ends or now, whichever is later; result() waits (spinning) until it is done."""
        self._k += 1
        start = max(time.perf_counter(), self._busy_until)
        self._busy_until = start + self.gpu_us * 1e-6
        return _Pending([5 + (self._k + i) % 50 for i in range(len(rows))],
                        self._logits[:len(rows)], self._busy_until)

    gpu_us = 0.0
    _busy_until = 0.0


class _Pending:
    def __init__(self, ids, logits, done_at):
        self._ids, self._logits, self._done_at = ids, logits, done_at

    def result(self):
        while time.perf_counter() < self._done_at:
            pass
        return self._ids, self._logits


def measure(llm, batch: int, steps: int, profile: bool, gpu_us: float = 0.0,
            pipeline: bool = False) -> tuple[float, float]:
    """(median, p90) µs of Engine.step() with `batch` rows decoding, each step taking `gpu_us`
    on a simulated GPU (0: none), the engine's pipelined decode on or off."""
    from flint_graph import SamplingParams

    eng = llm.engine
    eng.runner = InstantRunner(llm.cfg.vocab_size)
    eng.runner.gpu_us = gpu_us
    eng.pipeline = pipeline
    params = SamplingParams(max_tokens=steps + 100, temperature=0, ignore_eos=True)
    reqs = [llm._chat_request([{"role": "user", "content": f"hello {i}"}], None, params,
                              enable_thinking=True, tool_choice=None) for i in range(batch)]
    for r in reqs:
        eng.add(r)
    for _ in range(20):  # prefills and the first tokens
        eng.step()
    prof = cProfile.Profile() if profile else None
    times = []
    if prof:
        prof.enable()
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)
    bad = [r for r in reqs if r.finish_reason is not None or r.num_generated < steps]
    if bad:  # a step that decoded nothing would be timed as free
        raise SystemExit(f"probe_host_step: {len(bad)} of {batch} requests stopped early: "
                         f"{bad[0].finish_reason} {bad[0].errors}")
    for r in reqs:
        eng.abort(r)
    times.sort()
    return times[len(times) // 2] * 1e6, times[int(len(times) * 0.9)] * 1e6


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="checkpoint (default: a tiny synthetic one)")
    p.add_argument("--batch", default="1,8", help="comma-separated batch sizes (1-8)")
    p.add_argument("--steps", type=int, default=300, help="timed steps per batch size")
    p.add_argument("--profile", action="store_true", help="print cProfile's top functions")
    p.add_argument("--gpu-us", type=float, default=0.0,
                   help="simulate a GPU step of this many µs (the engine's time per token is "
                        "then this plus whatever host time it cannot hide), and time the "
                        "pipelined decode (EngineConfig.pipeline_decode) beside one step at a "
                        "time")
    args = p.parse_args()
    from flint_graph import LLM
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.checkpoints.make_checkpoint import write_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            model = Path(tmp) / "tiny"
            write_checkpoint(FlintConfig.preset("tiny"), model, formats=("bf16",), seed=0,
                             device="cpu", progress=False)
        for b in (int(x) for x in args.batch.split(",")):
            for pipeline in ((False, True) if args.gpu_us else (False,)):
                llm = LLM(model, device="cpu", progress=False)
                med, p90 = measure(llm, b, args.steps, args.profile, args.gpu_us, pipeline)
                if not args.gpu_us:
                    print(f"B={b}: host time per step median {med:.1f} µs, p90 {p90:.1f} µs")
                    continue
                print(f"B={b}, GPU step {args.gpu_us:.0f} µs, pipelined {pipeline}: time per "
                      f"step median {med:.1f} µs (+{med - args.gpu_us:.1f} over the GPU's), "
                      f"p90 {p90:.1f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
