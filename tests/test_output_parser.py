"""Tests for flint_graph/chat/output_parser.py against hand-written GLM-4.7 outputs and a reference
renderer of the call format (glm47-format.md, "Prompt layout"), at many chunkings.

Every case runs whole, per character, per token (a regex that keeps tags whole) and in seeded
random groupings; each must give the same ParsedOutput and the same concatenated deltas. The
streaming checks also require that a delta is never revised later (every emitted prefix is a prefix
of the final text, every emitted call equals the final one) and that a partial tag at the end of
the fed text is never released. Every chunking must also stream the same tool-call deltas, in
OpenAI's shape, whose argument fragments join to each final call's arguments JSON (withdrawn
calls end with an error). Outputs are compared exactly: parsing is text surgery, no tolerance
applies.
"""

import json
import random
import re

import pytest

from flint_graph.errors import InvalidRequestError
from flint_graph.chat.output_parser import (
    TAGS,
    OutputParser,
    ParseDelta,
    ParsedOutput,
    ToolCall,
    ToolCallDelta,
    parse_output,
)
from flint_graph.chat.tool_schema import only_strings, tool_schemas, type_argument

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


def call_streams(deltas: list[ToolCallDelta]) -> dict[int, list]:
    """index -> [id, name, joined arguments, error] of streamed calls, checking OpenAI's shape:
    indices 0, 1, ... one call after another, id and name on the first delta only, nothing
    after a withdrawal (error)."""
    streams: dict[int, list] = {}
    for d in deltas:
        if d.index not in streams:
            assert d.index == len(streams) and d.id == f"call_{d.index}" and d.name, d
            streams[d.index] = [d.id, d.name, "", None]
        else:
            assert d.index == len(streams) - 1 and d.id is None and d.name is None, d
            assert streams[d.index][3] is None, d
        streams[d.index][2] += d.arguments
        streams[d.index][3] = d.error
    return streams


def check_call_streams(streams: dict[int, list], calls: list[ToolCall]) -> None:
    """Every final call streamed its name and exactly its arguments JSON; every other streamed
    call was withdrawn."""
    finals = {c.id: c for c in calls}
    assert set(finals) <= {s[0] for s in streams.values()}
    for call_id, name, arguments, error in streams.values():
        if call_id in finals:
            assert (name, arguments, error) == (finals[call_id].name,
                                                finals[call_id].arguments_json(), None)
        else:
            assert error is not None, (call_id, arguments)


def stream(text, chunks, check_partial=True, **kw):
    """Feed `chunks`, checking every delta as it comes; returns (result, concatenated deltas,
    the streamed calls as call_streams gives them)."""
    parser = OutputParser(kw.get("tools"), kw.get("thinking", True))
    total, fed, trace = ParseDelta(), "", []
    names = ("reasoning", "content", "tool_calls", "errors", "tool_call_deltas")
    # With no tools, call tags are plain text: only the reasoning tags are ever held back.
    tags = TAGS if kw.get("tools") != [] else ("<think>", "</think>")
    for chunk in chunks:
        delta = parser.feed(chunk)
        fed += chunk
        for name in names:
            setattr(total, name, getattr(total, name) + getattr(delta, name))
        trace.append((fed, total.reasoning, total.content, list(total.tool_calls)))
        if check_partial:
            # The longest suffix of the fed text that could still become a tag must not have been
            # released (skipped when the same characters also end the text before it).
            held = max((t[:k] for t in tags for k in range(1, len(t)) if fed.endswith(t[:k])),
                       key=len, default="")  # fmt: skip
            if held and not fed[: -len(held)].endswith(held):
                assert not total.reasoning.endswith(held), (fed, total.reasoning)
                assert not total.content.endswith(held), (fed, total.content)
    delta = parser.finish(kw.get("finish_reason"))
    for name in names:
        setattr(total, name, getattr(total, name) + getattr(delta, name))
    for _, reasoning, content, calls in trace:  # deltas are final: nothing is ever taken back
        assert total.reasoning.startswith(reasoning) and total.content.startswith(content)
        assert total.tool_calls[: len(calls)] == calls
    streamed = ParsedOutput(total.reasoning, total.content, total.tool_calls, total.errors)
    streams = call_streams(total.tool_call_deltas)
    check_call_streams(streams, total.tool_calls)
    return parser.result(), streamed, streams


