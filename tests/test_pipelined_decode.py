"""The graph engine's pipelined decode (EngineConfig.pipeline_decode, flint_graph/runtime/
engine.py `_collect`): each decode step is launched before the previous step's tokens are
appended, so detokenizing, stop strings and the output parser run while the GPU computes.

On the CPU the graph runner is replaced by tests/reference_runner.py (the reference model
behind GraphRunner's interface, each slot a real SequenceKV with its rings), so every test
holds the pipelined engine to the reference engine token for token and log-probability for
log-probability: a step launched for a row that then ends (a stop string) writes one more KV
position, and KV reuse must account for it (a resume from a ring that lost an entry changes
the next turn's tokens here as it would on the GPU).
"""

import pytest

from flint_graph.runtime.engine_config import EngineConfig
from flint_graph.runtime.request import Request
from flint_graph.runtime.sampling import SamplingParams
from faults import failing_on_call
from reference_runner import use_reference_runner

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, logprobs=True, top_logprobs=3)


@pytest.fixture(scope="module")
def llms(tiny_ckpt):
    """(reference engine, graph-engine host logic one step at a time, the same pipelined),
    each with KV reuse on, 4 slots."""
    from flint_graph import LLM

    out = []
    for mode in ("reference", "sync", "pipelined"):
        llm = LLM(tiny_ckpt, device="cpu", progress=False,
                  engine=EngineConfig(max_slots=4, engine="reference"))
        if mode != "reference":
            use_reference_runner(llm.engine, pipeline=mode == "pipelined")
        out.append(llm)
    return out


def _fresh(llms):
    for llm in llms:
        llm.engine.drop_retained()
        assert not llm.engine.has_work


def _key(o):
    return (o.token_ids, o.text, o.finish_reason, o.logprobs, o.errors)


def test_engine_config_refuses_a_non_bool_pipeline_decode():
    from flint_graph.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="pipeline_decode 1: expected True or False"):
        EngineConfig(pipeline_decode=1)


def test_a_step_is_launched_before_the_previous_steps_tokens_are_appended(llms, monkeypatch):
    ref, sync, pipe = llms
    _fresh(llms)
    events = []
    runner = pipe.engine.runner
    launch = runner.launch
    append = Request.append

    def logged_launch(rows):
        events.append(("launch", len(rows)))
        return launch(rows)

    def logged_append(self, token_id):
        events.append(("append", self.num_generated))
        return append(self, token_id)

    monkeypatch.setattr(runner, "launch", logged_launch)
    monkeypatch.setattr(Request, "append", logged_append)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    pipe.generate([[5, 6, 7, 8]], params)
    # the first token comes from the prefill; then every decode step's launch comes before
    # the append of the token drawn by the step before it
    assert events[:4] == [("append", 0), ("launch", 1), ("launch", 1), ("append", 1)], events
    # max_tokens is known before the text: the last step launches nothing after it
    assert events.count(("launch", 1)) == 5 and events[-1] == ("append", 5), events


def test_batches_with_every_way_to_finish_equal_the_reference_engine(llms):
    """Rows ending at different steps by max_tokens, EOS (min_tokens holding it back), stop
    ids, stop strings and repeats; sampled rows with seeds beside greedy ones; log-probs."""
    ref = llms[0]
    _fresh(llms)
    prompts = [[5 + i, 9, 13 + i, 40, 41 + 2 * i] for i in range(4)]
    free = ref.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24,
                                                ignore_eos=True))
    text = free[1].text
    stop = text[len(text) // 2: len(text) // 2 + 2]  # ends row 1 mid-way, by its text
    stop_id = free[2].token_ids[5]
    cases = [
        SamplingParams(temperature=0.0, max_tokens=3, logprobs=True, top_logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=24, stop=[stop], ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=24, stop_token_ids=[stop_id]),
        SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=7, max_tokens=17,
                       min_tokens=4, logprobs=True),
    ]
    runs = []
    for llm in llms:
        _fresh(llms)
        reqs = [llm._request(p, c, None) for p, c in zip(prompts, cases)]
        for r in reqs:
            llm.engine.add(r)
        while llm.engine.has_work:
            llm.engine.step()
        runs.append([(r.output_ids, r.text, r.finish_reason, r.logprobs, r.errors)
                     for r in reqs])
    assert runs[1] == runs[0]
    assert runs[2] == runs[0]
    assert [r[2] for r in runs[0]][:3] == ["length", "stop", "stop"]


