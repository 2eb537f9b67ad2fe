"""Multi-turn KV reuse (flint_graph/runtime/prefix_cache.py, Engine): where a request may resume, the
retained-sequence cache, and on the reference engine (CPU) greedy outputs with reuse equal to a
cold start's over scripted conversations, with the prompt tokens actually served from the cache.

The tiny model's window is 17 (ring of 17 entries), so prompts of a few dozen tokens already
overwrite their rings: every resume below exercises the ring rules. Outputs are compared
token for token: a resumed prefill runs the same reference ops on fewer rows, which on the CPU
gives the same bits here (checked, not assumed: the KV test compares contents exactly too).
"""

import random

import pytest
import torch
from chat_fakes import script_chat_output
from greedy_match import assert_greedy_match

from flint_graph.runtime.engine_config import EngineConfig
from flint_graph.errors import InvalidRequestError
from flint_graph.runtime.prefix_cache import PrefixCache, Retained, common_prefix, resume_point
from flint_graph.runtime.sampling import SamplingParams

# log-probabilities for assert_greedy_match (tests/greedy_match.py: the graph engine's near ties)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, logprobs=True, top_logprobs=4)


def _exact(llm) -> bool:
    """Outputs must be identical (the CPU reference, chunk-invariant), not only up to a near
    tie (CUDA): greedy_match.py."""
    return llm.engine.device.type == "cpu"


# -- where a request may resume --------------------------------------------------------------

@pytest.mark.parametrize("cached,snaps,lcp,prompt,want", [
    (100, [], 100, 150, (100, None)),  # continues the whole sequence (tool loop)
    (100, [], 150, 150, (100, None)),
    (100, [], 99, 150, (99, None)),  # one before the end: the ring's spare entry serves
    (100, [], 98, 150, (0, None)),  # the ring has lost position 98 − W + 1: cold
    (100, [60], 59, 150, (59, 60)),  # GLM-4.7's next turn: diverges one before the snapshot
    (100, [60], 60, 150, (60, 60)),
    (100, [60], 80, 150, (60, 60)),  # between snapshot and end: the snapshot
    (100, [60], 58, 150, (0, None)),
    (100, [30, 60], 30, 150, (30, 30)),
    (100, [], 100, 100, (99, None)),  # a prompt that is the whole sequence: one token to run
    (100, [], 100, 60, (0, None)),  # a strict prefix, no ring saved there: cold
    (100, [60], 100, 60, (59, 60)),
    (5, [], 0, 10, (0, None)),
    (5, [], 3, 1, (0, None)),  # a one-token prompt always prefills
])
def test_resume_point(cached, snaps, lcp, prompt, want):
    assert resume_point(cached, snaps, lcp, prompt) == want


@pytest.mark.parametrize("lcp, snaps, want", [
    (100, [], (100, None)),  # the last whole position: the cut step's entry is not read
    (150, [], (100, None)),
    (99, [], (0, None)),  # one before: it would read the entry the cut step overwrote
    (99, [60], (60, 60)),  # the prompt's snapshot serves instead
    (59, [60], (59, 60)),
])
def test_resume_point_after_a_cut_decode_step(lcp, snaps, want):
    assert resume_point(100, snaps, lcp, 150, live_back=0) == want


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2, 3]) == 2


def test_cache_keeps_the_most_recent_and_takes_the_longest_match():
    c = PrefixCache(2)
    a, b, d = Retained([1, 2, 3, 4], "a"), Retained([1, 2, 9, 9], "b"), Retained([7, 7], "d")
    assert c.add(a) == [] and c.add(b) == []
    assert c.add(d) == [a]  # least recently used out
    m = c.take([1, 2, 9, 9, 5])
    assert m.entry is b and m.reuse == 4 and len(c) == 1
    assert c.take([3, 3]) is None and len(c) == 1
    assert PrefixCache(0).add(a) == [a]
    with pytest.raises(ValueError):
        PrefixCache(-1)


def test_reuse_never_serves_a_prompt_that_differs_inside_the_reused_prefix():
    rng = random.Random(0)
    for _ in range(2000):
        cache = PrefixCache(4)
        for k in range(4):
            ids = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
            snaps = {p: None for p in rng.sample(range(1, len(ids) + 1),
                                                 min(2, len(ids)))}
            cache.add(Retained(ids, k, snaps))
        prompt = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        m = cache.take(prompt)
        if m is not None:
            assert 0 < m.reuse < len(prompt)
            assert m.entry.ids[:m.reuse] == prompt[:m.reuse]
            assert m.snapshot is None or m.snapshot - 1 <= m.reuse <= m.snapshot


def test_engine_config_refuses_a_non_bool_kv_reuse():
    with pytest.raises(InvalidRequestError, match="kv_reuse"):
        EngineConfig(kv_reuse=1)


# -- the engine, reuse on and off ------------------------------------------------------------

@pytest.fixture(scope="module")
def llms(tiny_ckpt):
    from flint_graph import LLM

    on = LLM(tiny_ckpt, device="cpu", progress=False, engine=EngineConfig(max_slots=4))
    off = LLM(tiny_ckpt, device="cpu", progress=False,
              engine=EngineConfig(max_slots=4, kv_reuse=False))
    return on, off


def _chat(llm, turns: list[str], tools=None, enable_thinking=True):
    """A conversation: each user turn, the assistant's reply appended as the chat API returns
    it; returns (outputs per turn, cached tokens per turn)."""
    msgs, ids, cached = [], [], []
    for t in turns:
        msgs.append({"role": "user", "content": t})
        msg = llm.chat(msgs, tools=tools, params=GREEDY, enable_thinking=enable_thinking)
        ids.append(msg.output)
        cached.append(msg.output.cached_tokens)
        msgs.append({"role": "assistant", "content": msg.content or "",
                     "reasoning_content": msg.reasoning_content})
    return ids, cached


def test_multi_turn_chat_equals_a_cold_start_and_reuses_the_history(llms):
    on, off = llms
    turns = [f"turn {i}: say something about the number {i * 37}" for i in range(20)]
    got, cached = _chat(on, turns)
    want, none = _chat(off, turns)
    assert_greedy_match(got, want, _exact(on))
    assert not any(none)
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached


