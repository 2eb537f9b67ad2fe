"""Streaming split of GLM-4.7 output text into reasoning, content and tool calls.

Follows ../shared/glm47-format.md, "Parser requirements" 1-11. Input: incremental detokenizer text,
in which the tags `<think>` `</think>` `<tool_call>` `</tool_call>` `<arg_key>` `</arg_key>`
`<arg_value>` `</arg_value>` survive and role markers never appear. This module splits the text;
flint_graph/chat/tool_call_reader.py reads each call (grammar, repairs, streaming arguments) and
flint_graph/chat/tool_schema.py types its values. Decisions (tests/test_output_parser.py checks each):
- Tags are matched as text (requirement 10's token-id matching needs tag marks this API lacks).
- Thinking on: output starts in reasoning; a leading `<think>` (after optional blanks) is dropped;
  reasoning ends at the first `</think>` or `<tool_call>` and is kept as written. When a call
  ended it, the model's own `</think>` may still follow in the content: that first `</think>`
  is dropped (with the blanks after it), so no tag text reaches content.
- Thinking off: no reasoning unless the model opens it itself: output that starts (after
  blanks) with `<think>` has that reasoning split out as with thinking on; a leading bare
  `</think>` is dropped (with the blanks around it). Elsewhere `<think>` / `</think>` are plain
  content, and an output that starts with neither keeps its leading whitespace (an answer that
  begins with an indented code line stays indented).
- Tools: a list with at least one tool, or None (any name, no schema: values JSON-decoded when
  they parse), turns call parsing on. No tools (`[]`) turns it off: `<tool_call>` text is plain
  content and no warnings arise, as in vLLM, which runs no tool parser for a request without
  tools. With tools, a call to an undeclared name is an error and stays visible as content.
- Content loses its leading whitespace after `</think>` and after each parsed call; streaming
  holds that whitespace until a visible character arrives, so both modes agree.
- Output ending in reasoning (no `</think>`, no call): finish_reason "length", "abort", "repeat"
  or "stop_sequence" (a caller's stop string or stop token id) keeps it reasoning (cut off
  mid-thought from outside); any other ("stop": the model's end of turn, None, ...) means the
  model ended it, so it is the answer: result() has it as content only, and finish()'s delta
  repeats it as content (it was already streamed as reasoning).
- With tools, a call's inner tags in content (`<arg_key>` … `</tool_call>` with no `<tool_call>`
  before them: the model skipped the opening tag) stay content as written and add one error, so
  a half-written call is never shown as a plain answer without a warning (none after a rejected
  call: its leftover tags are covered by that call's error).
- A call the engine forced (tool_choice: `forced`, the `<tool_call>` and name it wrote) that
  the model did not complete is withdrawn: nothing after the forced text becomes content (it
  is the result's `withdrawn`), and its error ends "withdrawn (tool_choice forced it)".
- Errors (`errors`): malformed or rejected calls (their raw text becomes content), repairs,
  arguments that fit no reading of their schema, required arguments a kept call lacks and
  arguments it has that the tool does not declare (unless its additionalProperties is true or
  a schema; the call keeps them), each as "tool call N: ...".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache

from flint_graph.chat.tool_call_reader import (
    CALL_CLOSE,
    CALL_OPEN,
    KEY_CLOSE,
    KEY_OPEN,
    TAGS,
    VALUE_CLOSE,
    VALUE_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    CallReader,
    ToolCall,
    ToolCallDelta,
    held_from,
)
from flint_graph.chat.tool_schema import tool_schemas

__all__ = ["TAGS", "OutputParser", "ParseDelta", "ParsedOutput", "ToolCall", "ToolCallDelta",
           "parse_output"]

# Parser states: the text states emit as they go; CALL hands the text to a CallReader.
START, START_OFF, REASONING, STRIP, CONTENT, CALL = (
    "start", "start_off", "reasoning", "strip", "content", "call")
# finish reasons that end the output from outside the model; "stop_sequence": a caller's stop
# string or stop token (the request still finishes "stop", as in OpenAI's API)
_CUT_OFF = ("length", "abort", "repeat", "stop_sequence")
# a call's inner tags: in content (no `<tool_call>` before them) they are a malformed call
_STRAY = (CALL_CLOSE, KEY_OPEN, KEY_CLOSE, VALUE_OPEN, VALUE_CLOSE)


@dataclass
class ParseDelta:
    """What one feed()/finish() released. Deltas are final: later text never revises them.

    tool_calls: calls completed by this text (whole ToolCall objects); tool_call_deltas: the
    streaming pieces of calls (name, then arguments JSON fragments, or a withdrawal), see
    ToolCallDelta."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    tool_call_deltas: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class ParsedOutput:
    """Everything parsed so far; after finish(), the same for any chunking of the text."""

    reasoning: str
    content: str
    tool_calls: list[ToolCall]
    errors: list[str]
    # what the model wrote after a forced call's `<tool_call>` and name when that call was
    # rejected (`OutputParser(forced=…)`): shown neither as content nor as a call
    withdrawn: str = ""


