"""flint-nano's phrasings (nano/phrasings.py) and the episodes and eval cases built from them
(issue 25): held-out sentences no training template can produce, word problems with the right
answers, greetings and refusals that never call a tool, weather and conversion questions mapped
to the right call, and the eval's phrasing suite and its scoring."""

from __future__ import annotations

import random
import re
from types import SimpleNamespace

import pytest

from flint_graph.checkpoints.make_checkpoint import ensure_tiny_checkpoint
from flint_graph.chat.tokenizer import FlintTokenizer
from flint_graph.errors import InvalidRequestError
from flint_graph.nano import curriculum as cur
from flint_graph.nano import evals
from flint_graph.nano import phrasings as ph

# a value of each slot, to turn a template into a sentence it can produce
SAMPLE = {"k": "K1234", "a": "412", "b": "187", "days": "3", "limit": "5", "n": "4",
          "value": "120", "city": "Oslo", "unit": "celsius", "src": "kilometers", "dst": "miles",
          "expr": "12 * 34 + 5", "w": "amber", "ws": "amber basil", "tool": "lookup",
          "args": "table orders", "table": "orders", "field": "status", "name": "Ana",
          "pron": "she", "things": "apples", "when": "tomorrow"}


def _templates(split: str) -> list[str]:
    out = [t for table in ph.TABLES.values() for t in table[split]]
    if split == "train":  # the curriculum's cores are asked in training (and, as before, held out)
        out += [t for cores in cur.CORES.values() for t in cores]
    return out


def _sentence(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: SAMPLE[m.group(1)], template)


def test_every_slot_of_every_template_is_known():
    for split in ("train", "heldout"):
        for t in _templates(split):
            ph.pattern(t)  # KeyError for a slot SLOTS does not describe
            assert ph.pattern(t).fullmatch(_sentence(t)), t


@pytest.mark.parametrize("theirs, ours", [("train", "heldout"), ("heldout", "train")])
def test_no_template_of_one_split_produces_a_sentence_of_the_other(theirs, ours):
    patterns = [(t, ph.pattern(t)) for t in _templates(theirs)]
    for t in _templates(ours):
        if ours == "heldout" or t not in sum(cur.CORES.values(), []):
            s = _sentence(t)
            hits = [p for p, rx in patterns if rx.fullmatch(s)]
            assert not hits, f"{ours} {t!r} -> {s!r} is produced by {theirs} {hits}"


def _words(text: str) -> str:
    return " ".join(re.findall(r"[a-z']+", text.lower()))


def test_no_training_opening_or_closing_holds_a_held_out_sentence():
    """The openings and closings around training requests (curriculum.LEADS / TAILS) are
    sentences of their own: none may say a held-out greeting ("Good afternoon.", "Much
    appreciated." were about to be added as a closing, 2026-12-05) or a held-out opening or
    closing."""
    held = {_words(t) for table in ph.TABLES.values() for t in table["heldout"]
            if "{" not in t} | {_words(t) for t in cur.LEADS["heldout"] + cur.TAILS["heldout"]}
    held.discard("")
    for piece in cur.LEADS["train"] + cur.TAILS["train"]:
        w = _words(piece)
        if w:
            # whole words: "hi" is no part of "one more thing"
            assert not [h for h in held if f" {h} " in f" {w} "], \
                (piece, [h for h in held if f" {h} " in f" {w} "])


def test_the_eval_asks_nothing_a_training_template_produces():
    patterns = [(t, ph.pattern(t)) for t in _templates("train")]
    cases = evals.build_cases(("phrasing", "follow"), 60)
    assert {c.group for c in cases} == {*evals.PHRASING_GROUPS, "follow-arith", "follow-tools"}
    for c in cases:
        ask = c.messages[-1]["content"]
        hits = [p for p, rx in patterns if rx.fullmatch(ask)]
        assert not hits, f"{c.group} {c.index}: {ask!r} is produced by training {hits}"


