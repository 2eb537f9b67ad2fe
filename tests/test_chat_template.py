"""Golden tests for the GLM-4.7 chat template and `render_chat` (glm47-format.md "Prompt layout").

Every expected prompt is written out literally, derived by hand from glm47-format.md and the tools
preamble wording of our template. Exact string equality: there is no tolerance in a prompt.
"""

import copy
import re

import pytest

from flint_graph.chat_template import GLM47_CHAT_TEMPLATE, render_chat
from flint_graph.errors import InvalidRequestError, TemplateError

# The fixed parts of the tools system block, written out literally (not imported from the module).
TOOLS_HEAD = (
    "<|system|>\n# Tools\n\nYou may call one or more of the functions below to help with the "
    "request.\n\nEach function is described by one JSON object per line inside <tools></tools>:\n"
    "<tools>\n"
)
TOOLS_TAIL = (
    "</tools>\n\nTo call a function, write its name and each argument in this form:\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
    "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>..."
    "</tool_call>"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
# Keys deliberately not in alphabetical order, non-ASCII description: both must survive.
SEARCH = {
    "function": {
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        "name": "search",
        "description": "Suche im Netz — 検索",
    },
    "type": "function",
}
WEATHER_LINE = (
    '{"type": "function", "function": {"name": "get_weather", "description": "Weather for a '
    'city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}'
)
SEARCH_LINE = (
    '{"function": {"parameters": {"type": "object", "properties": {"q": {"type": "string"}}}, '
    '"name": "search", "description": "Suche im Netz — 検索"}, "type": "function"}'
)


def render(messages, tools=None, **kwargs):
    return render_chat(GLM47_CHAT_TEMPLATE, messages, tools, **kwargs)


def call(name, arguments):
    return {"id": f"call_{name}", "type": "function",
            "function": {"name": name, "arguments": arguments}}  # fmt: skip


def test_plain_chat():
    out = render([{"role": "user", "content": "Hello there!"}])
    assert out == "[gMASK]<sop><|user|>Hello there!<|assistant|><think>"


def test_system_and_user():
    msgs = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?\nAnswer in words."}]  # fmt: skip
    assert render(msgs) == (
        "[gMASK]<sop><|system|>You are terse.<|user|>What is 2+2?\nAnswer in words."
        "<|assistant|><think>"
    )


def test_thinking_off_and_no_generation_prompt():
    msgs = [{"role": "user", "content": "Hi"}]
    assert render(msgs, enable_thinking=False) == "[gMASK]<sop><|user|>Hi<|assistant|></think>"
    assert render(msgs, add_generation_prompt=False) == "[gMASK]<sop><|user|>Hi"


def test_one_tool_call_and_result():
    msgs = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "Need the tool.",
         "tool_calls": [call("get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call_get_weather", "content": '{"temp": 21}'},
    ]  # fmt: skip
    assert render(msgs, [WEATHER]) == (
        "[gMASK]<sop>" + TOOLS_HEAD + WEATHER_LINE + "\n" + TOOLS_TAIL
        + "<|user|>Weather in Paris?<|assistant|><think>Need the tool.</think>"
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
        '<|observation|><tool_response>{"temp": 21}</tool_response><|assistant|><think>'
    )  # fmt: skip


def test_several_calls_with_typed_arguments():
    # String values verbatim (inner whitespace, <, quotes, newline); others json.dumps with
    # default separators and non-ASCII kept; a JSON-string `arguments` is decoded first.
    code = 'if a < b:\n    print("x  y")'
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "  Calling tools now.\n",
         "tool_calls": [
             call("run", {"code": code, "retries": 3, "ratio": 2.5, "dry": False}),
             call("book", '{"where": {"city": "Zürich", "n": [1, 2]}, "note": null, "ok": true}'),
             call("ping", {}),
         ]},
    ]  # fmt: skip
    original = copy.deepcopy(msgs)
    assert render(msgs, add_generation_prompt=False) == (
        "[gMASK]<sop><|user|>go<|assistant|></think>Calling tools now."
        "<tool_call>run<arg_key>code</arg_key><arg_value>if a < b:\n    print(\"x  y\")"
        "</arg_value><arg_key>retries</arg_key><arg_value>3</arg_value>"
        "<arg_key>ratio</arg_key><arg_value>2.5</arg_value>"
        "<arg_key>dry</arg_key><arg_value>false</arg_value></tool_call>"
        '<tool_call>book<arg_key>where</arg_key><arg_value>{"city": "Zürich", "n": [1, 2]}'
        "</arg_value><arg_key>note</arg_key><arg_value>null</arg_value>"
        "<arg_key>ok</arg_key><arg_value>true</arg_value></tool_call>"
        "<tool_call>ping</tool_call>"
    )  # fmt: skip
    assert msgs == original  # the caller's JSON-string arguments were not replaced


