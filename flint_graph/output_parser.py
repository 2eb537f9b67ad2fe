"""Streaming split of GLM-4.7 output text into reasoning, content and tool calls.

Follows ../shared/glm47-format.md, "Parser requirements" 1-11. Input: incremental detokenizer text,
in which the tags `<think>` `</think>` `<tool_call>` `</tool_call>` `<arg_key>` `</arg_key>`
`<arg_value>` `</arg_value>` survive and role markers never appear. A call reads
`<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`; whitespace between
tags (GLM-4.5/4.6 newline layout) is accepted. Decisions (tests/test_output_parser.py checks each):
- Tags are matched as text (requirement 10's token-id matching needs tag marks this API lacks).
- Thinking on: output starts in reasoning; a leading `<think>` (after optional blanks) is dropped;
  reasoning ends at the first `</think>` or `<tool_call>` and is kept as written. Thinking off: no
  reasoning state; every tag but `<tool_call>` is plain content.
- Content loses its leading whitespace after `</think>` and after each parsed call; streaming
  holds that whitespace until a visible character arrives, so both modes agree.
- A value ends only at `</arg_value>`: `<`, `>`, `</div>`, newlines, even `<arg_key>` or
  `</tool_call>` text stay verbatim. The format has no escaping, so a value cannot hold a literal
  `</arg_value>` (the value would end early and the call be reported malformed). Names and keys
  are stripped; any tag other than `</arg_key>` inside a key is malformed.
- Typing: a parameter whose schema allows "string" keeps its text verbatim ("null" is None when
  null is allowed too); otherwise the stripped text is JSON-decoded and kept if it fits a declared
  type (integer, number, boolean (also True/False), object, array, null); else JSON-decoded as
  is; else kept as text. Undeclared parameters and tools=None use the last two rules.
- A malformed call (missing or unexpected tag, empty or blank-containing name, repeated key), a
  call still open at finish(), or a call to a name not in `tools` adds a message to `errors`, and
  its raw text becomes content verbatim; parsing resumes as content where the fault was found.
  tools=None checks no names; tools=[] rejects every call.
- Output ending in reasoning (no `</think>`, no call): finish_reason "length" or "abort" keeps it
  reasoning (cut off mid-thought); any other ("stop", None, ...) means the model ended it, so it
  is the answer: result() has it as content only, and finish()'s delta repeats it as content
  (it was already streamed as reasoning).
- Call ids are "call_0", "call_1", ... in the order one parser emits calls.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from flint_graph.errors import InvalidRequestError

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN,
        VALUE_CLOSE)  # fmt: skip
_MAX_TAG = max(len(t) for t in TAGS)
_ANY_TAG = re.compile("|".join(re.escape(t) for t in TAGS))
_REASONING_END = re.compile(f"{re.escape(THINK_CLOSE)}|{re.escape(CALL_OPEN)}")
_CONTENT_END = re.compile(re.escape(CALL_OPEN))
_NAME = re.compile(r"[^\s<>]+")
_NO_JSON = object()
_FITS = {  # JSON-schema type -> does a decoded value have it
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}
# Parser states. Text states emit as they go; the call states only accumulate raw text.
START, REASONING, STRIP, CONTENT = "start", "reasoning", "strip", "content"
NAME, NEXT, KEY, KEY_END, VALUE = "name", "next", "key", "key_end", "value"
_AFTER_VALUE = ((KEY_OPEN, KEY), (CALL_CLOSE, CONTENT))  # CONTENT: _complete() sets the state
_AFTER_KEY = ((VALUE_OPEN, VALUE),)
_CUT_OFF = ("length", "abort")  # finish reasons that end the output from outside the model


@dataclass
class ToolCall:
    """One complete, validated call: `arguments` maps each key to its typed value."""

    name: str
    arguments: dict[str, Any]
    id: str  # "call_<n>", n counting the calls this parser emitted, from 0

    def arguments_json(self) -> str:
        """The arguments as the OpenAI `function.arguments` JSON string (non-ASCII kept)."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class ParseDelta:
    """What one feed()/finish() released. Deltas are final: later text never revises them."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class ParsedOutput:
    """Everything parsed so far; after finish(), the same for any chunking of the text."""

    reasoning: str
    content: str
    tool_calls: list[ToolCall]
    errors: list[str]


def _tool_schemas(tools: list[dict] | None) -> dict[str, dict] | None:
    """Map tool name -> its `parameters.properties` (possibly empty) from OpenAI tool objects."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidRequestError(f"tools: expected a list of tool objects, found {type(tools)}")
    schemas: dict[str, dict] = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name or tool.get("type", "function") != "function":
            raise InvalidRequestError(
                f"tools[{i}]: expected {{'type': 'function', 'function': {{'name': str, ...}}}}, "
                f"found {str(tool)[:120]}"
            )
        if name in schemas:
            raise InvalidRequestError(f"tools[{i}]: duplicate function name {name!r}")
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, dict) else None
        schemas[name] = props if isinstance(props, dict) else {}
    return schemas