def test_reuse_and_chunk_size_leave_every_log_probability_unchanged(tiny_ckpt):
    """Stronger than equal tokens: with reuse on and prefill chunks of 5 tokens, against reuse
    off and whole prompts, every generated token's log-probability is the same float, turn
    after turn. The CPU reference sums in float64 (`reference.acc_dtype`), so a token's logits
    do not depend on the chunk it was prefilled in (docs/kv-reuse.md)."""
    from flint_graph import LLM

    params = SamplingParams(temperature=0.0, max_tokens=12, logprobs=True)
    runs = {}
    for name, cfg in (("on", EngineConfig(max_slots=2, prefill_chunk_tokens=5)),
                      ("off", EngineConfig(max_slots=2, kv_reuse=False))):
        llm = LLM(tiny_ckpt, device="cpu", progress=False, engine=cfg)
        msgs, out = [], []
        for i in range(6):
            msgs.append({"role": "user", "content": f"question {i} about {i * 91}: "
                                                    + " ".join(f"w{i * j}" for j in range(30))})
            msg = llm.chat(msgs, params=params)
            out.append((msg.output.token_ids, msg.output.logprobs, msg.output.cached_tokens))
            msgs.append({"role": "assistant", "content": msg.content or "",
                         "reasoning_content": msg.reasoning_content})
        runs[name] = out
    assert [o[:2] for o in runs["on"]] == [o[:2] for o in runs["off"]]
    assert all(o[2] > 0 for o in runs["on"][1:]) and not any(o[2] for o in runs["off"])


def test_a_tool_loop_reuses_almost_every_prompt_token(llms):
    on, off = llms
    tools = [{"type": "function", "function": {
        "name": "lookup", "description": "look a key up",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                       "required": ["key"]}}}]
    outs = {}
    for name, llm in (("on", on), ("off", off)):
        msgs = [{"role": "user", "content": "find the values of keys a, b and c"}]
        ids, fractions = [], []
        for step in range(5):
            msg = llm.chat(msgs, tools=tools, params=GREEDY)
            ids.append(msg.output)
            fractions.append(msg.output.cached_tokens / len(msg.output.prompt_token_ids))
            msgs.append({"role": "assistant", "content": msg.content or "",
                         "reasoning_content": msg.reasoning_content,
                         "tool_calls": [{"type": "function", "function": {
                             "name": "lookup", "arguments": {"key": "abc"[step % 3]}}}]})
            msgs.append({"role": "tool", "content": f"value {step}: {'x' * (step + 3)}"})
        outs[name] = (ids, fractions)
    assert_greedy_match(outs["on"][0], outs["off"][0], _exact(on))
    assert all(f > 0.5 for f in outs["on"][1][1:]), outs["on"][1]


def test_interleaved_diverging_and_prefix_prompts_equal_cold_starts(llms):
    """Two conversations taking turns on one engine; a third that repeats the first's opening
    then diverges at its second turn; a raw prompt that is a strict prefix of an earlier one;
    the same prompt twice."""
    on, off = llms
    a = [f"alpha {i} " * 3 for i in range(4)]
    b = [f"beta {i} " * 5 for i in range(4)]
    c = a[:1] + ["gamma diverges here"] + a[2:3]
    results = {}
    for name, llm in (("on", on), ("off", off)):
        out = []
        ma, mb = [], []
        for ta, tb in zip(a, b):
            for msgs, t in ((ma, ta), (mb, tb)):
                msgs.append({"role": "user", "content": t})
                msg = llm.chat(msgs, params=GREEDY)
                out.append(msg.output)
                msgs.append({"role": "assistant", "content": msg.content or ""})
        out += _chat(llm, c)[0]
        long = list(range(5, 70))
        # one after another (submitted together, none would have finished to be reused)
        cached = []
        for ids in (long, long[:40], long[:40], long):
            (o,) = llm.generate([ids], GREEDY)
            out.append(o)
            cached.append(o.cached_tokens)
        results[name] = (out, cached)
    assert_greedy_match(results["on"][0], results["off"][0], _exact(on))
    assert results["off"][1] == [0, 0, 0, 0]
    # the strict prefix finds no ring saved at its end (cold), its repeat resumes one token
    # before its end (a prompt must run one token), and the long prompt again all but one
    assert results["on"][1] == [0, 0, 39, 64]


def _resumed_kv_mismatches(on) -> list[str]:
    """Resume inside the ring window (one token before the snapshot) and exactly at it, then
    compare the sequence's KV (every ring entry, every full-layer position) with a cold
    prefill's of the same ids: the layers that differ, as "resume r, layer i"."""
    eng = on.engine
    base = list(range(3, 43))  # 40 tokens: the tiny rings (17) wrap twice
    bad = []
    for resume, tail in ((39, [50, 51, 52]), (40, [60, 61])):
        eng.drop_retained()
        first = on.generate([base], SamplingParams(temperature=0.0, max_tokens=4))[0]
        prompt = base[:resume] + tail
        req = on._request(prompt, SamplingParams(temperature=0.0, max_tokens=1), None)
        eng.add(req)
        with eng._lock, torch.inference_mode():
            eng._admit(eng.waiting.popleft())
            assert req.cached_tokens == resume, (req.cached_tokens, first.token_ids)
            seq = eng._kv[req.id]
            eng.model.prefill(seq, torch.tensor(prompt[resume:]), 64)
            cold = eng.model.new_sequence()
            eng.model.prefill(cold, torch.tensor(prompt), 64)
        n = len(prompt)
        for i, w in enumerate(seq.windows):
            got, want = (seq.k[i], cold.k[i]) if w else (seq.k[i][:n], cold.k[i][:n])
            if not torch.equal(got, want):
                bad.append(f"resume {resume}, layer {i}")
        eng.abort(req)
        eng.drop_retained()
    return bad


def test_resumed_prefill_writes_the_kv_a_cold_prefill_writes(llms):
    """After a resume inside the ring window (one token before the snapshot) and one exactly at
    it, the sequence's KV (every ring entry, every full-layer position) equals a cold
    prefill's of the same ids."""
    assert _resumed_kv_mismatches(llms[0]) == []


def test_the_kv_check_catches_a_resume_from_the_live_ring(llms, monkeypatch):
    """A planted fault: resuming from the live ring where only a snapshot holds the keys the
    resumed queries need (the ring has moved on to later positions). The KV check above must
    see it in the sliding layers (their rings hold other positions' keys); the greedy tokens
    of a flat random model may not (a 2026-12-05 trial: an 8-turn chat first differed at a
    near tie)."""
    import flint_graph.runtime.prefix_cache as pc

    def live_ring(cached, snapshots, lcp, prompt_len, live_back=1):
        top = min(lcp, prompt_len - 1, cached)
        return (top, None) if top > 0 else (0, None)

    monkeypatch.setattr(pc, "resume_point", live_ring)
    bad = _resumed_kv_mismatches(llms[0])
    windows = llms[0].engine.model.new_sequence().windows
    assert any(windows[int(b.rsplit(" ", 1)[1])] for b in bad), bad


