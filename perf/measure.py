"""The timed pieces of `flint-graph bench` (and the reference KV fill `flint-graph trace` uses):
a captured step's replays, the reference model's step, the engine's own loop end to end, and
a prefill. Times in ms."""

from __future__ import annotations

import statistics
import time

import torch


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def graph_steps(runner, b: int, ctx: int, steps: int) -> list[float]:
    """ms per replay of bucket b's captured step with every row at position ctx (the KV cache
    already filled): CUDA events around each replay, after 3 warm-ups."""
    from flint_graph.capture.decode_step import Row

    g = runner.graphs[b]
    g.set_rows([Row(slot=i, token=1 + i, position=ctx, temperature=1.0 - i % 2, top_k=20,
                    top_p=0.95, seed=i, draw_index=ctx) for i in range(b)])
    return replay_times_ms(g.replay, steps)


def replay_times_ms(replay, reps: int, warm: int = 3) -> list[float]:
    """ms of each of `reps` calls of `replay` (a graph replay) between CUDA events on the
    current stream, after `warm` untimed calls."""
    for _ in range(warm):
        replay()
    out = []
    for _ in range(reps):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        replay()
        e.record()
        e.synchronize()
        out.append(a.elapsed_time(e))
    return out


def reference_kv(model, b: int, ctx: int) -> list:
    """b sequences of `ctx` cached tokens of random KV (full layers hold ctx + 1 rows so the
    timed token's K/V goes in without growing the cache)."""
    cfg = model.cfg
    seqs = []
    for _ in range(b):
        s = model.new_sequence()
        for i, w in enumerate(s.windows):
            if w is None:
                shape = (ctx + 1, cfg.num_key_value_heads, cfg.head_dim)
                s.k[i] = torch.randn(shape, device=model.device).to(model.act_dtype)
                s.v[i] = torch.randn(shape, device=model.device).to(model.act_dtype)
            else:
                s.k[i].normal_()
                s.v[i].normal_()
        s.num_tokens = ctx
        seqs.append(s)
    return seqs


def reference_steps(model, b: int, ctx: int, steps: int, forward=None) -> list[float]:
    """ms per reference decode step (forward + sampling, synchronised) of b rows at context
    ctx, after one warm-up. `forward` replaces model.forward (the compiled baseline)."""
    from flint_graph.runtime.sampling import sample

    dev, forward = model.device, forward or model.forward
    seqs = reference_kv(model, b, ctx)
    tokens = [torch.tensor([1 + i], device=dev) for i in range(b)]
    temp = torch.tensor([1.0 - i % 2 for i in range(b)], device=dev)
    top_k = torch.full((b,), 20, device=dev)
    top_p = torch.full((b,), 0.95, device=dev)
    seeds = torch.arange(b, device=dev)
    pos = torch.full((b,), ctx, device=dev)
    out = []
    with torch.inference_mode():
        for i in range(steps + 1):
            for s in seqs:
                s.num_tokens = ctx
            _sync(dev)
            t0 = time.perf_counter()
            logits = torch.cat(forward(seqs, tokens))
            sample(logits, temp, top_k, top_p, seeds, pos)
            _sync(dev)
            if i:
                out.append((time.perf_counter() - t0) * 1e3)
    return out


def reference_fits(model, b: int, ctx: int) -> bool:
    """Whether b sequences of ctx tokens of reference KV fit in the free GPU memory (always on
    the CPU)."""
    if model.device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(model.device)
    return b * (ctx + 1) * model.cfg.kv_bytes_per_token * 1.3 < 0.9 * free


def cold(llm) -> None:
    """Forget the engine's retained sequences, so the next request prefills its whole prompt:
    every timed prompt here shares a prefix with an earlier one (the same chat prompt, ids
    0 … n), which KV reuse would otherwise serve from the cache (docs/kv-reuse.md)."""
    llm.engine.drop_retained()


