"""The terminal chat: the live region's safe text (`live_text`), the printed message and the
transcript keeping the real text, the header, and the way out of a full context."""

from __future__ import annotations

import ctypes
import dataclasses
import io
import json
import os
import random
import shutil
import subprocess
import sys
import time
import unicodedata
import uuid
from pathlib import Path

import pytest
from chat_fakes import FakeStream
from conftest_ckpt import scripted_sampler
from rich.cells import cell_len
from rich.console import Console

from flint_graph import SamplingParams
from flint_graph.terminal.chat_cli import CONTEXT_FULL, MESSAGE_TOO_LONG, RESULT_TOO_LONG, ChatSession
from flint_graph.terminal.live_text import (PLACEHOLDER, char_width, live_safe, printable, tail_lines,
                                   text_width)

# Characters terminals disagree on (emoji, modifiers, ZWJ, variation selectors, flags, combining
# marks, zero-width and format characters, controls) mixed with ones they agree on.
TRICKY = ["👍🏽", "👍", "🏽", "👨\u200d👩\u200d👧", "🇳🇴", "❤️", "❤", "e\u0301", "x\u0301\u0302",
          "\u200b", "\u200d", "\ufe0f", "\u202e", "\u00ad", "中", "文", "ｗ", "ｶ", "가", "ᄀ\u1161",
          "กำ", "क\u093f", "α", "ж", "’", "…", "①", "\u3248", "\x1b[31m", "\r", "\x9b", "\t",
          "\ue000", "\U000e0041", "a", "b", " ", "\n", "?", "─", "😀", "#\ufe0f\u20e3"]


@pytest.mark.parametrize("text, safe", [
    ("👍🏽", PLACEHOLDER),  # rich: 2 cells, tmux: 4
    ("ok 👍🏽👍🏽 done", f"ok {PLACEHOLDER} done"),  # one placeholder per run
    ("👨\u200d👩\u200d👧 x", f"{PLACEHOLDER} x"),  # a ZWJ family
    ("🇳🇴", PLACEHOLDER),
    ("❤️ ❤", f"{PLACEHOLDER} {PLACEHOLDER}"),
    ("e\u0301te\u0301", "été"),  # combining accents composed (NFC)
    ("x\u0301\u0302", "x"),  # and dropped where nothing composes
    ("zero\u200bwidth\u00ad", "zerowidth"),
    ("中文 ｗ", "中文 ｗ"),  # East Asian wide: 2 cells everywhere
    ("a\tb\x1b[31m\rc", "a b\u241b[31m\u240dc"),
    ("x\x9by", f"x{PLACEHOLDER}y"),  # C1 control (CSI on some terminals)
    ("line\n👍🏽\nnext", f"line\n{PLACEHOLDER}\nnext"),
])
def test_live_safe(text, safe):
    assert live_safe(text) == safe


def test_live_safe_width_is_what_rich_measures():
    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice(TRICKY) for _ in range(rng.randrange(1, 40)))
        safe = live_safe(text)
        for line in safe.split("\n"):
            assert all(char_width(ch) in (1, 2) for ch in line), repr(line)
            assert cell_len(line) == text_width(line), repr(line)


def _libc_wcwidth():
    try:
        libc = ctypes.CDLL(None)
        libc.wcwidth.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lambda ch: libc.wcwidth(ctypes.c_wchar(ch))


def test_live_safe_width_is_what_the_terminal_draws():
    # tmux and most terminals draw what the C library's wcwidth says.
    wcwidth = _libc_wcwidth()
    if wcwidth is None or wcwidth("中") != 2:
        pytest.skip("no UTF-8 wcwidth in the C library here")
    sample = [chr(c) for r in ((0x20, 0x7F), (0xA0, 0x250), (0x370, 0x530), (0x2010, 0x2050),
                               (0x3040, 0x3100), (0x3200, 0x3260), (0x4E00, 0x4F00),
                               (0xAC00, 0xAD00), (0xFF01, 0xFF60)) for c in range(*r)]
    kept = [ch for ch in sample if char_width(ch) in (1, 2)]
    assert len(kept) > 0.9 * len(sample) - 200  # ordinary text stays readable
    assert [(ch, char_width(ch), wcwidth(ch)) for ch in kept
            if wcwidth(ch) != char_width(ch)] == []


def test_tail_lines_fit_the_width_and_end_with_the_text():
    text = "".join(random.Random(1).choice(TRICKY + ["word "] * 20) for _ in range(3000))
    for width in (7, 40, 160):
        lines = tail_lines(text, width, 6)
        assert 1 <= len(lines) <= 6
        assert all(cell_len(line) <= width for line in lines), lines
    assert tail_lines("中" * 50, 9, 100) == ["中" * 4] * 12 + ["中" * 2]  # wide chars never split
    assert tail_lines("alpha beta\ngamma", 80, 5) == ["alpha beta", "gamma"]
    assert tail_lines("one two three four", 9, 2) == ["three", "four"]


def test_printable_shows_c0_and_c1_controls():
    assert printable("a\x1b[2Jb\x9b31mc\x85d\n\te") == "a\u241b[2Jb\ufffd31mc\ufffdd\n\te"


def _session(llm, inputs, params=None, console=None, **kw):
    console = console or Console(file=io.StringIO(), width=100, force_terminal=False)
    it = iter(inputs)
    console.input = lambda prompt="": next(it)  # type: ignore[method-assign]
    params = params or SamplingParams(max_tokens=6, seed=0)
    return ChatSession(llm, params, console=console, **kw), console