def _chat(llm, turns, tools=None):
    msgs, out = [], []
    for t in turns:
        msgs.append({"role": "user", "content": t})
        msg = llm.chat(msgs, tools=tools, params=GREEDY)
        out.append((_key(msg.output), msg.output.cached_tokens))
        msgs.append({"role": "assistant", "content": msg.content or "",
                     "reasoning_content": msg.reasoning_content})
    return out


def test_multi_turn_chat_with_reuse_equals_the_reference_engine(llms):
    _fresh(llms)
    turns = [f"turn {i}: the number {i * 37} and {'x' * i}" for i in range(8)]
    ref, sync, pipe = (_chat(llm, turns) for llm in llms)
    assert [o for o, _ in pipe] == [o for o, _ in ref]
    assert [o for o, _ in sync] == [o for o, _ in ref]
    assert all(c > 0 for _, c in pipe[1:]), pipe


def test_a_row_ended_by_its_text_keeps_the_token_its_last_step_fed(llms):
    """A stop string ends the row after its next step was launched: that step writes the last
    token's KV (one position past what the row's ids would claim without it), so the retained
    sequence holds every id, and a prompt that continues it resumes after all of them (a
    resume one token earlier would need the ring entry that write replaced) with the
    reference engine's tokens."""
    ref, sync, pipe = llms
    _fresh(llms)
    prompt = [7, 8, 9, 10, 11] * 5  # past the tiny model's 17-entry ring
    free = ref.generate([prompt], SamplingParams(temperature=0.0, max_tokens=30,
                                                 ignore_eos=True))[0]
    stop = free.text[len(free.text) // 2: len(free.text) // 2 + 2]
    params = SamplingParams(temperature=0.0, max_tokens=30, stop=[stop], ignore_eos=True)
    outs = {}
    for name, llm in zip(("ref", "sync", "pipe"), llms):
        got = []
        # each probe resumes from the sequence `first` left: the end, one and two before it
        for cut, extra in ((0, [20, 21, 22]), (1, [23, 24]), (2, [25, 26])):
            llm.engine.drop_retained()
            first = llm.generate([prompt], params)[0]
            assert first.finish_reason == "stop"
            (entry,) = llm.engine.prefix_cache.entries
            ids = prompt + first.token_ids
            probe = llm.generate([ids[:len(ids) - cut] + extra], GREEDY)[0]
            got.append((_key(first), _key(probe), len(entry.ids), probe.cached_tokens))
        outs[name] = got
    assert [g[:2] for g in outs["pipe"]] == [g[:2] for g in outs["ref"]]
    assert [g[:2] for g in outs["sync"]] == [g[:2] for g in outs["ref"]]
    n = len(prompt) + len(outs["ref"][0][0][0])
    assert [g[2] for g in outs["sync"]] == [n - 1] * 3 and [g[2] for g in outs["pipe"]] == [n] * 3
    # cached: everything, all but the diverging id, and two before the end the ring snapshot
    # at the prompt's end (the live rings lost the entry that position needs)
    assert [g[3] for g in outs["pipe"]] == [n, n - 1, len(prompt)]


def test_a_tool_loop_equals_the_reference_engine(llms):
    _fresh(llms)
    tools = [{"type": "function", "function": {
        "name": "lookup", "description": "look a key up",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                       "required": ["key"]}}}]
    outs = []
    for llm in llms:
        msgs = [{"role": "user", "content": "find the values of keys a, b and c"}]
        got = []
        for step in range(4):
            msg = llm.chat(msgs, tools=tools, params=GREEDY)
            got.append(_key(msg.output))
            msgs.append({"role": "assistant", "content": msg.content or "",
                         "reasoning_content": msg.reasoning_content,
                         "tool_calls": [{"type": "function", "function": {
                             "name": "lookup", "arguments": {"key": "abc"[step % 3]}}}]})
            msgs.append({"role": "tool", "content": f"value {step}"})
        outs.append(got)
    assert outs[1] == outs[0] and outs[2] == outs[0]


def test_an_abort_with_a_step_in_flight_and_requests_arriving_mid_decode(llms):
    """Rows join while others decode (the in-flight step is read, the prompt prefilled, the
    next step launched for all), one is aborted with its next step in flight, and the prompt
    that continues the aborted one resumes from it: all as on the reference engine."""
    _fresh(llms)
    runs = []
    for llm in llms:
        eng = llm.engine
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        a = llm._request([5, 6, 7, 8, 9] * 4, params, None)
        b = llm._request([30, 31, 32], params, None)
        eng.add(a)
        while a.num_generated < 3:
            eng.step()
        eng.add(b)
        while a.num_generated < 6:  # (pipelined: a's next step is in flight from here)
            eng.step()
        eng.abort(a)
        while eng.has_work:
            eng.step()
        c = llm.generate([a.prompt_ids + a.output_ids + [40]], GREEDY)[0]
        runs.append((a.output_ids, a.finish_reason, b.output_ids, _key(c), c.cached_tokens))
    assert [r[:4] for r in runs[1:]] == [runs[0][:4]] * 2
    assert runs[0][1] == "abort"
    # the aborted row's in-flight step fed its sixth token: the pipelined engine kept it
    assert [r[4] for r in runs] == [25, 25, 26]


