"""The synthetic curriculum flint-nano learns from (issue 11), made by our own code: chat
episodes in OpenAI message form, each assistant turn with `<think>` reasoning.

Skills: tool calls with typed arguments (string, integer, boolean, object) and the tool's result
fed back; multi-digit addition and subtraction answered after digit-by-digit reasoning; short
string tasks; long-context key-value recall where every asked key lies far behind the question,
with many questions per episode (many supervised answers per sequence); greetings and small
talk answered briefly with what the model can do, requests outside its skills refused, and the
skills asked as people type them (nano/phrasings.py: weather questions without a unit or day
count, unit names spelled out, word problems, terse forms, typos).

`split="train"` and `split="heldout"` never share a phrasing, a tool or a number pair (a pair's
split is a hash of it), so the eval measures generalisation, not recall of the training set.
`supervised(episode, tokenizer)` renders an episode with the chat template and marks the tokens
a model is trained on: every assistant turn's output and the stop token after it.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from flint_graph.nano import phrasings as ph

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

# A request is LEAD + CORE + TAIL. Every core is seen in training; the held-out split uses lead-ins
# and closings training never sees, so held-out phrasings are new sentences around known requests.
LEADS = {"train": ["", "", "Hi! ", "Quick question: ", "Please help. ", "Hello. ", "Hey, ",
                   "OK. ", "Question: ", "I need this: ", "Can you help? ",
                   # natural openings (eighteenth session: step 6517 answered 5 of its 12
                   # held-out arithmetic misses with a tool call or a refusal after "Good
                   # morning!" or "Sorry to bother you.", openings it had never seen)
                   "Good evening! ", "Excuse me, ", "Hello there. ", "Also, ", "Next: ",
                   "Apologies for asking again. ", "Hey there! ", "Another one: "],
         "heldout": ["Good morning! ", "One more thing: ", "Sorry to bother you. "]}
TAILS = {"train": ["", "", " Thanks.", " Thank you!", " Please be quick.", " Thanks, friend.",
                   " I appreciate it.", " Thanks heaps.", " Thanks a lot!",
                   " Grateful for the help.", " Have a nice day."],
         "heldout": [" Much obliged.", " Many thanks in advance."]}
CORES = {
    "weather": ["What's the weather in {city} for the next {days} days? Use {unit}.",
                "Give me a {days}-day forecast for {city} in {unit}.",
                "I'm going to {city}: forecast for {days} days please, {unit}.",
                "Forecast for {city}, {days} days, in {unit}."],
    "calc": ["Use the calculator for {expr}.", "Please compute {expr} with the calculator.",
             "Could the calculator work out {expr}?", "Calculator: {expr}"],
    # products and quotients asked in words (training only): the calculator where one is
    # offered, else the refusal (`times_refusal`); a new user's "What is 12 times 13?" got
    # -12 from step 7718, which had seen multiplication only next to the word "calculator"
    "mul": ["What is {a} times {b}?", "Multiply {a} by {b}.", "How much is {a} times {b}?",
            "What's {a} multiplied by {b}?", "{a} x {b} = ?"],
    "div": ["What is {a} divided by {b}?", "Divide {a} by {b}.",
            "How much is {a} divided by {b}?"],
    "convert": ["Convert {value} {src} to {dst}.", "How many {dst} is {value} {src}?",
                "I have {value} {src}; what is that in {dst}?"],
    "lookup": ["Find up to {limit} {table} where {field} is {value}.",
               "Show {limit} rows of {table} with {field} = {value}.",
               "Query {table}: {field} equal to {value}, at most {limit} results."],
    "generic": ["Use {tool} with {args}.", "Call {tool}: {args}.", "Please run {tool} for {args}.",
                "{tool} with {args}, please."],
    "add": ["What is {a} plus {b}?", "Add {a} and {b}.", "Sum {a} and {b}, please.",
            "Compute {a} + {b}.", "How much is {a} plus {b}?", "{a} + {b} = ?",
            "If I have {a} and get {b} more, how many do I have?", "Add {b} to {a}."],
    "sub": ["What is {a} minus {b}?", "Subtract {b} from {a}.", "Compute {a} - {b}.",
            "Take {b} away from {a}. What is left?", "How much is {a} minus {b}?",
            "{a} - {b} = ?", "If I have {a} and give away {b}, how many are left?"],
    "reverse": ["Reverse the word {w}.", "Spell {w} backwards.", "Write {w} in reverse order.",
                "What is {w} backwards?"],
    "repeat": ["Repeat these words: {ws}.", "Say back exactly: {ws}", "Echo the words {ws}.",
               "Copy this word list: {ws}"],
    "recall": ["What is the value of {k}?", "Which number belongs to {k}?",
               "Tell me the number stored under {k}.", "What was {k}?", "{k}?",
               "Look up {k} in the list."],
}


def phrase(rng: random.Random, split: str, skill: str, **kw) -> str:
    """A request for `skill` in `split`'s phrasing: a lead-in, a core sentence, a closing.
    Training replaces the lead-in or the closing by a sentence of coined words a third of the
    time, so words around a request that the model has never seen do not derail it (held-out
    closings like "Many thanks in advance." did)."""
    lead, core, tail = rng.choice(LEADS[split]), rng.choice(CORES[skill]), rng.choice(TAILS[split])
    core = _typos(rng, split, core)
    if split == "train" and rng.random() < 1 / 3:
        if rng.random() < .5:
            lead = _filler(rng) + " "
        else:
            tail = " " + _filler(rng)
    return lead + core.format(**kw) + tail


def _typos(rng: random.Random, split: str, template: str) -> str:
    """In training, one typo in a template word (phrasings.typo) for TYPO_RATE of requests;
    held-out requests are left as written (their rng draws stay those of the shipped reports)."""
    if split == "train" and rng.random() < ph.TYPO_RATE:
        return ph.typo(rng, template)
    return template


def _wrapped(rng: random.Random, split: str, text: str) -> str:
    """`text` with a lead-in and a closing of `split` half the time."""
    if rng.random() < .5:
        return text
    return rng.choice(LEADS[split]) + text + rng.choice(TAILS[split])


def _filler(rng: random.Random) -> str:
    words = [coined(rng) for _ in range(rng.randint(2, 6))]
    return " ".join(words).capitalize() + rng.choice(".!?")


@dataclass
class Episode:
    """One conversation: OpenAI messages (assistant turns carry reasoning_content), the tools
    offered, and what it tests ("tool", "arith", "string", "repeat", "recall", "remember"; a
    chain is its second request's kind)."""

    kind: str
    messages: list[dict]
    tools: list[dict] | None = None
    meta: dict = field(default_factory=dict)


def in_split(split: str, *key) -> bool:
    """Whether a number pair (or any key) belongs to `split`: one in eight is held out."""
    h = sum((i + 1) * (v * 2654435761 % 2**32) for i, v in enumerate(key))  # stable, unlike hash
    return (h % 8 == 0) == (split == "heldout")


def _ask(rng, split, skill, **kw) -> dict:
    return {"role": "user", "content": phrase(rng, split, skill, **kw)}


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
            borrow_in, carry = carry, int(s < 0)
            steps.append(f"{x}-{y}-{borrow_in}={s + 10 * carry}{' borrow' if carry else ''}")
            out.append(s + 10 * carry)
    if carry and op == "+":
        out.append(carry)
    return "; ".join(steps)


def compare(a: int, b: int) -> str:
    """The reasoning that opens every subtraction: which operand is larger, decided where a
    small model can read it (the digit counts, else the first digits that differ, most
    significant first). Without it the choice between "a - b" and "the answer is negative"
    fell on the first reasoning token, and step 6517 answered 460 - 674 with 9786 (10000 - 214)
    in every held-out negative case."""
    sa, sb = str(a), str(b)
    if len(sa) != len(sb):
        why = f"{len(sa)} digits {'>' if len(sa) > len(sb) else '<'} {len(sb)} digits"
    else:
        x, y = next(((x, y) for x, y in zip(sa, sb) if x != y), (None, None))
        if x is None:
            return f"Compare {a} and {b}: they are equal."
        why = f"{x} {'>' if x > y else '<'} {y}"
    return f"Compare {a} and {b}: {why}, so {max(a, b)} is larger."


def subtraction_reasoning(a: int, b: int) -> str:
    """Column reasoning for a - b (either order), after `compare`; a negative answer is worked
    as b - a and then negated."""
    if a < b:
        return (f"{compare(a, b)} The answer is negative: {b} - {a}, column by column: "
                f"{_digits(b, a, '-')}. So it is {a - b}.")
    return f"{compare(a, b)} {a} - {b}, column by column: {_digits(a, b, '-')}. So it is {a - b}."


OPERAND_DIGITS = (1, 2, 3, 3, 3, 4, 4)  # drawn per operand; 3 digits (the eval's) most often


def arithmetic(rng: random.Random, split: str, digits: int | None = None,
               op: str | None = None, negative: bool | None = None) -> Episode:
    """a + b or a − b (a ≥ b, or in training now and then a < b with a negative answer),
    answered after column reasoning. Each operand's length is drawn
    from OPERAND_DIGITS (a uniform draw over 10..9999 would make nine in ten operands 4-digit
    and under-train the rest), or both have `digits` digits; `op` "+" or "-" (default: drawn).
    `negative=True` asks a − b with a < b (the eval's held-out negative differences; pass
    op="-")."""
    def draw() -> int:
        d = digits or rng.choice(OPERAND_DIGITS)
        return rng.randint(10 ** (d - 1), 10 ** d - 1)

    while True:
        a, b = draw(), draw()
        if in_split(split, a, b) and (not negative or a < b):
            break
    op = op or rng.choice("+-")
    # 40% of the training subtractions with a < b keep it, answered negative (250 - 750 gave
    # 500 before); the held-out split draws nothing more, so its cases stay the same
    if negative is None:
        negative = split == "train" and op == "-" and b > a and rng.random() < 0.4
    if op == "-" and b > a and not negative:
        a, b = b, a
    ans = a + b if op == "+" else a - b
    q = _ask(rng, split, "add" if op == "+" else "sub", a=a, b=b)
    if op == "-":
        why = subtraction_reasoning(a, b)
    else:
        why = f"{a} {op} {b}, column by column: {_digits(a, b, op)}. So it is {ans}."
    return Episode("arith", [q, _say(why, str(ans))], meta={"a": a, "b": b, "op": op,
                                                              "answer": ans})


def string_task(rng: random.Random, split: str) -> Episode:
    """Reverse a word, letter by letter."""
    w = rng.choice(WORDS) + rng.choice(WORDS)[:rng.randint(0, 3)]
    q = _ask(rng, split, "reverse", w=w)
    why = f"The letters of {w} are {' '.join(w)}; backwards: {' '.join(reversed(w))}."
    return Episode("string", [q, _say(why, w[::-1])], meta={"answer": w[::-1]})


def repeat_task(rng: random.Random, split: str) -> Episode:
    """Repeat a list of 3-8 words (lead_word) exactly: trains writing every lead token, which
    copying a name the model has never seen needs."""
    words = [lead_word(rng) for _ in range(rng.randint(3, 8))]
    q = _ask(rng, split, "repeat", ws=" ".join(words))
    return Episode("repeat", [q, _say("Word by word: " + ", ".join(words) + ".", " ".join(words))],
                   meta={"answer": " ".join(words)})


def word_problem(rng: random.Random, split: str, digits: int | None = None,
                 op: str | None = None) -> Episode:
    """a + b or a − b (a ≥ b) asked as a word problem or a terse form (phrasings.WORD_PROBLEMS),
    answered as `arithmetic` answers: column reasoning, then the number alone. Operands as
    `arithmetic` draws them (`digits` for both, default OPERAND_DIGITS), pairs of `split`."""
    def draw() -> int:
        d = digits or rng.choice(OPERAND_DIGITS)
        return rng.randint(10 ** (d - 1), 10 ** d - 1)

    op = op or rng.choice("+-")
    while True:
        a, b = draw(), draw()
        if op == "-" and b > a:
            a, b = b, a
        if in_split(split, a, b):
            break
    ans = a + b if op == "+" else a - b
    name, pron = rng.choice(ph.NAMES[split])
    tpl = _typos(rng, split, rng.choice(ph.WORD_PROBLEMS[(split, op)]))
    text = tpl.format(a=a, b=b, name=name, pron=pron, things=rng.choice(ph.THINGS[split]))
    why = (subtraction_reasoning(a, b) if op == "-" else
           f"{a} {op} {b}, column by column: {_digits(a, b, op)}. So it is {ans}.")
    return Episode("arith", [{"role": "user", "content": _wrapped(rng, split, text)},
                             _say(why, str(ans))],
                   meta={"a": a, "b": b, "op": op, "answer": ans})


def greeting(rng: random.Random, split: str) -> Episode:
    """A greeting or small talk (phrasings.GREETINGS), answered briefly: for hello, how and
    who with what the model can do (phrasings.CAN); never a tool call, tools offered or not."""
    intent = rng.choice(list(ph.GREETINGS))
    text = _typos(rng, split, rng.choice(ph.GREETINGS[intent][split]))
    why, answer = ph.GREETING_REPLIES[intent]
    return Episode("greet", [{"role": "user", "content": text}, _say(why, answer)],
                   meta={"intent": intent, "answer": answer})


def out_of_scope(rng: random.Random, split: str) -> Episode:
    """A request outside the skills (phrasings.OUT_OF_SCOPE), refused in one sentence that says
    what the model can do (phrasings.REFUSAL) instead of invented text or an invented tool."""
    pool = ph.MADE_REQUESTS if split == "train" and rng.random() < 0.5 else \
        ph.OUT_OF_SCOPE[split]
    text = _wrapped(rng, split, _typos(rng, split, rng.choice(pool)))
    return Episode("refuse", [{"role": "user", "content": text},
                              _say("This is outside what I can do.", ph.REFUSAL)],
                   meta={"answer": ph.REFUSAL})


def _when(rng: random.Random, split: str) -> tuple[str, int]:
    """A time phrase and the day count it asks for (phrasings.WHEN; in training a third of the
    time phrasings.WHEN_TRAIN, drawn so that the held-out cases stay the same)."""
    table = ph.WHEN_TRAIN if split == "train" and rng.random() < 1 / 3 else ph.WHEN
    when, days = rng.choice(table)
    if days is None:
        days = rng.randint(2, 7)
        when = when.format(n=days)
    return when, days


CITY_PREFIXES = ["New", "San", "Port", "Saint", "Las", "El", "Fort", "Lake", "Cape", "Santa"]


def _city(rng: random.Random, split: str) -> str:
    """A city: in training half the time a coined one, a quarter of those two words ("Port
    Zelan", "Kasu Miro"): step 6517 had seen one-word cities only and wrote "New low" for New
    York. The held-out split draws as before (its cases stay the same)."""
    if split != "train" or rng.random() >= .5:
        return rng.choice(CITIES[split])
    if rng.random() < .25:
        first = rng.choice(CITY_PREFIXES) if rng.random() < .5 else coined(rng).title()
        return f"{first} {coined(rng).title()}"
    return coined(rng).title()


def weather_ask(rng: random.Random, split: str) -> tuple[dict, dict, dict]:
    """(user message, get_weather call, result): weather asked as people ask it
    (phrasings.WEATHER): days from the time phrase (today 1, tomorrow 2, the weekend 3, this
    week 7, the next n days n; in training a quarter of the time none, phrasings.WEATHER_NOW:
    1), metric unless fahrenheit is asked for."""
    city, (when, days) = _city(rng, split), _when(rng, split)
    text = _typos(rng, split, rng.choice(ph.WEATHER[split])).format(city=city, when=when)
    if split == "train" and rng.random() < .25:  # no time said: today (the held-out draws stay)
        text, days = _typos(rng, split, rng.choice(ph.WEATHER_NOW)).format(city=city), 1
    unit = rng.choice(["", "", "celsius", "fahrenheit"])
    if unit:
        text += rng.choice(ph.WEATHER_UNIT[split]).format(unit=unit)
    call = {"name": "get_weather", "arguments": {"city": city, "days": days,
                                                 "metric": unit != "fahrenheit"}}
    result = {"city": city, "high": rng.randint(-5, 35), "sky": rng.choice(["sun", "rain"])}
    return {"role": "user", "content": _wrapped(rng, split, text)}, call, result


def convert_ask(rng: random.Random, split: str) -> tuple[dict, dict, dict]:
    """(user message, convert_units call, result): a conversion with the units named as people
    name them (phrasings.UNIT_NAMES), either direction of a UNITS pair; the call takes the
    symbols."""
    src, dst = rng.choice(UNITS)
    if rng.random() < .5:
        src, dst = dst, src
    value = rng.randint(1, 500)
    tpl = _typos(rng, split, rng.choice(ph.CONVERT[split]))
    text = tpl.format(value=value, src=rng.choice(ph.UNIT_NAMES[src]),
                      dst=rng.choice(ph.UNIT_NAMES[dst]))
    call = {"name": "convert_units", "arguments": {"value": value, "from_unit": src,
                                                   "to_unit": dst}}
    result = {"value": round(value * rng.uniform(0.2, 3.5), 2), "unit": dst}
    return {"role": "user", "content": _wrapped(rng, split, text)}, call, result


# Generated tools (training only) teach reading a schema: random names, parameters and types,
# asked for in the generic style ("Use NAME with PARAM VALUE, ..."). None of their words is the
# held-out tool's.
VERBS = ["get", "set", "find", "send", "create", "check", "list", "order", "reserve", "schedule",
         "cancel", "track", "update", "rate"]
NOUNS = ["invoice", "ticket", "parcel", "meeting", "alarm", "playlist", "recipe", "ride", "room",
         "payment", "reminder", "score", "song", "flight", "coupon"]
PARAMS = ["name", "count", "date", "priority", "urgent", "notes", "amount", "label", "tags",
          "private", "size", "level", "config", "email", "quantity", "express", "details",
          "max_items", "dry_run", "user_name", "retry_count", "extra", "owner", "color",
          "is_public", "seat_count", "settings", "title"]
_O = {"type": "object"}
_TYPES = [_S, _I, _B, _O]


# Coined words (training only) make the model copy strings it has never seen: a city, a tool or
# parameter name, a value. Trained on a few fixed cities and names only, it wrote "Paris" for
# every held-out city and invented training tool names for the held-out tool.
_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr",
           "st", "gl", "sh", "ch")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "y")