def test_header_names_the_weights_format(tiny_llm):
    """A new user could not tell whether the NVFP4 GGUF or its BF16 twin ran (2026-12-05)."""
    s, console = _session(tiny_llm, ["/exit"])
    s.run()
    assert " · BF16 weights · cpu · " in console.file.getvalue()


def test_header_counts_tools_in_the_singular_and_plural(tiny_llm):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    other = {"type": "function", "function": {"name": "g", "parameters": {"type": "object"}}}
    for tools, words in (([tool], "· 1 tool\n"), ([tool, other], "· 2 tools\n")):
        s, console = _session(tiny_llm, ["/exit"], tools=tools)
        s.run()
        assert words in console.file.getvalue()


def test_piped_chat_output_is_not_broken_at_80_columns(tiny_llm, monkeypatch, capsys):
    """Piped (a new-user trial), the header's help line broke mid-phrase at 80 columns; the
    chat's own console now leaves wrapping to whoever reads the output."""
    from report_console import piped

    piped(monkeypatch, 80)
    s = ChatSession(tiny_llm, SamplingParams(max_tokens=4))
    s.console.input = lambda prompt="": "/exit"  # type: ignore[method-assign]
    s.run()
    header = [ln for ln in capsys.readouterr().out.splitlines() if "/reset" in ln]
    assert len(header) == 1 and "/exit" in header[0] and len(header[0]) > 80, header


def test_printed_answer_and_transcript_keep_the_real_text(tiny_llm, monkeypatch, tmp_path):
    text = "x</think>ok 👍🏽 e\u0301 \x1b[31m done<|user|>"
    monkeypatch.setattr("flint_graph.runtime.engine.sample",
                        scripted_sampler(tiny_llm.tokenizer.encode(text)))
    path = tmp_path / "t.json"
    s, console = _session(tiny_llm, ["hi", f"/save {path}", "/exit"],
                          params=SamplingParams(max_tokens=60))
    s.run()
    assert "ok 👍🏽 e\u0301 \u241b[31m done" in console.file.getvalue()  # controls made visible
    saved = json.loads(path.read_text())["messages"]
    assert saved[1]["content"] == "ok 👍🏽 e\u0301 \x1b[31m done"


def test_live_region_draws_only_safe_text_within_the_screen(tiny_llm):
    console = Console(file=io.StringIO(), width=30, height=10, force_terminal=True,
                      color_system=None)
    s, _ = _session(tiny_llm, [], console=console)
    tricky = "".join(TRICKY) * 20
    view = s._live_view({"reasoning": tricky, "content": tricky, "calls": ["get_weather"]})
    lines = view.plain.split("\n")
    assert len(lines) <= 5  # at most half the screen: a taller region cannot be erased
    assert all(cell_len(line) <= 30 and all(char_width(ch) for ch in line) for line in lines)
    assert lines[-1] == "tool call: get_weather"
    msg = s._show(FakeStream("think 👍🏽 " * 30, "answer 👍🏽 中文"))
    out = console.file.getvalue()
    assert msg.content == "answer 👍🏽 中文"
    assert out.count("👍") == 1 and "answer 👍🏽 中文" in out  # only the final print has it


def test_full_context_says_how_to_continue(tiny_llm, monkeypatch):
    # A 256-token context keeps the prefill quick; the answer fills what the prompt leaves.
    small = dataclasses.replace(tiny_llm.cfg, max_position_embeddings=256)
    monkeypatch.setattr(tiny_llm, "cfg", small)
    monkeypatch.setattr(tiny_llm.engine, "cfg", small)  # where the context limit is read
    per = len(tiny_llm.tokenizer.encode("hello world " * 100)) / 100
    long_turn = "hello world " * int(180 / per)
    params = SamplingParams(max_tokens=256, temperature=0.0, ignore_eos=True)
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    s, _ = _session(tiny_llm, [long_turn, "and now?", "/reset", "hi", "/exit"], params=params,
                    console=console, enable_thinking=False)
    s.run()
    out = console.file.getvalue()
    footers = [line for line in out.splitlines() if " tokens · " in line]
    assert CONTEXT_FULL in footers[0]  # the answer filled the context
    refusal = out[out.index(footers[0]) + len(footers[0]):out.index("conversation reset")]
    assert "context limit" in refusal and CONTEXT_FULL in refusal  # the next turn says so too
    assert "/reset" in CONTEXT_FULL and len(footers) == 2  # and /reset was the way out
    assert [m["role"] for m in s.messages] == ["user", "assistant"]


def test_a_first_message_longer_than_the_context_says_to_shorten_it(tiny_llm, monkeypatch):
    # Alone in the conversation, a too-long message got "/reset starts a new one", which could
    # not help; the next, shorter message works without /reset.
    small = dataclasses.replace(tiny_llm.cfg, max_position_embeddings=256)
    monkeypatch.setattr(tiny_llm, "cfg", small)
    monkeypatch.setattr(tiny_llm.engine, "cfg", small)  # where the context limit is read
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    s, _ = _session(tiny_llm, ["hello world " * 300, "hi", "/exit"], console=console,
                    system="be brief")
    s.run()
    out = console.file.getvalue()
    assert "context limit" in out and MESSAGE_TOO_LONG in out and CONTEXT_FULL not in out
    assert [m["role"] for m in s.messages] == ["system", "user", "assistant"]