def check_all_chunkings(text, expected, streamed_reasoning=None, check_partial=True, **kw):
    """parse_output and every chunking agree with `expected` (and stream the same call deltas);
    returns the one-shot result."""
    want, num_errors = expected
    one_shot = parse_output(text, **kw)
    assert len(one_shot.errors) == num_errors, one_shot.errors
    assert one_shot == ParsedOutput(want.reasoning, want.content, want.tool_calls, one_shot.errors)
    want_streamed = ParsedOutput(
        want.reasoning if streamed_reasoning is None else streamed_reasoning,
        want.content, want.tool_calls, one_shot.errors,
    )  # fmt: skip
    want_streams = None
    for name, chunks in chunkings(text):
        result, streamed, streams = stream(text, chunks, check_partial, **kw)
        assert result == one_shot, name
        assert streamed == want_streamed, name
        want_streams = streams if want_streams is None else want_streams
        assert streams == want_streams, name
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
        {"thinking": False},  # leading whitespace kept (issue 23 item 6)
        out("", "\n  Use `a<b` and <b>bold</b>; a literal <think> or </think> stays."),
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
        "</tool_call>",
        {"tools": TOOLS},
        # (an undeclared argument is JSON-decoded too, and named in an error:
        # test_arguments_a_tool_does_not_declare_are_named)
        out("", "", [call("get_weather", 0, city="1984", days=3),
                     call("run_query", 1, dry_run=True)]),
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
    "no_tools_calls_are_plain_text": (  # as vLLM: no tools, no tool parser, no warnings
        f"Hm <tool_call>x</tool_call>.</think>{WEATHER_PARIS} <arg_key>",
        {"tools": []},
        out("Hm <tool_call>x</tool_call>.", f"{WEATHER_PARIS} <arg_key>"),
    ),
    "thinking_off_model_opens_reasoning": (  # issue 6 item 10
        "<think>plan</think>done",
        {"tools": TOOLS, "thinking": False},
        out("plan", "done"),
    ),
    "thinking_off_model_opens_reasoning_after_blanks": (
        "\n <think>plan a < b</think>\n\ndone",
        {"thinking": False},
        out("plan a < b", "done"),
    ),
    "thinking_off_reasoning_ended_by_call": (
        f"<think>plan{WEATHER_PARIS}ok",
        {"tools": TOOLS, "thinking": False},
        out("plan", "ok", [call("get_weather", 0, city="Paris")]),
    ),
    "thinking_off_leading_close_dropped": (
        "\n</think>\ndone </think>",
        {"thinking": False},
        out("", "done </think>"),
    ),
    "think_close_after_call_in_reasoning_dropped": (  # issue 6 item 2(c)
        "Need.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
        "</tool_call>more</think>answer",
        {"tools": TOOLS},
        out("Need.", "moreanswer", [call("get_weather", 0, city="Oslo")]),
    ),
    "think_close_right_after_call_in_reasoning": (
        f"Need.{WEATHER_PARIS}\n</think>\n\nanswer",
        {"tools": TOOLS},
        out("Need.", "answer", [call("get_weather", 0, city="Paris")]),
    ),
    "think_close_after_two_calls_in_reasoning": (
        f"Need.{WEATHER_PARIS} {WEATHER_PARIS}</think>ok",
        {"tools": TOOLS},
        out("Need.", "ok", [call("get_weather", 0, city="Paris"),
                            call("get_weather", 1, city="Paris")]),
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
    "unknown_tool_after_known": (f"</think>{WEATHER_PARIS}{RAW_UNKNOWN}", {"tools": TOOLS},
                                 out("", RAW_UNKNOWN, [call("get_weather", 0, city="Paris")],
                                     errors=1), "delete_everything"),
    "missing_call_close_between_calls": (
        f"</think>{RAW_NO_CALL_CLOSE}{WEATHER_PARIS}", {"tools": TOOLS},
        out("", RAW_NO_CALL_CLOSE, [call("get_weather", 1, city="Paris")], errors=1),
        "</tool_call>"),
    "unterminated_at_finish": (f"</think>{RAW_OPEN_VALUE}", {"tools": TOOLS,
                               "finish_reason": "length"},
                               out("", RAW_OPEN_VALUE, errors=1), "(cut off by max_tokens)"),
    "json_body_instead_of_args": (RAW_JSON_BODY, {"tools": TOOLS},
                                  out("", RAW_JSON_BODY, errors=1), "function name"),
    "empty_name": ("</think><tool_call></tool_call>ok", {"tools": TOOLS},
                   out("", "<tool_call></tool_call>ok", errors=1), "function name"),
    "value_holding_close_tag": (f"</think>{RAW_VALUE_HAS_CLOSE}", {"tools": TOOLS},
                                out("", RAW_VALUE_HAS_CLOSE, errors=1), "found 'b</arg_value"),
    "repeated_key": (f"</think>{RAW_DUP_KEY}", {"tools": TOOLS},
                     out("", RAW_DUP_KEY, errors=1), "repeats"),
    "call_tag_in_prose": ("</think>Write <tool_call> then the name.", {"tools": TOOLS},
                          out("", "Write <tool_call> then the name.", errors=1), "function name"),
    "call_tag_then_markup": ("</think><tool_call>get_weather <b>x</b>", {"tools": TOOLS},
                             out("", "<tool_call>get_weather <b>x</b>", errors=1), "'get_weather <'"),
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


# A call whose opening tag the model skipped (a new user's "Hi", then a weather question, gave
# the first: content that reads as an answer, finish reason "stop", no warning).
STRAY = {
    "skipped_open": ("ad</arg_key><arg_value>Paris</arg_value><arg_key>by</arg_key><arg_value>"
                     "{\"field\": \"basil\"}</arg_value></tool_call>", "</arg_key>"),
    "only_close": ("The weather is fine.</tool_call>", "</tool_call>"),
    "key_open_first": ("x <arg_key>city</arg_key>", "<arg_key>"),
    "value_open_first": ("<arg_value>Lima", "<arg_value>"),
    "value_close_first": ("Lima</arg_value>", "</arg_value>"),
}


@pytest.mark.parametrize("name", list(STRAY))
def test_call_tags_without_an_opening_tag_are_reported_once(name):
    """With tools, a call's inner tags in content stay as written, with one error naming the
    first; without tools (calls off) they are plain text and no error arises."""
    text, first = STRAY[name]
    result = check_all_chunkings(f"ok</think>{text}", out("ok", text, errors=1), tools=TOOLS)
    assert f"holds {first} with no <tool_call>" in result.errors[0], result.errors
    assert parse_output(f"ok</think>{text}", tools=[]).errors == []


def test_stray_call_tags_after_a_parsed_call_are_reported():
    text = f"Go.</think>{WEATHER_PARIS}then </arg_value> more"
    result = parse_output(text, tools=TOOLS)
    assert len(result.tool_calls) == 1 and len(result.errors) == 1, result
    assert "holds </arg_value>" in result.errors[0]


def test_partial_tags_held_back_then_released():
    parser = OutputParser(TOOLS, thinking=False)
    assert parser.feed("Hello <tool_") == ParseDelta(content="Hello ")
    assert parser.feed("call>get_wea") == ParseDelta()  # never a partial name
    # The name goes out once complete; a string value streams, less a possible "</arg_value>".
    assert parser.feed("ther<arg_key>city</arg_key><arg_value>Lima</arg_va") == ParseDelta(
        tool_call_deltas=[ToolCallDelta(0, "call_0", "get_weather"),
                          ToolCallDelta(0, arguments='{"city": "'),
                          ToolCallDelta(0, arguments="Lima")])
    delta = parser.feed("lue></tool_call>")
    assert delta == ParseDelta(tool_calls=[call("get_weather", 0, city="Lima")], tool_call_deltas=[
        ToolCallDelta(0, arguments='"'), ToolCallDelta(0, arguments="}")])
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
    if "enum" in schema:
        return rng.choice(schema["enum"])
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


# -- repairs of malformed calls (issue 6 item 2(b)) -----------------------------------------------

SEARCH = [{"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}}}}]
REPAIRED = {  # name: (text after "</think>", expected arguments of the one call, error words)
    "missing_value_open": (
        "<tool_call>search<arg_key>query</arg_key><arg_value>a</arg_value>"
        "<arg_key>limit</arg_key>5</arg_value></tool_call>",
        {"query": "a", "limit": 5}, ["missing <arg_value>"]),
    "doubled_key_close": (
        "<tool_call>search<arg_key>query</arg_key></arg_key><arg_value>x</arg_value></tool_call>",
        {"query": "x"}, ["doubled </arg_key>"]),
    "missing_value_open_string_with_angles": (  # blanks between tags are layout, as always
        "<tool_call>search<arg_key>query</arg_key>\n a < b > c\n</arg_value></tool_call>",
        {"query": "a < b > c\n"}, ["missing <arg_value>"]),
    "missing_value_open_first_then_more": (
        "<tool_call>search<arg_key>limit</arg_key>7</arg_value>"
        "<arg_key>query</arg_key><arg_value>q</arg_value></tool_call>",
        {"limit": 7, "query": "q"}, ["missing <arg_value>"]),
    "missing_key_close": (
        "<tool_call>search<arg_key>query<arg_value>x</arg_value></tool_call>",
        {"query": "x"}, ["missing </arg_key>"]),
    "missing_key_open": (
        "<tool_call>search<arg_key>query</arg_key><arg_value>x</arg_value>"
        "\nlimit</arg_key><arg_value>3</arg_value></tool_call>",
        {"query": "x", "limit": 3}, ["missing <arg_key>"]),
    "doubled_value_close": (
        "<tool_call>search<arg_key>query</arg_key><arg_value>x</arg_value></arg_value>"
        "</tool_call>",
        {"query": "x"}, ["doubled </arg_value>"]),
    "two_repairs_in_one_call": (
        "<tool_call>search<arg_key>query</arg_key></arg_key><arg_value>x</arg_value>"
        "<arg_key>limit</arg_key>2</arg_value></tool_call>",
        {"query": "x", "limit": 2}, ["doubled </arg_key>", "missing <arg_value>"]),
}  # fmt: skip
AMBIGUOUS = {  # name: (text after "</think>", error word): an error, the text stays content
    "missing_value_open_with_tag_inside": (
        "<tool_call>search<arg_key>query</arg_key>a<arg_key>b</arg_value></tool_call>",
        "<arg_value>"),
    "missing_value_open_blank_value": (
        "<tool_call>search<arg_key>query</arg_key> </arg_value></tool_call>", "<arg_value>"),
    "missing_value_close_at_end": (
        "<tool_call>search<arg_key>query</arg_key><arg_value>a</tool_call>", "inside a value"),
    "missing_key_close_key_has_blank": (
        "<tool_call>search<arg_key>the query<arg_value>x</arg_value></tool_call>", "</arg_key>"),
    "missing_key_open_two_words": (
        "<tool_call>search<arg_key>query</arg_key><arg_value>x</arg_value>"
        "max limit</arg_key><arg_value>3</arg_value></tool_call>", "after a value"),
    "missing_value_open_and_close": (
        "<tool_call>search<arg_key>query</arg_key>x</tool_call>", "<arg_value>"),
    "missing_key_and_value": ("<tool_call>search<arg_value>x</arg_value></tool_call>",
                              "<arg_key>"),
    "empty_key": ("<tool_call>search<arg_key> </arg_key><arg_value>x</arg_value></tool_call>",
                  "empty argument key"),
    "name_glued_to_key": ("<tool_call>searchquery</arg_key><arg_value>x</arg_value></tool_call>",
                          "found </arg_key>"),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REPAIRED))
def test_unambiguous_malformed_calls_are_repaired(name):
    text, arguments, words = REPAIRED[name]
    expected = out("", "tail", [ToolCall("search", arguments, "call_0")], errors=len(words))
    result = check_all_chunkings(f"</think>{text} tail", expected, tools=SEARCH)
    assert all(w in e and "repaired" in e for w, e in zip(words, result.errors)), result.errors


@pytest.mark.parametrize("name", list(AMBIGUOUS))
def test_ambiguous_malformed_calls_stay_visible(name):
    text, word = AMBIGUOUS[name]
    result = check_all_chunkings(f"</think>{text}", out("", text, errors=1), tools=SEARCH)
    assert word in result.errors[0] and "kept as content" in result.errors[0], result.errors


# -- typing by the whole JSON Schema (items 2(e), 2(f)) -------------------------------------------

LEVEL = {"$defs": {"Level": {"type": "string", "enum": ["1", "2", "3"]}},
         "properties": {"level": {"$ref": "#/$defs/Level"}}}
TYPING = [  # (parameters schema, value text, expected value, error word or None)
    (LEVEL, "2", "2", None),
    (LEVEL, "4", "4", "does not fit"),
    (LEVEL, '"2"', '"2"', "does not fit"),  # a string schema never unquotes: text is the value
    ({"properties": {"level": {"enum": ["true", "false"]}}}, "true", "true", None),
    ({"properties": {"level": {"enum": ["7", 8]}}}, "7", "7", None),
    ({"properties": {"level": {"enum": ["7", 8]}}}, "8", 8, None),
    ({"properties": {"level": {"enum": ["7", 8]}}}, "9", "9", "does not fit"),
    ({"properties": {"level": {"const": "null"}}}, "null", "null", None),
    ({"properties": {"level": {"const": 3}}}, "3", 3, None),
    ({"properties": {"level": {"enum": [True, False]}}}, "true", True, None),
    # string-or-X: the JSON reading wins where it fits (as SGLang, llama.cpp and Ollama)
    ({"properties": {"level": {"enum": [1, "1"]}}}, "1", 1, None),
    ({"properties": {"level": {"type": ["string", "integer"]}}}, "7", 7, None),
    ({"properties": {"level": {"type": ["string", "integer"]}}}, "007", "007", None),
    ({"properties": {"level": {"type": ["string", "number"]}}}, "seven", "seven", None),
    ({"properties": {"level": {"type": ["string", "array"]}}}, "[1, 2]", [1, 2], None),
    ({"properties": {"level": {"type": ["string", "object"]}}}, '{"a": 1}', {"a": 1}, None),
    ({"properties": {"level": {"anyOf": [{"type": "string"}, {"type": "boolean"}]}}}, "true",
     True, None),
    ({"properties": {"level": {"type": ["string", "integer"]}}}, "1.5", "1.5", None),
    ({"properties": {"level": {"type": ["integer", "null"]}}}, "null", None, None),
    ({"properties": {"level": {"type": "string"}}}, "null", "null", None),
    ({"definitions": {"N": {"type": "integer"}},
      "properties": {"level": {"$ref": "#/definitions/N"}}}, "12", 12, None),
    ({"$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"type": "number"}},
      "properties": {"level": {"$ref": "#/$defs/A"}}}, "1.5", 1.5, None),  # a chain of refs
    ({"$defs": {"Loop": {"$ref": "#/$defs/Loop"}},
      "properties": {"level": {"$ref": "#/$defs/Loop"}}}, "[1]", [1], None),  # a cycle ends
    ({"properties": {"level": {"allOf": [{"type": "string"}, {"enum": ["1", "2"]}]}}},
     "1", "1", None),
    ({"properties": {"level": {"allOf": [{"$ref": "#/$defs/X"}]}},
      "$defs": {"X": {"type": "boolean"}}}, "False", False, None),
    ({"properties": {"level": {"oneOf": [{"type": "integer"}, {"type": "array"}]}}},
     "[1, 2]", [1, 2], None),
    ({"properties": {"level": {"anyOf": [{"$ref": "#/$defs/S"}, {"type": "null"}]}},
      "$defs": {"S": {"type": "string"}}}, "2", "2", None),
    ({"$ref": "#/$defs/Args", "$defs": {"Args": {"properties": {"level": {"type": "string"}}}}},
     "5", "5", None),  # properties reached through the root's own $ref
    ({"allOf": [{"properties": {"level": {"type": "string"}}}]}, "5", "5", None),
    ({"properties": {}, "additionalProperties": {"type": "string"}}, "5", "5", None),
    ({"properties": {"level": {"description": "free-form"}}}, "5", 5, None),
    ({"properties": {"level": {"$ref": "https://example.com/s.json"}}}, "5", 5, None),
    # one-step repairs (2(f)) and what they leave alone
    ({"properties": {"level": {"type": "integer"}}}, '"42"', 42, "quoted value"),
    ({"properties": {"level": {"type": "number"}}}, ' "4.5" ', 4.5, "quoted value"),
    ({"properties": {"level": {"type": "boolean"}}}, '"true"', True, "quoted value"),
    ({"properties": {"level": {"type": "integer"}}}, '"4.5"', '"4.5"', "does not fit"),
    ({"properties": {"level": {"type": "integer"}}}, "many", "many", "does not fit"),
    ({"properties": {"level": {"type": "integer"}}}, "[1, 2]", "[1, 2]", "does not fit"),
    ({"properties": {"level": {"type": "number"}}}, "NaN", "NaN", "does not fit"),
    ({"properties": {"level": {"type": "array"}}}, '[{\\"id\\": \\"1\\"}]', [{"id": "1"}],
     "backslash-escaped"),
    ({"properties": {"level": {"type": "object"}}}, '{\\"a\\": [1, \\"x\\"]}',
     {"a": [1, "x"]}, "backslash-escaped"),
    ({"properties": {"level": {"type": "array"}}}, '"[1, 2]"', [1, 2], "quoted value"),
    ({"properties": {"level": {"type": "string"}}}, '[{\\"id\\": 1}]', '[{\\"id\\": 1}]', None),
    ({"properties": {"level": {"type": "array"}}}, '[\\"a\\", b]', '[\\"a\\", b]',
     "does not fit"),
    # A float that overflows is Infinity, which json.dumps would write into the arguments JSON
    # (not JSON): refused like NaN. Nesting too deep for Python's parser is text, not a crash.
    ({"properties": {"level": {"type": "number"}}}, "1e999", "1e999", "does not fit"),
    ({"properties": {"level": {"type": "array"}}}, "[1, -1e999]", "[1, -1e999]", "does not fit"),
    ({"properties": {"level": {"type": "number"}}}, '"1e999"', '"1e999"', "does not fit"),
    ({"properties": {"level": {"description": "free-form"}}}, "1e999", "1e999", None),
    ({"properties": {"level": {"type": "array"}}}, "[" * 3000 + "]" * 3000,
     "[" * 3000 + "]" * 3000, "does not fit"),
]  # fmt: skip


@pytest.mark.parametrize(("params", "text", "value", "word"), TYPING)
def test_arguments_typed_by_the_whole_schema(params, text, value, word):
    tools = [{"type": "function", "function": {"name": "set_level", "parameters": params}}]
    raw = f"<tool_call>set_level<arg_key>level</arg_key><arg_value>{text}</arg_value></tool_call>"
    expected = out("", "", [call("set_level", 0, level=value)], errors=word is not None)
    result = check_all_chunkings(f"</think>{raw}", expected, tools=tools)
    got = result.tool_calls[0].arguments["level"]
    assert type(got) is type(value)  # 1 == 1.0 == True: the JSON type must match too
    if word is not None:
        assert word in result.errors[0] and "level" in result.errors[0], result.errors


TEXT_OR_COUNT = [{"type": "object", "properties": {"kind": {"const": "text"},
                                                   "value": {"type": "string"}}},
                 {"type": "object", "properties": {"kind": {"const": "count"},
                                                   "value": {"type": "integer"}}}]
BRANCHED = [  # (parameters schema, (key, text) in call order, expected arguments, error word)
    ({"anyOf": TEXT_OR_COUNT}, [("kind", "count"), ("value", "7")], {"kind": "count", "value": 7},
     None),
    ({"anyOf": TEXT_OR_COUNT}, [("value", "7"), ("kind", "count")], {"value": 7, "kind": "count"},
     None),  # the selecting key after the value it selects
    ({"anyOf": TEXT_OR_COUNT}, [("kind", "text"), ("value", "7")], {"kind": "text", "value": "7"},
     None),
    ({"oneOf": TEXT_OR_COUNT}, [("value", "7"), ("kind", "text")], {"value": "7", "kind": "text"},
     None),
    ({"anyOf": TEXT_OR_COUNT}, [("kind", "count"), ("value", "many")],
     {"kind": "count", "value": "many"}, "fit none of the 2 alternatives"),
    ({"$ref": "#/$defs/Q", "$defs": {"Q": {"anyOf": [{"$ref": "#/$defs/T"}, {"$ref": "#/$defs/C"}]},
                                     "T": TEXT_OR_COUNT[0], "C": TEXT_OR_COUNT[1]}},
     [("value", "7"), ("kind", "count")], {"value": 7, "kind": "count"}, None),  # through $ref
    ({"allOf": [{"properties": {"id": {"type": "integer"}}}, {"oneOf": TEXT_OR_COUNT}]},
     [("value", "7"), ("id", "3"), ("kind", "count")], {"value": 7, "id": 3, "kind": "count"},
     None),  # through allOf, beside a common key
    ({"anyOf": [{"properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                 "required": ["a", "b"]},
                {"properties": {"a": {"type": "integer"}}}]},
     [("a", "5")], {"a": 5}, None),  # the first branch needs b: the second fits
]  # fmt: skip


@pytest.mark.parametrize(("params", "pairs", "arguments", "word"), BRANCHED)
def test_arguments_fit_one_branch_of_a_root_choice(params, pairs, arguments, word):
    """Issue 23 item 6: a root anyOf/oneOf of object schemas types the arguments by the branch
    the other values select, in any key order, or reports that none fits; streamed or not."""
    tools = [{"type": "function", "function": {"name": "inspect", "parameters": params}}]
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
    raw = f"<tool_call>inspect{body}</tool_call>"
    expected = out("", "", [call("inspect", 0, **arguments)], errors=word is not None)
    result = check_all_chunkings(f"</think>{raw}", expected, tools=tools)
    got = result.tool_calls[0].arguments
    assert [type(got[k]) for k in arguments] == [type(v) for v in arguments.values()]
    assert list(got) == list(arguments)  # the call's key order
    if word is not None:
        assert word in result.errors[0], result.errors


def test_type_argument_directly():
    root = LEVEL
    schema = tool_schemas([{"type": "function", "function": {"name": "f", "parameters": root}}])
    level = schema["f"].param("level")
    assert type_argument("2", level, root) == ("2", None)
    assert only_strings(level, root)
    assert not only_strings({"enum": ["7", 8]}, {})
    assert only_strings({"anyOf": [{"type": "string"}, {"const": "x"}]}, {})
    assert not only_strings({"type": ["string", "null"]}, {})
    assert type_argument(" 3 ", None, None) == (3, None)  # no schema: JSON, else text
    assert type_argument("hi there", None, None) == ("hi there", None)


# -- streaming calls (item 2(g)) ------------------------------------------------------------------

def test_long_string_argument_streams_as_it_arrives():
    body = "line one\n<p>a < b</p>\n" * 50
    text = ("</think><tool_call>write_file<arg_key>path</arg_key><arg_value>a.html</arg_value>"
            f"<arg_key>content</arg_key><arg_value>{body}</arg_value></tool_call>")
    parser, args, name_at, streamed_at_half = OutputParser(TOOLS), "", None, None
    for i, ch in enumerate(text):
        for d in parser.feed(ch).tool_call_deltas:
            name_at = i if d.name else name_at
            args += d.arguments
        if i == text.index(body) + len(body) // 2:
            streamed_at_half = args
    parser.finish("stop")
    assert name_at == text.index("<arg_key>") + len("<arg_key>") - 1  # the tag after the name
    assert streamed_at_half == '{"path": "a.html", "content": ' + json.dumps(
        body[: len(body) // 2 + 1])[:-1]  # everything so far, the JSON string still open
    assert args == parser.result().tool_calls[0].arguments_json()


def test_typed_values_go_out_whole_at_their_close():
    text = "</think><tool_call>get_weather<arg_key>days</arg_key><arg_value>12</arg_value>"
    parser = OutputParser(TOOLS)
    pieces = [d.arguments for ch in text for d in parser.feed(ch).tool_call_deltas]
    assert pieces == ["", '{"days": 12']  # never "1" then "2": the type is known only at the end
    finish = parser.finish("length").tool_call_deltas
    assert len(finish) == 1 and "end of output" in finish[0].error  # withdrawn at the end


def test_streamed_call_that_turns_out_malformed_is_withdrawn():
    text = (f"</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value>"
            f"<arg_key>days</arg_key>x<arg_key>{WEATHER_PARIS}")
    parser = OutputParser(TOOLS)
    deltas = parser.feed(text).tool_call_deltas + parser.finish("stop").tool_call_deltas
    streams = call_streams(deltas)
    assert streams[0][:3] == ["call_0", "get_weather", '{"city": "Rome"']
    assert "expected <arg_value>" in streams[0][3]
    assert streams[1] == ["call_1", "get_weather", '{"city": "Paris"}', None]
    result = parser.result()
    assert result.tool_calls == [call("get_weather", 1, city="Paris")]  # ids follow the deltas
    assert result.content.startswith("<tool_call>get_weather<arg_key>city")


def test_rejected_names_never_stream_and_take_no_index():
    deltas = OutputParser(TOOLS).feed(f"</think>{RAW_UNKNOWN}{WEATHER_PARIS}").tool_call_deltas
    assert [d.index for d in deltas] == [0] * len(deltas) and deltas[0].name == "get_weather"


def test_repeated_key_withdraws_the_streamed_call():
    parser = OutputParser(TOOLS)
    deltas = parser.feed(f"</think>{RAW_DUP_KEY}ok").tool_call_deltas
    assert deltas[-1].error is not None and "repeats" in deltas[-1].error
    assert "".join(d.arguments for d in deltas) == '{"city": "A"'  # nothing after the repeat
    parser.finish()
    assert parser.result().content == RAW_DUP_KEY + "ok"


def test_zero_argument_call_and_openai_shape():
    deltas = OutputParser(TOOLS).feed("</think><tool_call>list_files</tool_call>").tool_call_deltas
    assert [d.to_openai() for d in deltas] == [
        {"index": 0, "id": "call_0", "type": "function",
         "function": {"name": "list_files", "arguments": ""}},
        {"index": 0, "function": {"arguments": "{}"}},
    ]


def test_has_tool_calls():
    parser = OutputParser(TOOLS)
    parser.feed(f"</think>{RAW_UNKNOWN}")
    assert not parser.has_tool_calls
    parser.feed(WEATHER_PARIS)
    assert parser.has_tool_calls


def test_call_tag_in_prose_does_not_hold_back_the_rest():
    # Text after `<tool_call>` that can no longer be a function name ends the call at once:
    # the answer streams on instead of arriving whole at the end of the output, and the error
    # quotes a few characters, not everything up to the next tag.
    prose = "More prose follows here. " * 200
    parser = OutputParser(TOOLS)
    streamed = "".join(parser.feed(w).content
                       for w in re.findall(r"\S+|\s+", f"</think>Write <tool_call> then {prose}"))
    assert streamed.endswith(prose)
    parser.feed("<tool_call>")
    parser.finish("stop")
    assert [len(e) < 200 for e in parser.result().errors] == [True, True]


def test_long_word_after_call_tag_is_read_in_linear_time():
    # The early check that ends a call whose text can no longer be a name must resume where it
    # stopped: re-reading the whole candidate on every feed took 6.8 s for this 80,000-character
    # word fed 4 characters at a time (a blob after a stray <tool_call>); resuming, ~0.1 s.
    import time

    parser = OutputParser(TOOLS)
    parser.feed("</think><tool_call>")
    start = time.perf_counter()
    for _ in range(20_000):
        parser.feed("abcd")
    parser.finish("stop")
    assert time.perf_counter() - start < 2.0
    assert parser.result().content == "<tool_call>" + "abcd" * 20_000


def test_a_call_without_a_required_argument_is_kept_and_reported():
    # `generate --tools` printed get_weather {"city": "Celsius"} with no error, though the
    # schema requires days and metric
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                         "metric": {"type": "boolean"}},
        "required": ["city", "days", "metric"]}}}]
    out = parse_output(f"x</think>{WEATHER_PARIS}", tools)
    assert [c.name for c in out.tool_calls] == ["get_weather"]
    assert out.errors == ["tool call 1: get_weather: missing required arguments days, metric"]
    full = WEATHER_PARIS.replace("</tool_call>", "<arg_key>days</arg_key><arg_value>2</arg_value>"
                                 "<arg_key>metric</arg_key><arg_value>true</arg_value></tool_call>")
    assert parse_output(f"x</think>{full}", tools).errors == []