def test_failed_requests_leave_nothing_and_an_abort_mid_prefill_its_whole_chunks(
        llms, monkeypatch):
    """A request aborted between prefill steps (a client that left or timed out) keeps the
    chunks it finished: the same prompt sent again resumes after them, with the outputs of a
    cold start. One whose prefill failed leaves nothing."""
    on, off = llms
    eng = on.engine
    eng.prefix_cache.clear()
    prompt = list(range(1, 60))
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=True)
    req = on._request(prompt, params, None)
    eng.add(req)
    monkeypatch.setattr(eng.pacer, "budget", lambda decoding, start=0, chunk=None: 10)
    eng.step()
    eng.step()  # 20 of 59 prompt tokens prefilled
    assert req in eng.prefilling
    eng.abort(req)
    assert [len(e.ids) for e in eng.prefix_cache.entries] == [20]
    monkeypatch.undo()
    again = on.generate([prompt], params)[0]
    cold = off.generate([prompt], params)[0]
    assert again.cached_tokens == 20 and again.prompt_tokens == len(prompt) == 59
    assert (again.token_ids, again.logprobs) == (cold.token_ids, cold.logprobs)
    eng.drop_retained()
    bad = on._request(list(range(1, 20)), SamplingParams(max_tokens=3), None)
    real = eng.model.prefill

    def failing(*a, **k):
        raise RuntimeError("simulated prefill fault")

    monkeypatch.setattr(eng.model, "prefill", failing)
    eng.add(bad)
    eng.step()
    assert bad.finish_reason == "error" and len(eng.prefix_cache) == 0
    monkeypatch.setattr(eng.model, "prefill", real)


def _interrupt_decode_after(monkeypatch, steps: int) -> None:
    """Make the reference model raise KeyboardInterrupt (Ctrl-C) in decode step `steps` + 1,
    right after its first sliding layer wrote the step's KV: the ring then holds a position
    the request's ids do not yet count."""
    from flint_graph.reference import SequenceKV

    real = SequenceKV.update
    seen = {"n": 0}

    def update(self, layer, k, v):
        out = real(self, layer, k, v)
        if k.shape[0] == 1 and self.windows[layer] is not None:
            seen["n"] += 1
            if seen["n"] == steps * sum(w is not None for w in self.windows) + 1:
                monkeypatch.setattr(SequenceKV, "update", real)
                raise KeyboardInterrupt
        return out

    monkeypatch.setattr(SequenceKV, "update", update)


def _aborted_after_a_cut_step(llm, monkeypatch, prompt: list[int]):
    """A request on `llm` (cache emptied first) whose sixth decode step is cut by Ctrl-C,
    then aborted as the chat does; returns it."""
    eng = llm.engine
    eng.prefix_cache.clear()
    req = llm._request(prompt, SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
                       None)
    eng.add(req)
    _interrupt_decode_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        while not req.is_finished:
            eng.step()
    eng.abort(req)
    return req


@pytest.mark.parametrize("resume_at, cached", [(1, "all"), (2, "prompt"), (3, "prompt")])
def test_a_decode_step_interrupted_by_ctrl_c_keeps_what_is_whole(llms, monkeypatch,
                                                                 resume_at, cached):
    """Ctrl-C lands inside a decode step (the terminal chat's way to stop a reply): the step
    already wrote the next position into some rings, over the spare entry the sequence's
    rings hold. The request is aborted as the API does. Its positions before the step stay
    reusable (dropping them all cost a new user's next chat turn its whole history,
    2026-12-07), but only where the cut cannot reach: resuming at the last whole position
    from the live rings, or earlier from the prompt's ring snapshot; a later prompt gets a
    cold start's tokens and log-probabilities either way."""
    on, off = llms
    eng = on.engine
    req = _aborted_after_a_cut_step(on, monkeypatch, list(range(3, 43)))
    whole = len(req.prompt_ids) + req.num_generated - 1  # the cut step wrote this position
    assert [len(e.ids) for e in eng.prefix_cache.entries] == [whole]
    assert eng.prefix_cache.entries[0].live_back == 0
    ids = (req.prompt_ids + req.output_ids)[:-resume_at] + [99, 98, 97]
    q = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=True)
    a, b = on.generate([ids], q)[0], off.generate([ids], q)[0]
    assert a.cached_tokens == (whole if cached == "all" else len(req.prompt_ids))
    assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    eng.drop_retained()


def test_a_cut_decode_step_never_serves_a_resume_from_its_overwritten_ring_entry(llms,
                                                                                monkeypatch):
    """The sibling without a snapshot to fall back on: the prompt's snapshot is gone (as when
    there was no memory for it), so a prompt diverging one token before the last whole
    position has nothing that holds the keys it needs and runs cold, not from the cut rings."""
    on, off = llms
    eng = on.engine
    req = _aborted_after_a_cut_step(on, monkeypatch, list(range(4, 44)))
    (entry,) = eng.prefix_cache.entries
    entry.snapshots.clear()
    ids = (req.prompt_ids + req.output_ids)[:-2] + [99, 98, 97]
    q = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=True)
    a, b = on.generate([ids], q)[0], off.generate([ids], q)[0]
    assert a.cached_tokens == 0
    assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    eng.drop_retained()


def test_a_row_whose_interrupted_step_is_run_again_is_retained(llms, monkeypatch):
    """After Ctrl-C the caller may keep stepping instead of aborting: the next completed step
    rewrites the interrupted position with the same token, so the finished sequence is
    retained again and serves a later prompt like a cold start."""
    on, off = llms
    eng = on.engine
    eng.prefix_cache.clear()
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    req = on._request(list(range(5, 45)), params, None)
    eng.add(req)
    _interrupt_decode_after(monkeypatch, 4)
    with pytest.raises(KeyboardInterrupt):
        while not req.is_finished:
            eng.step()
    while not req.is_finished:
        eng.step()
    assert len(eng.prefix_cache) == 1
    cold = off.generate([req.prompt_ids], params)[0]
    assert req.output_ids == cold.token_ids
    ids = req.prompt_ids + req.output_ids + [77, 76]
    q = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=True)
    a, b = on.generate([ids], q)[0], off.generate([ids], q)[0]
    assert a.cached_tokens > 0 and (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    eng.drop_retained()


def test_ctrl_c_during_another_requests_prefill_leaves_it_whole(llms, monkeypatch):
    """Ctrl-C lands while a step prefills request B in chunks (found by a bad-input trial: B's
    cache was then a chunk ahead of the engine's count, its answer changed and reuse carried
    the damage into its next turn). B goes on, prefilled again from its first token: its
    tokens and log-probabilities are a cold start's, and so is a later turn resuming from
    it."""
    on, off = llms
    eng = on.engine
    eng.prefix_cache.clear()
    q = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=True)
    ids = [(7 * i) % 200 + 3 for i in range(90)]
    on.generate([ids[:50]], q)  # retained: B resumes from it, then is cut mid-chunk
    monkeypatch.setattr(eng, "prefill_chunk_tokens", 16)
    fired = {"n": 0}

    def hook(req, done, total):
        if done > req.cached_tokens and not fired["n"]:
            fired["n"] = 1
            raise KeyboardInterrupt

    eng.prefill_progress = hook
    b = on._request(ids, q, None)
    eng.add(b)
    with pytest.raises(KeyboardInterrupt):
        while not b.is_finished:
            eng.step()
    eng.prefill_progress = None
    assert b.cached_tokens == 0  # starts over, nothing reused
    while not b.is_finished:
        eng.step()
    cold = off.generate([ids], q)[0]
    assert (b.output_ids, b.logprobs) == (cold.token_ids, cold.logprobs)
    more = ids + b.output_ids + [11, 12, 13]
    a, c = on.generate([more], q)[0], off.generate([more], q)[0]
    assert a.cached_tokens > 0 and (a.token_ids, a.logprobs) == (c.token_ids, c.logprobs)
    eng.drop_retained()