def e2e_record(llm, fmt: str, b: int, tokens: int, prompt_ids: list[int], engine=None,
               seed: int | None = None) -> dict:
    """End to end at batch b: b identical chat prompts (EOS ignored) through the engine's own
    loop (`Engine.step`: scheduling, the step, sampling, detokenizer, stop checks). TTFT: the
    median request's submission to first token (prefills run one after another, so it grows
    with b); ms_per_token: the median wall time of the steps in which all b rows decode (no
    prefill in them), i.e. the TPOT each request sees once the batch is full. `seed`: row i
    draws with seed + i (the same tokens, so the same experts, run after run; a step's time
    depends on how many experts its rows pick); None: fresh seeds."""
    from flint_graph.runtime.sampling import SamplingParams

    reqs = [llm._request(prompt_ids, SamplingParams(
        max_tokens=tokens, ignore_eos=True, seed=None if seed is None else seed + i), None)
        for i in range(b)]
    eng = llm.engine
    cold(llm)
    t0 = time.perf_counter()
    for r in reqs:
        eng.add(r)
    first: dict[int, float] = {}
    steady: list[float] = []
    try:
        while any(not r.is_finished for r in reqs):
            full = (all(r.output_ids for r in reqs) and not eng.waiting and not eng.prefilling
                    and all(len(r.output_ids) < tokens for r in reqs))
            t = time.perf_counter()
            eng.step()
            if full:
                steady.append((time.perf_counter() - t) * 1e3)
            for r in reqs:
                if r.output_ids and r.id not in first:
                    first[r.id] = (time.perf_counter() - t0) * 1e3
    finally:
        for r in reqs:
            if not r.is_finished:
                eng.abort(r)
            r.pending.clear()
    return {"engine": engine or eng.name, "format": fmt, "B": b,
            "prompt_tokens": len(prompt_ids), "tokens": tokens, "steady_steps": len(steady),
            "ms_per_token": statistics.median(steady) if steady else None,
            "ttft_ms": statistics.median(first.values())}


def matmul_peak_flops(device, n: int = 8192, reps: int = 20) -> float | None:
    """Dense BF16 matmul FLOP/s of torch.matmul at n³ on a CUDA device (median of `reps`
    timed runs after 3 warm-ups): the peak MFU is taken against, measured in the run that
    reports it. None on the CPU."""
    if torch.device(device).type != "cuda":
        return None
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n ** 3 / statistics.median(times)


def _prefill_figures(cfg, n: int, seconds: float, peak: float | None) -> dict:
    """tokens/s, and with a measured matmul peak the TFLOP/s and MFU of an n-token prefill
    (FLOPs from `FlintConfig.prefill_flops`)."""
    out = {"tokens_per_s": n / seconds}
    if peak:
        flops = cfg.prefill_flops(n)["total"]
        out.update(tflops=flops / seconds / 1e12, mfu=flops / seconds / peak)
    return out


PREFILL_REPS = 3  # timed prompts per length up to PREFILL_REPS_MAX tokens on a GPU (median)
PREFILL_REPS_MAX = 4096


def prefill_record(llm, fmt: str, n: int, peak: float | None = None) -> dict:
    """Time to the first token of an n-token prompt (chunked prefill + one step), each run
    cold; the median of PREFILL_REPS runs up to PREFILL_REPS_MAX tokens on a GPU (one run
    took single-ms figures that moved by ±1 ms between benches), else one; tokens/s, and
    TFLOP/s and MFU against `peak` (FLOP/s) when given."""
    from flint_graph.runtime.sampling import SamplingParams

    ids = [(7 * i) % (llm.tokenizer.vocab_size - 1) + 1 for i in range(n)]
    reps = PREFILL_REPS if n <= PREFILL_REPS_MAX and llm.device.type == "cuda" else 1
    runs = []
    for _ in range(reps):
        cold(llm)
        runs.append(llm.generate([ids], SamplingParams(max_tokens=1, ignore_eos=True))[0])
    ms = statistics.median(r.ttft_ms for r in runs)
    return {"engine": llm.engine.name, "format": fmt, "tokens": n, "ms": ms, "runs": reps,
            "cached_tokens": max(r.cached_tokens for r in runs),
            **_prefill_figures(llm.cfg, n, ms / 1e3, peak)}