@pytest.mark.parametrize("params", [
    {"allOf": [{"$ref": "#"}, {"$ref": "#"}, {"$ref": "#"}],
     "properties": {"a": {"type": "integer"}}},  # the reported one: 3^32 expansions
    {"anyOf": [{"$ref": "#"}, {"$ref": "#"}], "properties": {"a": {"type": "integer"}}},
    {"$defs": {"A": {"allOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/A"}]}},
     "properties": {"a": {"$ref": "#/$defs/A"}}},
])
def test_schemas_that_expand_exponentially_are_refused_when_declared(params):
    """Issue 26 item 5: a schema whose references fan out under a combinator was typed for
    minutes; it is refused at once, naming the tool."""
    import time

    from flint_graph.errors import InvalidRequestError

    t0 = time.process_time()
    with pytest.raises(InvalidRequestError, match="tools\\[0\\] 'f'.*expands to more than.*"
                                                  "a reference cycle under a combinator"):
        tool_schemas([{"type": "function", "function": {"name": "f", "parameters": params}}])
    assert time.process_time() - t0 < 2


def test_a_flat_schema_past_the_node_bound_is_not_asked_about_cycles():
    """A bad-input trial (2026-12-05): 60,000 plain properties were refused with a hint about
    "a reference cycle under a combinator", which the schema did not have."""
    from flint_graph.errors import InvalidRequestError

    flat = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(60000)}}
    with pytest.raises(InvalidRequestError, match="counting every property") as e:
        tool_schemas([{"type": "function", "function": {"name": "f", "parameters": flat}}])
    assert "cycle" not in str(e.value)


