"""Reading one GLM-4.7 tool call, from just after `<tool_call>` to `</tool_call>` (or its fault).

A call reads `NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>`, whitespace allowed
between tags (the GLM-4.5/4.6 layout). `CallReader` gets the text after `<tool_call>` piece by
piece (`buf`, `run()`) and ends with either a `ToolCall` or the call's raw text, which the
output parser shows as content. Decisions (tests/test_output_parser.py checks each):
- A value ends only at `</arg_value>`: `<`, `>`, newlines, even `<arg_key>` text stay verbatim, so
  a value cannot hold a literal `</arg_value>`. Names and keys are stripped; a name is one
  blank-free word; a key ends at its first tag. Text after `<tool_call>` that can no longer be
  a name (a second word, a `<` or `>` that starts no tag) rejects the call as soon as it
  arrives, so prose that merely mentions `<tool_call>` keeps streaming as content.
- Repairs, each reported in `errors` ("tool call N: repaired ..."), only where one reading is
  possible: a missing `</arg_key>` (`<arg_key>k<arg_value>`), a missing `<arg_value>` (text with
  no tag in it, then `</arg_value>`), a missing `<arg_key>` (a blank-free word, then `</arg_key>`)
  and a doubled `</arg_key>` or `</arg_value>`. Everything else (a missing `</arg_value>` or
  `</tool_call>`, other tags in a key, a blank value without `<arg_value>`, ...) is malformed:
  an error, the raw text to content, never a call with guessed or empty arguments.
- Unknown tool names and repeated keys are found early but the call is still read to its end,
  so its whole raw text becomes content, as for any rejected call.
- Values are typed by the tool's schema (flint_graph/chat/tool_schema.py). A value that fits no
  reading keeps its text and adds an error; the call still counts.
- Streaming (OpenAI's ChoiceDeltaToolCall): the name goes out as soon as the tag after it
  arrives (unless it is not a declared tool), then the arguments as JSON text fragments: a
  value whose schema admits only strings streams as it arrives (its text is the value, whatever
  follows), any other value goes out whole at its `</arg_value>`, and `}` at `</tool_call>`; a
  tool whose parameters are a choice of object schemas (tool_schema.py) types its values only
  once the call is whole, so its arguments go out in one piece at `</tool_call>`. The
  fragments of a call concatenate to exactly `ToolCall.arguments_json()`. A streamed call that
  then turns out malformed gets a last delta with `error` set: it is withdrawn.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flint_graph.chat.tool_schema import ToolSchema, only_strings, type_argument

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"
TAGS = (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN,
        VALUE_CLOSE)  # fmt: skip
MAX_TAG = max(len(t) for t in TAGS)
_ANY_TAG = re.compile("|".join(re.escape(t) for t in TAGS))
_WORD = re.compile(r"[^\s<>]+")  # a name, or a key whose opening/closing tag is missing
CALL_NAME = _WORD  # a function name this parser reads (chat_messages holds history to it)
_WORD_RUN = re.compile(r"[^\s<>]*")
_BLANKS = re.compile(r"\s*")
NAME, KEY, KEY_END, VALUE, NEXT = "name", "key", "key_end", "value", "next"


@dataclass
class ToolCall:
    """One complete, validated call: `arguments` maps each key to its typed value."""

    name: str
    arguments: dict[str, Any]
    id: str  # "call_<n>": n counts the conversation's calls (OutputParser first_id + index)

    def arguments_json(self) -> str:
        """The arguments as the OpenAI `function.arguments` JSON string (non-ASCII kept)."""
        return json.dumps(self.arguments, ensure_ascii=False)


# why an output ended inside a call, in the words of the API's fields (a bad-input trial found
# Python's repr in this message: "(finish_reason='stop_sequence')")
_CUT_BY = {"length": "cut off by max_tokens", "stop_sequence": "cut off by a stop string",
           "abort": "the request was aborted", "repeat": "cut off as a repeating loop"}


@dataclass
class ToolCallDelta:
    """A piece of one streaming tool call, after OpenAI's `ChoiceDeltaToolCall`.

    index: which call (0, 1, ... in the order calls start streaming; a withdrawn call keeps
    its index, so the final `tool_calls` may skip one); id ("call_<index>") and name: on a
    call's first delta only; arguments: the next fragment of its `arguments` JSON text (all of
    a call's fragments joined equal the final `ToolCall.arguments_json()`); error: set on the
    last delta of a call that turned out malformed: drop that call, its text went to content.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    error: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """This delta as an OpenAI `choices[].delta.tool_calls[]` entry (no `error` there)."""
        fn = {"arguments": self.arguments} | ({"name": self.name} if self.name else {})
        head = {"id": self.id, "type": "function"} if self.id else {}
        return {"index": self.index, **head, "function": fn}


