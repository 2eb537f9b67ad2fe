"""Tests for flint_graph/output_parser.py against hand-written GLM-4.7 outputs and a reference
renderer of the call format (glm47-format.md, "Prompt layout"), at many chunkings.

Every case runs whole, per character, per token (a regex that keeps tags whole) and in seeded
random groupings; each must give the same ParsedOutput and the same concatenated deltas. The
streaming checks also require that a delta is never revised later (every emitted prefix is a prefix
of the final text, every emitted call equals the final one) and that a partial tag at the end of
the fed text is never released. Outputs are compared exactly: parsing is text surgery, no
tolerance applies.
"""

import json
import random
import re

import pytest

from flint_graph.errors import InvalidRequestError
from flint_graph.output_parser import (
    TAGS,
    OutputParser,
    ParseDelta,
    ParsedOutput,
    ToolCall,
    parse_output,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"},
            "units": {"type": "string", "enum": ["c", "f"]}}}}},
    {"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object", "properties": {
            "path": {"type": "string"}, "content": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "run_query", "parameters": {
        "type": "object", "properties": {
            "sql": {"type": "string"}, "limit": {"type": "integer"},
            "threshold": {"type": "number"},
            "dry_run": {"type": "boolean"}, "filters": {"type": "object"},
            "columns": {"type": "array", "items": {"type": "string"}},
            "cursor": {"type": ["string", "null"]},
            "timeout": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}}},
    {"type": "function", "function": {"name": "list_files", "parameters": {
        "type": "object", "properties": {}}}},
]  # fmt: skip
TOKEN = re.compile(r"</?(?:think|tool_call|arg_key|arg_value)>|\s+|\w+|[^\w\s]")
CODE = (
    '<!doctype html>\n<div class="card">\n  <script>\n'
    '    if (a < b && b > c) { note = "<arg_key>"; }  // ends </tool_call>\n'
    "  </script>\n</div>\n"
)


def call(name: str, index: int, /, **arguments) -> ToolCall:
    return ToolCall(name, arguments, f"call_{index}")


def out(reasoning="", content="", tool_calls=(), errors=0) -> tuple[ParsedOutput, int]:
    """Expected output and the expected number of error messages (their text is checked apart)."""
    return ParsedOutput(reasoning, content, list(tool_calls), []), errors


def chunkings(text: str) -> list[tuple[str, list[str]]]:
    """Whole, per character, per token, seeded random character groups and token groups."""
    tokens = TOKEN.findall(text)
    assert "".join(tokens) == text
    result = [("whole", [text]), ("chars", list(text)), ("tokens", tokens)]
    for seed in range(3):
        rng, chunks, i = random.Random(seed), [], 0
        while i < len(text):
            n = rng.randint(1, 13)
            chunks.append(text[i : i + n])
            i += n
        result.append((f"random{seed}", chunks))
    for seed in range(2):
        rng, chunks, i = random.Random(100 + seed), [], 0
        while i < len(tokens):
            n = rng.randint(1, 4)
            chunks.append("".join(tokens[i : i + n]))
            i += n
        result.append((f"tokens{seed}", chunks))
    return result


def stream(text, chunks, check_partial=True, **kw):
    """Feed `chunks`, checking every delta as it comes; returns (result, concatenated deltas)."""
    parser = OutputParser(kw.get("tools"), kw.get("thinking", True))
    total, fed, trace = ParseDelta(), "", []
    for chunk in chunks:
        delta = parser.feed(chunk)
        fed += chunk
        for name in ("reasoning", "content", "tool_calls", "errors"):
            setattr(total, name, getattr(total, name) + getattr(delta, name))
        trace.append((fed, total.reasoning, total.content, list(total.tool_calls)))
        if check_partial:
            # The longest suffix of the fed text that could still become a tag must not have been
            # released (skipped when the same characters also end the text before it).
            held = max((t[:k] for t in TAGS for k in range(1, len(t)) if fed.endswith(t[:k])),
                       key=len, default="")  # fmt: skip
            if held and not fed[: -len(held)].endswith(held):
                assert not total.reasoning.endswith(held), (fed, total.reasoning)
                assert not total.content.endswith(held), (fed, total.content)
    delta = parser.finish(kw.get("finish_reason"))
    for name in ("reasoning", "content", "tool_calls", "errors"):
        setattr(total, name, getattr(total, name) + getattr(delta, name))
    for _, reasoning, content, calls in trace:  # deltas are final: nothing is ever taken back
        assert total.reasoning.startswith(reasoning) and total.content.startswith(content)
        assert total.tool_calls[: len(calls)] == calls
    streamed = ParsedOutput(total.reasoning, total.content, total.tool_calls, total.errors)
    return parser.result(), streamed