def test_a_recursive_schema_that_only_chains_is_accepted():
    tree = {"$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"},
                                                             "v": {"type": "integer"}}}},
            "properties": {"head": {"$ref": "#/$defs/N"}}}
    assert "head" in tool_schemas([{"type": "function", "function": {
        "name": "f", "parameters": tree}}])["f"].properties


@pytest.mark.parametrize("text,kind", [
    ("[" * 960 + "]" * 960, "array"),  # decoded fine, failed to encode on a deeper stack
    ('["\\ud800"]', "array"),  # a lone surrogate: no UTF-8 form
    ('{"k\\udfff": 1}', "object"),
])
def test_argument_json_that_cannot_be_written_back_is_kept_as_text(text, kind):
    """A bad-input trial: these decoded as JSON for a string-or-array parameter and then made
    the server's response fail (500). Too deep or unencodable JSON is not a reading: the text
    is the value (it is a string the schema admits)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "properties": {"x": {"type": ["string", kind]}}}}}]
    out = parse_output(f"</think><tool_call>f<arg_key>x</arg_key><arg_value>{text}"
                       "</arg_value></tool_call>", tools=tools)
    (call,) = out.tool_calls
    assert call.arguments == {"x": text}
    json.dumps(call.arguments, ensure_ascii=False).encode("utf-8")


def test_first_id_numbers_a_later_turns_calls_after_the_earlier_ones():
    """A turn parsed with first_id = n (the calls already in the conversation) names its calls
    call_n, call_n+1, ... in the finished calls and in the streamed deltas alike, while the
    deltas' index stays the position in this message (OpenAI's streaming rule)."""
    parser = OutputParser(TOOLS, first_id=3)
    parser.feed(f"</think>{WEATHER_PARIS}")
    delta = parser.feed(WEATHER_PARIS)
    parser.finish()
    result = parser.result()
    assert [c.id for c in result.tool_calls] == ["call_3", "call_4"]
    assert delta.tool_call_deltas[0].index == 1 and delta.tool_call_deltas[0].id == "call_4"


@pytest.mark.parametrize("params, path, found", [
    ({"type": "object", "properties": {"n": {"type": "int"}}}, "parameters.properties.n", '"int"'),
    ({"type": "dict", "properties": {"n": {"type": "integer"}}}, "parameters", '"dict"'),
    ({"properties": {"n": {"type": ["integer", "float"]}}}, "parameters.properties.n",
     '["integer", "float"]'),
    ({"properties": {"n": {"type": []}}}, "parameters.properties.n", "[]"),
    ({"properties": {"n": {"type": None}}}, "parameters.properties.n", "null"),
    ({"properties": {"x": {"type": [{}]}}}, "parameters.properties.x", "[{}]"),  # unhashable
    ({"properties": {"n": {"anyOf": [{"type": "string"}, {"type": "str"}]}}},
     "parameters.properties.n.anyOf[1]", '"str"'),
    ({"$defs": {"U": {"type": "enum"}}, "properties": {"u": {"$ref": "#/$defs/U"}}},
     "#/$defs/U", '"enum"'),
    # every other place a subschema sits (the bad-input trial found these accepted)
    ({"properties": {"a": {"type": "array", "items": {"type": "int"}}}},
     "parameters.properties.a.items", '"int"'),
    ({"properties": {"a": {"prefixItems": [{"type": "string"}, {"type": "str"}]}}},
     "parameters.properties.a.prefixItems[1]", '"str"'),
    ({"properties": {"a": {"not": {"type": "nothing"}}}}, "parameters.properties.a.not",
     '"nothing"'),
    ({"patternProperties": {"^x": {"type": "float"}}}, "parameters.patternProperties.^x",
     '"float"'),
    ({"if": {"type": "object"}, "then": {"type": "dict"}}, "parameters.then", '"dict"'),
    ({"dependentSchemas": {"a": {"type": "bool"}}}, "parameters.dependentSchemas.a", '"bool"'),
    ({"$defs": {"Unused": {"type": "long"}}}, "parameters.$defs.Unused", '"long"'),
])
def test_a_type_that_is_no_json_schema_type_is_refused_when_declared(params, path, found):
    """The bad-input trial: `"type": "int"` was accepted and then admitted any value, so the
    tool got whatever the model wrote. Now the declaration is refused, naming where."""
    from flint_graph.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError) as e:
        tool_schemas([{"type": "function", "function": {"name": "f", "parameters": params}}])
    msg = str(e.value)
    assert msg.startswith("tools[0] 'f': ") and f"{path}.type is {found};" in msg, msg
    assert "expected one of string, number, integer" in msg


def test_the_first_bad_type_in_schema_order_is_named():
    from flint_graph.errors import InvalidRequestError

    params = {"properties": {"a": {"type": "int"}, "b": {"type": "int"}}}
    with pytest.raises(InvalidRequestError, match=r"parameters\.properties\.a\.type"):
        tool_schemas([{"type": "function", "function": {"name": "f", "parameters": params}}])


def test_every_json_schema_type_and_list_of_them_is_accepted():
    props = {t: {"type": t} for t in ("string", "number", "integer", "boolean", "object",
                                      "array", "null")}
    props["either"] = {"type": ["string", "null"]}
    schema = tool_schemas([{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": props}}}])["f"]
    assert set(schema.properties) == set(props)


@pytest.mark.parametrize("others, errors", [
    ("absent", ["tool call 1: calculator: arguments 'from_unit', 'filter' not among its "
                "declared parameters"]),
    (False, ["tool call 1: calculator: arguments 'from_unit', 'filter' not among its declared "
             "parameters (its additionalProperties is false)"]),
    (True, []),  # other arguments are expected
    ({"type": "integer"}, []),  # ... and described
])
def test_arguments_a_tool_does_not_declare_are_named(others, errors):
    """A new user's forced call `calculator {'expression': '25', 'from_unit': 825, 'filter':
    825}` came back with no error. The call is kept (JSON Schema admits other keys unless
    additionalProperties is false) and the undeclared names are reported."""
    params = {"type": "object", "properties": {"expression": {"type": "string"}},
              "required": ["expression"]}
    if others != "absent":
        params["additionalProperties"] = others
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": params}}]
    text = ("</think><tool_call>calculator<arg_key>expression</arg_key><arg_value>25"
            "</arg_value><arg_key>from_unit</arg_key><arg_value>825</arg_value><arg_key>filter"
            "</arg_key><arg_value>825</arg_value></tool_call>")
    got = parse_output(text, tools=tools)
    assert [(c.name, c.arguments) for c in got.tool_calls] == [
        ("calculator", {"expression": "25", "from_unit": 825, "filter": 825})]
    assert got.errors == errors


@pytest.mark.parametrize("forced, written, withdrawn", [
    ("<tool_call>", "Hello! I can check the weather.", "Hello! I can check the weather."),
    ("<tool_call>get_weather", " sunny<|x|>", "sunny<|x|>"),
    ("<tool_call>get_weather", "<arg_key>city</arg_key>oops", "<arg_key>city</arg_key>oops"),
    ("<tool_call>calculator", "<arg_key>expression</arg_key><arg_value>457</arg_value>"
     "</tool_call>", "<arg_key>expression</arg_key><arg_value>457</arg_value></tool_call>"),
])
@pytest.mark.parametrize("chunk", [1, 5, 1000])
def test_a_forced_call_the_model_did_not_complete_is_no_content(forced, written, withdrawn,
                                                                chunk):
    """A new user's trial (2026-12-07): tool_choice "required" and "Hi" answered content
    "<tool_call>Hello! I can …", the engine's forced text shown as the model's; its re-trial:
    with that gone, the rest of the call's markup ("<arg_key>expression</arg_key>…") was still
    the content. A rejected forced call gives no content, streamed or not; what the model
    wrote after the forced text is the result's `withdrawn` (the server's
    withdrawn_tool_calls[].text), and the error says why."""
    text = "</think>" + forced + written
    parser = OutputParser(TOOLS, forced=forced)
    deltas = [parser.feed(text[i:i + chunk]) for i in range(0, len(text), chunk)]
    deltas.append(parser.finish("stop"))
    streamed = "".join(d.content for d in deltas)
    out = parser.result()
    assert not out.tool_calls and out.content == streamed == ""
    for c in (c for d in deltas for c in d.tool_call_deltas if c.error):
        assert c.error.endswith("withdrawn (tool_choice forced it)"), c  # not "kept as content"
    assert out.withdrawn == withdrawn
    assert out.errors and out.errors[0].startswith("tool call 1")
    assert out.errors[0].endswith("withdrawn (tool_choice forced it)"), out.errors


@pytest.mark.parametrize("forced", ["<tool_call>", "<tool_call>get_weather"])
@pytest.mark.parametrize("chunk", [1, 1000])
def test_output_cut_inside_the_forced_text_is_withdrawn_whole(forced, chunk):
    """A bad-input trial (2026-12-07): max_tokens ended while the engine wrote the forced
    `<tool_call>` and name, and "<tool_call>convert" came back as content. Every prefix of
    the forced text (the output cut there) gives no content and the withdrawn error; a
    stream's withdrawal of the call's fragments says the same, not "kept as content"."""
    for cut in range(len("<tool_call>"), len(forced) + 1):
        text = "</think>" + forced[:cut]
        parser = OutputParser(TOOLS, forced=forced)
        deltas = [parser.feed(text[i:i + chunk]) for i in range(0, len(text), chunk)]
        deltas.append(parser.finish("length"))
        out = parser.result()
        assert out.content == "" and not out.tool_calls and out.withdrawn == "", (cut, out)
        assert "".join(d.content for d in deltas) == ""
        assert out.errors and out.errors[0].endswith("withdrawn (tool_choice forced it)"), out
        for d in deltas:
            for c in d.tool_call_deltas:
                assert not c.error or c.error.endswith("withdrawn (tool_choice forced it)"), c


def test_only_the_forced_call_is_withdrawn():
    """A later rejected call, or a rejected first call the engine did not force, keeps its
    text as content, as written (it is the model's own)."""
    bad = "<tool_call>nope<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
    out = parse_output("</think>" + bad, tools=TOOLS)
    assert out.content == bad
    parser = OutputParser(TOOLS, forced="<tool_call>get_weather")
    parser.feed(f"</think>{WEATHER_PARIS}{bad}")
    parser.finish("stop")
    out = parser.result()
    assert len(out.tool_calls) == 1 and out.content == bad and out.withdrawn == ""