def test_bytes_that_are_not_utf8_on_a_strict_stdin_keep_the_session(tiny_llm, monkeypatch):
    # With a strict locale decoder (LANG=en_US.UTF-8), a typed byte that is not UTF-8 raised
    # UnicodeDecodeError out of input() and ended the chat ("internal error"), transcript lost.
    stdin = io.TextIOWrapper(io.BytesIO(b"hello \xff\n/exit\n"), encoding="utf-8",
                             errors="strict")
    monkeypatch.setattr(sys, "stdin", stdin)
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    s = ChatSession(tiny_llm, SamplingParams(max_tokens=6, seed=0), console=console)
    assert s.run() == 0
    out = console.file.getvalue()
    assert "not valid UTF-8 text: a lone surrogate U+DCFF at character 6 (an undecodable input byte 0xFF reads as one)" in out
    assert s.messages == []


TMUX_DRIVER = """
import sys
sys.path.insert(0, {tests!r})
from chat_fakes import FakeLLM
from flint_graph.terminal.chat_cli import ChatSession
ChatSession(FakeLLM({reasoning!r}, {content!r}, delay_s=0.002), None).run()
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_live_region_leaves_a_clean_screen_in_tmux(tmp_path):
    # The case: reasoning holding 👍🏽 (2 cells for rich, 4 in tmux) in a 160x50 pane
    # left ~20 stale copies of its lines and lost part of the text.
    reasoning = " ".join(["question number twelve 👍🏽 needs a careful look at clouds",
                          "👨\u200d👩\u200d👧 e\u0301te\u0301 中文字 ❤️ 🇳🇴 zero\u200bwidth"] * 12)
    content = "Answer: sunny 👍🏽 with 中文 and more text. " * 8
    driver = tmp_path / "driver.py"
    driver.write_text(TMUX_DRIVER.format(tests=str(Path(__file__).parent),
                                         reasoning=reasoning, content=content))
    sock = f"flint-test-{uuid.uuid4().hex[:8]}"  # our own tmux server, never the user's
    tmux = ["tmux", "-L", sock]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TMUX")}
    subprocess.run(tmux + ["new-session", "-d", "-x", "160", "-y", "50",
                           f"{sys.executable} {driver}; sleep 30"], check=True, env=env)
    def capture():
        return subprocess.run(tmux + ["capture-pane", "-p", "-J"], capture_output=True,
                              text=True).stdout

    def wait_for(done, seconds=60.0):  # polls the pane; a loaded CI machine can take a while
        deadline = time.monotonic() + seconds
        screen = capture()
        while not done(screen) and time.monotonic() < deadline:
            time.sleep(0.05)
            screen = capture()
        return screen

    def ends_at_prompt(screen):  # the footer printed and the next prompt after it
        lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
        return " tokens · " in screen and lines[-1:] == ["you>"]

    try:
        wait_for(lambda screen: "you>" in screen)
        subprocess.run(tmux + ["send-keys", "question number 12 about the weather", "Enter"],
                       check=True)
        screen = wait_for(ends_at_prompt)
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
    lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
    assert lines[-2:] == ["prompt 10 tokens · output 50 tokens · TTFT 1 ms · 500.0 tokens/s · stop",
                          "you>"], screen
    assert lines[-4] == f"▸ reasoning ({len(reasoning)} chars, /reasoning shows it)", screen
    # The answer, printed once with its real characters (tmux joins its wrapped lines).
    assert unicodedata.normalize("NFC", lines[-3]) == content.rstrip(), screen
    assert lines[-5] == "you> question number 12 about the weather", screen  # no stale lines


def test_ctrl_c_before_the_first_token_leaves_no_empty_answer_in_history(tiny_llm, monkeypatch):
    class Stopped(FakeStream):
        def __init__(self):
            super().__init__("", "")
            self.message.finish_reason = self.message.output.finish_reason = "abort"
            self.message.output.token_ids = []

        def __iter__(self):
            raise KeyboardInterrupt  # Ctrl-C during prefill, before any delta

    monkeypatch.setattr(tiny_llm, "stream_chat", lambda *a, **k: Stopped())
    s, console = _session(tiny_llm, ["hi", "/exit"])
    s.run()
    # no empty answer, and the question is taken back (a new user's stopped 7K-token paste
    # was read again from the start on every later turn)
    assert s.messages == []
    from flint_graph.terminal.chat_cli import STOPPED_EARLY

    screen = console.file.getvalue()
    footer, after = screen.split("· stopped\n")
    assert " · output 0 tokens · " in footer.splitlines()[-1]
    assert " ".join(after.split()).startswith(STOPPED_EARLY)


def test_ctrl_c_while_a_long_message_is_tokenized_keeps_the_session(tiny_llm, monkeypatch):
    # Ctrl-C before the stream existed (a 1 MB message being tokenized) ended the whole chat,
    # its unsaved transcript and the rest of the input with it (bad-input trial)
    from flint_graph.terminal.chat_cli import STOPPED_EARLY

    calls = {"n": 0}

    def stream_chat(*a, **k):
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt
        return FakeStream("", "fine")

    monkeypatch.setattr(tiny_llm, "stream_chat", stream_chat)
    s, console = _session(tiny_llm, ["a very long message", "and another", "/exit"])
    assert s.run() in (0, None)
    screen = console.file.getvalue()
    assert STOPPED_EARLY in " ".join(screen.split()) and "fine" in screen  # answered next
    assert [m["role"] for m in s.messages] == ["user", "assistant"]
    assert s.messages[0]["content"] == "and another"


@pytest.fixture(scope="module")
def nano_llm():
    from flint_graph.api import LLM

    return LLM(device="cpu", progress=False)  # flint-nano: it calls the tools it is offered


NANO_TOOLS = json.loads((Path(__file__).parent.parent / "examples" / "tools.json").read_text())
GREEDY = SamplingParams(temperature=0.0, max_tokens=120)


def test_commands_work_at_the_tool_result_prompt(nano_llm):
    # "/reset" typed as the result used to go to the model as the tool's output
    s, console = _session(nano_llm, ["Convert 120 km to mi.", "", "/help", "/reset", "/exit"],
                          params=GREEDY, tools=NANO_TOOLS)
    assert s.run() == 0
    out = console.file.getvalue()
    assert "tool call: convert_units" in out and "type the result of convert_units" in out
    assert "conversation reset" in out and s.messages == []


def test_exit_at_the_tool_result_prompt_ends_the_chat(nano_llm):
    s, _ = _session(nano_llm, ["Convert 120 km to mi.", "/exit", "never read"], params=GREEDY,
                    tools=NANO_TOOLS)
    assert s.run() == 0
    assert [m["role"] for m in s.messages] == ["user", "assistant"]


def test_the_end_of_input_at_the_tool_result_prompt_ends_the_chat(nano_llm):
    """Ctrl-D or a piped script's end at the result prompt ends the chat, as at you>: a new
    user's piped chat said "tool loop stopped" and then printed a dangling "you>"."""
    s, console = _session(nano_llm, [], params=GREEDY, tools=NANO_TOOLS)
    lines = iter(["Convert 120 km to mi."])
    prompts = []

    def ask(prompt=""):
        prompts.append(prompt)
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    console.input = ask  # type: ignore[method-assign]
    assert s.run() == 0
    assert "tool loop stopped (end of input)" in console.file.getvalue()
    assert len(prompts) == 2 and "result of convert_units" in prompts[-1], prompts


