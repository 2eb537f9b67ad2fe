"""KV reuse on the graph engine (capture/runner.py save_rings / load_rings, slots retained and
evicted by Engine) on the tiny checkpoint: greedy chats and a tool loop with reuse on against
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