def _interrupt_call(monkeypatch, obj, name: str, nth: int) -> None:
    """Make call `nth` (1-based) of obj.name raise KeyboardInterrupt (Ctrl-C); the others run."""
    real, calls = getattr(obj, name), {"n": 0}

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == nth:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(obj, name, flaky)


def test_ctrl_c_between_a_decode_forward_and_its_token_is_redone(llms, monkeypatch):
    """The reference engine's forward stores a step's KV and counts it; Ctrl-C before the drawn
    token is appended left the count one ahead of the ids, so the next step wrote at a shifted
    position. The next step now redoes the position: outputs equal a cold start's."""
    on, off = llms
    eng = on.engine
    eng.prefix_cache.clear()
    q = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=True)
    ids = list(range(20, 60))
    req = on._request(ids, q, None)
    eng.add(req)
    # the third decode step (call 4): after its forward, before the append
    _interrupt_call(monkeypatch, eng, "_sample_and_append", 4)
    with pytest.raises(KeyboardInterrupt):
        while not req.is_finished:
            eng.step()
    while not req.is_finished:
        eng.step()
    cold = off.generate([ids], q)[0]
    assert (req.output_ids, req.logprobs) == (cold.token_ids, cold.logprobs)
    eng.drop_retained()


def test_ctrl_c_before_a_prompts_first_token_is_drawn(llms, monkeypatch):
    """Ctrl-C after a prompt's last chunk but before its first token is appended: the request
    had joined the decoding rows with no token to feed. It is prefilled again and answers as
    a cold start."""
    on, off = llms
    eng = on.engine
    eng.prefix_cache.clear()
    q = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=True)
    ids = list(range(30, 75))
    req = on._request(ids, q, None)
    eng.add(req)
    _interrupt_call(monkeypatch, eng, "_sample_and_append", 1)
    with pytest.raises(KeyboardInterrupt):
        eng.step()
    assert req in eng.prefilling and req not in eng.running
    while not req.is_finished:
        eng.step()
    cold = off.generate([ids], q)[0]
    assert (req.output_ids, req.logprobs) == (cold.token_ids, cold.logprobs)
    eng.drop_retained()


def test_out_of_memory_for_a_snapshot_evicts_retained_sequences_first(llms, monkeypatch):
    """A ring snapshot that runs out of memory evicts retained sequences (least recently used
    first) and tries again; with none left it is skipped. Neither fails the request, and the
    outputs stay a cold start's (issue 22: memory pressure evicts before anything is refused)."""
    on, off = llms
    eng = on.engine
    eng.prefix_cache.clear()
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    for k in range(3):  # three retained sequences
        on.generate([list(range(10 + k, 50 + k))], params)
    assert len(eng.prefix_cache) == 3
    real, fails = eng._save_rings, {"n": 2}

    def tight(rid, chunk_snapshot=False):
        if fails["n"]:
            fails["n"] -= 1
            raise torch.OutOfMemoryError("simulated: no memory for the snapshot")
        return real(rid, chunk_snapshot)

    monkeypatch.setattr(eng, "_save_rings", tight)
    ids = list(range(100, 140))
    a = on.generate([ids], params)[0]
    assert a.finish_reason == "length" and not a.errors
    assert len(eng.prefix_cache) == 2  # two evicted for the snapshot, the new one retained
    assert a.token_ids == off.generate([ids], params)[0].token_ids
    fails["n"] = 10 ** 6  # never any memory: every snapshot skipped, nothing fails
    b = on.generate([list(range(200, 240))], params)[0]
    assert b.finish_reason == "length" and not b.errors
    c = on.generate([list(range(200, 240)) + b.token_ids + [7, 8]], params)[0]
    assert (c.token_ids == off.generate([list(range(200, 240)) + b.token_ids + [7, 8]],
                                        params)[0].token_ids)
    eng.drop_retained()


def test_the_start_up_report_bounds_the_snapshots_memory(tiny_llm):
    from flint_graph.runtime.prefix_cache import MAX_SNAPSHOTS

    r = tiny_llm.startup["kv_reuse"]
    eng = tiny_llm.engine
    assert r["retained_max"] == eng.prefix_cache.capacity > 0
    assert r["snapshot_bytes"] == tiny_llm.cfg.sliding_kv_bytes_per_slot > 0
    assert r["snapshot_bytes_max"] == ((eng.max_slots + r["retained_max"]) * MAX_SNAPSHOTS
                                       * r["snapshot_bytes"])


def test_the_start_up_report_bounds_the_reference_engines_retained_kv(tiny_llm):
    """The reference engine's retained sequences keep KV tensors of their own (not slots of a
    preallocated cache): the report gives their rings, their bytes per token and the most
    retained_max sequences can hold, and a retained sequence holds no more than that."""
    r = tiny_llm.startup["kv_reuse"]
    eng, cfg = tiny_llm.engine, tiny_llm.cfg
    assert eng.runner is None
    assert r["retained_ring_bytes"] == cfg.sliding_kv_bytes_per_slot
    assert r["retained_kv_bytes_per_token"] == cfg.kv_bytes_per_token > 0
    assert r["retained_kv_bytes_max"] == r["retained_max"] * (
        r["retained_ring_bytes"] + r["retained_kv_bytes_per_token"] * eng.context_limit)
    eng.drop_retained()
    tiny_llm.generate([list(range(3, 90))], SamplingParams(max_tokens=4))
    (entry,) = eng.prefix_cache.entries
    held = sum(t.nbytes for t in entry.kv.k + entry.kv.v)
    grown = -(-len(entry.ids) // entry.kv.chunk_tokens) * entry.kv.chunk_tokens
    assert held <= r["retained_ring_bytes"] + r["retained_kv_bytes_per_token"] * grown
    eng.drop_retained()


def test_the_kv_cache_leaves_room_for_every_snapshot(monkeypatch):
    """The graph engine sizes its KV cache after the slots' rings and the most the ring
    snapshots can take (capture/runner.py snapshot_reserve), so taking one never needs memory
    the cache holds: full size, 8 slots, 1.8 GB (three snapshots a sequence)."""
    from flint_graph.capture import runner
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.runtime.prefix_cache import MAX_SNAPSHOTS

    cfg = FlintConfig.preset("full")
    free = 40 * 2 ** 30  # below the 262K-token context limit's need
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 2 * free))
    reserve = runner.snapshot_reserve(cfg, 8)
    assert reserve == 2 * 8 * MAX_SNAPSHOTS * cfg.sliding_kv_bytes_per_slot
    assert 1.7e9 < reserve < 1.8e9
    tokens = runner.kv_tokens_for(cfg, 8, None, torch.device("cpu"))
    ring = cfg.sliding_kv_bytes_per_slot * 10  # 8 slots, the scratch and the snapshot row
    used = tokens * cfg.kv_bytes_per_token * 9 + ring + reserve
    assert used <= free * runner.KV_MEMORY_FRACTION < used + cfg.kv_bytes_per_token * 9
    # and after the prefill's kept BF16 dense weights (prefill.dense_bf16_bytes), when given
    dense = 2_400_000_000
    fewer = runner.kv_tokens_for(cfg, 8, None, torch.device("cpu"), reserve=dense)
    assert fewer * cfg.kv_bytes_per_token * 9 + ring + reserve + dense \
        <= free * runner.KV_MEMORY_FRACTION < (fewer + 1) * cfg.kv_bytes_per_token * 9 + ring \
        + reserve + dense