_CODAS = ("", "", "n", "r", "s", "l", "x", "nd")
# what the held-out split asks for: coined words never spell one of these
HELDOUT_WORDS = frozenset({c.lower() for c in CITIES["heldout"]} | {
    "book", "table", "book_table", "restaurant", "party", "party_size", "outdoor", "options"})


_PIECES: list[str] = []
_LEADS: list[str] = []


def coin_from(pieces, leads=()) -> None:
    """Coin half of the words from `pieces` (a tokenizer's word pieces,
    FlintTokenizer.word_pieces()) from now on in this process, each word starting with one of
    `leads` (FlintTokenizer.word_pieces(leading_space=True)) when given. Held-out names are
    spelled with tokens that the curriculum's own words never show, and a model cannot copy a
    token it has never been trained to write: before leads, 1,098 of the 1,568 lead tokens
    (" book") were never a training target, and the held-out tool book_table came out as
    "ward_table" in the reasoning."""
    _PIECES[:] = sorted(set(pieces))
    _LEADS[:] = sorted(set(leads))


def coined(rng: random.Random, syllables: tuple[int, int] = (1, 3)) -> str:
    """A made-up lower-case word, none of HELDOUT_WORDS: pronounceable syllables, or (after
    coin_from, half the time) one or two vocabulary pieces, the first a lead piece."""
    while True:
        if _PIECES and rng.random() < .5:
            w = rng.choice(_LEADS or _PIECES) + (rng.choice(_PIECES) if rng.random() < .5 else "")
        else:
            w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS)
                        for _ in range(rng.randint(*syllables))) + rng.choice(_CODAS)
        if w not in HELDOUT_WORDS:
            return w