def test_a_tool_result_gets_an_answer(nano_llm):
    s, console = _session(nano_llm, ["Convert 120 km to mi.", '{"value": 74.56, "unit": "mi"}',
                                     "/exit"], params=GREEDY, tools=NANO_TOOLS)
    assert s.run() == 0
    assert [m["role"] for m in s.messages] == ["user", "assistant", "tool", "assistant"]
    assert "74.56" in s.messages[-1]["content"]


def test_a_tool_result_of_several_lines_is_fenced_too(nano_llm):
    # '"""' at the result prompt used to go to the model as the result, and each later line
    # as a message of its own
    s, _ = _session(nano_llm, ["Convert 120 km to mi.", '"""', '{"value": 74.56,',
                               ' "unit": "mi"}', '"""', "/exit"], params=GREEDY, tools=NANO_TOOLS)
    assert s.run() == 0
    assert [m["role"] for m in s.messages] == ["user", "assistant", "tool", "assistant"]
    assert s.messages[2]["content"] == '{"value": 74.56,\n "unit": "mi"}'


def test_a_result_too_long_for_the_context_is_asked_for_again(nano_llm, monkeypatch):
    # kept in the history, it made every later turn fail until /reset
    small = dataclasses.replace(nano_llm.cfg, max_position_embeddings=1024)
    monkeypatch.setattr(nano_llm, "cfg", small)
    monkeypatch.setattr(nano_llm.engine, "cfg", small)  # where the context limit is read
    s, console = _session(nano_llm, ["Convert 120 km to mi.", "K1234 = 5678 " * 300,
                                     '{"value": 74.56, "unit": "mi"}', "/exit"],
                          params=GREEDY, tools=NANO_TOOLS)
    assert s.run() == 0
    out = console.file.getvalue()
    assert "context limit" in out and RESULT_TOO_LONG in out and CONTEXT_FULL not in out
    assert [m["role"] for m in s.messages] == ["user", "assistant", "tool", "assistant"]
    assert s.messages[2]["content"] == '{"value": 74.56, "unit": "mi"}'


def test_a_fenced_message_of_several_lines_is_one_turn(nano_llm):
    import random

    from flint_graph.nano.curriculum import recall

    # 40 pairs: with a handful the untrained reply to the list itself derails the answer
    ep = recall(random.Random(3), "heldout", pairs=40, questions=1)
    lines = ep.messages[0]["content"].splitlines()
    s, _ = _session(nano_llm, ['"""' + lines[0], *lines[1:], '"""', ep.messages[2]["content"],
                               '"""/reset is text here"""', "/exit"], params=GREEDY)
    assert s.run() == 0
    users = [m["content"] for m in s.messages if m["role"] == "user"]
    assert users[0] == ep.messages[0]["content"]  # the list, as one message
    assert s.messages[3]["content"].strip() == str(ep.meta["answers"][0])
    assert users[2] == "/reset is text here"  # fenced: sent, not run as a command


