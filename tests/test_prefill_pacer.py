"""The prefill budget per engine step (flint_graph/runtime/prefill_pacer.py) and the engine following
it: up to one chunk when nothing decodes, a time-sized share while rows decode, the hard cap."""

import pytest

from flint_graph.runtime.engine_config import EngineConfig, default_prefill_chunk
from flint_graph.errors import InvalidRequestError
from flint_graph.runtime.prefill_pacer import FIRST_TOKENS, MIN_TOKENS, PrefillPacer


def test_nothing_decoding_means_no_bound_unless_capped():
    assert PrefillPacer(50.0).budget(decoding=False) is None
    assert PrefillPacer(50.0, max_tokens=300).budget(decoding=False) == 300
    assert PrefillPacer(None).budget(decoding=True) is None
    assert PrefillPacer(None).budget(decoding=True, chunk=2048) == 2048


@pytest.mark.parametrize("decoding", [False, True])
def test_without_step_ms_no_timing_changes_the_budget(decoding):
    """step_ms=None: one chunk a step (capped by max_tokens) whatever was timed, so a rerun
    splits each prompt at the same tokens (timed budgets made a rerun of flint-nano's reference
    engine differ by 1.2e-5 nats on the H200, 2026-12-03)."""
    for cap, want in ((None, 512), (300, 300)):
        slow, fast = PrefillPacer(None, max_tokens=cap), PrefillPacer(None, max_tokens=cap)
        for n in (64, 256, 1024):
            slow.observe(n, 50.0 * n)
            fast.observe(n, 0.001 * n)
        for p in (slow, fast, PrefillPacer(None, max_tokens=cap)):
            assert p.budget(decoding=decoding, start=4096, chunk=512) == want


def test_the_budget_follows_the_fitted_line():
    p = PrefillPacer(50.0)
    assert p.budget(decoding=True) == FIRST_TOKENS  # nothing timed yet
    for n in (25, 512, 2048, 512):
        p.observe(n, 20.0 + 0.03 * n)  # 20 ms fixed + 30 µs per token
    a, d, b, c = p.cost()
    assert a == pytest.approx(20.0) and b == pytest.approx(0.03) and d == c == 0
    assert p.budget(decoding=True) in (999, 1000)  # (50 − 20) / 0.03, floating point
    assert p.predict_ms(1000) == pytest.approx(50.0)
    assert PrefillPacer(50.0, max_tokens=700).budget(decoding=True) == FIRST_TOKENS
    capped = PrefillPacer(50.0, max_tokens=100)
    capped.samples.extend(p.samples)
    assert capped.budget(decoding=True) == 100


def test_the_cost_grows_with_the_cached_prefix():
    """ms = 5 + 0.001·s + n·(0.02 + 1e-5·s): later in a long prompt a step takes fewer tokens,
    and where the fixed part alone passes the budget it still takes as many tokens as that
    part is worth."""
    p = PrefillPacer(200.0)
    for n in (64, 256, 1024):
        for s in (0, 4000, 16000, 32000):
            p.observe(n, 5 + 0.001 * s + n * (0.02 + 1e-5 * s), start=s)
    assert p.predict_ms(100, 20000) == pytest.approx(5 + 20 + 100 * 0.22, rel=1e-6)
    early, late = p.budget(True, start=0), p.budget(True, start=30000)
    assert early > late >= MIN_TOKENS
    slow = PrefillPacer(10.0)
    slow.samples.extend(p.samples)
    fixed, per = 5 + 0.001 * 30000, 0.02 + 1e-5 * 30000
    assert slow.budget(True, start=30000) == int(fixed / per)  # 35 ms fixed > 10 ms budget


def test_a_budget_below_the_fixed_cost_still_moves_the_prompt():
    p = PrefillPacer(5.0)
    p.observe(16, 20.0)
    p.observe(64, 21.0)
    assert p.budget(decoding=True) >= MIN_TOKENS