def lead_word(rng: random.Random) -> str:
    """A word for the repeat task: a lead piece drawn uniformly (so every lead token is
    written often), with a vocabulary piece after it half the time; none of HELDOUT_WORDS.
    Before coin_from, a coined word."""
    while _LEADS:
        w = rng.choice(_LEADS) + (rng.choice(_PIECES) if rng.random() < .5 else "")
        if w not in HELDOUT_WORDS:
            return w
    return coined(rng)


def _name(rng: random.Random, split: str) -> str:
    """A place or value name: from WORDS, or (training, half the time) coined."""
    if split == "train" and rng.random() < .5:
        return " ".join(coined(rng).title() for _ in range(rng.randint(1, 2)))
    return rng.choice(WORDS).title() + rng.choice(["", " " + rng.choice(WORDS).title()])


def generated_tool(rng: random.Random, taken: tuple[str, ...] = ()) -> dict:
    """A random tool: verb_noun name (not in `taken`, nor a fixed or held-out tool's), each
    part from VERBS/NOUNS or coined; 1-4 parameters named from PARAMS or coined, of random
    types, all required."""
    def part(words):
        return rng.choice(words) if rng.random() < .5 else coined(rng, (1, 2))

    fixed = {t["function"]["name"] for s in SPLITS for t in TOOLS[s]}
    name = next(n for n in iter(lambda: f"{part(VERBS)}_{part(NOUNS)}", None)
                if n not in taken and n not in fixed and n not in HELDOUT_WORDS)
    names: list[str] = []
    count = rng.randint(1, 4)
    while len(names) < count:
        p = rng.choice(PARAMS) if rng.random() < .5 else "_".join(
            coined(rng, (1, 2)) for _ in range(rng.randint(1, 2)))
        if p not in names and p not in HELDOUT_WORDS:
            names.append(p)
    props = {p: rng.choice(_TYPES) for p in names}
    return _tool(name, f"{name.split('_')[0].title()} a {name.split('_')[1]}.", props,
                 list(props))