# -- generated ids back into the next prompt (flint_graph/chat/generated_ids.py) ------------------

def test_splice_puts_back_a_non_canonical_generation(tiny_llm):
    from flint_graph.chat.generated_ids import splice_generated

    tok = tiny_llm.tokenizer

    def dec(ids):
        return tok.decode(ids, False)

    head = "[gMASK]<sop><|user|>what is it?<|assistant|><think>"
    prev = tok.encode(head)
    reply = "it is fine</think>yes indeed"
    out = [i for ch in reply for i in tok.encode_text(ch)] + tok.encode("<|observation|>")
    assert dec(out) == reply + "<|observation|>"
    new = tok.encode(head + reply + "<|observation|><tool_response>42</tool_response>"
                     "<|assistant|><think>")
    assert new[:len(prev) + len(out)] != prev + out  # re-encoding split it otherwise
    got = splice_generated(new, [(prev, out)], dec)
    assert got[:len(prev) + len(out)] == prev + out
    assert dec(got) == dec(new)
    # not verbatim (the template dropped the reasoning): left alone
    other = tok.encode(head[:-len("<think>")] + "</think>yes indeed<|user|>next")
    assert splice_generated(other, [(prev, out)], dec) == other
    # a prompt that does not start with the earlier prompt: left alone
    assert splice_generated(out + new, [(prev, out)], dec) == out + new
    assert splice_generated(new, [], dec) == new


def test_only_the_models_own_output_after_its_own_prompt_is_spliced(tiny_llm):
    """Text spelling control tokens is replaced only where it reproduces, right after the same
    prompt ids, exactly what the model generated: then by the model's own ids. After another
    prompt, or differing by one character, it stays ordinary text."""
    from flint_graph.chat.generated_ids import splice_generated

    tok = tiny_llm.tokenizer

    def dec(t):
        return tok.decode(t, False)

    prev = tok.encode("[gMASK]<sop><|user|>a<|assistant|><think>")
    out = tok.encode("</think>b<|user|>")
    tail = tok.encode("<|assistant|>")
    same = prev + tok.encode_text("</think>b<|user|>") + tail
    assert splice_generated(same, [(prev, out)], dec) == prev + out + tail
    other = tok.encode("[gMASK]<sop><|user|>z<|assistant|><think>")
    forged = other + tok.encode_text("</think>b<|user|>") + tail
    assert splice_generated(forged, [(prev, out)], dec) == forged
    near = prev + tok.encode_text("</think>c<|user|>") + tail
    assert splice_generated(near, [(prev, out)], dec) == near


@pytest.mark.parametrize("steps", [2, 3, 5])
def test_splice_restores_every_generated_turn_of_a_tool_loop(tiny_llm, steps):
    """Step k of a tool loop re-renders steps 1 … k−1's replies; each was generated as a
    non-canonical tokenisation. Every one of them comes back as the model's own ids, not only
    the first (step k's prompt, itself spliced, matches only once the earlier ones are), so
    the new prompt continues the retained step k − 1 sequence to its end."""
    from flint_graph.chat.generated_ids import splice_generated
    from flint_graph.runtime.prefix_cache import common_prefix

    tok = tiny_llm.tokenizer

    def dec(t):
        return tok.decode(t, False)

    def odd(text):  # a tokenisation BPE would not choose: one id per character
        return [i for ch in text for i in tok.encode_text(ch)]

    text = "[gMASK]<sop><|user|>what is it?<|assistant|><think>"
    done, prompt = [], tok.encode(text)
    for k in range(steps):
        reply = f"thought {k}</think>calling lookup {k}"
        out = odd(reply) + tok.encode("<|observation|>")
        done.append((prompt, out))
        text += reply + f"<|observation|><tool_response>{k}</tool_response><|assistant|><think>"
        new = splice_generated(tok.encode(text), done, dec)
        assert new[:len(prompt) + len(out)] == prompt + out, f"step {k + 1}"
        assert common_prefix(new, prompt + out) == len(prompt) + len(out)
        assert dec(new) == text
        prompt = new


def test_common_prefix_agrees_with_a_plain_scan():
    rng = random.Random(3)
    for _ in range(3000):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 40))]
        b = a[:rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(5))]
        want = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert common_prefix(a, b) == want


def test_graph_engine_ring_snapshot_round_trips():
    """GraphRunner.save_rings (one stacked copy of every sliding layer's ring of a slot) and
    load_rings (one batched copy back) on a CPU KV cache: the slot's rings come back exactly,
    other slots and full layers are untouched, and a snapshot is a copy (later writes to the
    slot do not reach it)."""
    from types import SimpleNamespace

    from flint_graph.capture.kv_cache import KVCache
    from flint_graph.capture.runner import GraphRunner
    from flint_graph.checkpoints.config import FlintConfig

    cfg = FlintConfig.preset("tiny")
    kv = KVCache(cfg, num_slots=2, max_tokens=64, device="cpu")
    gen = torch.Generator().manual_seed(0)
    for layer in kv.layers:
        for t in (layer.k, layer.v):
            t.copy_(torch.randn(t.shape, generator=gen))
    before = [(layer.k.clone(), layer.v.clone()) for layer in kv.layers]
    runner = SimpleNamespace(kv=kv)
    saved = GraphRunner.save_rings(runner, 1)
    assert [s is None for s in saved] == [not layer.ring for layer in kv.layers]
    for layer in kv.layers:  # the slot moves on (decode writes its rings)
        layer.k[1] = 0.5
        layer.v[1] = -0.5
    assert all(torch.equal(s[0], b[0][1]) for s, b in zip(saved, before) if s is not None)
    GraphRunner.load_rings(runner, 1, saved)
    for layer, (k0, v0) in zip(kv.layers, before):
        if layer.ring:
            assert torch.equal(layer.k, k0) and torch.equal(layer.v, v0)
        else:  # a full layer's pages are not part of a snapshot
            assert torch.equal(layer.k[1], torch.full_like(layer.k[1], 0.5))


