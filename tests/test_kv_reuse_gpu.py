"""KV reuse on the graph engine (capture/runner.py save_rings / load_rings, slots retained and
evicted by Engine) on the tiny checkpoint: greedy chats, tool loops, diverging, interleaved and
strict-prefix prompts (the CPU file's scripts) with reuse on against
the same engine kind with reuse off, and the prompt tokens served from the cache.

A resumed prefill runs fewer rows than a cold one, in other chunk buckets; its GEMMs may
round differently in the last bit, so a near-tie in the logits could in principle flip a
greedy pick: the test reports the first differing turn if one does."""

import pytest

from flint_graph.runtime.engine_config import EngineConfig
from flint_graph.runtime.sampling import SamplingParams

pytestmark = pytest.mark.gpu
GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@pytest.fixture(scope="module")
def llms(tiny_ckpt):
    from flint_graph import LLM

    on = LLM(tiny_ckpt, device="cuda", progress=False,
             engine=EngineConfig(engine="graph", max_slots=4))
    off = LLM(tiny_ckpt, device="cuda", progress=False,
              engine=EngineConfig(engine="graph", max_slots=4, kv_reuse=False))
    return on, off


def _chat(llm, turns):
    msgs, ids, cached = [], [], []
    for t in turns:
        msgs.append({"role": "user", "content": t})
        msg = llm.chat(msgs, params=GREEDY)
        ids.append(msg.output.token_ids)
        cached.append(msg.output.cached_tokens)
        msgs.append({"role": "assistant", "content": msg.content or ""})
    return ids, cached


def test_graph_engine_chat_with_reuse_equals_a_cold_start(llms):
    on, off = llms
    turns = [f"turn {i}: tell me about {i * 13} " * 3 for i in range(10)]
    got, cached = _chat(on, turns)
    want, _ = _chat(off, turns)
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert first is None, f"turn {first} differs: {got[first]} vs {want[first]}"
    assert all(c > 0 for c in cached[1:]), cached


def test_more_conversations_than_slots_evict_and_stay_correct(llms):
    on, off = llms
    convs = [[f"conv {c} turn {t} " * 4 for t in range(3)] for c in range(6)]
    for llm in (on, off):
        llm._outs = []
        msgs = [[] for _ in convs]
        for t in range(3):
            for c, conv in enumerate(convs):
                msgs[c].append({"role": "user", "content": conv[t]})
                msg = llm.chat(msgs[c], params=GREEDY)
                llm._outs.append(msg.output.token_ids)
                msgs[c].append({"role": "assistant", "content": msg.content or ""})
    assert on._outs == off._outs
    assert len(on.engine.prefix_cache) <= on.engine.max_slots


def test_graph_engine_ctrl_c_mid_prefill_and_mid_decode_leave_nothing_wrong(llms, monkeypatch):
    """Ctrl-C inside a chunked prefill (from the progress hook) and inside a decode step (after
    the graph replay, before the token is appended): the request goes on and its tokens are
    those of an engine that was never interrupted; a later turn resuming from it too."""
    on, off = llms
    eng = on.engine
    eng.drop_retained()
    ids = [(7 * i) % 200 + 3 for i in range(90)]
    q = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    on.generate([ids[:50]], q)
    monkeypatch.setattr(eng, "prefill_chunk_tokens", 16)
    fired = {"prefill": 0, "decode": 0}

    def hook(req, done, total):
        if done > req.cached_tokens and not fired["prefill"]:
            fired["prefill"] = 1
            raise KeyboardInterrupt

    real = eng._graph_decode_deltas

    def deltas(rows, ids_, logits):
        fired["decode"] += 1
        if fired["decode"] == 3:
            raise KeyboardInterrupt
        return real(rows, ids_, logits)

    eng.prefill_progress = hook
    monkeypatch.setattr(eng, "_graph_decode_deltas", deltas)
    b = on._request(ids, q, None)
    eng.add(b)
    for _ in range(2):  # the prefill's interrupt, then the decode's
        with pytest.raises(KeyboardInterrupt):
            while not b.is_finished:
                eng.step()
    eng.prefill_progress = None
    while not b.is_finished:
        eng.step()
    assert b.output_ids == off.generate([ids], q)[0].token_ids
    more = ids + b.output_ids + [11, 12, 13]
    a, c = on.generate([more], q)[0], off.generate([more], q)[0]
    assert a.token_ids == c.token_ids
    eng.drop_retained()


# The CPU file's scripted conversations (tests/test_kv_reuse.py), here on the graph engine:
# its resumed prefills replay other chunk buckets than a cold start, yet the greedy tokens and
# the cached counts must be the CPU test's.

def test_graph_engine_twenty_turn_chat_keeps_reasoning_and_equals_a_cold_start(llms):
    from test_kv_reuse import test_multi_turn_chat_equals_a_cold_start_and_reuses_the_history

    llms[0].engine.drop_retained()
    test_multi_turn_chat_equals_a_cold_start_and_reuses_the_history(llms)


def test_graph_engine_tool_loop_equals_a_cold_start(llms):
    from test_kv_reuse import test_a_tool_loop_reuses_almost_every_prompt_token

    llms[0].engine.drop_retained()
    test_a_tool_loop_reuses_almost_every_prompt_token(llms)


def test_graph_engine_diverging_interleaved_and_prefix_prompts(llms):
    from test_kv_reuse import test_interleaved_diverging_and_prefix_prompts_equal_cold_starts

    llms[0].engine.drop_retained()
    test_interleaved_diverging_and_prefix_prompts_equal_cold_starts(llms)


def test_graph_engine_new_conversation_with_the_same_tools_resumes_after_them(llms):
    from test_kv_reuse import test_a_new_conversation_with_the_same_tools_resumes_after_them

    test_a_new_conversation_with_the_same_tools_resumes_after_them(llms)