def held_from(buf: str, tags: tuple[str, ...] = TAGS) -> int:
    """Start of the longest suffix of `buf` that could still grow into one of `tags` (len(buf)
    if none): the text a streaming reader holds back. Tags hold '<' only at their start, so
    only the last '<' can begin such a suffix."""
    j = buf.rfind("<", max(0, len(buf) - MAX_TAG + 1))
    if j >= 0 and any(t.startswith(buf[j:]) and t != buf[j:] for t in tags):
        return j
    return len(buf)


def _quote(text: str, limit: int = 40) -> str:
    """`text` (its leading blanks dropped) for an error message, cut to `limit` characters."""
    text = text.lstrip()
    return repr(text if len(text) <= limit else text[:limit] + "…")


class CallReader:
    """One call being read. Append text to `buf`, then `run(final)` until it returns True;
    then `call` is the ToolCall, or None and `rejected` is the raw text to show as content, and
    `buf` holds the text after it. `started`: the call took `index` (its name was streamed).

    schemas: tool name -> ToolSchema (None: any name, no schema); number: this call's ordinal
    among opened calls (1, 2, ...; for messages); on_delta / on_error receive ToolCallDeltas and
    error messages as they arise; first_id: added to `index` in the call's id ("call_<n>").
    """

    def __init__(self, schemas: dict[str, ToolSchema] | None, number: int, index: int,
                 on_delta: Callable[[ToolCallDelta], None], on_error: Callable[[str], None],
                 first_id: int = 0):
        self.buf = ""
        self.call: ToolCall | None = None
        self.rejected = ""
        self.started = False
        self._schemas, self._number, self._index = schemas, number, index
        self._id = f"call_{first_id + index}"
        self._on_delta, self._on_error = on_delta, on_error
        self._state, self._scan, self._raw = NAME, 0, [CALL_OPEN]
        self._name_scan, self._name_phase = 0, 0  # how far _name_odd has read, and its phase
        self._name, self._key = "", ""
        self._keys: list[str] = []
        self._args: dict[str, Any] = {}
        self._texts: dict[str, str] = {}  # values as written, for a tool typed as a whole
        self._value: list[str] = []
        self._streaming_value = False
        self._problem: str | None = None  # a reason to reject the call once it is read
        self._done, self._final = False, False
        self._finish_reason: str | None = None
        self._handlers = {NAME: self._on_name, KEY: self._on_key, KEY_END: self._on_key_end,
                          VALUE: self._on_value, NEXT: self._on_next}

    def run(self, final: bool, finish_reason: str | None = None) -> bool:
        """Read as far as `buf` allows (all of it when `final`); True once the call ended."""
        self._final, self._finish_reason = final, finish_reason
        while not self._done and self._handlers[self._state](final):
            pass
        return self._done

    # -- reporting ----------------------------------------------------------------------------

    @property
    def _live(self) -> bool:  # arguments are still being streamed
        return self.started and self._problem is None

    def _delta(self, arguments: str) -> None:
        if self._live and arguments:
            self._on_delta(ToolCallDelta(self._index, arguments=arguments))

    def _note(self, what: str) -> None:
        if self._problem is None:  # a rejected call's repairs would only be noise
            self._on_error(f"tool call {self._number}: repaired {what}")

    def _reject(self, reason: str, raw: str) -> bool:
        message = f"tool call {self._number}: {reason}; its text is kept as content"
        self._on_error(message)
        if self.started:
            self._on_delta(ToolCallDelta(self._index, error=message))
        self.rejected, self._done = raw, True
        return True

    def _malformed(self, at: int, reason: str) -> bool:
        """Reject the call; its raw text up to `at` becomes content, parsing resumes there."""
        raw, self.buf = "".join(self._raw) + self.buf[:at], self.buf[at:]
        if self._final and not self.buf:
            reason += f" ({_CUT_BY.get(self._finish_reason, 'the output ended there')})"
        return self._reject(reason, raw)

    def _fail(self, final: bool, expected: str, where: str) -> bool:
        """Malformed at the current position, quoting the same text at any chunking."""
        if not final and len(self.buf) < MAX_TAG:
            return False
        found = repr(self.buf[:MAX_TAG]) if self.buf else "end of output"
        return self._malformed(0, f"expected {expected} {where}, found {found}")

    # -- reading ------------------------------------------------------------------------------

    def _consume(self, n: int) -> str:
        """Move the first n characters of the buffer into the call's raw text."""
        if not n:  # keep the tag search's place: a long text waiting for a tag stays linear
            return ""
        text, self.buf, self._scan = self.buf[:n], self.buf[n:], 0
        self._raw.append(text)
        return text

    def _skip_blanks(self) -> None:
        self._consume(_BLANKS.match(self.buf).end())

    def _find_tag(self, final: bool) -> re.Match | None:
        """The first tag in the buffer; None (remembering how far was searched) if none yet."""
        m = _ANY_TAG.search(self.buf, self._scan)
        if m is None and not final:
            self._scan = max(0, len(self.buf) - MAX_TAG + 1)
        return m

    def _on_name(self, final: bool) -> bool:
        m = self._find_tag(final)
        # Text that can no longer be a name (a second word, or '<' / '>' that starts no tag)
        # ends the call at once, so what follows streams as content instead of waiting for the
        # next tag or the end of the output (`<tool_call>` written in prose).
        end = m.start() if m is not None else len(self.buf) if final else held_from(self.buf)
        odd = self._name_odd(end)
        if odd < end:
            return self._malformed(odd, "expected a function name (one word) then <arg_key> or "
                                        f"</tool_call>, found {_quote(self.buf[: odd + 1])}")
        if m is None:
            return final and self._malformed(len(self.buf), "output ended inside the call")
        if m.group() not in (KEY_OPEN, CALL_CLOSE):
            return self._malformed(m.start(), f"expected <arg_key> or </tool_call>, "
                                              f"found {m.group()}")
        name = self.buf[: m.start()].strip()
        if not _WORD.fullmatch(name):
            return self._malformed(m.start(), f"invalid function name {_quote(name)}")
        self._name = name
        if self._schemas is not None and name not in self._schemas:
            declared = ", ".join(self._schemas) or "none"
            self._problem = f"unknown tool {_quote(name)} (declared: {declared})"
        else:
            self.started = True
            self._on_delta(ToolCallDelta(self._index, self._id, name))
        self._consume(m.end())
        self._state = KEY
        return True if m.group() == KEY_OPEN else self._complete()

    def _name_odd(self, end: int) -> int:
        """The first position before `end` where the text after `<tool_call>` stops being
        blanks, one word, blanks (a second word, or '<' / '>'), else `end`. Resumes where the
        last call stopped (the buffer only grows while the name is read), so a long word fed
        in small pieces costs linear time."""
        i, phase, buf = self._name_scan, self._name_phase, self.buf
        while i < end:
            c = buf[i]
            if c in "<>":
                return i
            if c.isspace():
                phase = 2 if phase == 1 else phase  # 0: blanks before the word, 2: after it
            elif phase == 2:
                return i
            else:
                phase = 1
            i += 1
        self._name_scan, self._name_phase = i, phase
        return end

    def _on_key(self, final: bool) -> bool:
        m = self._find_tag(final)
        if m is None:
            return final and self._malformed(len(self.buf), "output ended inside a key")
        key = self.buf[: m.start()].strip()
        if m.group() == KEY_CLOSE and key:
            self._consume(m.end())
            self._set_key(key)
            self._state = KEY_END
            return True
        if m.group() == VALUE_OPEN and _WORD.fullmatch(key):
            self._note(f"a missing </arg_key> after key {key!r}")
            self._consume(m.end())
            self._set_key(key)
            self._open_value()
            return True
        if m.group() == KEY_CLOSE:
            return self._malformed(m.start(), "empty argument key")
        return self._malformed(m.start(), f"key {_quote(key)} not closed by </arg_key>")

    def _on_key_end(self, final: bool) -> bool:
        self._skip_blanks()
        if self.buf.startswith(VALUE_OPEN):
            self._consume(len(VALUE_OPEN))
            self._open_value()
            return True
        if self.buf.startswith(KEY_CLOSE):
            self._note(f"a doubled </arg_key> after key {self._key!r}")
            self._consume(len(KEY_CLOSE))
            return True
        m = self._find_tag(final)
        if m is None and not final:
            return False  # the value may still be closed by </arg_value> (a missing opener)
        if m is not None and m.group() == VALUE_CLOSE and self.buf[: m.start()].strip():
            self._note(f"a missing <arg_value> before the value of {self._key!r}")
            value = self._consume(m.start())
            self._consume(len(VALUE_CLOSE))
            self._end_value(value)
            return True
        return self._fail(final, VALUE_OPEN, f"after key {self._key!r}")

    def _on_value(self, final: bool) -> bool:
        i = self.buf.find(VALUE_CLOSE)
        if i < 0:
            if final:
                return self._malformed(len(self.buf), "output ended inside a value")
            self._take_value(held_from(self.buf, (VALUE_CLOSE,)))
            return False
        self._take_value(i)
        self._consume(len(VALUE_CLOSE))
        self._end_value("".join(self._value))
        return True

    def _on_next(self, final: bool) -> bool:
        self._skip_blanks()
        if self.buf.startswith(KEY_OPEN):
            self._consume(len(KEY_OPEN))
            self._state = KEY
            return True
        if self.buf.startswith(CALL_CLOSE):
            self._consume(len(CALL_CLOSE))
            return self._complete()
        if self.buf.startswith(VALUE_CLOSE):
            self._note(f"a doubled </arg_value> after the value of {self._key!r}")
            self._consume(len(VALUE_CLOSE))
            return True
        run = _WORD_RUN.match(self.buf).end()
        rest = self.buf[run:]
        if run and rest.startswith(KEY_CLOSE):
            key = self._consume(run)
            self._note(f"a missing <arg_key> before key {key!r}")
            self._consume(len(KEY_CLOSE))
            self._set_key(key)
            self._state = KEY_END
            return True
        could_grow = any(t.startswith(self.buf) for t in (KEY_OPEN, CALL_CLOSE, VALUE_CLOSE)) \
            or (run and KEY_CLOSE.startswith(rest))
        if could_grow and not final:
            return False
        return self._fail(final, f"{KEY_OPEN} or {CALL_CLOSE}", "after a value")

    # -- arguments ----------------------------------------------------------------------------

    def _set_key(self, key: str) -> None:
        if key in self._keys and self._problem is None:
            self._problem = f"{self._name!r} repeats the argument key {key!r}"
        self._keys.append(key)
        self._key, self._streaming_value = key, False

    def _schema(self) -> tuple[Any, Any]:
        tool = self._tool
        return (tool.param(self._key), tool.root) if tool is not None else (None, None)

    @property
    def _tool(self) -> ToolSchema | None:
        return (self._schemas or {}).get(self._name)

    @property
    def _as_a_whole(self) -> bool:  # typed once the call is whole (tool_schema.py)
        return self._tool is not None and bool(self._tool.variants)

    def _open_value(self) -> None:
        self._state, self._value = VALUE, []
        schema, root = self._schema()
        self._streaming_value = self._live and not self._as_a_whole and only_strings(schema, root)
        if self._streaming_value:  # its text is its value: open the JSON string now
            self._delta(f"{'{' if not self._args else ', '}{_dumps(self._key)}: \"")

    def _take_value(self, n: int) -> None:
        if not n:
            return
        text = self._consume(n)
        self._value.append(text)
        if self._streaming_value:
            self._delta(_dumps(text)[1:-1])  # JSON escapes are per character: fragments join

    def _end_value(self, text: str) -> None:
        self._state = NEXT
        if self._problem is not None:
            return
        if self._as_a_whole:
            self._texts[self._key] = text
            return
        schema, root = self._schema()
        value, note = type_argument(text, schema, root)
        if note is not None:
            self._on_error(f"tool call {self._number}: {self._name} argument {self._key!r}: {note}")
        if self._streaming_value:
            self._delta('"')
        else:
            self._delta(f"{'{' if not self._args else ', '}{_dumps(self._key)}: {_dumps(value)}")
        self._args[self._key] = value

    def _complete(self) -> bool:
        if self._problem is not None:
            return self._reject(self._problem, "".join(self._raw))
        if self._as_a_whole:
            self._args, notes = self._tool.type_arguments(self._texts)
            for note in notes:
                self._on_error(f"tool call {self._number}: {self._name} {note}")
            self._delta(_dumps(self._args))
        else:
            self._delta("}" if self._args else "{}")
        self.call = ToolCall(self._name, self._args, self._id)
        self._done = True
        return True


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