def _value(rng: random.Random, split: str, schema: dict):
    kind = schema["type"]
    if kind == "string":
        return _name(rng, split)
    if kind == "integer":
        return rng.randint(1, 500)
    if kind == "boolean":
        return rng.random() < .5
    return {k: rng.choice([rng.random() < .5, rng.randint(1, 99), rng.choice(WORDS)])
            for k in rng.sample(WORDS, rng.randint(1, 2))}


def _spoken(v) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    return json.dumps(v) if isinstance(v, dict) else str(v)


def _generic(rng: random.Random, split: str, tool: dict) -> tuple[dict, dict]:
    """(user message, call) asking for `tool` in the generic style with random arguments."""
    fn = tool["function"]
    args = {k: _value(rng, split, sch) for k, sch in fn["parameters"]["properties"].items()}
    said = [f"{k.replace('_', ' ')} {_spoken(v)}" for k, v in args.items()]
    text = said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]
    return _ask(rng, split, "generic", tool=fn["name"], args=text), \
        {"name": fn["name"], "arguments": args}


def _in_words(rng: random.Random, split: str) -> tuple[str, dict]:
    """(the calculator's expression, the user message) of a product or an exact quotient asked
    in words (CORES "mul", "div")."""
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    if rng.random() < .5:
        return f"{a} * {b}", _ask(rng, split, "mul", a=a, b=b)
    return f"{a * b} / {b}", _ask(rng, split, "div", a=a * b, b=b)


