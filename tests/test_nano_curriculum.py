"""The flint-nano curriculum (nano/curriculum.py): right answers, disjoint splits, tool calls
that our own parser reads back with their types, recall keys far behind their questions, and
train masks on exactly the assistant's output."""

from __future__ import annotations

import pytest

from flint_graph.checkpoints.make_checkpoint import ensure_tiny_checkpoint
from flint_graph.nano.curriculum import (TOOLS, arithmetic, episodes, in_split, recall,
                                         supervised, tool_use)
from flint_graph.chat.output_parser import parse_output
from flint_graph.chat.tokenizer import FlintTokenizer


@pytest.fixture(scope="module")
def tok():
    return FlintTokenizer.from_dir(ensure_tiny_checkpoint(progress=False))


def test_episodes_are_reproducible_and_split():
    a = episodes(3, 40, "train", recall_pairs=10, recall_questions=2)
    assert [e.messages for e in a] == [e.messages for e in episodes(3, 40, "train", 10, 2)]
    with pytest.raises(ValueError, match="split 'test'"):
        episodes(0, 1, "test")


def test_arithmetic_is_right_and_held_out_pairs_never_train():
    import random

    rng = random.Random(0)
    for split in ("train", "heldout"):
        for _ in range(300):
            e = arithmetic(rng, split)
            m = e.meta
            assert m["answer"] == (m["a"] + m["b"] if m["op"] == "+" else m["a"] - m["b"])
            assert m["answer"] >= 0 or split == "train"  # negative answers: training only
            assert e.messages[-1]["content"] == str(m["answer"])
            assert e.messages[-1]["reasoning_content"].endswith(f"So it is {m['answer']}.")
            pair = (m["a"], m["b"]) if in_split(split, m["a"], m["b"]) else (m["b"], m["a"])
            assert in_split(split, *pair) and not in_split(
                "heldout" if split == "train" else "train", *pair)


def test_tool_calls_parse_back_with_their_types(tok):
    import random

    from flint_graph.chat.chat_template import render_chat

    rng = random.Random(1)
    for split in ("train", "heldout"):
        seen = set()
        for _ in range(60):
            e = tool_use(rng, split)
            tools = e.tools  # training adds generated tools to the fixed ones
            call = e.meta["call"]
            seen.add(call["name"])
            prompt = render_chat(tok.chat_template, e.messages[:1], e.tools)
            full = render_chat(tok.chat_template, e.messages[:2], e.tools,
                               add_generation_prompt=False)
            parsed = parse_output(full[len(prompt):], tools, finish_reason="stop")
            assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
                (call["name"], call["arguments"])], (full[len(prompt):], parsed.errors)
        assert ("book_table" in seen) == (split == "heldout")  # a tool training never sees
        if split == "train":  # generated tools are asked for too, with typed arguments
            assert seen - {t["function"]["name"] for t in TOOLS["train"]}


def test_recall_asks_only_keys_far_behind_the_question(tok):
    import random

    e = recall(random.Random(2), "train", pairs=400, questions=8)
    ids, mask = supervised(e, tok)
    text = tok.decode(ids, skip_special=False)
    for key, answer in zip(e.meta["asked"], e.meta["answers"]):
        stored = text.index(f"{key} = {answer}")
        asked = text.index(f"{key}?") if f"{key}?" in text else text.rindex(key)
        # a token is at least one character here: the distance in tokens is at least this
        assert len(tok.encode(text[stored:asked])) > 513  # beyond the full model's window


def test_masks_cover_exactly_the_assistant_output(tok):
    for e in episodes(5, 30, "train", recall_pairs=12, recall_questions=3):
        ids, mask = supervised(e, tok)
        assert len(ids) == len(mask)
        trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special=False)
        for m in e.messages:
            if m["role"] == "assistant" and not m["reasoning_content"]:
                continue  # a context turn ("Ready."): shown, not trained
            if m["role"] == "assistant":
                assert m["reasoning_content"] in trained
                assert (m.get("content") or "") in trained
            elif m["role"] == "user":
                assert m["content"].splitlines()[0] not in trained
        assert ids[-1] == tok.token_id("<|endoftext|>") and mask[-1]
        stops = {tok.token_id(t) for t in ("<|user|>", "<|observation|>", "<|endoftext|>")}
        turns = sum(m["role"] == "assistant" and bool(m["reasoning_content"])
                    for m in e.messages)
        assert sum(1 for i, m in zip(ids, mask) if m and i in stops) == turns