def check_all_chunkings(text, expected, streamed_reasoning=None, check_partial=True, **kw):
    """parse_output and every chunking agree with `expected`; returns the one-shot result."""
    want, num_errors = expected
    one_shot = parse_output(text, **kw)
    assert len(one_shot.errors) == num_errors, one_shot.errors
    assert one_shot == ParsedOutput(want.reasoning, want.content, want.tool_calls, one_shot.errors)
    want_streamed = ParsedOutput(
        want.reasoning if streamed_reasoning is None else streamed_reasoning,
        want.content, want.tool_calls, one_shot.errors,
    )  # fmt: skip
    for name, chunks in chunkings(text):
        result, streamed = stream(text, chunks, check_partial, **kw)
        assert result == one_shot, name
        assert streamed == want_streamed, name
    return one_shot


WEATHER_PARIS = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
)
CASES = {
    "answer_after_reasoning": (
        "The user says hi. A short, friendly reply is enough.</think>\n\nHello! How can I help?",
        {"tools": TOOLS},
        out("The user says hi. A short, friendly reply is enough.", "Hello! How can I help?"),
    ),
    "stray_leading_think_dropped": (
        "\n<think>Compare 3 < 5 and 7 > 2.</think>Yes: 3 < 5 holds.",
        {},
        out("Compare 3 < 5 and 7 > 2.", "Yes: 3 < 5 holds."),
    ),
    "thinking_off_tags_are_text": (
        "\n  Use `a<b` and <b>bold</b>; a literal <think> or </think> stays.",
        {"thinking": False},
        out("", "Use `a<b` and <b>bold</b>; a literal <think> or </think> stays."),
    ),
    "code_value_verbatim": (
        "I need to create the page.</think>I'll write the file now.\n<tool_call>write_file"
        "<arg_key>path</arg_key><arg_value>site/index.html</arg_value>"
        f"<arg_key>content</arg_key><arg_value>{CODE}</arg_value></tool_call>",
        {"tools": TOOLS},
        out("I need to create the page.", "I'll write the file now.\n",
            [call("write_file", 0, path="site/index.html", content=CODE)]),
    ),
    "typed_by_schema": (
        "Query it.</think><tool_call>run_query"
        "<arg_key>sql</arg_key><arg_value>SELECT name FROM users WHERE age >= 18 AND note <> ''"
        "</arg_value><arg_key>limit</arg_key><arg_value>25</arg_value>"
        "<arg_key>threshold</arg_key><arg_value>0.75</arg_value>"
        "<arg_key>dry_run</arg_key><arg_value>false</arg_value>"
        '<arg_key>filters</arg_key><arg_value>{"region": "eu", "ids": [1, 2, 3]}</arg_value>'
        '<arg_key>columns</arg_key><arg_value>["name", "age"]</arg_value>'
        "<arg_key>cursor</arg_key><arg_value>null</arg_value>"
        "<arg_key>timeout</arg_key><arg_value>30</arg_value></tool_call>",
        {"tools": TOOLS},
        out("Query it.", "", [call(
            "run_query", 0, sql="SELECT name FROM users WHERE age >= 18 AND note <> ''", limit=25,
            threshold=0.75, dry_run=False, filters={"region": "eu", "ids": [1, 2, 3]},
            columns=["name", "age"], cursor=None, timeout=30)]),
    ),
    "string_param_keeps_number_text_and_python_bool": (
        "</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>1984</arg_value>"
        "<arg_key>days</arg_key><arg_value> 3 </arg_value></tool_call>"
        "<tool_call>run_query<arg_key>dry_run</arg_key><arg_value>True</arg_value>"
        "<arg_key>limit</arg_key><arg_value>many</arg_value>"
        "<arg_key>extra</arg_key><arg_value>[1, 2]</arg_value></tool_call>",
        {"tools": TOOLS},
        out("", "", [call("get_weather", 0, city="1984", days=3),
                     call("run_query", 1, dry_run=True, limit="many", extra=[1, 2])]),
    ),
    "two_calls_back_to_back": (
        f"Two cities.</think>{WEATHER_PARIS}<tool_call>get_weather<arg_key>city</arg_key>"
        "<arg_value>Zürich</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>",
        {"tools": TOOLS},
        out("Two cities.", "", [call("get_weather", 0, city="Paris"),
                                call("get_weather", 1, city="Zürich", days=3)]),
    ),
    "glm46_newlines_then_text": (
        "Need weather.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        "<arg_value>Oslo</arg_value>\n</tool_call>\n<tool_call>list_files\n</tool_call>\n\n"
        "Both requests are on their way.",
        {"tools": TOOLS},
        out("Need weather.", "Both requests are on their way.",
            [call("get_weather", 0, city="Oslo"), call("list_files", 1)]),
    ),
    "text_around_and_between_calls": (
        f"Plan.</think>Let me check.\n{WEATHER_PARIS}\nAnd the files:"
        "<tool_call>list_files</tool_call>  Done.",
        {"tools": TOOLS},
        out("Plan.", "Let me check.\nAnd the files:Done.",
            [call("get_weather", 0, city="Paris"), call("list_files", 1)]),
    ),
    "reasoning_ends_at_tool_call": (
        f"Check the weather first.\n{WEATHER_PARIS}",
        {"tools": TOOLS},
        out("Check the weather first.\n", "", [call("get_weather", 0, city="Paris")]),
    ),
    "thinking_off_call": (
        f"{WEATHER_PARIS}\nasked.",
        {"tools": TOOLS, "thinking": False},
        out("", "asked.", [call("get_weather", 0, city="Paris")]),
    ),
    "no_tools_declared_json_typing": (
        "</think><tool_call>lookup<arg_key>n</arg_key><arg_value>5</arg_value>"
        "<arg_key>s</arg_key><arg_value>hi there</arg_value></tool_call>",
        {},
        out("", "", [call("lookup", 0, n=5, s="hi there")]),
    ),
}
RAW_UNKNOWN = (
    "<tool_call>delete_everything<arg_key>confirm</arg_key><arg_value>true</arg_value></tool_call>"
)
RAW_NO_KEY_CLOSE = "<tool_call>get_weather<arg_key>city<arg_value>Paris</arg_value></tool_call>"
RAW_NO_VALUE_OPEN = "<tool_call>get_weather<arg_key>city</arg_key>Paris</arg_value></tool_call>"
RAW_NO_CALL_CLOSE = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
RAW_OPEN_VALUE = (
    "<tool_call>write_file<arg_key>path</arg_key><arg_value>a.py</arg_value>"
    "<arg_key>content</arg_key><arg_value>print(1 < 2)\n"
)
RAW_JSON_BODY = '<tool_call>get_weather\n{"city": "Paris"}\n</tool_call>'
RAW_VALUE_HAS_CLOSE = (
    "<tool_call>write_file<arg_key>path</arg_key><arg_value>a</arg_value>b</arg_value></tool_call>"
)
RAW_DUP_KEY = (
    "<tool_call>get_weather<arg_key>city</arg_key><arg_value>A</arg_value>"
    "<arg_key>city</arg_key><arg_value>B</arg_value></tool_call>"
)
MALFORMED = {  # name: (text, kwargs, expected, a word each error message must contain)
    "unknown_tool": (f"</think>{RAW_UNKNOWN} Done.", {"tools": TOOLS},
                     out("", RAW_UNKNOWN + " Done.", errors=1), "delete_everything"),
    "empty_tool_list_rejects": (f"</think>{WEATHER_PARIS}", {"tools": []},
                                out("", WEATHER_PARIS, errors=1), "unknown tool"),
    "missing_arg_key_close": (f"</think>{RAW_NO_KEY_CLOSE}", {"tools": TOOLS},
                              out("", RAW_NO_KEY_CLOSE, errors=1), "</arg_key>"),
    "missing_arg_value_open": (f"</think>{RAW_NO_VALUE_OPEN}", {"tools": TOOLS},
                               out("", RAW_NO_VALUE_OPEN, errors=1), "<arg_value>"),
    "missing_call_close_between_calls": (
        f"</think>{RAW_NO_CALL_CLOSE}{WEATHER_PARIS}", {"tools": TOOLS},
        out("", RAW_NO_CALL_CLOSE, [call("get_weather", 0, city="Paris")], errors=1),
        "</tool_call>"),
    "unterminated_at_finish": (f"</think>{RAW_OPEN_VALUE}", {"tools": TOOLS,
                               "finish_reason": "length"},
                               out("", RAW_OPEN_VALUE, errors=1), "'length'"),
    "json_body_instead_of_args": (RAW_JSON_BODY, {"tools": TOOLS},
                                  out("", RAW_JSON_BODY, errors=1), "function name"),
    "empty_name": ("</think><tool_call></tool_call>ok", {"tools": TOOLS},
                   out("", "<tool_call></tool_call>ok", errors=1), "function name"),
    "value_holding_close_tag": (f"</think>{RAW_VALUE_HAS_CLOSE}", {"tools": TOOLS},
                                out("", RAW_VALUE_HAS_CLOSE, errors=1), "found 'b</arg_value"),
    "repeated_key": (f"</think>{RAW_DUP_KEY}", {"tools": TOOLS},
                     out("", RAW_DUP_KEY, errors=1), "repeats"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
def test_well_formed_outputs(name):
    text, kw, expected = CASES[name]
    result = check_all_chunkings(text, expected, **kw)
    assert result.errors == []


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_calls_are_reported_and_left_visible(name):
    text, kw, expected, word = MALFORMED[name]
    result = check_all_chunkings(text, expected, **kw)
    assert all(word in message for message in result.errors), result.errors
    assert all(call.arguments for call in result.tool_calls)  # never a silent call with {}


@pytest.mark.parametrize(("finish_reason", "as_content"),
                         [("stop", True), (None, True), ("length", False), ("abort", False)])
def test_output_ending_inside_reasoning(finish_reason, as_content):
    text = "The answer is 42 because 6 * 7 = 42 and 42 > 41; see <tool_"
    expected = out("", text) if as_content else out(text, "")
    check_all_chunkings(text, expected, streamed_reasoning=text, check_partial=False,
                        finish_reason=finish_reason)  # fmt: skip


def test_partial_tags_held_back_then_released():
    parser = OutputParser(TOOLS, thinking=False)
    assert parser.feed("Hello <tool_") == ParseDelta(content="Hello ")
    assert parser.feed("call>get_wea") == ParseDelta()  # never a partial name
    assert parser.feed("ther<arg_key>city</arg_key><arg_value>Lima</arg_va") == ParseDelta()
    delta = parser.feed("lue></tool_call>")
    assert delta == ParseDelta(tool_calls=[call("get_weather", 0, city="Lima")])
    assert parser.feed(" a < b, x </arg_va") == ParseDelta(content="a < b, x ")
    assert parser.finish() == ParseDelta(content="</arg_va")  # released as text at the end
    with pytest.raises(RuntimeError, match="after finish"):
        parser.feed("more")


def test_call_emitted_exactly_when_its_close_tag_completes():
    text = f"Go.</think>{WEATHER_PARIS}tail"
    parser, end = OutputParser(TOOLS), text.index("</tool_call>") + len("</tool_call>")
    for i, ch in enumerate(text):
        delta = parser.feed(ch)
        assert len(delta.tool_calls) == (1 if i == end - 1 else 0), i


def test_ids_and_arguments_json():
    result = parse_output(f"</think>{WEATHER_PARIS}{RAW_UNKNOWN}{WEATHER_PARIS}", tools=TOOLS)
    assert [c.id for c in result.tool_calls] == ["call_0", "call_1"]  # rejected calls take no id
    zurich = ToolCall("get_weather", {"city": "Zürich", "days": 3}, "call_0")
    assert zurich.arguments_json() == '{"city": "Zürich", "days": 3}'
    assert json.loads(zurich.arguments_json()) == zurich.arguments


@pytest.mark.parametrize(("tools", "where"), [
    ({"name": "x"}, "tools:"),
    ([{"type": "function", "function": {"name": "a"}}, {"type": "function"}], "tools[1]"),
    ([{"type": "retrieval", "function": {"name": "a"}}], "tools[0]"),
    ([{"function": {"name": "a"}}, {"function": {"name": "a"}}], "duplicate"),
])  # fmt: skip
def test_bad_tools_are_refused(tools, where):
    with pytest.raises(InvalidRequestError, match=re.escape(where)):
        OutputParser(tools)


# -- seeded random outputs rendered by a reference of the GLM-4.7 call layout ---------------------

TEXT_BITS = ["a", "Bq", "x1", " ", "\n", "<", ">", " < ", "<b>", "</b>", "<tool_", "</arg_va",
             "<think", "</thin", "->", "if (a<b)", "é", "_", "{", "}"]  # fmt: skip
VALUE_BITS = TEXT_BITS + ["<arg_key>", "</tool_call>", "<tool_call>", "</think>", "\n  ", "</div>"]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in TOOLS}


def random_text(rng, bits, banned):
    while True:
        text = "".join(rng.choice(bits) for _ in range(rng.randint(0, 10)))
        if not any(tag in text for tag in banned):
            return text


def random_value(rng, schema):
    kinds = schema["type"] if "type" in schema else [s["type"] for s in schema["anyOf"]]
    kind = rng.choice(kinds) if isinstance(kinds, list) else kinds
    return {
        "string": lambda: random_text(rng, VALUE_BITS, ["</arg_value>"]),
        "integer": lambda: rng.randint(-10**6, 10**6),
        "number": lambda: rng.choice([round(rng.uniform(-100, 100), 3), rng.randint(-9, 9)]),
        "boolean": lambda: rng.random() < 0.5,
        "object": lambda: {"k": rng.randint(0, 99), "s": random_text(rng, TEXT_BITS, [])},
        "array": lambda: [random_text(rng, TEXT_BITS, []) for _ in range(rng.randint(0, 3))],
        "null": lambda: None,
    }[kind]()


def render_call(rng, name, arguments):
    """GLM-4.7 layout: strings verbatim, others JSON; optional newlines between tags (4.5/4.6)."""
    gap = lambda: rng.choice(["", "", "\n"])  # noqa: E731
    parts = [f"<tool_call>{name}"]
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"{gap()}<arg_key>{key}</arg_key>{gap()}<arg_value>{text}</arg_value>")
    return "".join(parts) + f"{gap()}</tool_call>"