def times_refusal(rng: random.Random) -> Episode:
    """A product or quotient asked in words with no tools offered (training only): outside the
    built-in skills (sums and differences), so the refusal, which names what it can do."""
    _, user = _in_words(rng, "train")
    return Episode("refuse", [user, _say("This is outside what I can do.", ph.REFUSAL)],
                   meta={"answer": ph.REFUSAL, "no_tools": True})


def _call(rng: random.Random, split: str, extra: list[dict]) -> tuple[dict, dict, str]:
    """(user message, the call it asks for, a JSON result); `extra` are generated tools
    offered besides the fixed ones (training asks for one of them half the time)."""
    skills = ["weather", "calc", "convert", "lookup"] + (["book"] if split == "heldout" else
                                                         ["generic"] * 4 * bool(extra))
    skill = rng.choice(skills)
    if skill in ("weather", "convert") and split == "train" and rng.random() < .5:
        user, call, result = (weather_ask if skill == "weather" else convert_ask)(rng, split)
        return user, call, json.dumps(result)
    if skill == "weather":
        city = (coined(rng).title() if split == "train" and rng.random() < .5 else
                rng.choice(CITIES[split]))
        days, metric = rng.randint(1, 7), rng.random() < .5
        user = _ask(rng, split, "weather", city=city, days=days,
                    unit="celsius" if metric else "fahrenheit")
        call = {"name": "get_weather", "arguments": {"city": city, "days": days,
                                                     "metric": metric}}
        result = {"city": city, "high": rng.randint(-5, 35), "sky": rng.choice(["sun", "rain"])}
    elif skill == "calc":
        if split == "train" and rng.random() < .5:
            expr, user = _in_words(rng, split)
        else:
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
        table, fld = rng.choice(TABLES), rng.choice(FIELDS)
        val = coined(rng) if split == "train" and rng.random() < .5 else rng.choice(WORDS)
        limit = rng.randint(1, 20)
        user = _ask(rng, split, "lookup", table=table, field=fld, value=val, limit=limit)
        call = {"name": "lookup", "arguments": {"table": table, "filter": {"field": fld,
                                                                           "equals": val},
                                                "limit": limit}}
        result = {"rows": rng.randint(0, limit)}
    else:
        tool = TOOLS["heldout"][0] if skill == "book" else rng.choice(extra)
        user, call = _generic(rng, split, tool)
        result = {"ok": True, "id": rng.randint(100, 999)}
    return user, call, json.dumps(result)


