"""Checking and normalising OpenAI-style chat requests before a chat template sees them.

Follows the OpenAI chat-completions message shapes and glm47-format.md ("Prompt layout"). Every
template, the checkpoint's own or ours, receives the same normalised messages:
  - `content` is always a string (or None for an assistant turn that only calls tools): a list of
    OpenAI text parts is joined in order with nothing between, as GLM-4.7's own template joins
    them (its `visible_text` macro); other part types are refused, naming the message and part.
  - An assistant turn with inline reasoning (`"<think>R</think>A"` in content, no
    `reasoning_content`) is split into reasoning R and content A by GLM-4.7's own rule, so the
    template's reasoning policy (drop before the last user message) applies to it. This must
    happen here, not in the template: `prompt_segments` hides marker text inside message strings
    from the template, so a template could no longer find the `</think>` to split on.
  - Tool-call `arguments` become a dict: a JSON string is decoded; "" or null mean no arguments.
  - The role "developer" (OpenAI's newer name for system instructions) becomes "system"; an
    assistant turn whose content is null or absent but that has reasoning (what this server
    returns when max_tokens ends an output inside its reasoning) gets content "".
Every value a template receives must be JSON data (strings, numbers, booleans, null, lists,
objects with string keys), valid Unicode (no lone surrogates, which UTF-8 cannot encode) and
nested at most `MAX_NESTING` deep (`check_data`): anything else could print in a form the
escaping of `prompt_segments` never saw (a bytes key prints as `b'<|user|>'`) or fail deep inside
rendering. Errors are InvalidRequestError naming the field, e.g. `messages[2].content[1]`.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping
from typing import Any

from flint_graph.chat.tool_call_reader import CALL_NAME
from flint_graph.checkpoints import jsonfile
from flint_graph.errors import InvalidRequestError, kind, not_utf8, shown

ROLES = ("system", "user", "assistant", "tool")
# OpenAI's newer name for system instructions (sent by recent clients); read as "system"
ROLE_ALIASES = {"developer": "system"}
MAX_NESTING = 200  # lists/objects inside one another; deeper (or a cycle) is refused
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")




_ABSENT = object()


def _found(obj: Mapping, key: str, show=kind) -> str:
    """How an error names obj[key]: 'found null' / 'found integer' (`show`), or 'but the key is
    missing' when it is absent (a missing key read as None was reported as "found None")."""
    value = obj.get(key, _ABSENT)
    return "but the key is missing" if value is _ABSENT else f"found {show(value)}"


def _check_str(value: Any, field: str, *, optional: bool) -> None:
    if not (isinstance(value, str) or (optional and value is None)):
        expected = "a string or null" if optional else "a string"
        raise InvalidRequestError(f"{field}: expected {expected}, found {kind(value)}")


