"""A long prompt's prefill reports its progress (issue 25: a 7K-token prompt on the CPU waited
seconds with nothing on the screen): the Engine's `prefill_progress` hook after each chunk,
`generate`'s transient bar on a terminal's stderr (terminal/progress.py `prefill_bar`) and the
chat's live region. The answer is the same with and without the hook."""

import io
import time

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
    with progress.prefill_bar(eng, enabled=True, terminal=True):
        hook = eng.prefill_progress
        hook(None, 2048, 8192)
        hook(None, 4096, 8192)
        hook(None, 8192, 8192)  # the prefill is done: the bar goes before the answer
    assert eng.prefill_progress is None
    assert len(consoles) == 1 and "4096/8192" in consoles[0].file.getvalue()
    with progress.prefill_bar(eng, enabled=False, terminal=True):
        assert eng.prefill_progress is None  # --no-progress: nothing at all
    with progress.prefill_bar(eng, enabled=True, terminal=False):
        assert eng.prefill_progress is not None  # a log or a pipe: plain lines
    assert eng.prefill_progress is None and len(consoles) == 1


def test_plain_lines_come_on_a_timer_after_ten_seconds_until_the_prefill_ends():
    """Where stderr is not a terminal (a log, a pipe), a long prefill writes plain lines from a
    timer: the first once it has run PLAIN_EVERY_S, then one every PLAIN_EVERY_S whether or
    not a chunk ended (a new user's trial: lines written only at chunk ends came 18 s apart
    and never during the last chunk), none after it ends, none for one that ends sooner.
    Here on a clock the test moves: 10 s per tick of the timer's sleep."""
    import threading

    lines, now, ticked = [], [0.0], threading.Event()

    def write(text):
        lines.append(text)
        ticked.set()

    hook = progress.PlainPrefillLines(write, every_s=0.02, clock=lambda: now[0])
    try:
        hook(None, 0, 21230)
        hook(None, 2048, 21230)
        now[0] = 0.019  # not yet
        time.sleep(0.1)
        assert lines == []
        now[0] = 0.021
        assert ticked.wait(2)
        assert lines == ["prompt: 2,048 of 21,230 tokens prefilled (9%), 0 s\n"]
        ticked.clear()
        now[0] = 0.05  # no chunk ended: a line all the same, with the time
        assert ticked.wait(2)
        assert lines[-1].startswith("prompt: 2,048 of 21,230 tokens prefilled")
        hook(None, 21230, 21230)  # the prefill ended: no more lines
        n = len(lines)
        now[0] = 1.0
        time.sleep(0.1)
        assert len(lines) == n
        hook(None, 0, 4096)  # the next prompt, ending within the interval: none
        now[0] = 1.01
        hook(None, 4096, 4096)
        now[0] = 2.0
        time.sleep(0.1)
        assert len(lines) == n
    finally:
        hook.close()


def test_piped_generate_and_chat_write_plain_progress_lines(chunked_llm, monkeypatch, capsys):
    """`generate` (stderr not a terminal) and the piped chat install the plain-line hook; with
    its interval at 10 ms and chunks of 30 ms a long prompt gets lines on stderr, stdout (the
    answer, `--json`) none, and the timer is stopped afterwards."""
    from flint_graph.terminal.chat_cli import ChatSession

    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.01)
    step = chunked_llm.engine.step

    def slow_step():  # each 16-token chunk takes longer than the interval
        time.sleep(0.03)
        return step()

    monkeypatch.setattr(chunked_llm.engine, "step", slow_step)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    with progress.prefill_bar(chunked_llm.engine, enabled=True, terminal=False):
        chunked_llm.generate([PROMPT], params)
    out = capsys.readouterr()
    assert "tokens prefilled" in out.err and "tokens prefilled" not in out.out
    console = Console(file=io.StringIO(), width=80, force_terminal=False)
    inputs = iter([PROMPT, "/exit"])
    console.input = lambda prompt="": next(inputs)  # type: ignore[method-assign]
    s = ChatSession(chunked_llm, params, console=console)
    s.run()
    out = capsys.readouterr()
    assert "tokens prefilled" in out.err and "tokens prefilled" not in s.console.file.getvalue()


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