def tool_use(rng: random.Random, split: str) -> Episode:
    """Ask → reasoning + one typed tool call → the tool's result → an answer that uses it.
    Training offers the fixed tools plus 1-2 generated ones; held-out, the fixed ones plus
    `book_table`, which training never sees."""
    tools = offered_tools(rng, split)
    extra = tools[len(TOOLS["train"]):] if split == "train" else []
    user, call, result = _call(rng, split, extra)
    args = ", ".join(f"{k}={json.dumps(v)}" for k, v in call["arguments"].items())
    said = _say(f"This needs {call['name']} with {args}.", calls=[call])
    if split == "train" and rng.random() < 0.3:
        # the call as an OpenAI-style client sends it back, without its reasoning: steps 6937
        # and 7718 renamed the first key of about half such results to "ok" (the generic
        # tools' key; eval --suite result). Held-out draws are untouched (no rng used there).
        # The template renders "" as it renders no reasoning at all; the call is then a
        # context turn (shown, not trained) and the answer to the result is what is trained.
        said["reasoning_content"] = ""
    msgs = [user, said, {"role": "tool", "content": result},
            _say("The tool answered; I report its result.", f"Result: {result}")]
    return Episode("tool", msgs, tools, meta={"call": call})


READY = "Ready."  # the reply to a list of values


def _key_values(rng: random.Random, pairs: int) -> tuple[list[int], list[int], dict]:
    """(keys, values, the user message listing them as "K1234 = 5678" lines)."""
    keys = rng.sample(range(1000, 10000), pairs)
    vals = [rng.randint(1000, 9999) for _ in keys]
    doc = "\n".join(f"K{k} = {v}" for k, v in zip(keys, vals))
    return keys, vals, {"role": "user", "content": "Remember these values.\n" + doc}


def remember(rng: random.Random, split: str) -> Episode:
    """A list of 2-40 key = value lines answered with READY after a short reasoning: what a
    recall episode shows as its (untrained) context turn, trained here on its own, so that in
    a chat the reply to a pasted list is READY and the question after it sees what training
    showed (in one sequence with the questions it could not be: chat drops an older turn's
    reasoning, training keeps it)."""
    pairs = rng.randint(2, 40)
    _, _, listing = _key_values(rng, pairs)
    return Episode("remember", [listing, _say(f"A list of {pairs} values to keep.", READY)])