@pytest.mark.parametrize("pairs,questions", [(1, 16), (5, 16), (40, 16), (3, 1)])
def test_short_recall_lists_ask_fewer_questions(pairs, questions):
    import random

    e = recall(random.Random(0), "train", pairs=pairs, questions=questions)
    assert 1 <= len(e.meta["asked"]) == len(set(e.meta["asked"])) <= min(questions, pairs)


def test_direct_answers_are_trained_with_tools_offered_too(tok):
    eps = episodes(4, 200, "train", recall_pairs=4, recall_questions=1)
    arith = [e for e in eps if e.kind == "arith"]
    with_tools = [e for e in arith if e.tools]
    assert 0.3 < len(with_tools) / len(arith) < 0.7
    for e in with_tools[:5]:  # rendered with the tools, still answered without a call
        ids, mask = supervised(e, tok)
        text = tok.decode(ids, skip_special=False)
        assert "<tools>" in text or "calculator" in text
        assert "<tool_call>" not in tok.decode([i for i, m in zip(ids, mask) if m],
                                               skip_special=False)


def test_coined_words_teach_copying_without_touching_the_held_out_split(tok):
    import random

    from flint_graph.nano import curriculum
    from flint_graph.nano.evals import build_cases

    pieces = tok.word_pieces()
    assert pieces and all(p.isalpha() and p.islower() and len(p) >= 2 for p in pieces)
    before = [(c.messages, c.expect) for c in build_cases(("tools", "arith"), 6)]
    curriculum.coin_from(["xq", "zv"])
    try:
        rng = random.Random(0)
        words = [curriculum.coined(rng) for _ in range(400)]
        assert not set(words) & curriculum.HELDOUT_WORDS
        assert any(set(w) <= set("xqzv") for w in words)  # pieces are used...
        assert any(not set(w) <= set("xqzv") for w in words)  # ...and syllables too
        # training requests name coined cities and tools; the held-out split is unchanged
        asks = " ".join(tool_use(rng, "train").messages[0]["content"] for _ in range(60))
        assert "xq" in asks or "zv" in asks or "Xq" in asks or "Zv" in asks
        assert [(c.messages, c.expect) for c in build_cases(("tools", "arith"), 6)] == before
    finally:
        curriculum.coin_from([])


def test_every_lead_token_is_written_in_training():
    """A held-out name is copied through tokens with a leading space (" book" of book_table);
    the model cannot write a token it was never trained to write, and before the repeat task
    two in three of them never were."""
    from flint_graph.nano import curriculum
    from flint_graph.nano.embedded import packaged_dir
    from flint_graph.nano.evals import build_cases

    tok = FlintTokenizer.from_dir(packaged_dir())  # flint-nano's own

    leads = tok.word_pieces(leading_space=True)
    assert leads and set(leads) <= set(tok.word_pieces())
    assert "book" in leads and all(len(tok.encode(" " + p)) == 1 for p in leads)
    before = [(c.messages, c.expect) for c in build_cases(("tools", "arith"), 6)]
    curriculum.coin_from(tok.word_pieces(), leads)
    try:
        eps = episodes(0, 1200, "train", mix=(("repeat", 1),))
        written = set()
        for e in eps:
            answer = e.meta["answer"]
            assert e.messages[-1]["content"] == answer and answer in e.messages[0]["content"]
            assert not set(answer.split()) & curriculum.HELDOUT_WORDS
            ids, mask = supervised(e, tok)
            written.update(i for i, m in zip(ids, mask) if m)
        lead_ids = {tok.encode(" " + p)[0] for p in leads}
        assert len(lead_ids & written) >= 0.9 * len(lead_ids)
        assert tok.encode(" book")[0] in written
        assert [(c.messages, c.expect) for c in build_cases(("tools", "arith"), 6)] == before
    finally:
        curriculum.coin_from([])