@pytest.mark.parametrize("seed", range(20))
def test_a_typo_changes_one_template_word_and_no_slot(seed):
    rng = random.Random(seed)
    t = rng.choice(_templates("train"))
    out = ph.typo(rng, t)
    assert re.findall(r"\{\w+\}", out) == re.findall(r"\{\w+\}", t)
    if re.search(r"(?<![{\w])[A-Za-z]{4,}(?![\w}])", t):
        changed = [(a, b) for a, b in zip(t.split(), out.split()) if a != b]
        assert len(changed) == 1 and abs(len(changed[0][0]) - len(changed[0][1])) <= 1
    else:
        assert out == t


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_word_problems_are_answered_right_with_pairs_of_their_split(split):
    rng = random.Random(1)
    for i in range(300):
        ep = cur.word_problem(rng, split, op="+-"[i % 2])
        m = ep.meta
        assert m["answer"] == (m["a"] + m["b"] if m["op"] == "+" else m["a"] - m["b"]) >= 0
        assert cur.in_split(split, m["a"], m["b"])
        assert ep.messages[-1]["content"] == str(m["answer"])
        assert str(m["a"]) in ep.messages[0]["content"] and str(m["b"]) in ep.messages[0]["content"]


def test_greetings_and_refusals_answer_briefly_without_a_call():
    rng = random.Random(2)
    for split in ("train", "heldout"):
        for _ in range(100):
            for ep in (cur.greeting(rng, split), cur.out_of_scope(rng, split)):
                reply = ep.messages[-1]
                assert "tool_calls" not in reply and 0 < len(reply["content"]) <= evals.BRIEF
            assert ep.messages[-1]["content"].startswith("I can't")


def test_greetings_and_refusals_are_trained_with_tools_offered_too():
    eps = cur.episodes(5, 400, "train", mix=(("greet", 1), ("refuse", 1)))
    assert {e.kind for e in eps} == {"greet", "refuse"}
    offered = [e for e in eps if e.tools]
    assert 100 < len(offered) < 300
    assert all("tool_calls" not in e.messages[-1] for e in offered)


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_weather_questions_map_their_words_to_the_call(split):
    rng = random.Random(3)
    words = dict((w, d) for w, d in ph.WHEN + ph.WHEN_TRAIN if d)
    for _ in range(200):
        user, call, _ = cur.weather_ask(rng, split)
        text, args = user["content"], call["arguments"]
        assert args["city"] in text
        assert args["metric"] == ("fahrenheit" not in text)
        said = sorted((w for w in words if w in text), key=len)  # "this weekend", not "this week"
        n = re.search(r"(?:for the next|in the coming|for) (\d+) days", text)
        # no time said (phrasings.WEATHER_NOW, training only): today
        assert args["days"] == (int(n.group(1)) if n else words[said[-1]] if said else 1)
        assert said or n or split == "train"


def test_conversions_name_units_in_words_and_call_with_symbols():
    rng = random.Random(4)
    pairs = {p for p in cur.UNITS} | {(b, a) for a, b in cur.UNITS}
    for _ in range(200):
        user, call, _ = cur.convert_ask(rng, "heldout")
        a = call["arguments"]
        assert (a["from_unit"], a["to_unit"]) in pairs and str(a["value"]) in user["content"]


def test_training_mixes_the_new_phrasings_in():
    from tools.train_nano import SHORT_MIX  # noqa: PLC0415 (a script's table)

    kinds = dict(SHORT_MIX)
    assert kinds.get("greet") and kinds.get("refuse")
    eps = cur.episodes(7, 600, "train", mix=SHORT_MIX)
    users = [m["content"] for e in eps for m in e.messages if m["role"] == "user"]
    weather = [ph.pattern(t) for t in ph.WEATHER["train"]]
    assert any(rx.fullmatch(u) for u in users for rx in weather)
    words = [ph.pattern(t) for t in ph.WORD_PROBLEMS[("train", "+")]]
    assert any(rx.fullmatch(u) for u in users for rx in words)


