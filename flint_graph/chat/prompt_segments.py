"""Which parts of a chat prompt are the template's scaffolding and which are the caller's data.

A chat prompt mixes two kinds of text. Scaffolding is what the template writes itself: its
literals ([gMASK]<sop>, <|user|>, <think>, <tool_call>, <arg_key>, the tools preamble, ...)
and what it derives from the request's structure (which role a turn has, whether thinking is
on). Data is every string the caller supplies: message content and text parts (system, user,
assistant, tool results), reasoning, tool-call names and argument keys and values, the whole
tool definitions (their JSON in the system block), tool_choice and any extra template variable;
dict keys count as well. The only string exempt is a message's `role`, which is checked to be
one of four fixed words and selects scaffolding. Scaffolding is encoded with the tokenizer's
added tokens matched (so `<|user|>` is one control id); data is encoded as ordinary text, so
the text `<|user|>` in a user message, a tool result, a tool name or a tool description becomes
the ids of its characters and can never forge a turn, close reasoning or end the prompt.

Mechanism (works for any Jinja template, the checkpoint's own included): before rendering, each
data string has every piece of added-token text replaced by an opaque placeholder. A piece is
a whole occurrence of an added token, or, at either end of the string, a fragment that could
join the neighbouring text into one (a proper prefix of a token at the end, a proper suffix at
the start; so two strings written side by side cannot combine into a token). Placeholders are
a per-render random nonce plus a number, letters and digits only, so the operations templates
apply to content (strip, split on newlines, `tojson` with or without ensure_ascii, equality)
keep them intact; equal pieces get equal placeholders. After rendering, the text is cut at the
placeholders into `Segment`s: scaffolding text, and data (the restored pieces) that the
tokenizer encodes as ordinary text (`FlintTokenizer.encode_segments`). Joined, the segments are
exactly the prompt the template would have written.

Consequences, stated so no one relies on the opposite: a template cannot see marker text inside
data (e.g. test `'</think>' in content`); the one such rule GLM-4.7 has, splitting inline
`<think>R</think>` out of assistant content, is applied before rendering (`chat_messages`). A
template that assembles a token from partial literals around a whole data string
(`'<|' ~ name ~ '|>'`) is outside this guarantee; a template that rewrites the placeholders
themselves (upper-casing, slicing, truncating or word-wrapping content through one) is refused
with a TemplateError.
Raw completion (`LLM.generate`, `--raw`) uses no template and matches added-token text as
tokens: there the caller writes the whole prompt, scaffolding included.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, NamedTuple

from flint_graph.errors import TemplateError


class Segment(NamedTuple):
    """A run of prompt text: `data` True for caller-supplied text (encoded as ordinary text),
    False for template scaffolding (added-token text in it becomes the token's id)."""

    text: str
    data: bool


def _alternation(strings: Iterable[str]) -> str:
    # Longest first, so that at one position the longest candidate wins (leftmost-longest).
    return "|".join(re.escape(s) for s in sorted(set(strings), key=lambda s: (-len(s), s)))


@lru_cache(maxsize=8)
def _patterns(markers: frozenset[str]) -> tuple[re.Pattern, Any, Any, int] | None:
    """(whole markers, a proper suffix of one at the start, a proper prefix of one at the end,
    the longest marker's length)."""
    markers = frozenset(m for m in markers if m)
    if not markers:
        return None
    suffixes = {m[k:] for m in markers for k in range(1, len(m))}
    prefixes = {m[:k] for m in markers for k in range(1, len(m))}
    whole = re.compile(_alternation(markers))
    lead = re.compile(f"(?:{_alternation(suffixes)})") if suffixes else None
    trail = re.compile(f"(?:{_alternation(prefixes)})\\Z") if prefixes else None
    return whole, lead, trail, max(len(m) for m in markers)


class DataEscaper:
    """Hides added-token text inside data strings from a template and finds it again afterwards
    (module docstring). One instance per render: the nonce is fresh each time.

    Args: markers: the text of every added token of the tokenizer (may be empty: then
    `escape` returns its input and `segments` one scaffolding segment).
    """

    def __init__(self, markers: Iterable[str]) -> None:
        self._patterns = _patterns(frozenset(markers))
        self._nonce = "fgdata" + secrets.token_hex(8)
        self._placeholder = re.compile(re.escape(self._nonce) + r"n(\d+)e")
        self._pieces: dict[str, int] = {}

    def escape(self, value: Any) -> Any:
        """A copy of `value` (str, list/tuple, mapping; keys included) with every marker piece
        in its strings replaced by a placeholder; other values are returned as they are."""
        if isinstance(value, str):
            return self._escape_str(value)
        if isinstance(value, Mapping):
            return {self.escape(k): self.escape(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.escape(v) for v in value]
        return value

    def _escape_str(self, s: str) -> str:
        if self._patterns is None or not s:
            return s
        whole, lead, trail, longest = self._patterns
        spans = [m.span() for m in whole.finditer(s)]
        if lead and (m := lead.match(s)):
            spans.append(m.span())
        # A fragment at the end is shorter than the longest marker: search only the tail, so
        # long content costs no scan per alternative per character.
        if trail and (m := trail.search(s, max(len(s) - longest, 0))):
            spans.append(m.span())
        if not spans:
            return s
        out, pos = [], 0
        for start, end in _merge(spans):
            out.append(s[pos:start])
            piece = s[start:end]
            index = self._pieces.setdefault(piece, len(self._pieces))
            out.append(f"{self._nonce}n{index}e")
            pos = end
        out.append(s[pos:])
        return "".join(out)

    def segments(self, rendered: str) -> list[Segment]:
        """Cut the rendered text at the placeholders: scaffolding segments and data segments
        (the pieces restored). Adjacent segments of one kind are merged; empty ones dropped.
        Raises TemplateError if the template altered a placeholder (its nonce is left over)."""
        pieces = list(self._pieces)
        out: list[Segment] = []

        def add(text: str, data: bool) -> None:
            if not text:
                return
            if out and out[-1].data == data:
                out[-1] = Segment(out[-1].text + text, data)
            else:
                out.append(Segment(text, data))

        pos = 0
        for m in self._placeholder.finditer(rendered):
            add(rendered[pos:m.start()], False)
            index = int(m.group(1))
            if index >= len(pieces):
                raise TemplateError("the chat template altered message text (an unknown "
                                    "placeholder is left in the prompt)")
            add(pieces[index], True)
            pos = m.end()
        add(rendered[pos:], False)
        # What is left of a placeholder the template changed: the whole nonce (upper- or
        # title-cased content), or part of it (content sliced, truncated or word-wrapped
        # through a placeholder). A cut that keeps both sides leaves 8 of the nonce's 16 random
        # hex digits in a row on one side; one that drops the rest leaves "fgdata" and the
        # first digits. Text that merely holds either by chance (8 of this render's random
        # digits in order, or "fgdata" and its first 2) is a 1-in-2^32 or 1-in-256 event. A
        # cut within the first 8 characters of a placeholder is not seen: that data is lost
        # from the prompt, but never becomes a control token.
        digits = self._nonce[len("fgdata"):]
        leftovers = {digits[i : i + 8] for i in range(len(digits) - 7)} | {self._nonce[:8]}
        for seg in out if self._pieces else ():  # no placeholder given out: none to find
            low = seg.text.lower()
            if not seg.data and any(p in low for p in leftovers):
                raise TemplateError("the chat template altered message text it was given, so "
                                    "its control-token text cannot be kept apart from the "
                                    "template's")
        return out


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, overlapping or touching (start, end) spans joined into maximal runs."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged
