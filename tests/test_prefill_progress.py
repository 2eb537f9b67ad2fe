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


def test_plain_lines_come_after_ten_seconds_and_then_at_most_every_ten():
    """Where stderr is not a terminal (a log, a pipe), a long prefill writes plain lines: the
    first once it has run PLAIN_EVERY_S (10 s), then at most one per 10 s, none at its end, and
    none at all for a prefill that ends sooner (a new user's piped 21K-token prompt prefilled
    for 194 s on 2 cores with nothing shown)."""
    lines, now = [], [0.0]
    hook = progress.plain_prefill_lines(lines.append, clock=lambda: now[0])
    for t, done in ((0, 0), (4, 2048), (9.9, 4096), (10.5, 6144), (15, 8192), (21, 10240),
                    (40, 12288), (45, 21230)):
        now[0] = t
        hook(None, done, 21230)
    assert lines == ["prompt: 6,144 of 21,230 tokens prefilled (28%), 10 s\n",
                     "prompt: 10,240 of 21,230 tokens prefilled (48%), 21 s\n",
                     "prompt: 12,288 of 21,230 tokens prefilled (57%), 40 s\n"]
    lines.clear()
    for t, done in ((100, 0), (103, 2048), (109, 4096)):  # the next prompt: 9 s in all
        now[0] = t
        hook(None, done, 4096)
    assert lines == []


def test_piped_generate_and_chat_write_plain_progress_lines(chunked_llm, monkeypatch, capsys):
    """`generate` (stderr not a terminal) and the piped chat install the plain-line hook; with
    its interval at 0 every chunk of a long prompt gets a line on stderr, and stdout (the
    answer, `--json`) gets none."""
    from flint_graph.terminal.chat_cli import ChatSession

    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)
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