def test_training_operands_have_every_length():
    import random

    rng = random.Random(0)
    lengths = [len(str(arithmetic(rng, "train").meta["b"])) for _ in range(700)]
    assert {1, 2, 3, 4} <= set(lengths) and lengths.count(3) > len(lengths) / 4


def test_a_list_is_answered_ready_as_the_recall_episodes_show_it(tok):
    import random

    from flint_graph.chat.chat_template import render_chat
    from flint_graph.nano.curriculum import READY, remember

    ep = remember(random.Random(9), "train")
    ids, mask = supervised(ep, tok)
    trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special=False)
    assert ep.messages[1]["reasoning_content"] in trained and READY in trained
    assert "K" not in trained  # the list itself is the prompt, not trained
    # In a chat the model's reply (reasoning and all) becomes an older turn; the next question
    # must then see exactly what the recall episodes train on after their context turn.
    q = {"role": "user", "content": "What was K1234?"}
    chat = render_chat(tok.chat_template, [*ep.messages, q])
    trained_view = render_chat(tok.chat_template,
                               [ep.messages[0], {"role": "assistant", "content": READY,
                                                 "reasoning_content": ""}, q],
                               clear_thinking=False)
    assert chat == trained_view


def test_a_second_request_sees_the_first_as_a_chat_shows_it(tok):
    import random

    from flint_graph.chat.chat_template import render_chat
    from flint_graph.nano.curriculum import chain

    rng = random.Random(11)
    seen_tools = seen_three = False
    for _ in range(30):
        ep = chain(rng, "train")
        users = [i for i, m in enumerate(ep.messages) if m["role"] == "user"]
        if len(users) < 2:
            continue  # clashing generated tools: the second request alone
        last = users[-1]
        earlier = ep.messages[:last]
        assert all(not m.get("reasoning_content") for m in earlier if m["role"] == "assistant")
        # a chat that really answered the first request (reasoning and all) renders the next
        # prompt exactly as training shows it
        answered = [dict(m, reasoning_content="worked it out") if m["role"] == "assistant"
                    else m for m in earlier]
        chat = render_chat(tok.chat_template, [*answered, ep.messages[last]], ep.tools)
        trained = render_chat(tok.chat_template, ep.messages[:last + 1], ep.tools,
                              clear_thinking=False)
        assert chat == trained
        ids, mask = supervised(ep, tok)
        text = tok.decode([i for i, m in zip(ids, mask) if m], skip_special=False)
        assert ep.messages[-1]["content"] in text
        # only the second request's assistant turns are trained, those with reasoning (a call
        # sent back without it, as an API client does, is context): one </think> each
        later = sum(m["role"] == "assistant" and bool(m["reasoning_content"])
                    for m in ep.messages[last:])
        assert text.count("</think>") == later
        seen_tools |= any(m.get("tool_calls") for m in earlier)
        seen_three |= len(users) == 3
    assert seen_tools  # a tool round trip as an earlier request occurs too
    assert seen_three  # and three requests in one chat


def test_short_lists_are_recalled_with_and_without_tools(tok):
    # a chat user pastes short lists, often with tools declared; trained only on long lists
    # without tools, the model called a tool for a 10-line list and answered "Ready." to the
    # question after it
    eps = episodes(3, 60, "train", mix=(("recall-short", 1), ("remember", 1)))
    short = [e for e in eps if e.kind == "recall"]
    assert short and any(e.tools for e in short) and any(not e.tools for e in short)
    assert any(e.tools for e in eps if e.kind == "remember")
    for e in short:
        listing = e.messages[0]["content"]
        assert 4 <= listing.count(" = ") <= 40
        for k, v in zip(e.meta["asked"], e.meta["answers"]):
            assert f"{k} = {v}" in listing
        ids, mask = supervised(e, tok)
        text = tok.decode([i for i, m in zip(ids, mask) if m], skip_special=False)
        assert "<tool_call>" not in text and all(str(v) in text for v in e.meta["answers"])