@pytest.mark.parametrize("max_tokens", [1, 4])
def test_the_prompt_end_snapshot_is_taken_after_the_first_token(tiny_ckpt, max_tokens):
    """The ring snapshot at the end of a prompt is deferred past its first token
    (`Engine._take_snapshots`: taken at the request's next step, or at its retirement when the
    first token also ends it) and still describes the rings the prefill left: it is copied
    once the first token is out, the retained sequence holds it at the prompt's length, and a
    longer prompt resuming from that sequence equals a cold start."""
    from flint_graph import LLM

    llm = LLM(tiny_ckpt, device="cpu", progress=False, engine=EngineConfig(max_slots=2))
    eng = llm.engine
    prompt = llm.tokenizer.encode("a prompt whose rings are saved " * 4)
    taken = {}
    save = eng._save_rings

    def spy(rid, chunk_snapshot=False):  # what the deferred snapshot copies, and when
        if not chunk_snapshot:
            taken["outputs"] = [len(r.output_ids) for r in eng.running if r.id == rid]
        return save(rid, chunk_snapshot)

    eng._save_rings = spy
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.generate([prompt], params)
    eng._save_rings = save
    assert taken["outputs"] == [1], "the snapshot came before the first token"
    (entry,) = eng.prefix_cache.entries
    assert len(prompt) in entry.snapshots
    cold = LLM(tiny_ckpt, device="cpu", progress=False,
               engine=EngineConfig(max_slots=2, kv_reuse=False))
    longer = prompt + llm.tokenizer.encode(" and more")
    out = llm.generate([longer], params)[0]
    assert out.cached_tokens > 0
    assert out.token_ids == cold.generate([longer], params)[0].token_ids


# -- the chat preamble's snapshot (prefix_cache.preamble_end) ----------------------------------

def test_preamble_end_is_the_first_user_token_of_a_long_enough_preamble():
    from flint_graph.runtime.prefix_cache import PREAMBLE_MIN, preamble_end

    user = 7
    long = list(range(100, 100 + PREAMBLE_MIN)) + [user, 1, 2, user, 3]
    assert preamble_end(long, user) == PREAMBLE_MIN
    assert preamble_end([1, 2, user, 3], user) is None  # [gMASK]<sop><|user|>: no preamble
    assert preamble_end(long, None) is None and preamble_end(long[:PREAMBLE_MIN], user) is None


SYSTEM = "You answer briefly. " * 12
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "look a key up in the table of records " * 3,
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                   "required": ["key"]}}}]


def _conversation(llm, turns):
    """A chat with SYSTEM and TOOLS; returns [(output, cached tokens, prompt ids)]."""
    msgs, out = [{"role": "system", "content": SYSTEM}], []
    for t in turns:
        msgs.append({"role": "user", "content": t})
        msg = llm.chat(msgs, tools=TOOLS, params=GREEDY)
        out.append((msg.output, msg.output.cached_tokens,
                    msg.output.prompt_token_ids))
        msgs.append({"role": "assistant", "content": msg.content or "",
                     "reasoning_content": msg.reasoning_content})
    return out


def test_a_new_conversation_with_the_same_tools_resumes_after_them(llms):
    """A chat's /reset, or an agent's next task: the system prompt and the tool definitions
    are the same, the first user message differs. Before, no snapshot lay there, so the new
    conversation was prefilled cold (a new-user trial: ~1-2 s a /reset on the CPU); now the
    first prompt's prefill stops at its first <|user|> once to save the rings, and that
    snapshot stays through later turns (pinned)."""
    from flint_graph.runtime.prefix_cache import preamble_end

    on, off = llms
    user = on.tokenizer.special_ids["<|user|>"]
    for llm in llms:
        llm.engine.drop_retained()
    first = ["what is stored under key a?", "and under key b?", "and c?", "thanks", "one more"]
    second = ["a different question entirely"]
    got = _conversation(on, first) + _conversation(on, second)
    want = _conversation(off, first) + _conversation(off, second)
    assert_greedy_match([g[0] for g in got], [w[0] for w in want], _exact(on))
    b = preamble_end(got[0][2], user)
    assert b is not None and got[-1][2][:b + 1] == got[0][2][:b + 1]
    # four later turns (each adds a prompt-end snapshot) did not push the preamble's out
    assert got[-1][1] == b, (got[-1][1], b)
    assert all(c > b for _, c, _ in got[1:len(first)])
    on.engine.drop_retained()


def test_the_preamble_snapshot_changes_no_token_or_log_probability(tiny_ckpt):
    """Saving the rings at the preamble's end on the way (inside the prefill's chunk since
    2026-12-05; a chunk boundary there before) leaves every generated token's log-probability
    the same float as a prefill with reuse off (the CPU reference sums in float64,
    docs/kv-reuse.md), and the retained sequence holds that snapshot and the prompt end's."""
    from flint_graph import LLM

    params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=True)
    runs = []
    for reuse in (True, False):
        llm = LLM(tiny_ckpt, device="cpu", progress=False,
                  engine=EngineConfig(max_slots=2, kv_reuse=reuse))
        msg = llm.chat([{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "what is under key q?"}], tools=TOOLS,
                       params=params)
        runs.append((msg.output.token_ids, msg.output.logprobs))
        if reuse:
            (entry,) = llm.engine.prefix_cache.entries
            assert len(entry.snapshots) == 2, sorted(entry.snapshots)  # preamble, prompt end
    assert runs[0] == runs[1]


def test_each_reuse_decision_is_logged_at_debug(llms, caplog):
    """Why a turn was or was not served from the cache, for a diagnosis (logger
    flint_graph.reuse; `tools/bench_reuse.py --log-reuse`): a cold prompt, its retention with
    its snapshots, and the next turn's resume point with the retained sequences it weighed."""
    import logging

    on, _ = llms
    on.engine.drop_retained()
    caplog.set_level(logging.DEBUG, logger="flint_graph.reuse")
    ids, _ = _chat(on, ["first question", "second question"])
    text = [r.getMessage() for r in caplog.records if r.name == "flint_graph.reuse"]
    first, second = (len(o.prompt_token_ids) for o in ids)
    assert text[0] == f"prompt of {first} ids: cold; retained: none", text
    assert any(t.startswith("request ") and " retained: " in t and "snapshots [" in t
               for t in text), text
    resumed = next(t for t in text if t.startswith(f"prompt of {second} ids: resumes at "))
    assert f"-> resume {ids[1].cached_tokens}" in resumed and "common prefix" in resumed
    on.engine.drop_retained()