def test_a_fence_left_open_at_the_end_of_input_quits_without_sending(tiny_llm):
    s, console = _session(tiny_llm, [])
    it = iter(['"""', "half a message"])

    def read(prompt=""):
        try:
            return next(it)
        except StopIteration:
            raise EOFError from None  # Ctrl-D, or the end of piped input

    console.input = read  # type: ignore[method-assign]
    assert s.run() == 0 and s.messages == []
    assert 'inside a """ block: that text was not sent' in console.file.getvalue()


def test_reasoning_cut_by_max_tokens_names_both_ways_out(tiny_llm, monkeypatch):
    """An answer still reasoning when max_tokens ran out: the footer names --max-tokens and
    --stop-on-repeat (a model stuck in a loop needs the second, not more tokens; a new user's
    "Hi" on flint-nano, 2026-12-02)."""
    monkeypatch.setattr("flint_graph.runtime.engine.sample",
                        scripted_sampler(tiny_llm.tokenizer.encode("thinking " * 20)))
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    s, _ = _session(tiny_llm, ["hi", "/exit"], params=SamplingParams(max_tokens=8),
                    console=console)
    s.run()
    footer = [line for line in console.file.getvalue().splitlines() if " tokens · " in line][0]
    assert "length" in footer and "--max-tokens" in footer and "--stop-on-repeat" in footer


def test_piped_input_is_echoed_after_its_prompt(tiny_llm):
    """A terminal echoes what the user types; piped input it does not, so `chat < turns.txt`
    printed prompts and answers run together ("you> ▸ reasoning ..."). With echo_input (the
    default when stdin is not a terminal) each line read is printed after its prompt, a byte
    that is not UTF-8 shown as U+FFFD instead of failing to encode."""
    s, console = _session(tiny_llm, ["/help", "bad \udcff byte", "/bad\x1b[2J", "/exit"],
                          echo_input=True)
    s.run()
    out = console.file.getvalue().splitlines()
    assert "/help" in out and "/exit" in out and "bad \ufffd byte" in out
    # control characters are shown, not sent to the terminal (a bad-input trial, 2026-12-05)
    assert "\x1b" not in console.file.getvalue() and "/bad\u241b[2J" in out
    # a 200 KB line (a pasted file) is echoed by its start and its length, not whole
    s, console = _session(tiny_llm, ["word " * 40_000, "/exit"], echo_input=True)
    s.run()
    text = console.file.getvalue()
    assert "… (200,000 characters)" in text.replace("\n", "") and len(text) < 10_000, text[-500:]
    quiet, console = _session(tiny_llm, ["/help", "/exit"])  # a console passed in: no echo
    quiet.run()
    assert "/exit" not in console.file.getvalue().splitlines()


def test_help_lists_every_command_and_key(tiny_llm):
    """/help printed the banner's one-line reminder again, without /help itself (a new
    user's trial): it lists each command (and the fence, Ctrl-C, Ctrl-D) on a line of its own."""
    from flint_graph.terminal.chat_cli import COMMANDS

    s, console = _session(tiny_llm, ["/help", "/exit"])
    s.run()
    lines = console.file.getvalue().splitlines()
    listed = lines[lines.index(next(x for x in lines if x.startswith("/reset "))):]
    for cmd in COMMANDS:
        assert any(x.startswith(cmd + " ") or x.startswith(cmd + ",") or f", {cmd} " in x
                   for x in listed), cmd
    assert any(x.startswith('"""') for x in listed)
    assert any(x.startswith("Ctrl-C") for x in listed) and "Ctrl-D" in "".join(listed)


def test_save_takes_a_quoted_name_without_its_quotes(tiny_llm, tmp_path, monkeypatch):
    """`/save ""` wrote a file literally named "" and `/save "my chat.json"` kept the quotes in
    the name (a bad-input trial, 2026-12-03): one pair of surrounding quotes is dropped, and an
    empty name is the usage error."""
    monkeypatch.chdir(tmp_path)
    s, console = _session(tiny_llm, ["hi", '/save ""', '/save "my chat.json"',
                                     "/save 'b.json'", "/exit"])
    s.run()
    out = console.file.getvalue()
    assert "usage: /save FILE" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.json", "my chat.json"]


