"""Chat prompts: our GLM-4.7-layout Jinja template and a renderer that behaves like HF's.

Follows glm47-format.md ("Prompt layout", "Serving flags"). `GLM47_CHAT_TEMPLATE` is our own text;
the synthetic checkpoints ship it in tokenizer_config.json. `render_chat` renders whatever template
a checkpoint ships, in a Jinja sandbox set up as HF transformers sets up `apply_chat_template`
(trim_blocks, lstrip_blocks, loop controls, a `tojson` that is plain `json.dumps`, a
`raise_exception` global), after validating the OpenAI-style messages and tools.

Layout the template writes (no newlines between turns):
  [gMASK]<sop>
  [<|system|>\\n# Tools ... <tools>\\n{json.dumps line per tool}\\n</tools>\\n\\n ... call format]
  <|system|>TEXT  <|user|>TEXT
  <|assistant|>(<think>REASONING</think> | </think>)CONTENT<tool_call>NAME<arg_key>K</arg_key>
      <arg_value>V</arg_value>...</tool_call>...
  <|observation|><tool_response>RESULT</tool_response>...   (one marker per run of tool messages)
  <|assistant|><think>   or   <|assistant|></think>  (generation prompt, thinking on / off)
Assistant content and reasoning are stripped (as GLM-4.7's own template does); reasoning is kept
only after the last user message unless clear_thinking=False.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from flint_graph.errors import InvalidRequestError, TemplateError

_TOOLS_PREAMBLE = (
    "<|system|>\\n# Tools\\n\\nYou may call one or more of the functions below to help with the "
    "request.\\n\\nEach function is described by one JSON object per line inside <tools></tools>:"
    "\\n<tools>\\n"
)
_CALL_FORMAT = (
    "</tools>\\n\\nTo call a function, write its name and each argument in this form:\\n"
    "<tool_call>{function-name}<arg_key>{arg-key-1}</arg_key><arg_value>{arg-value-1}"
    "</arg_value><arg_key>{arg-key-2}</arg_key><arg_value>{arg-value-2}</arg_value>..."
    "</tool_call>"
)

GLM47_CHAT_TEMPLATE = (
    """{#- Flint chat template: the GLM-4.7 prompt layout. -#}
{%- set keep_reasoning = clear_thinking is defined and clear_thinking is false -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
[gMASK]<sop>
{%- if tools -%}
{{- '"""
    + _TOOLS_PREAMBLE
    + """' -}}
{%- for tool in tools -%}
{{- tool | tojson(ensure_ascii=False) ~ '\\n' -}}
{%- endfor -%}
{{- '"""
    + _CALL_FORMAT
    + """' -}}
{%- endif -%}
{%- for m in messages -%}
{%- set content = m.content if m.content is string else '' -%}
{%- if m.role == 'system' -%}
{{- '<|system|>' ~ content -}}
{%- elif m.role == 'user' -%}
{{- '<|user|>' ~ content -}}
{%- elif m.role == 'assistant' -%}
{%- set reasoning = m.reasoning_content if m.reasoning_content is string
      else (m.reasoning if m.reasoning is string else '') -%}
{{- '<|assistant|>' -}}
{%- if reasoning.strip() and (keep_reasoning or loop.index0 > ns.last_user) -%}
{{- '<think>' ~ reasoning.strip() ~ '</think>' -}}
{%- else -%}
{{- '</think>' -}}
{%- endif -%}
{{- content.strip() -}}
{%- for call in m.tool_calls or [] -%}
{%- set fn = call.function if call.function is defined else call -%}
{%- if fn.arguments is not mapping -%}
{{- raise_exception('tool call arguments must be a mapping (decode the JSON string first)') -}}
{%- endif -%}
{{- '<tool_call>' ~ fn.name -}}
{%- for key, value in fn.arguments.items() -%}
{{- '<arg_key>' ~ key ~ '</arg_key><arg_value>' -}}
{{- value if value is string else value | tojson(ensure_ascii=False) -}}
{{- '</arg_value>' -}}
{%- endfor -%}
{{- '</tool_call>' -}}
{%- endfor -%}
{%- elif m.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|observation|>' -}}{%- endif -%}
{{- '<tool_response>' ~ content ~ '</tool_response>' -}}
{%- else -%}
{{- raise_exception('unknown message role ' ~ m.role) -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|assistant|>' ~ ('</think>' if enable_thinking is defined and enable_thinking is false
    else '<think>') -}}
{%- endif -%}
"""
)

_ROLES = ("system", "user", "assistant", "tool")
_TOOL_CHOICES = ("none", "auto", "required")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    # HF's override of Jinja's tojson: plain json.dumps (no HTML escaping), non-ASCII kept.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template raised: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])  # fmt: skip
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from e


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check_str(value: Any, field: str, *, optional: bool) -> None:
    if not (isinstance(value, str) or (optional and value is None)):
        expected = "a string or null" if optional else "a string"
        raise InvalidRequestError(f"{field}: expected {expected}, found {_type(value)}")


def _normalize_call(call: Any, field: str) -> dict:
    if not isinstance(call, Mapping):
        raise InvalidRequestError(f"{field}: expected an object, found {_type(call)}")
    if call.get("type", "function") != "function":
        raise InvalidRequestError(f"{field}.type: expected 'function', found {call['type']!r}")
    fn = call.get("function")
    if not isinstance(fn, Mapping):
        raise InvalidRequestError(f"{field}.function: expected an object, found {_type(fn)}")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{field}.function.name: expected a non-empty string, "
                                  f"found {name!r}")  # fmt: skip
    args = fn.get("arguments")
    if isinstance(args, str):  # OpenAI sends arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            raise InvalidRequestError(f"{field}.function.arguments: expected a JSON object, "
                                      f"found invalid JSON ({e})") from e  # fmt: skip
    if not isinstance(args, Mapping):
        raise InvalidRequestError(f"{field}.function.arguments: expected a JSON object, "
                                  f"found {_type(args)}")  # fmt: skip
    return {**call, "type": "function", "function": {**fn, "arguments": dict(args)}}


def validate_messages(messages: Any) -> list[dict]:
    """Check OpenAI-style chat messages and return copies with tool-call arguments decoded to
    dicts (the caller's objects are not modified). Raises InvalidRequestError naming
    `messages[i].field` with the expected and found value."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError(f"messages: expected a non-empty list, found {messages!r:.80}")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise InvalidRequestError(f"{where}: expected an object, found {_type(m)}")
        role = m.get("role")
        if role not in _ROLES:
            raise InvalidRequestError(f"{where}.role: expected one of {_ROLES}, found {role!r}")
        _check_str(m.get("content"), f"{where}.content", optional=True)
        msg = dict(m)
        for key in ("reasoning_content", "reasoning"):
            _check_str(m.get(key), f"{where}.{key}", optional=True)
        calls = m.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                raise InvalidRequestError(f"{where}.tool_calls: only assistant messages carry "
                                          f"tool calls, found role {role!r}")  # fmt: skip
            if not isinstance(calls, list):
                raise InvalidRequestError(f"{where}.tool_calls: expected a list, "
                                          f"found {_type(calls)}")  # fmt: skip
            msg["tool_calls"] = [_normalize_call(c, f"{where}.tool_calls[{j}]")
                                 for j, c in enumerate(calls)]  # fmt: skip
        out.append(msg)
    return out


_TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def validate_tools(tools: Any) -> list[dict] | None:
    """Check OpenAI function tools ({"type": "function", "function": {"name", "parameters"?,
    "description"?}}); None or [] mean no tools. Raises InvalidRequestError naming `tools[i]`."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise InvalidRequestError(f"tools: expected a list, found {_type(tools)}")
    names = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            found = tool.get("type") if isinstance(tool, Mapping) else _type(tool)
            raise InvalidRequestError(f"{where}.type: expected 'function', found {found!r}")
        fn = tool.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidRequestError(f"{where}.function: expected an object, found {_type(fn)}")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequestError(f"{where}.function.name: expected a non-empty string, "
                                      f"found {name!r}")  # fmt: skip
        if name in names:
            raise InvalidRequestError(f"{where}.function.name: duplicate tool name {name!r}")
        if not _TOOL_NAME.fullmatch(name):
            # The output parser refuses names with spaces or tags, so such a tool could never
            # be called: refuse it here, where the user can fix it.
            raise InvalidRequestError(f"{where}.function.name: {name!r} must be letters, "
                                      "digits, '_', '-' or '.' (at most 64)")
        names.add(name)
        params = fn.get("parameters")
        if params is not None and not isinstance(params, Mapping):
            raise InvalidRequestError(f"{where}.function.parameters: expected a JSON schema "
                                      f"object, found {_type(params)}")  # fmt: skip
        _check_str(fn.get("description"), f"{where}.function.description", optional=True)
    return list(tools)


def _check_tool_choice(tool_choice: Any, tools: list[dict] | None) -> None:
    if tool_choice is None or tool_choice in ("none", "auto"):
        return
    declared = [t["function"]["name"] for t in tools or []]
    if tool_choice == "required" and declared:
        return
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        fn = tool_choice.get("function")
        if isinstance(fn, Mapping) and fn.get("name") in declared:
            return
    raise InvalidRequestError(f"tool_choice: expected one of {_TOOL_CHOICES} ('required' needs "
                              f"tools) or a function object naming one of {declared}, "
                              f"found {tool_choice!r:.120}")  # fmt: skip


def render_chat(template: str, messages: list[dict], tools: list[dict] | None = None, *,
                add_generation_prompt: bool = True, enable_thinking: bool = True,
                tool_choice: str | dict | None = None, **kwargs: Any) -> str:  # fmt: skip
    """Render `messages` (and `tools`) with the Jinja chat `template`; returns the prompt text.

    Messages follow OpenAI chat: role system/user/assistant/tool, content str or None, assistant
    `reasoning_content` (or `reasoning`) and `tool_calls` whose `arguments` may be a dict or a
    JSON string (decoded here). tool_choice "none" leaves the tools out of the prompt (vLLM
    --exclude-tools-when-tool-choice-none); other choices do not change the prompt. Extra
    `kwargs` (e.g. clear_thinking=False) go to the template as variables.
    Raises InvalidRequestError for bad messages/tools/tool_choice/flags (naming the field) and
    TemplateError if the template does not compile, raises, or fails while rendering.
    """
    for flag, value in (("add_generation_prompt", add_generation_prompt),
                        ("enable_thinking", enable_thinking),
                        ("clear_thinking", kwargs.get("clear_thinking", True))):  # fmt: skip
        if not isinstance(value, bool):
            raise InvalidRequestError(f"{flag}: expected a bool, found {_type(value)}")
    msgs = validate_messages(messages)
    tool_list = validate_tools(tools)
    _check_tool_choice(tool_choice, tool_list)
    if tool_choice == "none":
        tool_list = None
    if not isinstance(template, str):
        raise TemplateError(f"chat template: expected a string, found {_type(template)}")
    compiled = _compile(template)
    try:
        return compiled.render(messages=msgs, tools=tool_list, tool_choice=tool_choice,
                               add_generation_prompt=add_generation_prompt,
                               enable_thinking=enable_thinking, **kwargs)  # fmt: skip
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template failed: {e}") from e
    except (InvalidRequestError, TemplateError):
        raise
    except Exception as e:  # a checkpoint's template is untrusted code: any failure is its own
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