def test_episodes_render_with_the_chat_template():
    tok = FlintTokenizer.from_dir(ensure_tiny_checkpoint(progress=False))
    rng = random.Random(6)
    for ep in [cur.greeting(rng, "train"), cur.out_of_scope(rng, "train"),
               cur.word_problem(rng, "train"), cur.chain(rng, "train")]:
        ids, mask = cur.supervised(ep, tok)
        assert len(ids) == len(mask) and any(mask)


def _msg(content="", calls=(), finish="stop"):
    return SimpleNamespace(content=content, finish_reason=finish, tool_calls=[
        SimpleNamespace(name=n, arguments=a) for n, a in calls])


@pytest.mark.parametrize("group, reply, calls, finish, correct", [
    ("phr-greet", "Hello! " + ph.CAN, (), "stop", True),
    ("phr-greet", "You're welcome!", (), "stop", True),  # another intent's reply still counts
    ("phr-greet", "ratcen", (), "stop", False),  # brief nonsense does not
    ("phr-greet", "", (), "stop", False),
    ("phr-greet", "x" * (evals.BRIEF + 1), (), "stop", False),
    ("phr-greet", "Goodbye!", (), "length", False),
    ("phr-greet", "", [("lookup", {})], "tool_calls", False),
    ("phr-refuse", ph.REFUSAL, (), "stop", True),
    ("phr-refuse", "Paris.", (), "stop", False),
    ("phr-refuse", "I can't do that.", [("lookup", {})], "tool_calls", False),
])
def test_greetings_and_refusals_are_scored_brief_and_callless(group, reply, calls, finish,
                                                              correct):
    case = evals.Case(group, 0, [], None, "")
    assert evals.score(case, _msg(reply, calls, finish)) == {"correct": correct}


def test_answers_cut_off_by_the_limit_are_counted_per_group():
    recs = [{"group": "phr-greet", "index": i, "expect": "", "got": "x", "correct": f == "stop",
             "finish": f} for i, f in enumerate(["stop", "length", "length"])]
    rep = evals.summarize(recs)
    assert rep["groups"]["phr-greet"]["length_hits"] == 2
    evals.check_report(rep, "r.json")
    bad = dict(rep, groups={"phr-greet": dict(rep["groups"]["phr-greet"], length_hits=9)})
    with pytest.raises(InvalidRequestError, match="length_hits"):
        evals.check_report(bad, "r.json")
    inconsistent = dict(rep, groups={"phr-greet": dict(rep["groups"]["phr-greet"], length_hits=1)})
    with pytest.raises(InvalidRequestError, match="length_hits.*finish"):
        evals.check_report(inconsistent, "r.json")
    for field, value in (("n", -3), ("seed", -1)):
        with pytest.raises(InvalidRequestError, match=field):
            evals.check_report(dict(rep, **{field: value}), "r.json")
    assert not evals._known_group("recall@²") and evals._known_group("recall@4096")
    recs[0]["finish"] = "nope"
    with pytest.raises(InvalidRequestError, match=r"cases\[0\].finish"):
        evals.check_report(evals.summarize(recs), "r.json")


def test_phrasing_cases_are_reproducible_and_hold_their_targets():
    a, b = evals.build_cases(("phrasing",), 8, seed=1), evals.build_cases(("phrasing",), 8, seed=1)
    assert [c.messages for c in a] == [c.messages for c in b]
    multi = [c for c in a if c.group == "phr-multi"]
    assert all(len(c.messages) == 3 and c.messages[1]["role"] == "assistant" for c in multi)
    assert {g for g, _ in evals.TARGETS} >= {"phr-tools", "phr-arith", "phr-greet", "phr-refuse"}
    assert "phrasing" not in evals.DEFAULT_SUITES  # the shipped reports keep their case list