def test_tool_results_in_a_row_share_one_observation():
    msgs = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "",
         "tool_calls": [call("a", {"x": 1}), call("b", {"y": "z"})]},
        {"role": "tool", "content": "result A"},
        {"role": "tool", "content": " result B "},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": None, "tool_calls": [call("a", {"x": 2})]},
        {"role": "tool", "content": "result C"},
    ]  # fmt: skip
    assert render(msgs) == (
        "[gMASK]<sop><|user|>q<|assistant|></think>"
        "<tool_call>a<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"
        "<tool_call>b<arg_key>y</arg_key><arg_value>z</arg_value></tool_call>"
        "<|observation|><tool_response>result A</tool_response>"
        "<tool_response> result B </tool_response>"
        "<|user|>again<|assistant|></think>"
        "<tool_call>a<arg_key>x</arg_key><arg_value>2</arg_value></tool_call>"
        "<|observation|><tool_response>result C</tool_response><|assistant|><think>"
    )  # fmt: skip


MULTI_TURN = [
    {"role": "user", "content": "First?"},
    {"role": "assistant", "content": "  One.  ", "reasoning_content": "  old thoughts \n"},
    {"role": "user", "content": "Second?"},
    {"role": "assistant", "content": "Let me check.", "reasoning": "\nnew thoughts",
     "tool_calls": [call("lookup", {"k": "v"})]},
    {"role": "tool", "content": "found"},
    {"role": "assistant", "content": "Two.", "reasoning_content": "wrap up"},
]  # fmt: skip


def test_multi_turn_drops_old_reasoning():
    # Turn 1's reasoning precedes the last user message: bare </think>. The current tool loop
    # (after "Second?") keeps its reasoning, stripped; `reasoning` is accepted like
    # `reasoning_content`.
    assert render(MULTI_TURN, add_generation_prompt=False) == (
        "[gMASK]<sop><|user|>First?<|assistant|></think>One.<|user|>Second?"
        "<|assistant|><think>new thoughts</think>Let me check."
        "<tool_call>lookup<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>"
        "<|observation|><tool_response>found</tool_response>"
        "<|assistant|><think>wrap up</think>Two."
    )  # fmt: skip


def test_clear_thinking_false_keeps_all_reasoning():
    out = render(MULTI_TURN, add_generation_prompt=False, clear_thinking=False)
    assert out.startswith(
        "[gMASK]<sop><|user|>First?<|assistant|><think>old thoughts</think>One.<|user|>Second?"
        "<|assistant|><think>new thoughts</think>Let me check."
    )
    assert out.endswith("<|assistant|><think>wrap up</think>Two.")


def test_tools_block_with_system_message():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render(msgs, [WEATHER, SEARCH]) == (
        "[gMASK]<sop>" + TOOLS_HEAD + WEATHER_LINE + "\n" + SEARCH_LINE + "\n" + TOOLS_TAIL
        + "<|system|>Be brief.<|user|>Hi<|assistant|><think>"
    )  # fmt: skip


def test_tool_choice():
    msgs = [{"role": "user", "content": "Hi"}]
    with_tools = "[gMASK]<sop>" + TOOLS_HEAD + WEATHER_LINE + "\n" + TOOLS_TAIL
    assert render(msgs, [WEATHER], tool_choice="none") == (
        "[gMASK]<sop><|user|>Hi<|assistant|><think>"
    )
    named = {"type": "function", "function": {"name": "get_weather"}}
    for choice in (None, "auto", "required", named):
        assert render(msgs, [WEATHER], tool_choice=choice) == (
            with_tools + "<|user|>Hi<|assistant|><think>"
        )
    assert render(msgs, []) == "[gMASK]<sop><|user|>Hi<|assistant|><think>"


