"""tool_choice "required" / named (api.forced_call, Request.force / steer) on the CPU with the
tiny checkpoint: which draws the forced `<tool_call>` + name replace, with thinking on (after
the model's `</think>`; an end of turn before it becomes `</think>` and the call; a call the
model opens itself gets only the name) and off (at once); the engine appends the steered
tokens and records their log-probabilities. flint-nano's forced calls over HTTP:
tests/test_server.py."""

import pytest

from flint_graph.api import forced_call
from flint_graph.runtime.sampling import SamplingParams

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_forced_call_names():
    assert forced_call("required") == ""
    assert forced_call(NAMED) == "get_weather"
    assert forced_call("auto") is None and forced_call(None) is None
    assert forced_call("none") is None


def _req(llm, thinking, choice=NAMED):
    return llm._chat_request([{"role": "user", "content": "hi"}], TOOLS,
                             SamplingParams(max_tokens=20), enable_thinking=thinking,
                             tool_choice=choice)


def _ids(llm):
    t = llm.tokenizer
    return (t.token_id("<tool_call>"), t.token_id("</think>"),
            t.encode_text("get_weather"), t.token_id("<|user|>"))


@pytest.mark.parametrize("thinking", [True, False])
def test_draws_are_steered_into_the_call(tiny_llm, thinking):
    call, think, name, eos = _ids(tiny_llm)
    req = _req(tiny_llm, thinking)
    other = 7
    assert other not in (call, think, eos, *name)
    steps = [other, other] if thinking else []
    steered = [req.steer(t) for t in steps]
    if thinking:
        assert steered == [other, other]  # reasoning is left alone
        assert req.steer(think) == think  # the model's own </think> starts the call
    assert [req.steer(other) for _ in range(1 + len(name))] == [call, *name]
    assert req.steer(other) == other  # then the model writes the arguments


def test_an_end_of_turn_before_the_reasoning_ends_becomes_the_call(tiny_llm):
    call, think, name, eos = _ids(tiny_llm)
    req = _req(tiny_llm, True)
    assert eos in req.eos_ids
    assert [req.steer(eos)] + [req.steer(5) for _ in range(1 + len(name))] == \
        [think, call, *name]


def test_a_call_the_model_opens_itself_gets_only_the_forced_name(tiny_llm):
    call, think, name, eos = _ids(tiny_llm)
    req = _req(tiny_llm, True)
    assert [req.steer(call)] + [req.steer(5) for _ in range(len(name))] == [call, *name]
    req = _req(tiny_llm, True, "required")
    assert req.steer(call) == call and req.steer(5) == 5  # required: any name


def test_the_engine_appends_the_forced_tokens(tiny_llm):
    call, think, name, eos = _ids(tiny_llm)
    msg = tiny_llm.chat([{"role": "user", "content": "hi"}], TOOLS,
                        SamplingParams(max_tokens=12, temperature=0, logprobs=True),
                        enable_thinking=False, tool_choice=NAMED)
    out = msg.output
    assert out.token_ids[:1 + len(name)] == [call, *name]
    assert len(out.logprobs) == len(out.token_ids)  # the forced tokens' own log-probabilities
    # the tiny model's call is a call or reported as none; the forced text is never content
    assert [c.name for c in msg.tool_calls] == ["get_weather"] or \
        any(e.startswith("tool call 1") for e in out.errors), (msg, out.errors)
    assert not msg.content.startswith("<tool_call>")


def test_a_named_choice_never_returns_a_call_to_another_tool(tiny_llm):
    """A bad-input trial: tools `get` and `get_weather`, tool_choice naming `get`, and a model
    that continues the forced name with `_weather...` gave a 200 calling get_weather. Under a
    named choice only that tool is declared to the parser: the call is reported and kept as
    content."""
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}
        for n in ("get", "get_weather")]
    tok = tiny_llm.tokenizer
    req = tiny_llm._chat_request([{"role": "user", "content": "hi"}], tools,
                                 SamplingParams(max_tokens=60), enable_thinking=False,
                                 tool_choice={"type": "function", "function": {"name": "get"}})
    req._forced += tok.encode_segments([("_weather<arg_key>city</arg_key><arg_value>Paris"
                                         "</arg_value></tool_call>", False)])
    req._forced.append(tok.token_id("<|observation|>"))
    (out,) = tiny_llm._run([req])
    assert not out.tool_calls, out.tool_calls
    assert any("unknown tool" in e and "get_weather" in e for e in out.errors), out.errors


def test_a_later_turns_calls_get_ids_after_the_conversations_earlier_calls(tiny_llm):
    """LLM.chat numbers a turn's calls after those already in the history (two earlier calls:
    the next is call_2), so a transcript's tool results pair with their calls unambiguously
    (the terminal chat's saved transcripts had call_0 twice, 2026-12-03)."""
    history = [{"role": "user", "content": "weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "call_0", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
               {"role": "tool", "tool_call_id": "call_0", "content": "{}"},
               {"role": "tool", "tool_call_id": "call_1", "content": "{}"},
               {"role": "user", "content": "and Paris?"}]
    req = tiny_llm._chat_request(history, TOOLS, SamplingParams(max_tokens=4),
                                 enable_thinking=False, tool_choice=None)
    req.parser.feed('<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris'
                    '</arg_value></tool_call>')
    req.parser.finish()
    assert [c.id for c in req.parser.result().tool_calls] == ["call_2"]
