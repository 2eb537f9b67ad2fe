"""The synthetic curriculum flint-nano learns from (issue 11), made by our own code: chat
episodes in OpenAI message form, each assistant turn with `<think>` reasoning.

Skills: tool calls with typed arguments (string, integer, boolean, object) and the tool's result
fed back; multi-digit addition and subtraction answered after digit-by-digit reasoning; short
string tasks; long-context key-value recall where every asked key lies far behind the question,
with many questions per episode (many supervised answers per sequence).

`split="train"` and `split="heldout"` never share a phrasing, a tool or a number pair (a pair's
split is a hash of it), so the eval measures generalisation, not recall of the training set.
`supervised(episode, tokenizer)` renders an episode with the chat template and marks the tokens
a model is trained on: every assistant turn's output and the stop token after it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

SPLITS = ("train", "heldout")


def _tool(name: str, doc: str, props: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": doc,
        "parameters": {"type": "object", "properties": props, "required": required}}}


_S, _I, _B = {"type": "string"}, {"type": "integer"}, {"type": "boolean"}
TOOLS = {
    "train": [
        _tool("calculator", "Evaluate an arithmetic expression.", {"expression": _S},
              ["expression"]),
        _tool("get_weather", "Weather forecast for a city.",
              {"city": _S, "days": _I, "metric": _B}, ["city", "days", "metric"]),
        _tool("convert_units", "Convert a value between units.",
              {"value": _I, "from_unit": _S, "to_unit": _S}, ["value", "from_unit", "to_unit"]),
        _tool("lookup", "Look up rows of a table.",
              {"table": _S, "filter": {"type": "object"}, "limit": _I},
              ["table", "filter", "limit"]),
    ],
    "heldout": [
        _tool("book_table", "Book a restaurant table.",
              {"restaurant": _S, "party_size": _I, "outdoor": _B, "options": {"type": "object"}},
              ["restaurant", "party_size", "outdoor", "options"]),
    ],
}
CITIES = {"train": ["Paris", "Oslo", "Lima", "Cairo", "Seoul", "Quito", "Perth", "Dakar"],
          "heldout": ["Hanoi", "Tunis", "Bergen", "Cusco"]}
UNITS = [("km", "mi"), ("kg", "lb"), ("m", "ft"), ("l", "gal")]
TABLES = ["orders", "users", "flights", "books"]
FIELDS = ["status", "country", "author", "origin"]
WORDS = ["amber", "basil", "cedar", "delta", "ember", "fjord", "gamma", "harbor", "iris",
         "juniper", "kelp", "lotus", "maple", "nectar", "onyx", "pepper", "quartz", "raven"]

PHRASES = {
    "train": {
        "weather": ["What's the weather in {city} for the next {days} days? Use {unit}.",
                    "Give me a {days}-day forecast for {city} in {unit}."],
        "calc": ["Use the calculator for {expr}.", "Please compute {expr} with the calculator."],
        "convert": ["Convert {value} {src} to {dst}.", "How many {dst} is {value} {src}?"],
        "lookup": ["Find up to {limit} {table} where {field} is {value}.",
                   "Show {limit} rows of {table} with {field} = {value}."],
        "add": ["What is {a} plus {b}?", "Add {a} and {b}.", "Sum {a} and {b}, please."],
        "sub": ["What is {a} minus {b}?", "Subtract {b} from {a}."],
        "reverse": ["Reverse the word {w}.", "Spell {w} backwards."],
        "recall": ["What is the value of {k}?", "Which number belongs to {k}?"],
    },
    "heldout": {
        "weather": ["I'm going to {city}: forecast for {days} days please, {unit}."],
        "calc": ["Could the calculator work out {expr}?"],
        "convert": ["I have {value} {src}; what is that in {dst}?"],
        "lookup": ["Query {table}: {field} equal to {value}, at most {limit} results."],
        "add": ["If I have {a} and get {b} more, how many do I have?"],
        "sub": ["Take {b} away from {a}. What is left?"],
        "reverse": ["Write {w} in reverse order."],
        "recall": ["Tell me the number stored under {k}."],
        "book": ["Book {restaurant} for {size}{where}; {note}."],
    },
}


@dataclass
class Episode:
    """One conversation: OpenAI messages (assistant turns carry reasoning_content), the tools
    offered, and what it tests ("tool", "arith", "string", "recall")."""

    kind: str
    messages: list[dict]
    tools: list[dict] | None = None
    meta: dict = field(default_factory=dict)


def in_split(split: str, *key) -> bool:
    """Whether a number pair (or any key) belongs to `split`: one in eight is held out."""
    h = sum((i + 1) * (v * 2654435761 % 2**32) for i, v in enumerate(key))  # stable, unlike hash
    return (h % 8 == 0) == (split == "heldout")


def _ask(rng, split, skill, **kw) -> dict:
    return {"role": "user", "content": rng.choice(PHRASES[split][skill]).format(**kw)}


def _say(reasoning: str, content: str = "", calls: list[dict] | None = None) -> dict:
    msg = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if calls:
        msg["tool_calls"] = [{"type": "function", "function": c} for c in calls]
    return msg


def _digits(a: int, b: int, op: str) -> str:
    """Column-by-column reasoning, least significant digit first."""
    steps, carry, out = [], 0, []
    da, db = str(a)[::-1], str(b)[::-1]
    for i in range(max(len(da), len(db))):
        x, y = int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0
        if op == "+":
            s = x + y + carry
            steps.append(f"{x}+{y}+{carry}={s}")
            out.append(s % 10)
            carry = s // 10
        else:
            s = x - y - carry
            carry = int(s < 0)
            steps.append(f"{x}-{y}={s + 10 * carry}{' borrow' if carry else ''}")
            out.append(s + 10 * carry)
    if carry and op == "+":
        out.append(carry)
    return "; ".join(steps)


def arithmetic(rng: random.Random, split: str) -> Episode:
    """a + b or a − b (a ≥ b) with 2–4 digit operands, answered after column reasoning."""
    while True:
        a, b = rng.randint(10, 9999), rng.randint(10, 9999)
        if in_split(split, a, b):
            break
    op = rng.choice("+-")
    if op == "-" and b > a:
        a, b = b, a
    ans = a + b if op == "+" else a - b
    q = _ask(rng, split, "add" if op == "+" else "sub", a=a, b=b)
    why = f"{a} {op} {b}, column by column: {_digits(a, b, op)}. So it is {ans}."
    return Episode("arith", [q, _say(why, str(ans))], meta={"a": a, "b": b, "op": op,
                                                              "answer": ans})


def string_task(rng: random.Random, split: str) -> Episode:
    """Reverse a word, letter by letter."""
    w = rng.choice(WORDS) + rng.choice(WORDS)[:rng.randint(0, 3)]
    q = _ask(rng, split, "reverse", w=w)
    why = f"The letters of {w} are {' '.join(w)}; backwards: {' '.join(reversed(w))}."
    return Episode("string", [q, _say(why, w[::-1])], meta={"answer": w[::-1]})


def _call(rng: random.Random, split: str) -> tuple[dict, dict, str]:
    """(user message, the call it asks for, a JSON result)."""
    skill = rng.choice(["weather", "calc", "convert", "lookup"] + ["book"] * (split == "heldout"))
    if skill == "weather":
        city, days, metric = rng.choice(CITIES[split]), rng.randint(1, 7), rng.random() < .5
        user = _ask(rng, split, "weather", city=city, days=days,
                    unit="celsius" if metric else "fahrenheit")
        call = {"name": "get_weather", "arguments": {"city": city, "days": days,
                                                     "metric": metric}}
        result = {"city": city, "high": rng.randint(-5, 35), "sky": rng.choice(["sun", "rain"])}
    elif skill == "calc":
        expr = f"{rng.randint(2, 99)} * {rng.randint(2, 99)} + {rng.randint(1, 999)}"
        user = _ask(rng, split, "calc", expr=expr)
        call = {"name": "calculator", "arguments": {"expression": expr}}
        result = {"result": eval(expr, {"__builtins__": {}})}  # our own digits and operators
    elif skill == "convert":
        (src, dst), value = rng.choice(UNITS), rng.randint(1, 500)
        user = _ask(rng, split, "convert", value=value, src=src, dst=dst)
        call = {"name": "convert_units", "arguments": {"value": value, "from_unit": src,
                                                       "to_unit": dst}}
        result = {"value": round(value * rng.uniform(0.2, 3.5), 2), "unit": dst}
    elif skill == "lookup":
        table, fld, val, limit = (rng.choice(TABLES), rng.choice(FIELDS), rng.choice(WORDS),
                                  rng.randint(1, 20))
        user = _ask(rng, split, "lookup", table=table, field=fld, value=val, limit=limit)
        call = {"name": "lookup", "arguments": {"table": table, "filter": {"field": fld,
                                                                           "equals": val},
                                                "limit": limit}}
        result = {"rows": rng.randint(0, limit)}
    else:
        name, size, out = rng.choice(WORDS).title() + " Bistro", rng.randint(1, 12), \
            rng.random() < .5
        note = rng.choice(["no extra requests", "a high chair needed"])
        opts = {"high_chair": note.endswith("needed")}
        user = _ask(rng, split, "book", restaurant=name, size=size,
                    where=" outside" if out else " inside", note=note)
        call = {"name": "book_table", "arguments": {"restaurant": name, "party_size": size,
                                                    "outdoor": out, "options": opts}}
        result = {"confirmed": True, "table": rng.randint(1, 40)}
    return user, call, json.dumps(result)


def tool_use(rng: random.Random, split: str) -> Episode:
    """Ask → reasoning + one typed tool call → the tool's result → an answer that uses it."""
    tools = TOOLS["train"] + (TOOLS["heldout"] if split == "heldout" else [])
    user, call, result = _call(rng, split)
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in call["arguments"].items())
    msgs = [user, _say(f"This needs {call['name']} with {args}.", calls=[call]),
            {"role": "tool", "content": result},
            _say("The tool answered; I report its result.", f"Result: {result}")]
    return Episode("tool", msgs, tools, meta={"call": call})


