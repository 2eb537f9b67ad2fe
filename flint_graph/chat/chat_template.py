"""Chat prompts: our GLM-4.7-layout Jinja template and a renderer that behaves like HF's.

Follows glm47-format.md ("Prompt layout", "Serving flags"). `GLM47_CHAT_TEMPLATE` is our own text;
the synthetic checkpoints ship it in tokenizer_config.json. `render_chat` renders whatever template
a checkpoint ships, in a Jinja sandbox set up as HF transformers sets up `apply_chat_template`
(trim_blocks, lstrip_blocks, loop controls, a `tojson` that is plain `json.dumps`, a
`raise_exception` global), after validating and normalising the OpenAI-style messages and tools
(`chat_messages`). `render_chat_segments` returns the prompt as segments that keep the caller's
data apart from the template's scaffolding, so control-token text in data stays text
(`prompt_segments`); the API encodes those.

Layout the template writes (no newlines between turns):
  [gMASK]<sop>
  [<|system|>\\n# Tools ... <tools>\\n{json.dumps line per tool}\\n</tools>\\n\\n ... call format]
  <|system|>TEXT  <|user|>TEXT
  <|assistant|>(<think>REASONING</think> | </think>)CONTENT<tool_call>NAME<arg_key>K</arg_key>
      <arg_value>V</arg_value>...</tool_call>...
  <|observation|><tool_response>RESULT</tool_response>...   (one marker per run of tool messages)
  <|assistant|><think>   or   <|assistant|></think>  (generation prompt, thinking on / off)
Assistant content and reasoning are stripped (as GLM-4.7's own template does); reasoning is kept
only after the last user message unless clear_thinking=False. Like GLM-4.7's template it also
joins text parts and splits inline `<think>R</think>` out of assistant content, so it renders the
same under HF's apply_chat_template (our renderer does both before rendering).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import jinja2

from flint_graph.chat.chat_messages import (check_data, check_tool_choice, validate_messages,
                                        validate_tools)
from flint_graph.errors import InvalidRequestError, TemplateError, kind, shown
from flint_graph.chat.prompt_segments import DataEscaper, Segment
from flint_graph.chat.template_sandbox import compile_template, render_budgeted, template_variables

__all__ = ["GLM47_CHAT_TEMPLATE", "Segment", "check_template_kwargs", "render_chat",
           "render_chat_segments",
           "validate_messages", "validate_tools"]  # validation lives in chat_messages

# what the sandbox gives every template (template_sandbox.compile_template, and Jinja's own)
TEMPLATE_FUNCTIONS = frozenset({"raise_exception", "strftime_now", "range", "namespace", "dict",
                                "cycler", "joiner"})
TEMPLATE_RESERVED = frozenset({"loop", "caller", "varargs", "kwargs", "self", "super",
                               "lipsum", "environment"})

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
{#- Text parts joined in order (GLM-4.7's visible_text); our renderer joins them first. -#}
{%- macro visible_text(content) -%}
{%- if content is string -%}{{- content -}}
{%- elif content is iterable and content is not mapping -%}
{%- for part in content if part is mapping and part.type == 'text' -%}
{{- part.text -}}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- for m in messages -%}
{%- set content = visible_text(m.content) -%}
{%- if m.role == 'system' -%}
{{- '<|system|>' ~ content -}}
{%- elif m.role == 'user' -%}
{{- '<|user|>' ~ content -}}
{%- elif m.role == 'assistant' -%}
{%- set reasoning = m.reasoning_content if m.reasoning_content is string
      else (m.reasoning if m.reasoning is string else '') -%}
{#- Inline <think>R</think> in content: GLM-4.7's split (the renderer does it first). -#}
{%- if m.reasoning_content is not string and m.reasoning is not string
      and '</think>' in content -%}
{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1]
      .lstrip('\\n') -%}
{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
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


def render_chat(template: str, messages: list[dict], tools: list[dict] | None = None, *,
                add_generation_prompt: bool = True, enable_thinking: bool = True,
                tool_choice: str | dict | None = None, **kwargs: Any) -> str:  # fmt: skip
    """Render `messages` (and `tools`) with the Jinja chat `template`; returns the prompt text.

    Messages follow OpenAI chat (normalised by `chat_messages.validate_messages`): role
    system/user/assistant/tool; content a string or a list of text parts (joined), None only
    for an assistant turn with tool_calls; assistant `reasoning_content` (or `reasoning`, or
    inline `<think>...</think>` in content) and `tool_calls` whose `arguments` may be a dict, a
    JSON string (decoded here), "" or null (no arguments). tool_choice "none" leaves the tools
    out of the prompt (vLLM --exclude-tools-when-tool-choice-none); other choices do not change
    the prompt. Extra `kwargs` (e.g. clear_thinking=False) go to the template as variables.
    Raises InvalidRequestError for bad messages/tools/tool_choice/flags (naming the field) and
    TemplateError if the template does not compile, raises, or fails while rendering.
    """
    segments = render_chat_segments(template, messages, tools, markers=(),
                                    add_generation_prompt=add_generation_prompt,
                                    enable_thinking=enable_thinking, tool_choice=tool_choice,
                                    **kwargs)  # fmt: skip
    return "".join(s.text for s in segments)


def check_template_kwargs(template: Any, kwargs: dict[str, Any]) -> None:
    """Raise InvalidRequestError for a keyword argument `render_chat` would hand `template` as
    a variable and should not: one of the template's own functions or a name Jinja reserves,
    a value that is not data (`check_data`), or a name the template never reads from its
    caller (`template_variables`; it would have no effect)."""
    for name, value in kwargs.items():  # template variables are data too
        if name in TEMPLATE_FUNCTIONS:  # `raise_exception=1` replaced the template's own
            raise InvalidRequestError(f"{name}: the chat template's own function; a template "
                                      "variable cannot replace it")
        if name in TEMPLATE_RESERVED:
            raise InvalidRequestError(f"{name}: a name Jinja gives its own meaning in a "
                                      "template; a template variable cannot take it")
        check_data(value, name)
    free = template_variables(template) if isinstance(template, str) else None
    unread = sorted(set(kwargs) - free) if free is not None else []
    if unread:  # it would go nowhere, silently (a bad-input trial, 2026-12-07: other
        # runtimes' request options, frequency_penalty, n, response_format, chat_template …,
        # and names the template sets itself, keep_reasoning)
        own = sorted(free - TEMPLATE_FUNCTIONS - TEMPLATE_RESERVED
                     - {"messages", "tools", "tool_choice", "add_generation_prompt"})
        one = len(unread) == 1
        names = ", ".join(n if n.isidentifier() and len(n) <= 40 else shown(n, 40)
                          for n in unread[:5]) + (f" and {len(unread) - 5} more"
                                                  if len(unread) > 5 else "")
        raise InvalidRequestError(
            f"{names}: not {'a variable' if one else 'variables'} this checkpoint's chat "
            f"template reads from its caller, so {'it' if one else 'they'} would have no "
            f"effect (it reads {', '.join(own) or 'no other variables'}; sampling settings go "
            "in SamplingParams; other runtimes' request options such as penalties, n or "
            "response_format are not supported)", field=unread[0])


def render_chat_segments(template: str, messages: list[dict], tools: list[dict] | None = None,
                         *, markers: Iterable[str], add_generation_prompt: bool = True,
                         enable_thinking: bool = True, tool_choice: str | dict | None = None,
                         **kwargs: Any) -> list[Segment]:  # fmt: skip
    """Like `render_chat`, but the prompt comes back as `Segment`s that keep the caller's data
    apart from the template's scaffolding (`prompt_segments` says which is which and how).

    `markers`: the text of every added token of the tokenizer that will encode the prompt
    (`FlintTokenizer.added_tokens`); inside data they are encoded as ordinary text. Joined,
    the segments' text is the prompt. Raises as `render_chat`.
    """
    for flag, value in (("add_generation_prompt", add_generation_prompt),
                        ("enable_thinking", enable_thinking),
                        ("clear_thinking", kwargs.get("clear_thinking", True))):  # fmt: skip
        if not isinstance(value, bool):
            raise InvalidRequestError(f"{flag}: expected a bool, found {kind(value)}")
    msgs = validate_messages(messages)
    tool_list = validate_tools(tools)
    check_tool_choice(tool_choice, tool_list)
    check_template_kwargs(template, kwargs)
    if tool_choice == "none":
        tool_list = None
    if not isinstance(template, str):
        raise TemplateError(f"chat template: expected a string, found {kind(template)}")
    compiled = compile_template(template)
    esc = DataEscaper(markers)
    # The role picks scaffolding and is one of four fixed words: everything else is data.
    msgs = [{k: (v if k == "role" else esc.escape(v)) for k, v in m.items()} for m in msgs]
    try:
        text = render_budgeted(compiled, messages=msgs, tools=esc.escape(tool_list),
                       tool_choice=esc.escape(tool_choice),
                       add_generation_prompt=add_generation_prompt,
                       enable_thinking=enable_thinking, **esc.escape(kwargs))  # fmt: skip
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template failed: {e}") from e
    except (InvalidRequestError, TemplateError):
        raise
    except Exception as e:  # a checkpoint's template is untrusted code: any failure is its own
        raise TemplateError(f"chat template failed: {type(e).__name__}: {e}") from e
    return esc.segments(text)