def _schema_types(schema: Any) -> set[str]:
    """JSON-schema type names a parameter allows (`type` string or list, anyOf/oneOf members)."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    types = {kind} if isinstance(kind, str) else set()
    if isinstance(kind, list):
        types = {t for t in kind if isinstance(t, str)}
    for group in ("anyOf", "oneOf"):
        for sub in schema.get(group) if isinstance(schema.get(group), list) else ():
            types |= _schema_types(sub)
    return types


def _typed(value: str, schema: Any) -> Any:
    """Type one argument's text by its schema (module docstring, "Argument typing")."""
    types, text = _schema_types(schema), value.strip()
    if "null" in types and text == "null":
        return None
    if "string" in types:
        return value
    try:
        decoded = json.loads(text)
    except ValueError:
        decoded = _NO_JSON
    if decoded is not _NO_JSON and any(_FITS[t](decoded) for t in types if t in _FITS):
        return decoded
    if "boolean" in types and text in ("True", "False"):
        return text == "True"
    return value if decoded is _NO_JSON else decoded


def _held_from(buf: str) -> int:
    """Start of the longest suffix of `buf` that could still grow into a tag (len(buf) if none).

    Tags hold '<' only at their start, so only the last '<' can begin such a suffix.
    """
    j = buf.rfind("<", max(0, len(buf) - _MAX_TAG + 1))
    if j >= 0 and any(t.startswith(buf[j:]) and t != buf[j:] for t in TAGS):
        return j
    return len(buf)