def recall(rng: random.Random, split: str, pairs: int, questions: int,
           far_fraction: float = 0.5) -> Episode:
    """A user message listing `pairs` key = value lines, then `questions` turns each asking one
    key from the first `far_fraction` of the list (far behind the question: with enough pairs,
    beyond the sliding window, so only the full-attention layers can answer)."""
    keys = rng.sample(range(1000, 10000), pairs)
    vals = [rng.randint(1000, 9999) for _ in keys]
    doc = "\n".join(f"K{k} = {v}" for k, v in zip(keys, vals))
    msgs: list[dict] = [{"role": "user", "content": "Remember these values.\n" + doc},
                        _say("I will keep the list in mind.", "Ready.")]
    far = max(1, int(pairs * far_fraction))
    asked = rng.sample(range(far), min(questions, far))  # a short list gets fewer questions
    for i in asked:
        msgs.append(_ask(rng, split, "recall", k=f"K{keys[i]}"))
        msgs.append(_say(f"K{keys[i]} was in the list.", str(vals[i])))
    return Episode("recall", msgs, meta={"asked": [f"K{keys[i]}" for i in asked],
                                         "answers": [vals[i] for i in asked]})


def episodes(seed: int, n: int, split: str = "train", recall_pairs: int = 400,
             recall_questions: int = 16, mix=(("tool", 4), ("arith", 3), ("string", 1),
                                              ("recall", 1))):
    """`n` episodes of `split` drawn with the weights of `mix`, reproducible from `seed`.
    Raises ValueError for an unknown split."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {SPLITS}")
    rng = random.Random(f"{seed}/{split}")
    kinds, weights = zip(*mix)
    out = []
    for _ in range(n):
        kind = rng.choices(kinds, weights)[0]
        out.append(arithmetic(rng, split) if kind == "arith" else
                   string_task(rng, split) if kind == "string" else
                   tool_use(rng, split) if kind == "tool" else
                   recall(rng, split, recall_pairs, recall_questions))
    return out


def supervised(ep: Episode, tokenizer) -> tuple[list[int], list[bool]]:
    """(token ids of the whole rendered episode, per-token train mask): True on each assistant
    turn's output (reasoning, `</think>`, content, tool calls) and on the stop token after it
    (the next role marker, or `<|endoftext|>` after the last turn; episodes end with an
    answer). Rendered with
    clear_thinking=False so every turn keeps its reasoning, as the model sees its current turn.
    Raises ValueError when an assistant turn has no reasoning (its output could not be told
    from the template's)."""
    from flint_graph.chat_template import render_chat

    tpl = tokenizer.chat_template
    ids: list[int] = []
    mask: list[bool] = []
    done = ""
    for i, m in enumerate(ep.messages):
        if m["role"] != "assistant":
            continue
        if not m.get("reasoning_content"):
            raise ValueError(f"message {i}: an assistant turn without reasoning")
        prompt = render_chat(tpl, ep.messages[:i], ep.tools, clear_thinking=False)
        full = render_chat(tpl, ep.messages[:i + 1], ep.tools, add_generation_prompt=False,
                           clear_thinking=False)
        assert prompt.startswith(done) and full.startswith(prompt), "template is not prefix-stable"
        between = tokenizer.encode(prompt[len(done):])
        ids += between  # its first token ends the previous turn: the stop token to learn
        mask += [bool(done) and j == 0 for j in range(len(between))]
        out = tokenizer.encode(full[len(prompt):])
        ids += out
        mask += [True] * len(out)
        done = full
    ids.append(tokenizer.token_id("<|endoftext|>"))  # after the final answer
    mask.append(True)
    return ids, mask


def tokenizer_corpus(n: int = 4000, seed: int = 0) -> list[str]:
    """Text to train flint-nano's tokenizer on: `n` rendered training episodes (GLM-4.7
    template, short recall lists) plus the built-in general corpus, so chat outside the
    curriculum still tokenizes compactly."""
    from flint_graph.chat_template import GLM47_CHAT_TEMPLATE, render_chat
    from flint_graph.tokenizer import build_corpus

    texts = [render_chat(GLM47_CHAT_TEMPLATE, ep.messages, ep.tools, add_generation_prompt=False,
                         clear_thinking=False)
             for ep in episodes(seed, n, "train", recall_pairs=8, recall_questions=4)]
    return texts + build_corpus(4096, seed)