@pytest.mark.parametrize("reply", ["<|observation|>", "<|user|>", "</think><|observation|>",
                                   "</think><tool_call>lookup<arg_key>key"])
def test_a_tool_loop_step_after_an_empty_or_cut_reply_resumes(tiny_ckpt, monkeypatch, reply):
    """On the H200 (2026-12-05) the BF16 tool loop's step 1 ran cold after a step 0 whose
    reply came back empty. A reply that ends at its first token, one with no content or
    reasoning, and one cut off inside a call (max_tokens) are all retained: the next step
    resumes at least from the previous prompt's end less one token (a snapshot there, or the
    live ring). Only a failed request is never retained."""
    from flint_graph import LLM

    llm = LLM(tiny_ckpt, device="cpu", progress=False, engine=EngineConfig(max_slots=2))
    ids = llm.tokenizer.encode_segments([(reply, False)])
    script_chat_output(monkeypatch, llm, ids)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"key": {"type": "string"}}}}}]
    msgs = [{"role": "system", "content": "You look values up. " * 20},
            {"role": "user", "content": "find the value of a " + "x " * 300}]
    prompts = []
    for step in range(3):
        msg = llm.chat(msgs, tools=tools, params=SamplingParams(temperature=0.0,
                                                                max_tokens=len(ids)))
        out = msg.output
        assert out.finish_reason != "error", out.errors
        prompts.append((len(out.prompt_token_ids), out.cached_tokens))
        msgs += [{"role": "assistant", "content": msg.content or "",
                  "reasoning_content": msg.reasoning_content,
                  "tool_calls": [{"type": "function", "function": {
                      "name": "lookup", "arguments": {"key": f"k{step}"}}}]},
                 {"role": "tool", "content": f"value {step}"}]
    for (before, _), (_, cached) in zip(prompts, prompts[1:]):
        assert cached >= before - 1, prompts


@pytest.mark.parametrize("first_tokens", [3, 1], ids=["snapshot", "live-ring"])
def test_an_abort_before_a_resumed_requests_first_chunk_keeps_no_wrong_ring(llms, monkeypatch,
                                                                           first_tokens):
    """A request resumed one token before the end of what it reuses (its rings restored from
    the snapshot at P, or the live rings of a sequence of P tokens; its cached tokens P - 1)
    and aborted before its first chunk: its rings are those of position P, not P - 1, so
    keeping it as a sequence of P - 1 tokens would serve a resume at P - 2 from a ring missing
    a key it needs (and holding a later one). Only a request that prefilled a chunk of its own
    keeps its prefix; the next prompt here matches a cold start, log-probability for
    log-probability. (The live-ring form is a bad-input trial's, 2026-12-05: a request
    admitted while another prompt took the step's prefill budget, its client gone.)"""
    on, off = llms
    eng = on.engine
    eng.drop_retained()
    rng = random.Random(7)
    a = [rng.randrange(3, 200) for _ in range(60)]
    params = SamplingParams(temperature=0.0, max_tokens=3, logprobs=True)
    # retained: a and its output ids but the last, with a snapshot at 60
    on.generate([a], SamplingParams(temperature=0.0, max_tokens=first_tokens))
    b = a[:59] + [201] + [rng.randrange(3, 200) for _ in range(20)]
    req = on._request(b, params, None)
    eng.add(req)
    monkeypatch.setattr(eng.pacer, "budget", lambda decoding, start=0, chunk=None: 0)
    eng.step()  # admitted (rings from the snapshot at 60, 59 cached), no chunk prefilled
    assert req in eng.prefilling and req.cached_tokens == 59
    eng.abort(req)
    monkeypatch.undo()
    c = b[:58] + [202] + [rng.randrange(3, 200) for _ in range(20)]
    got, want = on.generate([c], params)[0], off.generate([c], params)[0]
    assert (got.token_ids, got.logprobs) == (want.token_ids, want.logprobs)
    eng.drop_retained()


def test_the_pacers_time_is_its_own_ttft_phase(tiny_llm, monkeypatch):
    """Issue 22's turn-2 stall was the prefill pacer's first fit (torch.linalg.lstsq, 67 ms on
    the GPU machine), counted in "admit" with the prefix match and the ring load. The budget
    now has its own phase, "schedule", so a slow budget shows there and "admit" stays the
    match and the ring load."""
    import time

    from flint_graph.runtime.sampling import SamplingParams

    engine = tiny_llm.engine
    real = engine.pacer.budget

    def slow(*a, **k):
        time.sleep(0.05)
        return real(*a, **k)

    monkeypatch.setattr(engine.pacer, "budget", slow)
    (out,) = tiny_llm.generate(["hello there"], SamplingParams(max_tokens=2, temperature=0.0))
    phases = out.ttft_phases_ms
    assert list(phases) == ["queued", "admit", "schedule", "prefill", "first_token"]
    assert phases["schedule"] >= 50 and phases["admit"] < 50, phases


def test_the_chat_turn_after_a_reply_stopped_by_ctrl_c_reuses_the_history(llms, monkeypatch):
    """A new user's trial (2026-12-07): a chat reply stopped with Ctrl-C (it lands inside a
    decode step) left nothing retained, so the next turn prefilled its whole 568-token
    history (TTFT 711 ms against 30-100 ms a turn before). The history up to the stopped
    turn's prompt is reused now, with a cold start's tokens."""
    on, off = llms
    on.engine.prefix_cache.clear()
    msgs = [{"role": "user", "content": "say something about the number 37, at length"}]
    first = on.chat(msgs, params=GREEDY)
    msgs += [{"role": "assistant", "content": first.content or "",
              "reasoning_content": first.reasoning_content},
             {"role": "user", "content": "and now about 74"}]
    stream = on.stream_chat(msgs, params=SamplingParams(temperature=0.0, max_tokens=40,
                                                         ignore_eos=True))
    _interrupt_decode_after(monkeypatch, 5)
    text = []
    with pytest.raises(KeyboardInterrupt):
        for delta in stream:
            text.append(delta.content or "")
    stopped = stream.output
    assert stopped.finish_reason == "abort" and len(stopped.token_ids) >= 5
    msgs += [{"role": "assistant", "content": "".join(text)},
             {"role": "user", "content": "thanks"}]
    a, b = on.chat(msgs, params=GREEDY), off.chat(msgs, params=GREEDY)
    assert a.output.cached_tokens >= len(stopped.prompt_token_ids) - 1
    assert a.output.token_ids == b.output.token_ids
    on.engine.drop_retained()


