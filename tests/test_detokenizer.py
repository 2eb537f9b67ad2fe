"""Detokenizer flush (issue 6, item 5): output text = decode(prompt + output) − decode(prompt).

The rule (flint_graph/chat/tokenizer.py, `IncrementalDetokenizer`): the output's text is
decode(prompt + output) with its longest common prefix with decode(prompt) removed. So a
character the prompt leaves incomplete belongs to the output only if the output completes it,
and otherwise never shows; a character the output itself leaves incomplete at the end comes
out as one U+FFFD. Values below are written out by hand from the tiny tokenizer's ids (printed
in comments as their bytes); `rule` restates the definition for the random sweeps.
"""

import random

import pytest
from conftest_ckpt import scripted_sampler

from flint_graph.runtime.request import Request
from flint_graph.runtime.sampling import SamplingParams
from flint_graph.chat.tokenizer import FlintTokenizer, IncrementalDetokenizer

R = "\ufffd"
# "Hello world " + F0 9F, the first two bytes of 🌶 (F0 9F 8C B6): 471 = "ld", 312 = " F0 9F".
HELLO_CHILI = [39, 68, 75, 323, 343, 285, 471, 312]
CHILI_REST = [234, 114]  # 8C, B6: the bytes that complete 🌶
EOS = 1004  # <|endoftext|>


@pytest.fixture(scope="module")
def tok(tiny_ckpt):
    return FlintTokenizer.from_dir(tiny_ckpt)


def rule(tok, prompt, output):
    full, head = tok.decode(prompt + output), tok.decode(prompt)
    n = 0
    while n < min(len(full), len(head)) and full[n] == head[n]:
        n += 1
    return full[n:]


def stream(tok, prompt, output):
    detok = IncrementalDetokenizer(tok, prompt)
    return [detok.push(i) for i in output] + [detok.flush()]


def run(tok, prompt, output, **kw):
    """Feed `output` to a Request as the engine would; return (text, finish_reason, deltas)."""
    params = SamplingParams(**kw)
    req = Request(prompt, params, tok, [EOS], None, max_new_tokens=10_000)
    for i in output:
        if req.is_finished:
            break
        req.append(i)
    if not req.is_finished:
        req.finish("abort")
    return req.text, req.finish_reason, [d.text for d in req.pending]


def test_fixture_ids_are_the_issue_ones(tok):
    assert tok.decode(HELLO_CHILI) == "Hello world " + R
    assert tok.decode(HELLO_CHILI + CHILI_REST) == "Hello world 🌶"
    assert tok.eos_id == EOS


# -- the issue's inputs, through Request and through the public API -----------------------------

@pytest.mark.parametrize("output, want", [
    ([EOS], ""),                                  # EOS first: the prompt's U+FFFD stays its own
    ([64, 65, 66, EOS], "abc"),                   # other text: the broken character never leaks
    (CHILI_REST + [0, EOS], "🌶!"),               # the output completes it: the character is its
    ([234, EOS], ""),                             # extends it (8C) and stops: still the prompt's
    ([234, 64, EOS], "a"),                        # extends it, then breaks it: 8C goes with it
    ([380, EOS], "é"),                            # a new character right after the broken one
    ([171, 123, 121, 64, EOS], R + "a"),          # a literal U+FFFD (EF BF BD) is the output's
])  # fmt: skip
def test_prompt_ending_mid_character(tok, output, want):
    assert rule(tok, HELLO_CHILI, output[:-1]) == want
    text, reason, pieces = run(tok, HELLO_CHILI, output)
    assert (text, reason) == (want, "stop")
    assert "".join(pieces) == want


def test_completed_character_is_emitted_once_whole(tok):
    assert stream(tok, HELLO_CHILI, CHILI_REST + [0]) == ["", "🌶", "!", ""]


def test_issue_inputs_through_generate_and_stream(tiny_llm, monkeypatch):
    for script, want in (([EOS], ""), ([64, 65, 66, EOS], "abc"), (CHILI_REST + [EOS], "🌶")):
        monkeypatch.setattr("flint_graph.runtime.engine.sample", scripted_sampler(script))
        out = tiny_llm.generate([HELLO_CHILI], SamplingParams(max_tokens=20))[0]
        assert (out.text, out.token_ids, out.finish_reason) == (want, script, "stop")
        deltas = list(tiny_llm.stream(HELLO_CHILI, SamplingParams(max_tokens=20)))
        assert "".join(d.text for d in deltas) == want


# -- a prompt ending in a complete character ------------------------------------------------------

@pytest.mark.parametrize("prompt_text", ["Hello world 🌶", "Hello world", "Zürich", "你好", "€",
                                         "x" + R])  # fmt: skip
def test_prompt_ending_in_complete_character(tok, prompt_text):
    prompt = tok.encode(prompt_text)
    assert tok.decode(prompt) == prompt_text
    assert run(tok, prompt, [EOS])[:2] == ("", "stop")
    assert run(tok, prompt, [64, 65, 66, EOS])[:2] == ("abc", "stop")  # a literal U+FFFD too
    assert run(tok, prompt, [171, 123, 121, EOS])[:2] == (R, "stop")


# -- 2-, 3- and 4-byte characters split between prompt and output --------------------------------