def test_save_names_that_are_rich_markup_are_shown_as_typed(tiny_llm, tmp_path, monkeypatch):
    """`/save a[/]b.json` saved, then ended the chat with `internal error: MarkupError`, and
    `/save x[bold]y.json` said "saved … to xy.json" (a bad-input trial, 2026-12-06): the name
    goes into the message escaped, in the success and the error line alike."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a[").mkdir()
    s, console = _session(tiny_llm, ["hi", "/save a[/]b.json", "/save x[bold]y.json",
                                     "/save nodir[/]/z.json", "hello", "/exit"])
    s.run()
    out = console.file.getvalue()
    assert "saved 2 messages to a[/]b.json" in out and "to x[bold]y.json" in out
    assert "nodir[/]" in out and (tmp_path / "a[" / "]b.json").exists()
    assert len(s.messages) == 4  # the chat went on: "hello" was answered


def test_save_takes_exactly_one_file_name(tiny_llm, tmp_path, monkeypatch):
    """`/save a b c` wrote a file named "a b c" (bad-input trial, 2026-12-04): the argument is
    read as shell words, and anything but one word is the usage error, saying what it found."""
    monkeypatch.chdir(tmp_path)
    s, console = _session(tiny_llm, ["hi", "/save a b c", '/save "bob.json', "/save   ",
                                     '/save "  "',
                                     "/save a\0b", '/save "x\0"', "/save a\\ b.json", "/exit"])
    s.run()
    out = console.file.getvalue()
    assert "usage: /save FILE: expected one file name, found 3 words" in out
    assert "could not read the file name (no closing quotation; quote a name" in out
    assert "expected one file name, found none" in out
    assert "expected one file name, found a blank name" in out
    assert out.count("a file name cannot hold a NUL character") == 2  # was an internal error
    assert [p.name for p in tmp_path.iterdir()] == ["a b.json"]


def test_a_line_or_ctrl_d_typed_while_an_answer_streamed_is_read():
    """A Ctrl-D pressed while an answer streamed was dropped when readline took the terminal
    (new-user trial, 2026-12-04): it is read first, as is a whole line typed ahead; a half-typed
    line is left for readline."""
    import os
    import pty

    from flint_graph.terminal.chat_cli import queued_line

    master, slave = pty.openpty()
    try:
        with open(slave, "rb", buffering=0, closefd=False) as tty:
            assert queued_line(tty) is None  # nothing typed
            os.write(master, b"hel")
            assert queued_line(tty) is None  # no newline yet: readline's to edit
            os.write(master, b"lo\n")
            assert queued_line(tty) == "hello"
            os.write(master, b"\x04")
            with pytest.raises(EOFError):
                queued_line(tty)
            assert queued_line(io.BytesIO(b"x\n")) is None  # not a terminal
    finally:
        os.close(master)
        os.close(slave)


def test_a_pasted_burst_is_read_one_line_at_a_time():
    """A new user's trial (2026-12-06): 45 lines pasted into a fenced message arrived while
    readline held the terminal in raw mode, so they were queued ending in carriage returns and
    read back as one line joined by \r (the model then answered wrongly). Each is its own
    line now, whatever ends it, one per call. A bad-input trial the same day: a paste past one
    read (~4 KB) was cut at the read's end, or split inside a UTF-8 character; a piece with no
    line end yet waits (for readline's edit buffer) instead of being sent."""
    import os
    import pty
    import tty as termios_tty

    from flint_graph.terminal.chat_cli import drop_queued, pending_text, queued_line

    master, slave = pty.openpty()
    try:
        termios_tty.setraw(slave)  # as readline leaves it while a paste arrives
        with open(slave, "rb", buffering=0, closefd=False) as t:
            os.write(master, b"Remember these.\rK1 = 2\rK3 = 4\r\"\"\"\r")
            got = [queued_line(t) for _ in range(4)]
            assert got == ["Remember these.", "K1 = 2", "K3 = 4", '"""'], got
            assert queued_line(t) is None
            os.write(master, b"a\r\nb\nc")
            assert [queued_line(t) for _ in range(3)] == ["a", "b", None]
            assert pending_text(t) == "c" and pending_text(t) == ""
            lines = [("\u00e9" * 50 + f" {i}") for i in range(100)]  # ~10 KB, 2-byte chars
            data = "\r".join(lines).encode() + b"\r"
            for i in range(0, len(data), 3000):  # arriving in pieces, as a paste does
                os.write(master, data[i:i + 3000])
            got = []
            while (line := queued_line(t)) is not None:
                got.append(line)
            assert got == lines
            os.write(master, b"x\ry\rz\r")
            assert queued_line(t) == "x"
            drop_queued(t)  # Ctrl-C during the answer: the rest is not sent
            assert queued_line(t) is None
    finally:
        os.close(master)
        os.close(slave)


def test_a_pasted_fenced_message_keeps_its_line_breaks(tiny_llm, monkeypatch):
    """The same paste through the chat: the fenced message is its lines joined by newlines."""
    import flint_graph.terminal.chat_cli as cc

    # nothing queued at the first prompt (the user types the opening fence), then the paste
    pasted = iter([None, "Remember these.", "K1 = 2", "K3 = 4", '"""'])
    monkeypatch.setattr(cc, "queued_line", lambda stream: next(pasted, None))
    s, console = _session(tiny_llm, ['"""', "/exit"])
    # queued lines are read on a terminal only
    monkeypatch.setattr(type(s.console), "is_terminal", property(lambda self: True))
    monkeypatch.setattr(s, "answer", lambda: None)
    s.run()
    assert s.messages[-1] == {"role": "user", "content": "Remember these.\nK1 = 2\nK3 = 4"}


def test_save_takes_a_name_of_up_to_255_characters(tiny_llm, tmp_path, monkeypatch):
    """A bad-input trial (2026-12-05): `/save` of a legal 250-character name failed with "File
    name too long": the temporary file beside it took the whole name plus 10 characters. A
    name past the limit is still refused, naming why."""
    monkeypatch.chdir(tmp_path)
    ok, long = "a" * 245 + ".json", "b" * 300 + ".json"
    s, console = _session(tiny_llm, ["hi", f"/save {ok}", f"/save {long}", "/exit"])
    s.run()
    out = console.file.getvalue()
    assert [p.name for p in tmp_path.iterdir()] == [ok]
    assert "cannot save transcript (File name too long)" in out and out.count("cannot save") == 1


def test_save_with_nothing_to_save_says_so_and_a_tool_chat_keeps_its_tools(tiny_llm, tmp_path,
                                                                          monkeypatch):
    """A new user's trial (2026-12-05): `/save t.json` right after `/reset` said the file
    "holds a transcript of 4 messages that this chat's 0 do not begin with"; and a saved tool
    chat left its tools out, so it could not be replayed as it ran."""
    monkeypatch.chdir(tmp_path)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    s, console = _session(tiny_llm, ["hi", "/save t.json", "/reset", "/save t.json", "/exit"],
                          tools=tools)
    s.run()
    out = console.file.getvalue()
    assert "nothing to save yet" in out and "do not begin with" not in out
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["tools"] == tools and [m["role"] for m in saved["messages"]][0] == "user"


def test_a_piped_fenced_message_is_echoed_by_its_first_lines(tiny_llm):
    """A final new-user trial (2026-12-05): a 2,500-line \"\"\" message piped into the chat was
    printed back whole, one "...>" line each, while a long single line was cut at 2,000
    characters. Now its first ECHO_LINES lines are printed back and the rest counted; the
    model still gets every line."""
    from flint_graph.terminal.chat_cli import ECHO_LINES

    body = [f"K{i:04d} = {i * 7 % 9973}" for i in range(300)]
    s, console = _session(tiny_llm, ['"""Remember these values.', *body, '"""', "/exit"],
                          echo_input=True)
    s.run()
    out = console.file.getvalue()
    assert body[ECHO_LINES - 3] in out and body[ECHO_LINES + 5] not in out
    assert f"... ({302 - ECHO_LINES:,} more lines, to \"\"\")" in out
    sent = s.messages[0]["content"]
    assert sent.splitlines() == ["Remember these values.", *body]


def test_save_to_a_pipe_or_to_a_dash_says_what_it_is(tiny_llm, tmp_path, monkeypatch):
    """A bad-input trial (2026-12-05): `/save /dev/stdout` in a piped chat said
    "/proc/16996/fd/pipe:[443385]: cannot save transcript (No such file or directory)" (the
    link was resolved first), and `/save -` wrote a file named "-". Both are refused, naming
    what the user typed."""
    import os

    monkeypatch.chdir(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "out"
    link.symlink_to(fifo)
    s, console = _session(tiny_llm, ["hi", f"/save {link}", "/save -", "/save new/", "/exit"])
    s.run()
    out = " ".join(console.file.getvalue().split())  # the console wraps long lines
    assert f"{link}: exists and is not a regular file (a directory, device or pipe)" in out
    assert "-: /save writes a file, not standard output" in out
    assert "new/: names a directory (it ends with /); give a file name" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "out"]


def test_a_refusal_without_tools_gets_generates_note_once(monkeypatch):
    """A new user's trial (2026-12-05): `generate` notes that weather, conversions and lookups
    are tool calls when the model declines with no tools declared; the chat showed the bare
    refusal, which lists the very skills that need --tools. Now the chat says so too, once."""
    from chat_fakes import FakeLLM

    from flint_graph.cli import DECLINED

    refusal = DECLINED + " I can check the weather, convert units, ..."
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    it = iter(["What is the weather in Oslo?", "And in Bergen?", "/exit"])
    console.input = lambda prompt="": next(it)  # type: ignore[method-assign]
    ChatSession(FakeLLM("A tool request.", refusal), SamplingParams(max_tokens=6),
                console=console).run()
    out = console.file.getvalue()
    assert out.count("note: the model declined; if you asked for the weather") == 1
    assert "--tools TOOLS.json (e.g. examples/tools.json)" in out
    console = Console(file=io.StringIO(), width=200, force_terminal=False)
    it = iter(["What is the weather in Oslo?", "/exit"])
    console.input = lambda prompt="": next(it)  # type: ignore[method-assign]
    ChatSession(FakeLLM("A tool request.", refusal), SamplingParams(max_tokens=6),
                tools=[{"type": "function", "function": {"name": "f"}}], console=console).run()
    assert "note: the model declined" not in console.file.getvalue()  # tools were declared


def test_a_call_shown_as_text_without_tools_gets_generates_note():
    """A new user's trial (2026-12-06): "Convert 120 km to mi." in a chat without --tools printed
    the raw <tool_call> markup with no word why, while generate notes it. The chat notes it
    under every such answer, naming a --tools file that declared none."""
    from chat_fakes import FakeLLM

    call = "<tool_call>convert_units<arg_key>value</arg_key><arg_value>120</arg_value></tool_call>"
    console = Console(file=io.StringIO(), width=300, force_terminal=False)
    it = iter(["Convert 120 km to mi.", "/exit"])
    console.input = lambda prompt="": next(it)  # type: ignore[method-assign]
    ChatSession(FakeLLM("A conversion.", call), SamplingParams(max_tokens=6),
                console=console).run()
    out = console.file.getvalue()
    assert "note: the answer holds a tool call (<tool_call>), shown as text since no tools " \
        "were declared; pass --tools TOOLS.json" in out
    console = Console(file=io.StringIO(), width=300, force_terminal=False)
    it = iter(["Convert 120 km to mi.", "/exit"])
    console.input = lambda prompt="": next(it)  # type: ignore[method-assign]
    ChatSession(FakeLLM("A conversion.", call), SamplingParams(max_tokens=6),
                console=console, tools=[], tools_path="empty.json").run()
    assert "shown as text since empty.json declares none" in console.file.getvalue()


def test_read_line_capped_drops_a_long_line_whole():
    from flint_graph.terminal.chat_cli import read_line_capped

    stream = io.StringIO("short\r\n" + "x" * 5000 + "\nnext\nlast")
    assert read_line_capped(stream, 100) == "short"
    assert read_line_capped(stream, 100) is None  # read to its end, not kept
    assert read_line_capped(stream, 100) == "next"
    assert read_line_capped(stream, 100) == "last"
    with pytest.raises(EOFError):
        read_line_capped(stream, 100)


def test_a_piped_line_past_the_cap_is_dropped_and_the_chat_goes_on(tiny_llm, monkeypatch,
                                                                   capsys):
    """A bad-input trial (2026-12-06): `head -c 1500000000 /dev/zero | tr '\\0' a | flint-graph
    chat` held 3.3 GB (input() reads a line whole) before the size check refused it. A piped
    line is now read up to PIPED_LINE_MAX_CHARS; a longer one is read past and reported."""
    from flint_graph.terminal import chat_cli

    monkeypatch.setattr(chat_cli, "PIPED_LINE_MAX_CHARS", 100)
    stdin = io.TextIOWrapper(io.BytesIO(b"a" * 5000 + b"\n/help\n/exit\n"), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", stdin)
    s = ChatSession(tiny_llm, SamplingParams(max_tokens=6, seed=0))
    assert s.run() == 0
    out = capsys.readouterr().out
    assert "that line holds more than 100 characters" in out and "it was not sent" in out
    assert "/reset" in out  # /help after it still ran
    assert s.messages == [] and "a" * 200 not in out


def test_a_tool_result_that_is_not_json_gets_a_note_once(nano_llm):
    """A new user's trial (2026-12-06): "it is sunny and 25 degrees" typed as get_weather's
    result was answered from an invented {"sky": "rain"} without a word; the result is still
    sent as typed, with a note (once a session) that flint-nano was trained on JSON results."""
    s, console = _session(nano_llm, ["Convert 120 km to mi.", "about 74.6 miles",
                                     "Convert 5 kg to lb.", "roughly 11 pounds", "/exit"],
                          params=GREEDY, tools=NANO_TOOLS)
    assert s.run() == 0
    out = console.file.getvalue()
    assert out.count("note: this result is not JSON") == 1, out
    assert s.messages[2] == {"role": "tool", "content": "about 74.6 miles",
                             "tool_call_id": s.messages[1]["tool_calls"][0]["id"]}


def test_a_system_prompt_longer_than_the_context_is_named(tiny_llm, monkeypatch):
    """A bad-input trial (2026-12-06): `chat --system` of 120,000 characters blamed every
    message ("that message alone does not fit"), even after /reset; the hint now names the
    system prompt when it is the longer part."""
    small = dataclasses.replace(tiny_llm.cfg, max_position_embeddings=256)
    monkeypatch.setattr(tiny_llm, "cfg", small)
    monkeypatch.setattr(tiny_llm.engine, "cfg", small)
    console = Console(file=io.StringIO(), width=400, force_terminal=False)
    s, _ = _session(tiny_llm, ["hi", "/exit"], console=console, system="be brief " * 300)
    s.run()
    out = console.file.getvalue()
    assert "the system prompt (--system) is longer than that message" in out, out
    assert MESSAGE_TOO_LONG not in out and CONTEXT_FULL not in out


@pytest.mark.parametrize("result", ["[" * 3000, "1" * 5000, '{"v": ' + "9" * 5000 + "}"],
                         ids=["nested-3000", "digits-5000", "digits-in-object"])
def test_a_result_json_cannot_read_keeps_the_chat_going(nano_llm, result):
    """A bad-input trial (2026-12-06): 3,000 '[' typed as a tool result ended the chat with
    "internal error: RecursionError" (the JSON note's check caught only ValueError), losing
    the conversation before /save. Each of these is sent as typed, with the note."""
    s, console = _session(nano_llm, ["Convert 120 km to mi.", result, "/exit"],
                          params=GREEDY, tools=NANO_TOOLS)
    assert s.run() == 0
    out = console.file.getvalue()
    assert "note: this result is not JSON" in out and "internal error" not in out
    assert any(m["role"] == "tool" and m["content"] == result for m in s.messages)


@pytest.mark.parametrize("first", ['\ufeff"""', "\ufeff/reset", "\ufeffHi"])
def test_a_byte_order_mark_before_the_first_line_is_dropped(tiny_llm, first):
    """A BOM at the start of piped chat input (some Windows editors write one) kept the
    opening \"\"\" or the first /command from being seen, and reached the model as "\\ufeffHi"
    (a bad-input trial, 2026-12-06); `generate` already dropped it from stdin. Only the
    first line loses it: later ones are the user's text as typed."""
    rest = {'\ufeff"""': ["a", "b", '"""'], "\ufeff/reset": [], "\ufeffHi": []}[first]
    s, console = _session(tiny_llm, [first, *rest, "x\ufeff", "/exit"])
    assert s.run() == 0
    users = [m["content"] for m in s.messages if m["role"] == "user"]
    want = {'\ufeff"""': ["a\nb", "x\ufeff"], "\ufeff/reset": ["x\ufeff"],
            "\ufeffHi": ["Hi", "x\ufeff"]}[first]
    assert users == want, users


def test_the_banner_names_every_command():
    """A new user's trial (2026-12-07): the README says "/help lists the commands", but the
    banner's reminder listed every command except /help."""
    from flint_graph.terminal.chat_cli import COMMANDS, HELP

    assert all(cmd in HELP for cmd in COMMANDS)