def recall(rng: random.Random, split: str, pairs: int, questions: int,
           far_fraction: float = 0.5) -> Episode:
    """A user message listing `pairs` key = value lines, then `questions` turns each asking one
    key from the first `far_fraction` of the list (far behind the question: with enough pairs,
    beyond the sliding window, so only the full-attention layers can answer)."""
    keys, vals, listing = _key_values(rng, pairs)
    msgs: list[dict] = [listing, _say("", READY)]  # context, as chat shows an old turn
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
    Kinds: tool, arith, string, repeat, remember, recall (lists of `recall_pairs`),
    recall-short (4-40 pairs, 1-4 questions: a list a chat user pastes), greet (greetings and
    small talk), refuse (requests outside the skills), follow (a request that points back at
    the previous answer, `follow_up`) and chain. All but tool, recall and chain
    offer tools half the time and still answer directly, so a chat with tools declared does not
    turn every request into a call (a pasted list got a tool call). In training, a tool request
    for the weather or a conversion is asked as people ask it half the time (weather_ask,
    convert_ask) and an arith one as a word problem or terse form 40% of the time; half its
    calculator requests are a product or quotient in words, and 15% of its refusals one with
    no tools offered (`times_refusal`).
    Raises ValueError for an unknown split."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: expected one of {SPLITS}")
    rng = random.Random(f"{seed}/{split}")
    kinds, weights = zip(*mix)
    out = []
    for _ in range(n):
        kind = rng.choices(kinds, weights)[0]
        out.append(chain(rng, split) if kind == "chain" else
                   _draw(rng, split, kind, recall_pairs, recall_questions))
    return out


def _draw(rng: random.Random, split: str, kind: str, recall_pairs: int = 400,
          recall_questions: int = 16) -> Episode:
    if kind == "arith" and split == "train" and rng.random() < 0.4:
        kind = "word"
    ep = (arithmetic(rng, split) if kind == "arith" else
          word_problem(rng, split) if kind == "word" else
          greeting(rng, split) if kind == "greet" else
          (times_refusal(rng) if split == "train" and rng.random() < 0.15 else
           out_of_scope(rng, split)) if kind == "refuse" else
          string_task(rng, split) if kind == "string" else
          repeat_task(rng, split) if kind == "repeat" else
          tool_use(rng, split) if kind == "tool" else
          remember(rng, split) if kind == "remember" else
          recall(rng, split, rng.randint(4, 40), rng.randint(1, 4)) if kind == "recall-short" else
          follow_up(rng, split) if kind == "follow" else
          recall(rng, split, recall_pairs, recall_questions))
    if kind in ("arith", "word", "greet", "refuse", "string", "repeat", "remember",
                "recall-short") and not ep.meta.get("no_tools") and rng.random() < 0.5:
        ep.tools = offered_tools(rng, split)
    return ep


def older_turns(messages: list[dict]) -> list[dict]:
    """A finished request as a chat shows it later: its assistant turns without reasoning
    (the template then writes a bare `</think>`), so they are context, not trained."""
    return [dict(m, reasoning_content="") if m["role"] == "assistant" else m for m in messages]


# chains in training that are a greeting, then a tool request (the eval's phr-multi shape):
# step 9521, trained with the follow-ups, fell from 90% to 80% there (a request after a
# greeting refused, answered like a greeting or given an invented tool; docs/nano.md)
GREET_THEN_TOOL = 0.25


def chain(rng: random.Random, split: str) -> Episode:
    """Two or three requests in one conversation (tool use, arithmetic or a string task each;
    in training also a greeting or an out-of-scope request).
    The earlier ones are context, shown as a chat shows older turns (reasoning dropped, not
    trained); the last is trained. Without these, a second request in a chat got the first
    one's answer again, and with two requests only, a third often went wrong. The tools
    offered are all the requests' (the last one's alone if two generated tools clash by
    name)."""
    kinds = ("tool", "arith", "arith", "string") + (("greet", "refuse") if split == "train"
                                                    else ())
    if split == "train" and rng.random() < GREET_THEN_TOOL:
        reqs = [_draw(rng, split, "greet"), _draw(rng, split, "tool")]
    else:
        reqs = [_draw(rng, split, rng.choice(kinds)) for _ in range(rng.choice((2, 2, 3)))]
    last, tools = reqs[-1], {}
    for ep in reqs:
        for t in ep.tools or []:
            if tools.setdefault(t["function"]["name"], t) != t:
                return last
    history = [m for ep in reqs[:-1] for m in older_turns(ep.messages)]
    return Episode(last.kind, history + last.messages, list(tools.values()) or None,
                   meta=last.meta)