def random_output(seed):
    rng = random.Random(seed)
    while True:
        reasoning = random_text(rng, TEXT_BITS, ["</think>", "<tool_call>"])
        if not reasoning.lstrip().startswith("<think>"):
            break
    lead = random_text(rng, TEXT_BITS, ["<tool_call>"])
    text, content, calls = f"{reasoning}</think>{lead}", lead.lstrip(), []
    for n in range(rng.randint(0, 3)):
        name = rng.choice(list(SCHEMAS))
        keys = rng.sample(list(SCHEMAS[name]), rng.randint(0, len(SCHEMAS[name])))
        arguments = {k: random_value(rng, SCHEMAS[name][k]) for k in keys}
        gap = rng.choice(["", "\n", " \n ", random_text(rng, TEXT_BITS, ["<tool_call>"])])
        text += render_call(rng, name, arguments) + gap
        content += gap.lstrip()
        calls.append(ToolCall(name, arguments, f"call_{n}"))
    return text, out(reasoning, content, calls)


@pytest.mark.parametrize("seed", range(40))
def test_random_outputs_round_trip(seed):
    text, expected = random_output(seed)
    # The held-suffix check assumes text before a tag never ends like the tag's own start, which
    # random fragments ("</arg_va" before "<tool_call>") can break; the final-delta checks run.
    check_all_chunkings(text, expected, check_partial=False, tools=TOOLS)