class OutputParser:
    """Incremental parser of one generation: feed() text pieces, then finish() once.

    tools: OpenAI tool objects ({"type": "function", "function": {"name", "parameters"}}), used to
    check call names and type arguments; None checks nothing. thinking: whether the prompt ended
    inside `<think>`. Raises InvalidRequestError for a malformed `tools` list. Decisions and
    policies: module docstring.
    """

    def __init__(self, tools: list[dict] | None = None, thinking: bool = True):
        self._schemas = _tool_schemas(tools)
        self._state = START if thinking else STRIP
        self._buf = ""  # text not yet decided
        self._scan = 0  # in a call state: no tag starts in _buf before this offset
        self._raw: list[str] = []  # the current call's text, as read
        self._name, self._key = "", ""
        self._args: list[tuple[str, str]] = []
        self._num_calls = 0  # calls opened, for error messages
        self._finished = False
        self._finish_reason: str | None = None
        self._parts: dict[str, list[str]] = {REASONING: [], CONTENT: []}  # joined by result()
        self._tool_calls: list[ToolCall] = []
        self._errors: list[str] = []
        self._delta = ParseDelta()
        self._handlers = {
            START: self._on_start, REASONING: self._on_text, CONTENT: self._on_text,
            STRIP: self._on_strip, NAME: self._on_name, KEY: self._on_key, VALUE: self._on_value,
            NEXT: lambda final: self._expect(final, _AFTER_VALUE, "after a value"),
            KEY_END: lambda final: self._expect(final, _AFTER_KEY, f"after key {self._key!r}"),
        }  # fmt: skip

    # -- public -------------------------------------------------------------------------------

    def feed(self, text: str) -> ParseDelta:
        """Add generated text; returns what can now be released (a partial tag is held back)."""
        if self._finished:
            raise RuntimeError("OutputParser.feed() called after finish()")
        if not isinstance(text, str):
            raise TypeError(f"OutputParser.feed(text): expected str, found {type(text).__name__}")
        self._delta, self._buf = ParseDelta(), self._buf + text
        self._run(final=False)
        return self._delta

    def finish(self, finish_reason: str | None = None) -> ParseDelta:
        """End of output: release held text, report an open call, apply the no-`</think>` policy.

        finish_reason "length" or "abort" keeps unterminated reasoning as reasoning; anything else
        turns it into content (the delta then carries the whole reasoning text again, as content).
        """
        if self._finished:
            raise RuntimeError("OutputParser.finish() called twice")
        self._delta, self._finished = ParseDelta(), True
        self._finish_reason = finish_reason
        self._run(final=True)
        if self._state == REASONING and finish_reason not in _CUT_OFF:
            text, self._parts[REASONING] = "".join(self._parts[REASONING]), []
            self._emit(CONTENT, text)
        return self._delta

    def result(self) -> ParsedOutput:
        """A copy of everything parsed so far (complete once finish() has run)."""
        reasoning, content = ("".join(self._parts[c]) for c in (REASONING, CONTENT))
        return ParsedOutput(reasoning, content, list(self._tool_calls), list(self._errors))

    # -- emission -----------------------------------------------------------------------------

    def _emit(self, channel: str, text: str) -> None:
        """Append to "reasoning" or "content" of both the accumulated output and the delta."""
        self._parts[channel].append(text)  # a list: long outputs must not be re-copied per token
        setattr(self._delta, channel, getattr(self._delta, channel) + text)

    def _error(self, message: str) -> None:
        self._errors.append(message)
        self._delta.errors.append(message)

    # -- state machine: each handler returns True while it makes progress ----------------------

    def _run(self, final: bool) -> None:
        while self._handlers[self._state](final):
            pass

    def _on_start(self, final: bool) -> bool:
        rest = self._buf.lstrip()
        if rest.startswith(THINK_OPEN):
            self._buf = rest[len(THINK_OPEN) :]
        elif THINK_OPEN.startswith(rest) and not final:
            return False  # blank or a prefix of "<think>": cannot tell yet
        self._state = REASONING
        return True

    def _on_text(self, final: bool) -> bool:
        channel = self._state  # "reasoning" | "content"
        m = (_REASONING_END if channel == REASONING else _CONTENT_END).search(self._buf)
        if m is None:
            cut = len(self._buf) if final else _held_from(self._buf)
            self._emit(channel, self._buf[:cut])
            self._buf = self._buf[cut:]
            return False
        self._emit(channel, self._buf[: m.start()])
        self._buf = self._buf[m.end() :]
        if m.group() == THINK_CLOSE:
            self._state = STRIP
        else:
            self._num_calls += 1
            self._raw, self._args, self._scan, self._state = [CALL_OPEN], [], 0, NAME
        return True

    def _on_strip(self, final: bool) -> bool:
        self._buf = self._buf.lstrip()
        if not self._buf:
            return False
        self._state = CONTENT
        return True

    def _consume(self, n: int) -> str:
        """Move the first n characters of the buffer into the current call's raw text."""
        text, self._buf, self._scan = self._buf[:n], self._buf[n:], 0
        self._raw.append(text)
        return text

    def _find_tag(self, final: bool) -> re.Match | None:
        """The first tag in the buffer; None (remembering how far was searched) if none yet."""
        m = _ANY_TAG.search(self._buf, self._scan)
        if m is None and not final:
            self._scan = max(0, len(self._buf) - _MAX_TAG + 1)
        return m

    def _on_name(self, final: bool) -> bool:
        m = self._find_tag(final)
        if m is None:
            return final and self._malformed(len(self._buf), "output ended inside the call")
        name = self._buf[: m.start()].strip()
        if m.group() not in (KEY_OPEN, CALL_CLOSE):
            found = m.group()
            return self._malformed(m.start(), f"expected <arg_key> or </tool_call>, found {found}")
        if not _NAME.fullmatch(name):
            return self._malformed(m.start(), f"invalid function name {name!r}")
        self._name = name
        self._consume(m.end())
        self._state = KEY
        return True if m.group() == KEY_OPEN else self._complete()

    def _expect(self, final: bool, options: tuple[tuple[str, str], ...], where: str) -> bool:
        """After optional whitespace, one of `options` (tag, next state) must follow."""
        self._consume(len(self._buf) - len(self._buf.lstrip()))
        for tag, then in options:
            if self._buf.startswith(tag):
                self._consume(len(tag))
                self._state = then
                return self._complete() if tag == CALL_CLOSE else True
        if not final and len(self._buf) < _MAX_TAG:
            return False  # wait, so that the error quotes the same text at any chunking
        found = repr(self._buf[:_MAX_TAG]) if self._buf else "end of output"
        tags = " or ".join(tag for tag, _ in options)
        return self._malformed(0, f"expected {tags} {where}, found {found}")

    def _on_key(self, final: bool) -> bool:
        m = self._find_tag(final)
        if m is None:
            return final and self._malformed(len(self._buf), "output ended inside a key")
        key = self._buf[: m.start()].strip()
        if m.group() != KEY_CLOSE or not key:
            return self._malformed(m.start(), f"key {key!r} not closed by </arg_key>")
        self._key = key
        self._consume(m.end())
        self._state = KEY_END
        return True

    def _on_value(self, final: bool) -> bool:
        i = self._buf.find(VALUE_CLOSE, self._scan)
        if i < 0:
            if final:
                return self._malformed(len(self._buf), "output ended inside a value")
            self._scan = max(0, len(self._buf) - len(VALUE_CLOSE) + 1)
            return False
        self._args.append((self._key, self._consume(i)))
        self._consume(len(VALUE_CLOSE))
        self._state = NEXT
        return True

    def _malformed(self, at: int, reason: str) -> bool:
        """Report the open call; its raw text up to `at` becomes content, parsing resumes there."""
        raw = "".join(self._raw) + self._buf[:at]
        self._buf, self._state = self._buf[at:], CONTENT
        if self._finished and not self._buf:
            reason += f" (finish_reason={self._finish_reason!r})"
        self._error(f"tool call {self._num_calls}: {reason}; its text is kept as content")
        self._emit(CONTENT, raw)
        return True

    def _complete(self) -> bool:
        """A structurally whole call: check name and keys, type the values, emit it."""
        raw, name, keys = "".join(self._raw), self._name, [k for k, _ in self._args]
        problem = None
        if self._schemas is not None and name not in self._schemas:
            problem = f"unknown tool {name!r} (declared: {', '.join(self._schemas) or 'none'})"
        elif len(set(keys)) != len(keys):
            problem = f"{name!r} repeats an argument key ({', '.join(keys)})"
        if problem is not None:
            self._error(f"tool call {self._num_calls}: {problem}; its text is kept as content")
            self._emit(CONTENT, raw)
            self._state = CONTENT
            return True
        props = (self._schemas or {}).get(name, {})
        args = {k: _typed(v, props.get(k)) for k, v in self._args}
        call = ToolCall(name, args, f"call_{len(self._tool_calls)}")
        self._tool_calls.append(call)
        self._delta.tool_calls.append(call)
        self._state = STRIP
        return True


def parse_output(
    text: str,
    tools: list[dict] | None = None,
    thinking: bool = True,
    finish_reason: str | None = None,
) -> ParsedOutput:
    """One-shot parse of a whole generation: `feed(text)` then `finish(finish_reason)`."""
    parser = OutputParser(tools, thinking)
    parser.feed(text)
    parser.finish(finish_reason)
    return parser.result()
