"""A long prompt's prefill reports its progress (issue 25: a 7K-token prompt on the CPU waited
seconds with nothing on the screen): the Engine's `prefill_progress` hook after each chunk,
`generate`'s transient bar on a terminal's stderr (terminal/progress.py `prefill_bar`) and the
chat's live region. The answer is the same with and without the hook."""

import io

import pytest
from rich.console import Console

from flint_graph import LLM, SamplingParams
from flint_graph.runtime.engine_config import EngineConfig
from flint_graph.terminal import progress

PROMPT = " ".join(["the river runs under an old stone bridge"] * 12)


@pytest.fixture(scope="module")
def chunked_llm(tiny_ckpt):
    return LLM(tiny_ckpt, device="cpu", progress=False,
               engine=EngineConfig(engine="reference", prefill_chunk_tokens=16,
                                   kv_reuse=False))  # each request prefills its whole prompt


def test_the_hook_sees_every_chunk_and_changes_nothing(chunked_llm):
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=True)
    plain = chunked_llm.generate([PROMPT], params)[0]
    calls = []
    chunked_llm.engine.prefill_progress = lambda req, done, total: calls.append((done, total))
    try:
        hooked = chunked_llm.generate([PROMPT], params)[0]
    finally:
        chunked_llm.engine.prefill_progress = None
    n = len(plain.prompt_token_ids)
    assert n > 16 * 3
    want = [(min(done, n), n) for done in range(0, n + 16, 16)]  # 0: before the first chunk
    assert [c for c in calls if c[1] == n] == want, calls
    assert hooked.token_ids == plain.token_ids and hooked.logprobs == plain.logprobs


def test_a_hook_that_raises_ends_only_its_request(chunked_llm):
    def broken(req, done, total):
        raise RuntimeError("display gone")

    chunked_llm.engine.prefill_progress = broken
    try:
        out = chunked_llm.generate([PROMPT], SamplingParams(max_tokens=4))[0]
    finally:
        chunked_llm.engine.prefill_progress = None
    assert out.finish_reason == "error" and "display gone" in out.errors[0]
    assert "prefill_progress hook raised RuntimeError" in out.errors[0]
    assert not chunked_llm.engine.has_work
    assert chunked_llm.generate(["hi"], SamplingParams(max_tokens=2))[0].finish_reason


class _Engine:
    prefill_progress = None


def test_prefill_bar_installs_and_removes_its_hook(monkeypatch):
    import rich.console

    consoles = []

    def fake_console(**kw):
        c = Console(file=io.StringIO(), force_terminal=True, width=80)
        consoles.append(c)
        return c

    monkeypatch.setattr(rich.console, "Console", fake_console)
    eng = _Engine()
    with progress.prefill_bar(eng, enabled=True):
        hook = eng.prefill_progress
        hook(None, 2048, 8192)
        hook(None, 4096, 8192)
        hook(None, 8192, 8192)  # the prefill is done: the bar goes before the answer
    assert eng.prefill_progress is None
    assert len(consoles) == 1 and "4096/8192" in consoles[0].file.getvalue()
    with progress.prefill_bar(eng, enabled=False):
        assert eng.prefill_progress is None  # not a terminal: nothing at all


def test_the_chat_region_shows_the_prompt_while_it_prefills(tiny_llm):
    from flint_graph.terminal.chat_cli import ChatSession

    s = ChatSession(tiny_llm, SamplingParams(max_tokens=2),
                    console=Console(file=io.StringIO(), width=60, force_terminal=True))
    live = {"reasoning": "", "content": "", "calls": [], "prompt": (4096, 16384)}
    assert s._live_view(live).plain == "reading the prompt: 4,096 of 16,384 tokens"
    live["prompt"] = (16384, 16384)
    assert s._live_view(live).plain == ""
    live.update(prompt=(4096, 16384), reasoning="thinking")
    assert "reading the prompt" not in s._live_view(live).plain