def test_two_conversations_taking_turns_with_the_same_tools_each_keep_their_history(llms):
    """A bad-input trial (2026-12-07): two chats taking turns with the same system prompt and
    tools each resumed only after the preamble, every turn (416 of 609-1,228 tokens), because
    each turn took the other conversation's retained sequence, the only other one holding the
    preamble snapshot, and continued in its KV: both histories were lost at every turn. A
    resume from another sequence's preamble now takes a copy; each conversation resumes its
    own history, with a cold start's tokens."""
    from flint_graph.runtime.prefix_cache import preamble_end

    on, off = llms
    user = on.tokenizer.special_ids["<|user|>"]
    got, want = {}, {}
    for llm, out in ((on, got), (off, want)):
        llm.engine.drop_retained()
        msgs = {k: [{"role": "system", "content": SYSTEM}] for k in "AB"}
        for turn in range(3):
            for k in "AB":
                msgs[k].append({"role": "user", "content": f"{k} {turn}: what is under key {k}?"})
                msg = llm.chat(msgs[k], tools=TOOLS, params=GREEDY)
                out[k, turn] = (msg.output, msg.output.cached_tokens,
                                msg.output.prompt_token_ids)
                msgs[k].append({"role": "assistant", "content": msg.content or "",
                                "reasoning_content": msg.reasoning_content})
    keys = sorted(got)
    assert_greedy_match([got[k][0] for k in keys], [want[k][0] for k in keys], _exact(on))
    b = preamble_end(got["A", 0][2], user)
    assert b is not None and got["B", 0][1] == b  # B's first turn: A's preamble, a copy
    for k in "AB":
        for turn in (1, 2):
            before = len(got[k, turn - 1][2])  # its own last prompt, resumed one before its end
            assert got[k, turn][1] >= before - 1, (k, turn, got[k, turn][1], before)
    on.engine.drop_retained()


def test_the_graph_cache_copies_a_slots_full_layer_prefix():
    """KVCache.copy_prefix (the graph engine's fork of a chat preamble): the full layers'
    positions below n reach the other slot's pages, rings and other slots stay as they were."""
    from flint_graph.capture.kv_cache import KVCache, SlotKV
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.kernels.toolchain.spec import KV_PAGE

    cfg = FlintConfig.preset("tiny")
    cache = KVCache(cfg, num_slots=3, max_tokens=80, device="cpu")
    torch.manual_seed(0)
    for kv in cache.layers:
        kv.k.normal_()
        kv.v.normal_()
    before = [(kv.k.clone(), kv.v.clone()) for kv in cache.layers]
    cache.copy_prefix(0, 2, 37)
    src, dst = SlotKV(cache, 0), SlotKV(cache, 2)
    pos = torch.arange(37)
    for i, kv in enumerate(cache.layers):
        if kv.ring:
            assert torch.equal(kv.k, before[i][0]) and torch.equal(kv.v, before[i][1])
            continue
        for t in (kv.k, kv.v):
            a = t[src.pages[pos // KV_PAGE], :, pos % KV_PAGE]
            b = t[dst.pages[pos // KV_PAGE], :, pos % KV_PAGE]
            assert torch.equal(a, b)
        one = slice(cache.pages_per_slot, 2 * cache.pages_per_slot)  # slot 1: untouched
        assert torch.equal(kv.k[one], before[i][0][one])
    with pytest.raises(ValueError, match="two different slots"):
        cache.copy_prefix(1, 1, 5)
    with pytest.raises(ValueError, match="tokens: expected 0 to"):
        cache.copy_prefix(0, 1, cache.max_tokens + 1)


def _sigint_once_in(monkeypatch, cls, name: str, before: bool) -> None:
    """Make the next call of cls.name send this process a real SIGINT (Ctrl-C) before or after
    it runs; later calls run as they are."""
    import os
    import signal

    real = getattr(cls, name)

    def once(*a, **k):
        monkeypatch.setattr(cls, name, real)
        if before:
            os.kill(os.getpid(), signal.SIGINT)
        out = real(*a, **k)
        if not before:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(cls, name, once)


def test_ctrl_c_inside_a_retirement_retires_once(llms, monkeypatch):
    """A bad-input trial (2026-12-07): Ctrl-C right after `PrefixCache.add`, before the request
    left the running rows, let the next step retire it again: two retained entries shared one
    KV, and a later prompt resumed from rings another had overwritten (wrong tokens). The
    retirement now runs with Ctrl-C held (held_signals.py): one entry, a cold start's tokens."""
    from flint_graph.runtime.prefix_cache import PrefixCache

    on, off = llms
    on.engine.drop_retained()
    q = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=True)
    _sigint_once_in(monkeypatch, PrefixCache, "add", before=False)
    with pytest.raises(KeyboardInterrupt):
        on.generate([list(range(10, 40))], q)
    eng = on.engine
    assert not eng.running and not eng.prefilling and len(eng.prefix_cache) == 1
    full = eng.prefix_cache.entries[0].ids
    for more in ([20 + i for i in range(20)], [700, 701, 702]):
        ids = full[:-1] + more
        a, b = on.generate([ids], q)[0], off.generate([ids], q)[0]
        assert (a.token_ids, a.logprobs) == (b.token_ids, b.logprobs)
    kvs = [id(e.kv) for e in eng.prefix_cache.entries]
    assert len(kvs) == len(set(kvs))
    eng.drop_retained()


@pytest.mark.parametrize("where", ["take", "fork"])
def test_ctrl_c_inside_an_admission_loses_no_request(llms, monkeypatch, where):
    """The same trial: Ctrl-C while a request was being admitted (popped from the queue, its KV
    being taken or copied from a retained sequence) left it in no list, its stream stepping
    forever. Admission now runs with Ctrl-C held: the request is admitted, then Ctrl-C is
    raised, and the next steps finish it as a cold start would."""
    from flint_graph.runtime.prefix_cache import PrefixCache

    on, off = llms
    eng = on.engine
    eng.drop_retained()
    q = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=True)
    if where == "take":
        first = list(range(50, 90))
        on.generate([first], q)
        ids = first + [5, 6, 7]
        _sigint_once_in(monkeypatch, PrefixCache, "take", before=True)
    else:  # a second conversation with the same tools resumes from the first's preamble copy
        msgs = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "what is under key a?"}]
        on.chat(msgs, tools=TOOLS, params=GREEDY)
        ids = on.render([msgs[0], {"role": "user", "content": "and key z?"}], TOOLS)
        ids = on.tokenizer.encode(ids)
        monkeypatch.setattr(type(eng), "_fork", _sigint_after(type(eng)._fork, monkeypatch,
                                                            type(eng)))
    req = on._request(ids, q, None)
    eng.add(req)
    with pytest.raises(KeyboardInterrupt):
        eng.step()
    assert req in eng.prefilling or req in eng.running
    while not req.is_finished:
        eng.step()
    cold = off.generate([ids], q)[0]
    assert (req.output_ids, req.logprobs) == (cold.token_ids, cold.logprobs)
    eng.drop_retained()


def _sigint_after(real, monkeypatch, cls):
    import os
    import signal

    def once(self, *a, **k):
        monkeypatch.setattr(cls, "_fork", real)
        out = real(self, *a, **k)
        os.kill(os.getpid(), signal.SIGINT)
        return out

    return once