def test_noise_odd_observations_and_huge_budgets_never_break_the_budget():
    p = PrefillPacer(50.0)
    p.observe(64, 10.0)
    p.observe(64, 12.0)
    assert p.cost() is None and p.predict_ms(10) is None
    p.observe(128, 9.0)  # slower for fewer tokens: no negative or zero cost per token
    assert p.cost()[2] > 0
    assert p.budget(decoding=True) >= MIN_TOKENS
    for bad in [(10, float("inf")), (1e308, 5.0), (float("inf"), 5.0), (10, "5"),
                (10, None), (-3, 5.0), (10, float("nan")), (True, 5.0), (10, 5.0, -1),
                (10, 5.0, float("nan"))]:
        p.observe(*bad)
    assert len(p.samples) == 3
    huge = PrefillPacer(1e306)
    huge.samples.extend(p.samples)
    n = huge.budget(decoding=True)
    assert isinstance(n, int) and n >= 1
    for args in [{"step_ms": "50"}, {"step_ms": float("inf")}, {"step_ms": True},
                 {"max_tokens": "5"}, {"max_tokens": 2.5}, {"max_tokens": 0}]:
        with pytest.raises(ValueError):
            PrefillPacer(**args)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "50", True])
def test_engine_config_refuses_bad_step_ms(bad):
    with pytest.raises(InvalidRequestError, match="prefill_step_ms"):
        EngineConfig(prefill_step_ms=bad)


def test_default_chunk_depends_on_the_prefill_path():
    assert default_prefill_chunk(EngineConfig(), kernel_prefill=True) == 32768
    assert default_prefill_chunk(EngineConfig(), kernel_prefill=False) == 2048
    assert default_prefill_chunk(EngineConfig(prefill_chunk_tokens=300), True) == 300


def test_engine_prefills_a_time_sized_share_while_a_row_decodes(tiny_llm, monkeypatch):
    """Row A decodes; B's long prompt arrives: B is prefilled in shares of the pacer's budget,
    and A gets a token every step meanwhile."""
    from flint_graph.runtime.sampling import SamplingParams

    eng = tiny_llm.engine
    monkeypatch.setattr(eng.pacer, "budget",
                        lambda decoding, start=0, chunk=None: 40 if decoding else None)
    params = SamplingParams(max_tokens=30, ignore_eos=True)
    a = tiny_llm._request([5, 6, 7], params, None)
    eng.add(a)
    eng.step()
    assert len(a.output_ids) == 1  # prefilled whole (nothing decoding): its first token
    b = tiny_llm._request(list(range(1, 131)), params, None)
    eng.add(b)
    seen = []
    while not b.output_ids:
        before = len(a.output_ids)
        eng.step()
        assert len(a.output_ids) == before + 1
        seen.append(eng._prefilled.get(b.id, len(b.prompt_ids)))
    assert seen == [40, 80, 120, 130]
    for r in (a, b):
        eng.abort(r)


def test_interleave_record_tells_repeated_lengths_apart(tiny_llm):
    from flint_graph.perf.measure import interleave_record

    r = interleave_record(tiny_llm, "bf16", [40, 40], 50.0, warm_tokens=2)
    assert set(r["ttft_ms"]) == {"40 (1)", "40 (2)"}


@pytest.mark.parametrize("step_ms", [50.0, None])
def test_interleave_record_times_the_stream_while_prompts_arrive(tiny_llm, step_ms):
    from flint_graph.perf import schema
    from flint_graph.perf.bench_report import _interleave_row
    from flint_graph.perf.measure import interleave_record

    r = interleave_record(tiny_llm, "bf16", [40, 90], step_ms, warm_tokens=3)
    schema.check("interleave", r, schema._INTERLEAVE)
    assert set(r["ttft_ms"]) == {"40", "90"} and r["steps"] >= 1
    assert r["tpot_p50_ms"] <= r["tpot_p99_ms"] <= r["tpot_max_ms"]
    assert tiny_llm.engine.pacer.step_ms == 100.0  # restored
    assert not tiny_llm.engine.has_work
    assert "40+90" in _interleave_row(r)[0]


def test_bench_refuses_interleave_without_enough_slots():
    from flint_graph.perf.bench import BenchOptions, run_bench

    with pytest.raises(InvalidRequestError, match="--interleave"):
        run_bench(BenchOptions(preset="tiny", device="cpu", buckets=(1, 2), interleave=(64, 64),
                               progress=False))