# a rejected call's error ends so (tool_call_reader); a withdrawn forced call's so instead
KEPT, WITHDRAWN = "; its text is kept as content", "; withdrawn (tool_choice forced it)"


@cache
def _pattern(tags: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(re.escape(t) for t in tags))


class OutputParser:
    """Incremental parser of one generation: feed() text pieces, then finish() once.

    tools: OpenAI tool objects ({"type": "function", "function": {"name", "parameters"}}), used to
    check call names and type arguments; None parses calls to any name without a schema; []
    parses no calls. thinking: whether the prompt ended inside `<think>`. Raises
    InvalidRequestError for a malformed `tools` list. first_id: the number in the first call's
    id ("call_<first_id>", then counting up), so that a conversation's calls keep distinct ids
    when each turn is parsed anew (LLM.chat passes the calls already in the history). forced:
    the text the engine wrote for the model at the start of its first call (`<tool_call>` and
    the forced name, `LLM._force_call`): when that call is rejected, none of its text becomes
    content (the result's `withdrawn` holds what the model wrote after the forced text).
    Decisions and policies: module docstring.
    """

    def __init__(self, tools: list[dict] | None = None, thinking: bool = True,
                 first_id: int = 0, forced: str | None = None):
        self._first_id = first_id
        self._forced = forced
        self._withdrawn: list[str] = []  # content after a rejected forced call
        self._withholding = False
        self._schemas = tool_schemas(tools)
        self._calls_on = tools is None or len(tools) > 0
        # Text states hold back a suffix that may become a tag they act on (none but the
        # reasoning tags when calls are off: then call tags are plain text).
        self._hold = TAGS if self._calls_on else (THINK_OPEN, THINK_CLOSE)
        self._state = START if thinking else START_OFF
        self._buf = ""  # text not yet decided
        self._call: CallReader | None = None
        self._num_calls = 0  # calls opened, for error messages
        self._num_started = 0  # calls that streamed their name: the next call's delta index
        self._think_pending = False  # a call ended reasoning before the model's own </think>
        self._finished = False
        self._finish_reason: str | None = None
        self._parts: dict[str, list[str]] = {REASONING: [], CONTENT: []}  # joined by result()
        self._tool_calls: list[ToolCall] = []
        self._errors: list[str] = []
        self._stray_seen = False  # a call's inner tag already reported in content
        self._delta = ParseDelta()
        self._handlers = {START: self._on_start, START_OFF: self._on_start_off,
                          REASONING: self._on_text, CONTENT: self._on_text,
                          STRIP: self._on_strip, CALL: self._on_call}

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

        finish_reason "length", "abort", "repeat" or "stop_sequence" (the output was cut from
        outside) keeps unterminated reasoning as reasoning; anything else turns it into content
        (the delta then carries the whole reasoning text again, as content)."""
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
        return ParsedOutput(reasoning, content, list(self._tool_calls), list(self._errors),
                            "".join(self._withdrawn).strip())

    @property
    def has_tool_calls(self) -> bool:
        """Whether at least one call has been parsed (finish reason "tool_calls")."""
        return bool(self._tool_calls)

    # -- emission -----------------------------------------------------------------------------

    def _emit(self, channel: str, text: str) -> None:
        """Append to "reasoning" or "content" of both the accumulated output and the delta
        (content after a withdrawn forced call goes to `withdrawn` instead)."""
        if channel == CONTENT and self._withholding:
            self._withdrawn.append(text)
            return
        self._parts[channel].append(text)  # a list: long outputs must not be re-copied per token
        setattr(self._delta, channel, getattr(self._delta, channel) + text)

    def _error(self, message: str) -> None:
        self._errors.append(message)
        self._delta.errors.append(message)

    def _call_delta(self, delta: ToolCallDelta) -> None:
        self._delta.tool_call_deltas.append(delta)

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

    def _on_start_off(self, final: bool) -> bool:
        rest = self._buf.lstrip()
        for tag, then in ((THINK_OPEN, REASONING), (THINK_CLOSE, STRIP)):
            if rest.startswith(tag):
                self._buf, self._state = rest[len(tag) :], then
                return True
        if not final and (THINK_OPEN.startswith(rest) or THINK_CLOSE.startswith(rest)):
            return False  # blank or a prefix of a reasoning tag: cannot tell yet
        self._state = CONTENT  # the answer as written, leading blanks included
        return True

    def _ends(self, channel: str) -> tuple[str, ...]:
        """The tags that end text in `channel` ("reasoning" | "content")."""
        call = (CALL_OPEN,) if self._calls_on else ()
        if channel == REASONING:
            return (THINK_CLOSE, *call)
        return (*call, THINK_CLOSE) if self._think_pending else call

    def _on_text(self, final: bool) -> bool:
        channel = self._state  # "reasoning" | "content"
        ends = self._ends(channel)
        m = _pattern(ends).search(self._buf) if ends else None
        if m is None:
            cut = len(self._buf) if final else held_from(self._buf, self._hold)
            self._emit_text(channel, self._buf[:cut])
            self._buf = self._buf[cut:]
            return False
        self._emit_text(channel, self._buf[: m.start()])
        self._buf = self._buf[m.end() :]
        if m.group() == THINK_CLOSE:
            self._think_pending, self._state = False, STRIP
            return True
        self._think_pending |= channel == REASONING
        self._num_calls += 1
        self._call = CallReader(self._schemas, self._num_calls, self._num_started,
                                self._call_delta, self._error, self._first_id)
        self._state = CALL
        return True

    def _emit_text(self, channel: str, text: str) -> None:
        """`_emit` for the model's own text, reporting once a call's inner tag in content."""
        if channel == CONTENT and self._calls_on and not self._stray_seen:
            m = _pattern(_STRAY).search(text)
            if m is not None:
                self._stray_seen = True
                self._error(f"tool call markup outside a call: the content holds {m.group()} "
                            f"with no {CALL_OPEN} before it (a malformed call); shown as text")
        self._emit(channel, text)

    def _on_strip(self, final: bool) -> bool:
        self._buf = self._buf.lstrip()
        if not self._buf:
            return False
        self._state = CONTENT
        return True

    def _on_call(self, final: bool) -> bool:
        reader = self._call
        reader.buf, self._buf = reader.buf + self._buf, ""
        if not reader.run(final, self._finish_reason):
            return False
        self._buf, self._call = reader.buf, None
        self._num_started += reader.started
        if reader.call is not None:
            schema = (self._schemas or {}).get(reader.call.name)
            missing = [k for k in (schema.required if schema else ()) if k not in
                       reader.call.arguments]
            if missing:  # kept: the caller decides; vLLM passes such calls on unchecked
                self._error(f"tool call {self._num_calls}: {reader.call.name}: missing required "
                            f"argument{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
            extra = schema.undeclared(reader.call.arguments) if schema else []
            if extra:  # kept too (JSON Schema admits them unless additionalProperties: false)
                closed = " (its additionalProperties is false)" if schema.others is False else ""
                self._error(f"tool call {self._num_calls}: {reader.call.name}: argument"
                            f"{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} "
                            f"not among its declared parameters{closed}")
            self._tool_calls.append(reader.call)
            self._delta.tool_calls.append(reader.call)
            self._state = STRIP
        else:
            rejected = reader.rejected
            if self._num_calls == 1 and self._forced and (
                    rejected.startswith(self._forced) or self._forced.startswith(rejected)):
                # a forced call the model did not complete: its text and what follows it are
                # no answer (content showed "<tool_call>Hello! …", then call markup,
                # "<arg_key>expression</arg_key>…": a new user's trial and its re-trial,
                # 2026-12-07); kept apart for withdrawn_tool_calls, the error says why. The
                # output may also end inside the forced text itself (max_tokens reached while
                # the engine wrote it: content was "<tool_call>convert", a bad-input trial of
                # 2026-12-07): nothing of it is the model's either
                rejected, self._withholding = rejected[len(self._forced):].lstrip(), True
                self._withdraw_error()
            self._emit(CONTENT, rejected)
            self._state = CONTENT
            self._stray_seen = True  # its leftover tags are that call's, already reported
        return True


    def _withdraw_error(self) -> None:
        """Turn the rejected forced call's error, "…; its text is kept as content", into "…;
        withdrawn (tool_choice forced it)" wherever this parse reported it: the errors and the
        streamed withdrawal of its fragments (a stream said the text was kept as content and
        then sent none: a bad-input trial, 2026-12-07)."""
        def fix(message: str | None) -> str | None:
            return message[:-len(KEPT)] + WITHDRAWN if message and message.endswith(KEPT) \
                else message

        for errors in (self._errors, self._delta.errors):
            if errors:
                errors[-1] = fix(errors[-1])
        for d in self._delta.tool_call_deltas:
            d.error = fix(d.error)


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