def test_some_training_subtractions_are_negative():
    import random

    rng = random.Random(4)
    eps = [arithmetic(rng, "train", op="-") for _ in range(400)]
    neg = [e for e in eps if e.meta["answer"] < 0]
    assert 0.05 < len(neg) / len(eps) < 0.25
    for e in neg:
        a, b = e.meta["a"], e.meta["b"]
        assert e.meta["answer"] == a - b and e.messages[-1]["content"] == str(a - b)
        assert f"so {b} is larger. The answer is negative: {b} - {a}, column by column" in \
            e.messages[-1]["reasoning_content"]
    assert all(arithmetic(rng, "heldout", op="-").meta["answer"] >= 0 for _ in range(200))


@pytest.mark.parametrize("a, b, opening", [
    (460, 674, "Compare 460 and 674: 4 < 6, so 674 is larger. The answer is negative: 674 - 460"),
    (674, 460, "Compare 674 and 460: 6 > 4, so 674 is larger. 674 - 460, column by column"),
    (906, 919, "Compare 906 and 919: 0 < 1, so 919 is larger. The answer is negative"),
    (1234, 567, "Compare 1234 and 567: 4 digits > 3 digits, so 1234 is larger. 1234 - 567"),
    (56, 1234, "Compare 56 and 1234: 2 digits < 4 digits, so 1234 is larger. The answer is"),
    (788, 788, "Compare 788 and 788: they are equal. 788 - 788, column by column"),
])
def test_every_subtraction_opens_by_comparing_its_operands(a, b, opening):
    """Step 6517 chose between "a - b" and "the answer is negative" on its first reasoning
    token and answered every held-out negative difference as 10000 - |a - b|: the comparison
    now comes first, digit counts or the first differing digits, most significant first."""
    from flint_graph.nano.curriculum import subtraction_reasoning

    why = subtraction_reasoning(a, b)
    assert why.startswith(opening) and why.endswith(f"So it is {a - b}."), why


def test_some_training_cities_have_two_words():
    """A new user's "temperature in New York" got city "New low": training had one-word
    cities only. A quarter of the coined ones now have two words; the held-out ones do not
    change."""
    import random

    from flint_graph.nano.curriculum import CITIES, _city

    rng = random.Random(5)
    cities = [_city(rng, "train") for _ in range(2000)]
    two = [c for c in cities if " " in c]
    assert 0.08 < len(two) / len(cities) < 0.18
    assert all(len(c.split()) == 2 and all(w[0].isupper() for w in c.split()) for c in two)
    held = [_city(random.Random(6), "heldout") for _ in range(50)]
    assert set(held) <= set(CITIES["heldout"])


def test_training_says_the_days_of_a_weather_request_in_more_ways():
    """A new user's "this weekend" got days = 1: training had "over the weekend" only. A third
    of the training time phrases come from WHEN_TRAIN, each with its day count."""
    import random

    from flint_graph.nano.curriculum import _when
    from flint_graph.nano.phrasings import WHEN, WHEN_TRAIN

    rng = random.Random(7)
    drawn = [_when(rng, "train") for _ in range(600)]
    assert ("this weekend", 3) in drawn and ("tonight", 1) in drawn
    def phrases(table):
        return {(w, d) for w, d in table if d} | {(w.format(n=n), n) for w, d in table
                                                  if d is None for n in range(2, 8)}

    assert 0.2 < sum(d in phrases(WHEN_TRAIN) for d in drawn) / len(drawn) < 0.45
    assert all(_when(random.Random(i), "heldout") in phrases(WHEN) for i in range(50))