def follow_up(rng: random.Random, split: str, kind: str | None = None) -> Episode:
    """A request that points back at the previous answer (phrasings.FOLLOW_*): after a sum or
    difference, "that" / "it" / "the result" is its answer (add to it, subtract from it, double
    it), worked in the reasoning from "That is N, the last answer."; after a weather call or a
    conversion, "what about CITY" / "and VALUE UNIT" repeats the call with that one argument
    changed. The first request is context (`older_turns`), the follow-up is trained. Without
    these, step 8593 answered "Now subtract 100 from that." after 825 with 457 - 100, "Double
    it." with "You're welcome!" and "And what about Bergen?" with the refusal (a new user's
    trial, 2026-12-07). `kind` "arith" or "tool" picks one (default: arith 60% of the time)."""
    if kind is None:
        kind = "arith" if rng.random() < 0.6 else "tool"
    if kind == "arith":
        while True:
            first = arithmetic(rng, split)
            c = first.meta["answer"]
            if c > 0:  # "that" of a negative answer: not taught (column reasoning is for n ≥ 0)
                break
        op = rng.choice(("+", "-", "-", "x2"))
        d = c if op == "x2" else rng.randint(1, 10 ** rng.choice((1, 2, 3)) - 1)
        text = _typos(rng, split, rng.choice(ph.FOLLOW_ARITH[(split, op)])).format(b=d)
        that = f"That is {c}, the last answer. "
        if op == "-":
            why, ans = that + subtraction_reasoning(c, d), c - d
        else:
            double = "Double it: " if op == "x2" else ""
            ans = c + d
            why = (f"{that}{double}{c} + {d}, column by column: {_digits(c, d, '+')}. So it is "
                   f"{ans}.")
        msgs = older_turns(first.messages) + [
            {"role": "user", "content": _wrapped(rng, split, text)}, _say(why, str(ans))]
        tools = offered_tools(rng, split) if rng.random() < 0.5 else None
        return Episode("arith", msgs, tools, meta={"a": c, "b": d, "op": op, "answer": ans})
    weather = rng.random() < 0.6
    user, call, result = (weather_ask if weather else convert_ask)(rng, split)
    first = [user, _say(f"This needs {call['name']} with "
                        f"{', '.join(f'{k}={json.dumps(v)}' for k, v in call['arguments'].items())}.",
                        calls=[call]),
             {"role": "tool", "content": json.dumps(result)},
             _say("The tool answered; I report its result.", f"Result: {json.dumps(result)}")]
    args = dict(call["arguments"])
    if weather:
        while (city := _city(rng, split)) == args["city"]:
            pass
        args["city"] = city
        text = rng.choice(ph.FOLLOW_CITY[split]).format(city=city)
        result = {"city": city, "high": rng.randint(-5, 35), "sky": rng.choice(["sun", "rain"])}
    else:
        while (value := rng.randint(1, 500)) == args["value"]:
            pass
        args["value"] = value
        src = rng.choice(ph.UNIT_NAMES[args["from_unit"]])
        text = rng.choice(ph.FOLLOW_CONVERT[split]).format(value=value, src=src)
        result = {"value": round(value * rng.uniform(0.2, 3.5), 2), "unit": args["to_unit"]}
    again = {"name": call["name"], "arguments": args}
    said = _say(f"As before, for the new {'city' if weather else 'value'}: this needs "
                f"{call['name']} with {', '.join(f'{k}={json.dumps(v)}' for k, v in args.items())}.",
                calls=[again])
    msgs = older_turns(first) + [{"role": "user", "content": _wrapped(rng, split, text)}, said,
                                 {"role": "tool", "content": json.dumps(result)},
                                 _say("The tool answered; I report its result.",
                                      f"Result: {json.dumps(result)}")]
    return Episode("tool", msgs, offered_tools(rng, split), meta={"call": again})


def offered_tools(rng: random.Random, split: str) -> list[dict]:
    """The tools a request in `split` sees: the fixed ones plus 1-2 generated ones (training)
    or the held-out tool."""
    if split == "heldout":
        return TOOLS["train"] + TOOLS["heldout"]
    extra: list[dict] = []
    for _ in range(rng.randint(1, 2)):
        extra.append(generated_tool(rng, tuple(t["function"]["name"] for t in extra)))
    return TOOLS["train"] + extra


def supervised(ep: Episode, tokenizer) -> tuple[list[int], list[bool]]:
    """(token ids of the whole rendered episode, per-token train mask): True on each assistant
    turn's output (reasoning, `</think>`, content, tool calls) and on the stop token after it
    (the next role marker, or `<|endoftext|>` after the last turn; episodes end with an
    answer). Rendered with clear_thinking=False so every trained turn keeps its reasoning, as
    the model sees its current turn. An assistant turn without reasoning is context, not
    trained: it renders as chat shows an older turn (a bare `</think>` before its content)."""
    from flint_graph.chat.chat_template import render_chat

    tpl = tokenizer.chat_template
    ids: list[int] = []
    mask: list[bool] = []
    done = ""
    for i, m in enumerate(ep.messages):
        if m["role"] != "assistant":
            continue
        if not m.get("reasoning_content"):
            continue  # context: rendered inside the next trained turn's prompt
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
    from flint_graph.chat.chat_template import GLM47_CHAT_TEMPLATE, render_chat
    from flint_graph.chat.tokenizer import build_corpus

    texts = [render_chat(GLM47_CHAT_TEMPLATE, ep.messages, ep.tools, add_generation_prompt=False,
                         clear_thinking=False)
             for ep in episodes(seed, n, "train", recall_pairs=8, recall_questions=4)]
    return texts + build_corpus(4096, seed)