def check_data(value: Any, field: str, depth: int = 0) -> None:
    """Refuse what a chat template must not receive (module docstring): a value that is not
    JSON data, an object key that is not a string, a string with a lone surrogate (an
    undecodable byte read with surrogateescape), NaN or ±inf (no JSON number), or nesting
    deeper than MAX_NESTING.
    InvalidRequestError names the field, e.g. `messages[1].tool_calls[0].function.arguments.k`."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidRequestError(f"{field}: {not_utf8(value, e)}") from None
        return
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN or Infinity (Python's json module writes them as bare words, which
        # then reach the prompt as `"maximum": NaN`): not JSON data
        raise InvalidRequestError(f"{field}: {shown(value)} is not a JSON number; expected a "
                                  "finite number")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4000:
        # Python writes an int of more than sys.get_int_max_str_digits() (4,300 by default)
        # digits only with a ValueError, which the template raised as the checkpoint's fault
        # (a bad-input trial, 2026-12-07: `"maximum": 10**5000` in a tool schema)
        try:
            str(value)
        except ValueError:
            raise InvalidRequestError(f"{field}: an integer of about {_digits(value):,} "
                                      f"digits; expected at most {sys.get_int_max_str_digits():,}"
                                      ) from None
    if value is None or isinstance(value, (bool, int, float)):
        return
    if depth >= MAX_NESTING:
        where = field if len(field) <= 100 else field[:100] + "…"
        raise InvalidRequestError(f"{where}: nested more than {MAX_NESTING} levels deep (or "
                                  "contains itself)")
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRequestError(f"{field}: expected string keys (a JSON object), "
                                          f"found the {kind(key)} key {key!r:.60}")
            check_data(key, f"{field} key {key!r:.60}", depth + 1)
            check_data(item, f"{field}.{key}", depth + 1)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_data(item, f"{field}[{i}]", depth + 1)
    else:
        raise InvalidRequestError(f"{field}: expected JSON data (a string, number, bool, null, "
                                  f"list or object), found {kind(value)}")


def _digits(value: int) -> int:
    """About how many decimal digits `value` has (without writing it out)."""
    return int(value.bit_length() * math.log10(2)) + 1


def _content(m: Mapping, role: str, where: str) -> str | None:
    """The message's content as one string (None only for an assistant turn with tool calls).
    OpenAI: user, system and tool messages need content; an assistant message may omit it
    when it carries tool_calls."""
    if "content" not in m or m["content"] is None:
        if role == "assistant" and m.get("tool_calls"):
            return None
        if role == "assistant" and (m.get("reasoning_content") or m.get("reasoning")
                                    or "content" in m):
            # what this server answers when max_tokens (or a stop string) ends the output
            # inside its reasoning, or before any text at all (a stop string matched at once:
            # content null and nothing else, a bad-input trial of 2026-12-06): an agent loop
            # sends that message back as it came
            return ""
        if "content" in m:
            raise InvalidRequestError(f"{where}.content: expected a string or a list of text "
                                      "parts, found null")  # fmt: skip
        need = "unless it has tool_calls" if role == "assistant" else "(a string or text parts)"
        article = "an" if role == "assistant" else "a"
        raise InvalidRequestError(f"{where}.content: missing; {article} {role} message needs "
                                  f"content {need}")  # fmt: skip
    content = m["content"]
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequestError(f"{where}.content: expected a string or a list of text parts, "
                                  f"found {kind(content)}")  # fmt: skip
    if not content:  # OpenAI refuses an empty array too: it is not an empty string
        raise InvalidRequestError(f"{where}.content: expected a string or a non-empty list of "
                                  "text parts, found an empty list")
    texts = []
    for j, part in enumerate(content):
        part_type = part.get("type") if isinstance(part, Mapping) else None
        if part_type != "text":
            found = f"type {shown(part_type)}" if isinstance(part, Mapping) else kind(part)
            raise InvalidRequestError(f"{where}.content[{j}]: expected a text part "
                                      f'{{"type": "text", "text": ...}} (this model reads only '
                                      f"text), found {found}")  # fmt: skip
        _check_str(part.get("text"), f"{where}.content[{j}].text", optional=False)
        texts.append(part["text"])
    return "".join(texts)


def _split_inline_reasoning(content: str) -> tuple[str, str]:
    """GLM-4.7's template rule for `<think>R</think>A` in assistant content: reasoning is the
    text before the first </think> (after its last <think>), content the text after the last
    </think>; newlines next to the tags are dropped. Returns (reasoning, content)."""
    parts = content.split("</think>")
    reasoning = parts[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, parts[-1].lstrip("\n")


def _normalize_call(call: Any, field: str) -> dict:
    if not isinstance(call, Mapping):
        raise InvalidRequestError(f"{field}: expected an object, found {kind(call)}")
    if call.get("type", "function") != "function":
        raise InvalidRequestError(f'{field}.type: expected "function", found '
                                  f"{shown(call['type'])}")
    fn = call.get("function")
    if not isinstance(fn, Mapping):
        raise InvalidRequestError(f"{field}.function: expected an object, "
                                  f"{_found(call, 'function')}")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{field}.function.name: expected a non-empty string, "
                                  f"{_found(fn, 'name', shown)}")
    if not CALL_NAME.fullmatch(name):
        # what the output parser takes as a name (so every call this server returned comes
        # back), which leaves out the tag characters a name could forge turns with
        raise InvalidRequestError(f"{field}.function.name: {shown(name)} must not hold "
                                  "blanks, '<' or '>'")
    if "id" in call and call["id"] is not None and (not isinstance(call["id"], str)
                                                    or not call["id"]):
        raise InvalidRequestError(f"{field}.id: expected a non-empty string, found "
                                  f"{shown(call['id'])}")
    args = fn.get("arguments")
    if args is None or (isinstance(args, str) and not args.strip()):
        args = {}  # clients write a zero-argument call as "" or null
    elif isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = jsonfile.loads(args)
        except ValueError as e:  # invalid, nested too deeply, an integer past the digit limit
            raise InvalidRequestError(f"{field}.function.arguments: expected a JSON object, "
                                      f"found invalid JSON ({e})") from None  # fmt: skip
    if not isinstance(args, Mapping):
        raise InvalidRequestError(f"{field}.function.arguments: expected a JSON object, "
                                  f"found {kind(args)}")  # fmt: skip
    return {**call, "type": "function", "function": {**fn, "arguments": dict(args)}}


# The most messages one request may hold: far more than any conversation or agent loop needs,
# while 500,000 short messages kept the template busy for 5 s (and 65,536 for 2-3 s) before the
# prompt-size check could refuse them (hostile-input trials, 2026-12-03).
MAX_MESSAGES = 8192


def validate_messages(messages: Any) -> list[dict]:
    """Check OpenAI-style chat messages and return normalised copies (module docstring): content
    a string (text parts joined; None only for an assistant turn with tool calls), inline
    assistant reasoning split out, tool-call arguments dicts, tool results that name their
    calls in the calls' order (`_results_in_call_order`). The caller's objects are not
    modified. Raises InvalidRequestError naming `messages[i].field` with what was expected and
    found."""
    if isinstance(messages, tuple):
        messages = list(messages)
    if not isinstance(messages, list) or not messages:
        found = "an empty list" if isinstance(messages, list) else kind(messages)
        raise InvalidRequestError(f"messages: expected a non-empty list of message objects, "
                                  f"found {found}")
    if len(messages) > MAX_MESSAGES:
        raise InvalidRequestError(f"messages: {len(messages):,} messages; at most "
                                  f"{MAX_MESSAGES:,} (more cannot fit the context)")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            # LLM.chat's answer put straight back into the history (a bad-input trial)
            hint = "; a ChatMessage goes back as .to_dict()" \
                if type(m).__name__ == "ChatMessage" else ""
            raise InvalidRequestError(f"{where}: expected an object, found {kind(m)}{hint}")
        role = ROLE_ALIASES.get(m.get("role"), m.get("role")) \
            if isinstance(m.get("role"), str) else m.get("role")
        if role not in ROLES:
            raise InvalidRequestError(f"{where}.role: expected one of {', '.join(ROLES)} (or "
                                      f"developer, read as system), {_found(m, 'role', shown)}")
        msg = dict(m)
        msg["role"] = role
        # `name` (OpenAI's participant name) is not rendered by the template, but a wrong
        # type there is the caller's bug as anywhere else (a bad-input trial sent 5)
        for key in ("reasoning_content", "reasoning", "name"):
            _check_str(m.get(key), f"{where}.{key}", optional=True)
        if m.get("reasoning_content") and m.get("reasoning") \
                and m["reasoning_content"] != m["reasoning"]:  # ("" is "not given", as null)
            # both names of one field (this server streams both, equal): which one is meant?
            raise InvalidRequestError(f"{where}: reasoning_content and reasoning differ; they "
                                      "name the same field (give one, or both equal)")
        if not m.get("reasoning_content") and m.get("reasoning"):
            # "" is "not given" here as in the check above: the template would otherwise take
            # the empty reasoning_content and drop `reasoning` (a bad-input trial, 2026-12-06;
            # flint-nano renames result keys without its call's reasoning: docs/nano.md)
            msg["reasoning_content"] = m["reasoning"]
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                raise InvalidRequestError(f"{where}.tool_calls: only assistant messages carry "
                                          f"tool calls, found role {role!r}")  # fmt: skip
            if not isinstance(calls, list):
                raise InvalidRequestError(f"{where}.tool_calls: expected a list, "
                                          f"found {kind(calls)}")  # fmt: skip
            msg["tool_calls"] = [_normalize_call(c, f"{where}.tool_calls[{j}]")
                                 for j, c in enumerate(calls)]  # fmt: skip
        msg["content"] = content = _content(m, role, where)
        no_reasoning = not isinstance(m.get("reasoning_content"), str) and \
            not isinstance(m.get("reasoning"), str)  # fmt: skip
        if role == "assistant" and no_reasoning and content and "</think>" in content:
            msg["reasoning_content"], msg["content"] = _split_inline_reasoning(content)
        check_data(m, where)
        for j, call in enumerate(msg.get("tool_calls") or ()):  # decoded JSON strings too
            check_data(call["function"]["arguments"], f"{where}.tool_calls[{j}].function."
                                                      "arguments")
        out.append(msg)
    _check_tool_results(out)
    return _results_in_call_order(out)


def _results_in_call_order(messages: list[dict]) -> list[dict]:
    """`messages` with each run of tool results put in the order of the calls they answer,
    where every result of the run names its call by `tool_call_id` (checked before). OpenAI
    pairs a result with its call by id, but the chat template writes the results as
    `<tool_response>` blocks in message order without ids (glm47-format.md), so the model pairs
    them by position: results sent in another order were answered as if swapped (a bad-input
    trial, 2026-12-06: the 5 km result came back for the 120 km call)."""
    out, i = list(messages), 0
    while i < len(out):
        m = out[i]
        calls = m.get("tool_calls") if m["role"] == "assistant" else None
        j = i + 1
        while j < len(out) and out[j]["role"] == "tool":
            j += 1
        order = {c["id"]: k for k, c in enumerate(calls or ()) if c.get("id") is not None}
        run = out[i + 1:j]
        if run and all(r.get("tool_call_id") is not None and r["tool_call_id"] in order
                       for r in run):
            out[i + 1:j] = sorted(run, key=lambda r: order[r["tool_call_id"]])
        i = j
    return out


def _check_tool_results(messages: list[dict]) -> None:
    """Every tool message answers a call of the assistant message before it (OpenAI's rule:
    a tool result follows an assistant turn with tool_calls, directly or after the results of
    its other calls): at most one result per call, and a `tool_call_id` must name one of that
    turn's call ids (when its calls have ids) not answered yet. Calls left without a result are
    allowed (a client may decline to run one). Raises InvalidRequestError naming the message."""
    calls, asked, ids, answered = None, -1, set(), set()
    results = 0
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m["role"] != "tool":
            calls = m.get("tool_calls") if m["role"] == "assistant" else None
            asked, results, answered = i, 0, set()
            ids = {c["id"] for c in calls or () if c.get("id") is not None}
            if len(ids) < sum(c.get("id") is not None for c in calls or ()):
                raise InvalidRequestError(f"{where}.tool_calls: two calls share an id")
            continue
        if not calls:
            before = (f"messages[{asked}] is a {messages[asked]['role']} message without "
                      "tool_calls" if asked >= 0 else "no message comes before it")
            raise InvalidRequestError(f"{where}: a tool result must follow an assistant "
                                      f"message with tool_calls ({before})")
        results += 1
        if results > len(calls):
            raise InvalidRequestError(f"{where}: more tool results than the {len(calls)} "
                                      f"tool call(s) of messages[{asked}]")
        tid = m.get("tool_call_id")
        if tid is None or not ids:
            continue
        if not isinstance(tid, str):
            raise InvalidRequestError(f"{where}.tool_call_id: expected a string, found "
                                      f"{kind(tid)}")
        if tid not in ids:
            raise InvalidRequestError(f"{where}.tool_call_id: {shown(tid)} answers no call of "
                                      f"messages[{asked}] (its ids: "
                                      f"{', '.join(map(shown, sorted(ids)))})")
        if tid in answered:
            raise InvalidRequestError(f"{where}.tool_call_id: {shown(tid)} was answered "
                                      "already")
        answered.add(tid)


def validate_tools(tools: Any) -> list[dict] | None:
    """Check OpenAI function tools ({"type": "function", "function": {"name", "parameters"?,
    "description"?}}); None or [] mean no tools. Raises InvalidRequestError naming `tools[i]`."""
    if isinstance(tools, tuple):  # as messages may be (a bad-input trial, 2026-12-07)
        tools = list(tools)
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise InvalidRequestError(f"tools: expected a list, found {kind(tools)}")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise InvalidRequestError(f"{where}: expected a tool object ({{\"type\": "
                                      f"\"function\", \"function\": {{...}}}}), found "
                                      f"{kind(tool)}")
        if tool.get("type") != "function":
            raise InvalidRequestError(f"{where}.type: expected \"function\", "
                                      f"{_found(tool, 'type', shown)}")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidRequestError(f"{where}.function: expected an object, "
                                      f"{_found(tool, 'function')}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"{where}.function.name: expected a non-empty string, "
                                      f"{_found(fn, 'name', shown)}")
        if name in names:
            raise InvalidRequestError(f"{where}.function.name: duplicate tool name {name!r}")
        if not _TOOL_NAME.fullmatch(name):
            # The output parser refuses names with spaces or tags, so such a tool could never
            # be called: refuse it here, where the user can fix it.
            raise InvalidRequestError(f"{where}.function.name: {shown(name)} must be letters, "
                                      "digits, '_', '-' or '.' (at most 64)")
        names.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise InvalidRequestError(f"{where}.function.parameters: expected a JSON schema "
                                      f"object, found {kind(params)}")  # fmt: skip
        _check_str(fn.get("description"), f"{where}.function.description", optional=True)
        check_data(tool, where)
    return list(tools)


def check_tool_choice(tool_choice: Any, tools: list[dict] | None) -> None:
    """Check `tool_choice`: None, "none", "auto", "required" (needs tools) or
    {"type": "function", "function": {"name": N}} naming a declared tool; InvalidRequestError."""
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    check_data(tool_choice, "tool_choice")
    declared = [t["function"]["name"] for t in tools or []]
    if tool_choice == "required" and declared:
        return
    names = ", ".join(shown(n) for n in declared) if declared else "none: no tools are declared"
    if tool_choice == "required":
        raise InvalidRequestError('tool_choice: "required" needs tools, and no tools are '
                                  "declared")
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        if isinstance(fn, Mapping) and fn.get("name") in declared:
            return
        if isinstance(fn, Mapping) and isinstance(fn.get("name"), str):
            raise InvalidRequestError(f"tool_choice.function.name: no tool named "
                                      f"{shown(fn['name'])} (declared: {names})")
    # in JSON's words: an HTTP client sent it (a bad-input trial found Python's tuple repr)
    raise InvalidRequestError(f'tool_choice: expected "none", "auto", "required" or '
                              f'{{"type": "function", "function": {{"name": N}}}} naming a '
                              f"declared tool ({names}), found {shown(tool_choice, 120)}")