def test_some_tool_calls_come_back_without_their_reasoning(tok):
    """A tool call an OpenAI-style client sends back carries no reasoning; steps 6937 and 7718
    then renamed a result's first key to "ok" in about half the cases (eval --suite result).
    About 30% of training's tool episodes show the call that way (a context turn) and train
    the answer to its result; the held-out split never does, so the eval's cases stay put."""
    import random

    from flint_graph.nano.curriculum import tool_use

    rng = random.Random(5)
    eps = [tool_use(rng, "train") for _ in range(400)]
    bare = [e for e in eps if e.messages[1]["reasoning_content"] == ""]
    assert 0.2 < len(bare) / len(eps) < 0.4
    ids, mask = supervised(bare[0], tok)
    trained = tok.decode([i for i, m in zip(ids, mask) if m], skip_special=False)
    assert "<tool_call>" not in trained and bare[0].messages[3]["content"] in trained
    held = random.Random(5)
    assert all(tool_use(held, "heldout").messages[1]["reasoning_content"] for _ in range(200))


def test_products_in_words_call_the_calculator_or_get_the_refusal():
    """Training asks products and quotients in words (no "calculator"): with the tools offered
    the calculator gets the expression, with none the refusal; the held-out split is as it was
    (a new user's "What is 12 times 13?" got -12 from step 7718, 2026-12-06)."""
    import re

    from flint_graph.nano import phrasings as ph
    from flint_graph.nano.curriculum import CORES, times_refusal

    worded = re.compile(r"\d+ times \d+|\d+ multiplied by \d+|\d+ divided by \d+|"
                        r"Multiply \d+ by \d+|Divide \d+ by \d+|\d+ x \d+ = \?")
    assert all(worded.search(c.format(a=12, b=13)) for c in CORES["mul"] + CORES["div"])
    eps = episodes(6, 600, "train", recall_pairs=4, recall_questions=1,
                   mix=(("tool", 1), ("refuse", 1)))
    calls = [e for e in eps if e.kind == "tool" and worded.search(e.messages[0]["content"])
             and e.messages[1].get("tool_calls")]
    assert calls, "no product asked in words reached the calculator"
    for e in calls:
        (call,) = e.messages[1]["tool_calls"]
        assert call["function"]["name"] == "calculator"
        assert re.fullmatch(r"\d+ [*/] \d+", call["function"]["arguments"]["expression"])
    import random

    for seed in range(20):
        ep = times_refusal(random.Random(seed))
        assert ep.tools is None and ep.meta["no_tools"] and ep.messages[-1]["content"] == ph.REFUSAL
    refusals = [e for e in eps if e.kind == "refuse" and e.meta.get("no_tools")]
    assert refusals and all(e.tools is None for e in refusals)
    held = episodes(6, 300, "heldout", recall_pairs=4, recall_questions=1,
                    mix=(("tool", 1), ("refuse", 1)))
    assert not any(worded.search(m["content"]) for e in held for m in e.messages
                   if m["role"] == "user" and isinstance(m.get("content"), str))


def test_a_quarter_of_training_chains_are_a_greeting_then_a_tool_request():
    """GREET_THEN_TOOL: the phr-multi shape (a greeting answered, then a tool request) in
    training, with training phrasings; held-out chains never take it."""
    import random

    from flint_graph.nano.curriculum import GREET_THEN_TOOL, chain
    from flint_graph.nano.evals import GREETING_ANSWERS

    rng = random.Random(5)
    eps = [chain(rng, "train") for _ in range(400)]
    shaped = [ep for ep in eps if ep.kind == "tool"
              and sum(m["role"] == "user" for m in ep.messages) == 2
              and ep.messages[1]["role"] == "assistant" and not ep.messages[1].get("tool_calls")
              and ep.messages[1]["content"] in GREETING_ANSWERS]
    assert 0.6 * GREET_THEN_TOOL < len(shaped) / len(eps) < 1.6 * GREET_THEN_TOOL
    held = [chain(random.Random(i), "heldout") for i in range(60)]
    assert not any(ep.messages[1]["content"] in GREETING_ANSWERS for ep in held
                   if len(ep.messages) > 1 and ep.messages[1]["role"] == "assistant")