@pytest.mark.parametrize(
    ("messages", "field"),
    [
        ([], "messages"),
        ([{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}], "messages[1].role"),
        (["hello"], "messages[0]"),
        ([{"role": "user", "content": [{"type": "text", "text": "a"}]}], "messages[0].content"),
        ([{"role": "assistant", "content": "", "reasoning_content": 3}],
         "messages[0].reasoning_content"),
        ([{"role": "user", "content": "a", "tool_calls": []}], "messages[0].tool_calls"),
        ([{"role": "assistant", "content": "", "tool_calls": {"name": "f"}}],
         "messages[0].tool_calls"),
        ([{"role": "assistant", "content": "", "tool_calls": [call("f", "{not json")]}],
         "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "content": "", "tool_calls": [call("f", "[1, 2]")]}],
         "messages[0].tool_calls[0].function.arguments"),
        ([{"role": "assistant", "content": "", "tool_calls": [call("", {})]}],
         "messages[0].tool_calls[0].function.name"),
        ([{"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}],
         "messages[0].tool_calls[0].function"),
    ],
)  # fmt: skip
def test_bad_messages_name_the_field(messages, field):
    with pytest.raises(InvalidRequestError, match=rf"^{re.escape(field)}(:|\.| )"):
        render(messages)


@pytest.mark.parametrize(
    ("tools", "tool_choice", "field"),
    [
        ({"type": "function"}, None, "tools"),
        ([{"type": "retrieval", "function": {"name": "f"}}], None, "tools[0].type"),
        ([WEATHER, {"type": "function"}], None, "tools[1].function"),
        ([WEATHER, WEATHER], None, "tools[1].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], None,
         "tools[0].function.parameters"),
        ([WEATHER], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (None, "required", "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
    ],
)  # fmt: skip
def test_bad_tools_name_the_field(tools, tool_choice, field):
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidRequestError, match=rf"^{re.escape(field)}(:|\.| )"):
        render(msgs, tools, tool_choice=tool_choice)


def test_bad_flags():
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidRequestError, match="^enable_thinking: expected a bool"):
        render(msgs, enable_thinking="no")
    with pytest.raises(InvalidRequestError, match="^clear_thinking: expected a bool"):
        render(msgs, clear_thinking=None)


def test_template_errors():
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(TemplateError, match="does not compile: .*line 1"):
        render_chat("{% if messages %}unclosed", msgs)
    with pytest.raises(TemplateError, match="raised: no system prompt allowed"):
        render_chat("{{ raise_exception('no system prompt allowed') }}", msgs)
    with pytest.raises(TemplateError, match="failed: .*has no attribute .nothing."):
        render_chat("{{ messages[0].nothing.deeper }}", msgs)
    with pytest.raises(TemplateError, match="failed: .*unsafe"):  # the sandbox is on
        render_chat("{{ messages.__class__.__subclasses__() }}", msgs)


def test_renderer_environment_matches_hf():
    # trim_blocks/lstrip_blocks, tojson as json.dumps with its arguments, loop controls.
    template = (
        "{% for m in messages %}\n    {% if loop.index > 1 %}{% break %}{% endif %}\n"
        "{{ m | tojson }}|{{ m | tojson(separators=(',', ':'), sort_keys=True) }}"
        "|{{ m.content | tojson(ensure_ascii=True) }}\n{% endfor %}"
    )
    msgs = [{"role": "user", "content": "é<&>"}, {"role": "user", "content": "second"}]
    assert render_chat(template, msgs) == (
        '{"role": "user", "content": "é<&>"}|{"content":"é<&>","role":"user"}|"\\u00e9<&>"\n'
    )


@pytest.mark.parametrize("name", ["a b", "x<tool_call>", "", "n" * 65])
def test_tool_names_the_parser_could_never_match_are_refused(name):
    from flint_graph.chat_template import validate_tools
    from flint_graph.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="function.name"):
        validate_tools([{"type": "function", "function": {"name": name}}])


def test_duplicate_tool_name_is_named():
    from flint_graph.chat_template import validate_tools
    from flint_graph.errors import InvalidRequestError

    tool = {"type": "function", "function": {"name": "f"}}
    with pytest.raises(InvalidRequestError, match=r"tools\[1\].*duplicate tool name 'f'"):
        validate_tools([tool, tool])