def prefill_baseline_record(llm, fmt: str, n: int, peak: float | None = None) -> dict | None:
    """The torch-ops baseline of the graph engine's prefill on the same weights and KV cache
    (capture/prefill.py with torch's SDPA for attention): one n-token prefill into a free
    slot, logits on the host, after a warm-up. None unless the graph engine runs."""
    from flint_graph.capture.prefill import Prefill

    runner = llm.engine.runner
    cold(llm)  # retained sequences would hold the slot this needs
    if runner is None or runner.prefiller is None or not runner.free_slots:
        return None
    base = Prefill(llm.cfg, runner.prefiller.w, runner.kv, attention="sdpa")
    ids = torch.tensor([(7 * i) % (llm.tokenizer.vocab_size - 1) + 1 for i in range(n)])
    slot = runner.alloc_slot()
    try:
        base.prefill(slot, ids[:min(n, 64)], 2048)  # warm-up: cuBLAS and SDPA set-up
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        base.prefill(slot, ids, llm.engine.prefill_chunk_tokens).cpu()
        s = time.perf_counter() - t0
    finally:
        runner.free_slot(slot)
    return {"engine": "torch-ops", "format": fmt, "tokens": n, "ms": s * 1e3,
            **_prefill_figures(llm.cfg, n, s, peak)}


def interleave_record(llm, fmt: str, lengths: list[int], step_ms: float | None,
                      warm_tokens: int = 8) -> dict:
    """A running stream's time per token while long prompts arrive (issue 21 item 2).

    Stream A (a 64-token prompt, EOS ignored) decodes `warm_tokens` tokens; then one prompt per
    `lengths` entry arrives at once (max_tokens 1). Every step until the last of them has its
    first token gives A exactly one token: the wall time of those steps is A's time per token
    (p50, p99, max), beside each long prompt's TTFT from its arrival. The engine's pacer runs
    with `step_ms` (None: one chunk a step, untimed) and is restored after. ttft_ms is keyed by
    length (numbered where a length repeats); None for a prompt that failed."""
    from flint_graph.runtime.sampling import SamplingParams

    eng = llm.engine
    vocab = llm.tokenizer.vocab_size - 1
    saved = eng.pacer.step_ms
    eng.pacer.step_ms = step_ms
    a = llm._request([(3 * i) % vocab + 1 for i in range(64)],
                     SamplingParams(max_tokens=10 ** 6, ignore_eos=True), None)
    longs = [llm._request([(7 * i + n) % vocab + 1 for i in range(n)],
                          SamplingParams(max_tokens=1, ignore_eos=True), None) for n in lengths]
    cold(llm)
    try:
        eng.add(a)
        while len(a.output_ids) < warm_tokens:
            eng.step()
        t0 = time.perf_counter()
        for r in longs:
            eng.add(r)
        steps, ttft = [], {}
        # a prompt's label: its length, numbered when a length repeats
        labels = [str(n) if lengths.count(n) == 1 else f"{n} ({i + 1})"
                  for i, n in enumerate(lengths)]
        while len(ttft) < len(longs):
            t = time.perf_counter()
            eng.step()
            steps.append((time.perf_counter() - t) * 1e3)
            for label, r in zip(labels, longs):
                if label not in ttft and (r.output_ids or r.is_finished):
                    ttft[label] = (time.perf_counter() - t0) * 1e3 if r.output_ids else None
    finally:
        for r in [a, *longs]:
            if not r.is_finished:
                eng.abort(r)
            r.pending.clear()
        eng.pacer.step_ms = saved
    q = sorted(steps)
    return {"engine": eng.name, "format": fmt, "prefill_step_ms": step_ms,
            "prompts": list(lengths), "steps": len(steps),
            "tpot_p50_ms": statistics.median(q),
            "tpot_p99_ms": q[min(len(q) - 1, int(0.99 * len(q)))], "tpot_max_ms": q[-1],
            "ttft_ms": ttft}


def graph_nodes_per_bucket(runner) -> dict[str, int]:
    """Kernel nodes of each bucket's captured step (our launches where the driver cannot say)."""
    out = {}
    for b, g in runner.graphs.items():
        try:
            out[str(b)] = g.graph_nodes().get("kernel", 0)
        except RuntimeError:
            out[str(b)] = g.kernels_per_step
    return out
