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

import json
from collections.abc import Iterable
import contextvars
import math
import time
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.compiler import CodeGenerator
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from flint_graph.chat.chat_messages import (check_data, check_tool_choice, validate_messages,
                                        validate_tools)
from flint_graph.errors import InvalidRequestError, TemplateError, kind
from flint_graph.chat.prompt_segments import DataEscaper, Segment

__all__ = ["GLM47_CHAT_TEMPLATE", "Segment", "render_chat", "render_chat_segments",
           "validate_messages", "validate_tools"]  # validation lives in chat_messages

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


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:  # fmt: skip
    # HF's override of Jinja's tojson: plain json.dumps (no HTML escaping), non-ASCII kept.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template raised: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)




# A render's budget (issue 26: the sandbox kept templates from reaching Python, but nested
# loops, recursive macros and `n ** (n ** n)` ran past 60 s, and `'a' * 500000000` or string
# doubling took 2-8 GB). A chat template renders a few KB in milliseconds; these are far
# above that and far below harm. Each is a TemplateError naming the limit.
RENDER_SECONDS = 5.0  # wall time, checked at every call and operator the template evaluates
RENDER_CALLS = 2_000_000  # calls (functions, macros, filters' callables) and operators
RENDER_RANGE_ITEMS = 2_000_000  # items of every range() of one render together
RENDER_CHARS = 64 << 20  # characters of the output, and of one string or list * / + builds
RENDER_INT_BITS = 1 << 16  # bits of an integer ** may produce
_BUDGET: contextvars.ContextVar[list | None] = contextvars.ContextVar("render_budget",
                                                                      default=None)


def _spend(calls: int = 1, items: int = 0) -> None:
    """Charge the current render's budget ([deadline, calls left, range items left])."""
    b = _BUDGET.get()
    if b is None:
        return
    b[1] -= calls
    b[2] -= items
    if b[1] < 0:
        raise TemplateError(f"chat template: more than {RENDER_CALLS:,} calls and operations "
                            "in one render")
    if b[2] < 0:
        raise TemplateError(f"chat template: its range() loops exceed {RENDER_RANGE_ITEMS:,} "
                            "items in one render")
    if time.perf_counter() > b[0]:
        raise TemplateError(f"chat template: rendering took more than {RENDER_SECONDS:g} s")


def _budget_range(*args: int) -> range:
    r = safe_range(*args)
    _spend(items=len(r))
    return r


class _BudgetedCodeGenerator(CodeGenerator):
    """Jinja's code generator with `~` (concatenation) routed through the environment's
    `budgeted_concat`, which the sandbox cannot intercept otherwise (string doubling with `~`
    reached gigabytes)."""

    def visit_Concat(self, node, frame) -> None:
        self.write("environment.budgeted_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BudgetedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with every call and `*`, `**`, `+`, `~` charged to the render's
    budget, and those operators refused where their result would be too large to build."""

    intercepted_binops = frozenset({"*", "**", "+"})
    code_generator_class = _BudgetedCodeGenerator

    def budgeted_concat(self, values) -> str:
        """`a ~ b ~ ...` (no autoescape here: str of each, joined) within the budget."""
        _spend()
        parts = [str(v) for v in values]
        if sum(map(len, parts)) > RENDER_CHARS:
            raise TemplateError(f"chat template: builds a value longer than {RENDER_CHARS:,}")
        return "".join(parts)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        _spend()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator: str, left: Any, right: Any) -> Any:
        _spend()
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
        if operator == "**" and ints and abs(left) > 1 and right > 0 and \
                right * math.log2(abs(left)) > RENDER_INT_BITS:
            raise TemplateError(f"chat template: {left} ** {right} is larger than "
                                f"{RENDER_INT_BITS:,} bits")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and \
                        len(seq) * n > RENDER_CHARS:
                    raise TemplateError(f"chat template: a sequence of {len(seq):,} times "
                                        f"{n:,} is longer than {RENDER_CHARS:,}")
        if operator == "+" and all(isinstance(v, (str, list, tuple)) for v in (left, right)) \
                and len(left) + len(right) > RENDER_CHARS:
            raise TemplateError(f"chat template: builds a value longer than {RENDER_CHARS:,}")
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = _BudgetedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["range"] = _budget_range
    env.globals.pop("lipsum", None)  # megabytes of filler text on request: no use in a prompt
    try:
        return env.from_string(template)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"chat template does not compile: {e.message} (line {e.lineno})") from e
    except RecursionError:
        raise TemplateError("chat template does not compile: nested too deeply") from None
    except MemoryError:
        raise TemplateError("chat template does not compile: too large") from None


def _render(compiled: jinja2.Template, **variables: Any) -> str:
    """`compiled.render(**variables)` within the render budget (RENDER_* above): output
    gathered chunk by chunk up to RENDER_CHARS characters."""
    token = _BUDGET.set([time.perf_counter() + RENDER_SECONDS, RENDER_CALLS,
                         RENDER_RANGE_ITEMS])
    try:
        parts, size = [], 0
        for chunk in compiled.generate(**variables):
            size += len(chunk)
            if size > RENDER_CHARS:
                raise TemplateError(f"chat template: its output passes {RENDER_CHARS:,} "
                                    "characters")
            parts.append(chunk)
            _spend(calls=0)
        return "".join(parts)
    finally:
        _BUDGET.reset(token)


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
    for name, value in kwargs.items():  # template variables are data too
        check_data(value, name)
    if tool_choice == "none":
        tool_list = None
    if not isinstance(template, str):
        raise TemplateError(f"chat template: expected a string, found {kind(template)}")
    compiled = _compile(template)
    esc = DataEscaper(markers)
    # The role picks scaffolding and is one of four fixed words: everything else is data.
    msgs = [{k: (v if k == "role" else esc.escape(v)) for k, v in m.items()} for m in msgs]
    try:
        text = _render(compiled, messages=msgs, tools=esc.escape(tool_list),
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