def test_with_nothing_decoding_a_step_takes_at_most_one_chunk():
    """A step with nothing decoding takes one chunk, or fewer tokens where the timings say a
    chunk would pass IDLE_STEP_MS (the engine takes new requests and aborts only between
    steps: a 32K prompt on the CPU held it for ~12 minutes in one step, 2026-12-03)."""
    from flint_graph.runtime.prefill_pacer import IDLE_STEP_MS

    p = PrefillPacer(50.0)
    assert p.budget(decoding=False, chunk=2048) == 2048  # nothing timed yet: one chunk
    for n in (64, 256, 1024):
        p.observe(n, 2.0 * n)  # 2 ms per token: a CPU
    assert p.budget(decoding=False, chunk=2048) == pytest.approx(IDLE_STEP_MS / 2.0, abs=1)
    fast = PrefillPacer(50.0)
    for n in (64, 256, 1024):
        fast.observe(n, 0.01 * n + 5)
    assert fast.budget(decoding=False, chunk=8192) == 8192  # a GPU: the whole chunk fits
    assert PrefillPacer(50.0, max_tokens=300).budget(decoding=False, chunk=2048) == 300


def test_a_short_request_is_not_queued_behind_a_long_prompt(tiny_llm):
    """Steps prefill the prompts with the fewest tokens left first, at most one chunk per step
    with nothing decoding: a short request added while a long prompt prefills gets its first
    token before the long one, and `add` does not wait for a step in progress."""
    from flint_graph.runtime.sampling import SamplingParams

    eng = tiny_llm.engine
    eng.drop_retained()
    chunk, eng.prefill_chunk_tokens = eng.prefill_chunk_tokens, 16
    try:
        long_req = tiny_llm._request(list(range(1, 100)), SamplingParams(max_tokens=1), None)
        eng.add(long_req)
        eng.step()  # admitted, one chunk of 16 prefilled
        assert not long_req.output_ids and eng._prefilled[long_req.id] == 16
        short = tiny_llm._request([5, 6, 7], SamplingParams(max_tokens=1), None)
        eng.add(short)
        eng.step()
        assert short.output_ids and not long_req.output_ids
        while not long_req.is_finished:
            eng.step()
        assert long_req.output_ids
    finally:
        eng.prefill_chunk_tokens = chunk
        eng.drop_retained()


@pytest.mark.parametrize("step_ms", [None, 50.0])
def test_the_engine_splits_prompts_alike_whatever_the_timings(tiny_llm, monkeypatch, step_ms):
    """Requests overlapping a decoding row, run twice with the prefill clock made fast then
    slow: with step_ms=None both runs prefill the same (request, start, tokens) parts and give
    the same tokens and log-probabilities, bit for bit (what `flint-graph eval` relies on);
    with a time budget the parts follow the clock (the reason eval turns it off)."""
    import itertools

    from flint_graph.runtime import engine as engine_mod
    from flint_graph.runtime.prefill_pacer import PrefillPacer
    from flint_graph.runtime.sampling import SamplingParams

    eng = tiny_llm.engine
    saved = eng.pacer, eng.prefill_chunk_tokens

    def run(ms_per_call):
        eng.drop_retained()
        eng.pacer, eng.prefill_chunk_tokens = PrefillPacer(step_ms), 96
        clock = itertools.count(step=ms_per_call / 2e3)  # two reads per prefill call
        monkeypatch.setattr(engine_mod.time, "perf_counter", lambda: next(clock))
        parts, orig = [], eng._prefill_part

        def part(req, done, n, snapshot_at=None):
            parts.append((prompts.index(req.prompt_ids), done, n))
            return orig(req, done, n, snapshot_at)
        monkeypatch.setattr(eng, "_prefill_part", part)
        params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=True, temperature=0.0)
        prompts = [[3 + i % 50 for i in range(k, k + length)]
                   for k, length in ((0, 9), (7, 300), (11, 170), (13, 240))]
        reqs = [tiny_llm._request(p, params, None) for p in prompts]
        eng.add(reqs[0])
        eng.step()  # reqs[0] decodes while the others arrive
        for r in reqs[1:]:
            eng.add(r)
        while eng.has_work:
            eng.step()
        monkeypatch.undo()
        return parts, [(r.output_ids, r.logprobs) for r in reqs]

    try:
        fast, slow = run(0.5), run(400.0)
    finally:
        eng.pacer, eng.prefill_chunk_tokens = saved
        eng.drop_retained()
    if step_ms is None:
        assert fast == slow
        assert max(n for _, _, n in fast[0]) == 96  # a chunk a step
    else:
        assert fast[0] != slow[0]


@pytest.mark.parametrize("text,want", [("none", None), ("NONE", None), ("50", 50.0),
                                       ("0.5", 0.5)])