@pytest.mark.parametrize("text, cut, head", [
    ("Zürich", 2, "Z"),         # ü = C3 | BC: 2 bytes, 1 + 1
    ("€uro", 1, ""),            # € = E2 | 82 AC: 3 bytes, 1 + 2
    ("€uro", 2, ""),            # € = E2 82 | AC: 2 + 1
    ("你好", 2, ""),             # 你 = E4 BD | A0 (CJK)
    ("你好", 5, "你"),           # 好 = E5 A5 | BD
    ("龘", 1, ""),              # 龘 = E9 | BE 98
    ("𠀋", 1, ""),              # 𠀋 = F0 | A0 80 8B: 4 bytes, 1 + 3
    ("𠀋", 3, ""),              # F0 A0 80 | 8B: 3 + 1
    ("😀!", 1, ""),             # 😀 = F0 9F | 98 80
])  # fmt: skip
def test_character_split_between_prompt_and_output(tok, text, cut, head):
    ids = tok.encode(text)
    prompt, rest = ids[:cut], ids[cut:]
    assert tok.decode(prompt) == head + R
    # Completed by the output: the whole character is the output's, the prompt's text is not.
    assert run(tok, prompt, rest + [EOS])[:2] == (text[len(head):], "stop")
    # Not completed: nothing of it shows.
    assert run(tok, prompt, [EOS])[:2] == ("", "stop")
    assert run(tok, prompt, [64, EOS])[:2] == ("a", "stop")


# -- output that itself ends mid-character --------------------------------------------------------

@pytest.mark.parametrize("prompt_text, output, want", [
    ("Hello world", [312], " " + R),             # max_tokens=1: " F0 9F" of 🌶
    ("Hello", [299], R),                         # max_tokens=1: F0 9F
    ("Z", [127], R),                             # max_tokens=1: C3 of ü
    ("Hi", [64, 65, 66, 158, 224], "abc" + R),   # E2 82 of €: one U+FFFD for the cut character
    ("Hi", [172, 254, 222], R),                  # F0 A0 80 of 𠀋
])  # fmt: skip
def test_output_cut_mid_character_ends_in_one_replacement(tok, prompt_text, output, want):
    prompt = tok.encode(prompt_text)
    assert rule(tok, prompt, output) == want
    text, reason, pieces = run(tok, prompt, output, max_tokens=len(output))
    assert (text, reason) == (want, "length")
    assert pieces[-1].endswith(R) and all(R not in p for p in pieces[:-1])
    # An abort cuts the same way.
    assert run(tok, prompt, output)[:2] == (want, "abort")


def test_prompt_and_output_both_cut(tok):
    # The prompt's F0 9F extended by 8C and then cut: the character began in the prompt.
    assert run(tok, HELLO_CHILI, [234], max_tokens=1)[:2] == ("", "length")
    # The prompt's broken character, then the output's own: only the output's shows.
    assert run(tok, HELLO_CHILI, [64, 299], max_tokens=2)[:2] == ("a" + R, "length")


def test_flush_is_idempotent(tok):
    detok = IncrementalDetokenizer(tok, tok.encode("Hi"))
    assert detok.push(299) == ""
    assert detok.flush() == R
    assert detok.flush() == ""


# -- stop strings ---------------------------------------------------------------------------------

def test_stop_strings_with_a_broken_prompt_character(tok):
    assert run(tok, HELLO_CHILI, [64, 65, 66, EOS], stop=["b"])[:2] == ("a", "stop")
    # The completed character is the output's, so a stop string can match it.
    assert run(tok, HELLO_CHILI, CHILI_REST + [64, EOS], stop=["🌶"])[:2] == ("", "stop")
    assert run(tok, HELLO_CHILI, CHILI_REST + [64, EOS], stop=["🌶a"])[:2] == ("", "stop")
    # The prompt's U+FFFD is not output, so a stop string on it never matches.
    assert run(tok, HELLO_CHILI, [64, EOS], stop=[R])[:2] == ("a", "stop")
    assert run(tok, HELLO_CHILI, [64, 65, EOS], stop=[R + "a"])[:2] == ("ab", "stop")


def test_stop_string_in_text_held_at_the_cut(tok):
    # " F0 9F" is held back while 🌶 may still complete; at max_tokens the flush releases it and
    # the stop string " " in it ends the text, as it would had the next token completed 🌶.
    prompt = tok.encode("Hi")
    assert run(tok, prompt, [64, 65, 312], max_tokens=3, stop=[" "])[:2] == ("ab", "stop")
    assert run(tok, prompt, [64, 65, 312] + CHILI_REST, max_tokens=5,
               stop=[" "])[:2] == ("ab", "stop")
    # No match: the held stop-string prefix and the cut character both come out.
    assert run(tok, prompt, [64, 65, 312], max_tokens=3, stop=["abx"])[:2] == ("ab " + R,
                                                                             "length")
    # An abort keeps its reason.
    assert run(tok, prompt, [64, 65, 312], stop=[" "])[:2] == ("ab", "abort")


# -- every cut, random garbage -------------------------------------------------------------------

def test_streaming_equals_the_rule_at_every_cut(tok):
    rng = random.Random(0)
    texts = ["Hello world 🌶 Zürich 你好 € 𠀋 😀!", "龘" + R + "x🦀y", "ab 🌶🌶 " + R]
    cases = []
    for text in texts:
        ids = tok.encode(text)
        for cut in range(len(ids) + 1):
            for end in range(cut, len(ids) + 1):
                cases.append((ids[:cut], ids[cut:end]))
    # Random byte-level garbage: lone continuation bytes, leads without tails, literal U+FFFD.
    pool = [64, 65, 0, 312, 299, 234, 114, 127, 120, 158, 224, 105, 172, 254, 222, 233, 171,
            123, 121, 1011, 1015]  # fmt: skip
    for _ in range(400):
        seq = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
        cut = rng.randint(1, len(seq))
        cases.append((seq[:cut], seq[cut:]))
    for prompt, output in cases:
        pieces = stream(tok, prompt, output)
        assert "".join(pieces) == rule(tok, prompt, output), (prompt, output)
        # A push never emits a U+FFFD that later bytes could still complete.
        assert all(not p.endswith(R) for p in pieces[:-1]), (prompt, output)