def test_ctrl_c_while_a_steps_tokens_are_appended_leaves_the_rows_whole(llms, monkeypatch):
    """KeyboardInterrupt in the middle of appending a pipelined step's tokens (the next step
    already feeds them): the rows left take their tokens anyway, so ids and KV agree, and
    stepping on gives the uninterrupted run's outputs."""
    ref, _, pipe = llms
    params = SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True)
    prompts = [[5, 6, 7] * 3, [8, 9, 10] * 4]
    _fresh(llms)
    want = [o.token_ids for o in ref.generate(prompts, params)]
    eng = pipe.engine
    reqs = [pipe._request(p, params, None) for p in prompts]
    for r in reqs:
        eng.add(r)
    append = Request.append
    # the 7th: the first row's token of the third decode step (two came from the prefills)
    monkeypatch.setattr(Request, "append", failing_on_call(append, 7, KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        while eng.has_work:
            eng.step()
    monkeypatch.setattr(Request, "append", append)
    assert len({r.num_generated for r in reqs}) == 1  # both rows took the interrupted step's
    while eng.has_work:
        eng.step()
    assert [r.output_ids for r in reqs] == want


def test_ctrl_c_after_a_step_is_read_redoes_it_and_keeps_the_fed_token(llms, monkeypatch):
    """KeyboardInterrupt after a pipelined step's ids are read and before anything is
    launched or appended: the rows' KV holds their last output id (the step fed it), so an
    abort now retains it with that token, and a prompt diverging two tokens before the end
    equals the reference engine's (the live rings lost the entry a resume there needs)."""
    ref, _, pipe = llms
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompt = [11, 12, 13, 14] * 6
    outs = []
    for llm in (ref, pipe):
        _fresh(llms)
        eng = llm.engine
        req = llm._request(prompt, params, None)
        eng.add(req)
        while req.num_generated < 5:
            eng.step()
        if llm is pipe:
            real = eng._graph_tokens
            monkeypatch.setattr(eng, "_graph_tokens", failing_on_call(real, 1, KeyboardInterrupt()))
            with pytest.raises(KeyboardInterrupt):
                eng.step()
            monkeypatch.setattr(eng, "_graph_tokens", real)
            assert req.num_generated == 5 and eng._inflight is None
        eng.abort(req)
        (entry,) = eng.prefix_cache.entries
        ids = prompt + req.output_ids
        probe = llm.generate([ids[:-2] + [40, 41]], GREEDY)[0]
        outs.append((req.output_ids, len(entry.ids), _key(probe), probe.cached_tokens))
    assert outs[1][0] == outs[0][0] and outs[1][2] == outs[0][2]
    n = len(prompt) + 5
    # two before the end: the reference engine resumes from its live rings, the pipelined one
    # (whose rings hold one more) from the prompt's snapshot
    assert outs[0][1] == n - 1 and outs[1][1] == n
    assert outs[0][3] == n - 2 and outs[1][3] == len(prompt)


def test_a_failed_launch_appends_the_drawn_tokens_then_ends_its_rows(llms, monkeypatch):
    """As a failed step without pipelining: the tokens drawn so far are kept, the rows end
    with "error" naming the fault, nothing is retained, and the engine serves the next
    request."""
    _, sync, pipe = llms
    got = []
    for llm in (sync, pipe):
        _fresh(llms)
        runner = llm.engine.runner
        real = runner.launch
        failing = failing_on_call(real, 3, ValueError("injected fault"))
        monkeypatch.setattr(runner, "launch", failing)
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        outs = llm.generate([[5, 6, 7], [8, 9, 10, 11]], params)
        monkeypatch.setattr(runner, "launch", real)
        assert not llm.engine.prefix_cache.entries
        again = llm.generate([[5, 6, 7]], params)[0]
        got.append(([(o.token_ids, o.finish_reason, o.errors) for o in outs], _key(again)))
    assert got[1] == got[0]
    assert got[0][0][0][1] == "error" and len(got[0][0][0][0]) == 3
    assert got[0][0][0][2] == ["decode step failed: ValueError: injected fault"]