def test_prefill_step_ms_flag_takes_ms_or_none(text, want):
    import argparse

    from flint_graph.cli_args import step_ms

    assert step_ms(text) == want
    for bad in ("0", "-3", "inf", "nan", "1e309", "fast", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="finite number of ms > 0 or 'none'"):
            step_ms(bad)


def test_the_fit_is_solved_once_per_set_of_samples(monkeypatch):
    """The least-squares solve ran on every budget() call, and the engine asked for a budget on
    every step, prefilling or not: ~40 µs of host time per decode step on this CPU (B = 8:
    341 → 135 µs a step with an instant fake runner, 2026-12-05). It is solved again only
    after observe() adds a sample."""
    from flint_graph.runtime import prefill_pacer

    calls = []
    real = prefill_pacer.least_squares
    monkeypatch.setattr(prefill_pacer, "least_squares", lambda *a: calls.append(1) or real(*a))
    p = PrefillPacer(200.0)
    for n, ms in ((100, 12.0), (400, 30.0), (800, 55.0)):
        p.observe(n, ms)
    first = p.budget(decoding=True)
    for _ in range(50):
        assert p.budget(decoding=True) == first
    assert len(calls) == 1
    p.observe(1600, 101.0)
    p.budget(decoding=True)
    assert len(calls) == 2


def test_the_host_step_probe_runs():
    """tools/probe_host_step.py (issue 24's host time on any machine) stays runnable: a few
    decode steps of 2 rows with its instant runner, each step's time positive."""
    import tempfile
    from pathlib import Path

    from flint_graph import LLM
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.checkpoints.make_checkpoint import write_checkpoint

    from tool_module import tool_module

    probe = tool_module("probe_host_step")
    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(FlintConfig.preset("tiny"), Path(tmp) / "t", formats=("bf16",), seed=0,
                         device="cpu", progress=False)
        llm = LLM(Path(tmp) / "t", device="cpu", progress=False)
        med, p90 = probe.measure(llm, 2, 10, profile=False)
        assert 0 < med <= p90
        assert not llm.engine.has_work


@pytest.mark.parametrize("seed", range(6))
def test_least_squares_matches_torch_lstsq(seed):
    """The pacer's plain-Python solve (it replaced torch.linalg.lstsq on the step path, whose
    first call in a process is a suspect of issue 22's turn-2 stall) gives torch's solution
    for the engine's design matrix: columns 1, s, n, n·s of very different sizes, noisy ms."""
    import torch

    from flint_graph.runtime.prefill_pacer import least_squares

    g = torch.Generator().manual_seed(seed)
    m = 4 + seed * 5
    n = torch.randint(1, 32768, (m,), generator=g).double()
    s = torch.randint(0, 100000, (m,), generator=g).double()
    a = torch.stack([torch.ones(m, dtype=torch.float64), s, n, n * s], 1)
    x_true = torch.tensor([20.0, 1e-4, 0.03, 1e-7], dtype=torch.float64)
    y = a @ x_true + torch.randn(m, generator=g, dtype=torch.float64)
    scale = a.abs().amax(0)
    want = torch.linalg.lstsq(a / scale, y[:, None]).solution[:, 0] / scale
    got = least_squares(a.tolist(), y.tolist())
    assert got == pytest.approx(want.tolist(), rel=1e-6, abs=1e-12)


def test_least_squares_dependent_columns():
    """A column the others span (every start equal, so s and n·s repeat 1 and n) gets 0 and the
    rest still fit; an exact line is recovered; a single column is a ratio of sums."""
    from flint_graph.runtime.prefill_pacer import least_squares

    rows = [[1.0, 5.0, n, 5.0 * n] for n in (100.0, 400.0, 800.0, 1600.0)]
    y = [10.0 + 0.05 * r[2] for r in rows]
    x = least_squares(rows, y)
    pred = [sum(a * b for a, b in zip(r, x)) for r in rows]
    assert pred == pytest.approx(y, rel=1e-9)
    assert least_squares([[1.0, 2.0], [1.0, 4.0]], [3.0, 5.0]) == pytest.approx([1.0, 1.0])
    assert least_squares([[2.0], [4.0]], [2.0, 4.0]) == pytest.approx([1.0])
    assert least_squares([[0.0, 1.0], [0.0, 2.0]], [1.0, 2.0]) == pytest.approx([0.0, 1.0])