def test_made_up_refusal_requests_share_no_word_with_tools_or_the_held_out_side():
    """The out-of-scope requests made from parts (`phrasings._more_requests`) name no word a
    generated tool is made of (a tool could then serve them) and no content word (4+ letters,
    beyond the words of asking) of the held-out requests, so those stay unseen phrasings."""
    import re

    from flint_graph.nano.curriculum import NOUNS, VERBS
    from flint_graph.nano.phrasings import MADE_REQUESTS, OUT_OF_SCOPE

    made = MADE_REQUESTS
    assert len(made) >= 300
    common = {"about", "write", "what", "your"}  # the words of asking itself
    held = {w.lower() for s in OUT_OF_SCOPE["heldout"]
            for w in re.findall(r"[A-Za-z]{4,}", s)} - common
    for sentence in made:
        words = {w.lower() for w in re.findall(r"[A-Za-z]+", sentence)}
        assert not words & set(VERBS + NOUNS), sentence
        assert not {w for w in words if len(w) >= 4} & held, sentence


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_follow_ups_work_from_the_previous_answer_or_repeat_its_call(split):
    """curriculum.follow_up (a new user's trial, 2026-12-07): "that" is the previous answer,
    worked from it; "what about CITY" / "and VALUE UNIT" repeats the previous call with that
    argument changed. The first request is context only (no reasoning), the follow-up's
    phrasing is of its split."""
    rng = random.Random(11)
    kinds = set()
    for _ in range(200):
        ep = cur.follow_up(rng, split)
        users = [m for m in ep.messages if m["role"] == "user"]
        assert len(users) == 2
        first_turns = ep.messages[:ep.messages.index(users[1])]
        assert all(not m.get("reasoning_content") for m in first_turns
                   if m["role"] == "assistant")
        if ep.kind == "arith":
            m = ep.meta
            before = int(first_turns[-1]["content"])
            assert m["a"] == before > 0
            want = {"+": before + m["b"], "-": before - m["b"], "x2": 2 * before}[m["op"]]
            assert m["answer"] == want and ep.messages[-1]["content"] == str(want)
            assert ep.messages[-1]["reasoning_content"].startswith(f"That is {before}, ")
            kinds.add(m["op"])
        else:
            (old,) = [m for m in first_turns if m.get("tool_calls")]
            old_args = old["tool_calls"][0]["function"]["arguments"]
            new = ep.meta["call"]
            changed = {k for k in old_args if old_args[k] != new["arguments"][k]}
            assert changed in ({"city"}, {"value"}), (old_args, new)
            assert str(new["arguments"][changed.pop()]) in users[1]["content"]
            kinds.add(new["name"])
    assert kinds == {"+", "-", "x2", "get_weather", "convert_units"}


def test_follow_ups_are_in_the_training_mix_and_render():
    from tools.train_nano import SHORT_MIX  # noqa: PLC0415 (a script's table)

    assert dict(SHORT_MIX).get("follow")
    tok = FlintTokenizer.from_dir(ensure_tiny_checkpoint(progress=False))
    rng = random.Random(3)
    for _ in range(6):
        ids, mask = cur.supervised(cur.follow_up(rng, "train"), tok)
        assert len(ids) == len(mask) and any(mask)


def test_the_follow_suite_asks_held_out_follow_ups_with_their_answers():
    """eval --suite follow: the follow-up is the last message, after the first request's
    turns (reasoning dropped); its expectation is the follow-up's own answer or call."""
    cases = evals.build_cases(("follow",), 20)
    for c in cases:
        assert c.messages[-1]["role"] == "user"
        assert sum(m["role"] == "user" for m in c.messages) == 2
        assert all(not m.get("reasoning_content") for m in c.messages if m["role"] == "assistant")
        if c.group == "follow-arith":
            before = int(c.messages[-2]["content"])
            assert int(c.expect) != before
        else:
            first = next(m for m in c.messages if m.get("tool_calls"))
            old = first["tool_calls"][0]["function"]
            assert c.expect["name"] == old["name"] and c.expect["arguments"] != old["arguments"]
    assert evals.build_cases(("follow",), 20) == cases  # reproducible
