"""Terminal-safe text for the chat: control characters made visible, and a live-region view
whose width is certain.

A redrawing region (rich `Live`) moves the cursor up by the number of lines it *measured*. When
the terminal draws a character wider than rich measured (seen: 👍🏽 is 2 cells for rich and 4 in
tmux), the screen holds more lines than rich counts, and every redraw leaves stale copies. Emoji
sequences, skin-tone modifiers, variation selectors, combining and zero-width characters are
drawn differently by different terminals, so no width table can be right everywhere. The live
region therefore shows `live_safe(text)`: only characters whose width every terminal agrees on
(printable ASCII, letters, digits, punctuation, math and currency signs; East Asian wide ones
as 2 cells), zero-width ones dropped and everything else shown as `PLACEHOLDER`; `tail_lines`
wraps it itself and keeps the last lines, so the region never outgrows the screen. The real
text is printed once, append-only, when the answer is done.
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from rich.cells import cell_len

PLACEHOLDER = "?"  # ASCII: its width is 1 on every terminal

# C0 controls (but newline and tab) and DEL as Unicode control pictures, C1 controls (which some
# terminals obey as 8-bit escape sequences, e.g. U+009B = CSI) as U+FFFD.
_CONTROL = ({c: 0x2400 + c for c in range(32) if chr(c) not in "\n\t"} | {127: 0x2421}
            | {c: 0xFFFD for c in range(0x80, 0xA0)})

_KEEP = {"Lu", "Ll", "Lt", "Lm", "Lo", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf",
         "Po", "Sm", "Sc", "Sk", "Zs"}
# Zero width on some terminals, not on others: combining marks, format characters (ZWJ, ZWNJ,
# variation selectors are Mn, bidi controls, tags).
_DROP = {"Mn", "Me", "Mc", "Cf"}
# Code points that join or modify their neighbours although their category looks harmless:
# emoji skin-tone modifiers (Sk) and conjoining Hangul jamo (Lo, drawn 0 or 2 cells).
_JOINERS = ((0x1F3FB, 0x1F3FF), (0x1100, 0x11FF), (0xA960, 0xA97F), (0xD7B0, 0xD7FF))


def printable(text: str) -> str:
    """`text` with terminal control characters (ESC, CR, C1, ...) shown as visible symbols, so
    model output cannot move the cursor or recolour the terminal."""
    return text.translate(_CONTROL)


@lru_cache(maxsize=4096)
def char_width(ch: str) -> int | None:
    """Cells `ch` takes in the live region: 1 or 2 when every terminal (and rich) agrees,
    0 for a character the live region drops, None for one it replaces by PLACEHOLDER."""
    cp = ord(ch)
    if 0x20 <= cp < 0x7F or 0x2400 <= cp <= 0x2426:  # ASCII, and the control pictures
        return 1
    if any(lo <= cp <= hi for lo, hi in _JOINERS):
        return 0
    cat = unicodedata.category(ch)
    if cat in _DROP:
        return 0
    if cat not in _KEEP:
        return None  # emoji and other symbols, private use, unassigned, controls, separators
    eaw = unicodedata.east_asian_width(ch)
    if eaw == "A" and cat == "No":
        return None  # circled and parenthesised numbers: glibc's wcwidth draws some as 2
    width = 2 if eaw in "WF" else 1
    # rich must measure it the same way, or its line count would differ from ours.
    return width if cell_len(ch) == width else None


@lru_cache(maxsize=65536)
def _pair_ok(a: str, b: str) -> bool:
    # rich measures grapheme clusters: a pair it joins would measure less than the sum.
    return cell_len(a + b) == cell_len(a) + cell_len(b)


def live_safe(text: str) -> str:
    """`text` as the live region shows it: every character's width certain (see the module
    docstring); newlines kept, tabs as one space, each run of other characters (an emoji
    sequence) as one PLACEHOLDER; control characters as in `printable`. Display only."""
    out: list[str] = []
    replacing = False  # inside a run of replaced or dropped characters after a replacement
    for ch in unicodedata.normalize("NFC", printable(text)):
        if ch == "\n":
            out.append(ch)
            replacing = False
            continue
        width = 1 if ch == "\t" else char_width(ch)
        if width == 0:
            continue
        if width is None or (out and out[-1] != "\n" and not _pair_ok(out[-1], ch)):
            if not replacing:
                out.append(PLACEHOLDER)
            replacing = True
            continue
        out.append(" " if ch == "\t" else ch)
        replacing = False
    return "".join(out)


def text_width(text: str) -> int:
    """Cells `text` takes (for text returned by `live_safe`)."""
    return sum(char_width(ch) or 0 for ch in text)


# A long paragraph is wrapped from a cut point that moves in steps of this many characters, so
# the visible lines do not reflow on every token and a refresh costs O(shown text).
_CUT_STEP = 4096


def tail_lines(text: str, width: int, max_lines: int) -> list[str]:
    """The last `max_lines` lines of `live_safe(text)` word-wrapped to `width` cells (each line
    at most `width` cells, by a measure rich and the terminal share)."""
    width, lines = max(width, 2), []
    keep = max_lines * width
    for para in reversed(text.split("\n")):
        if len(lines) >= max_lines:
            break
        cut = max(0, (len(para) - keep) // _CUT_STEP * _CUT_STEP)
        lines[:0] = _wrap(live_safe(para[cut:]), width)
    return lines[-max_lines:] if max_lines > 0 else []


def _wrap(para: str, width: int) -> list[str]:
    """Greedy word wrap of one safe paragraph; a word wider than the line is folded."""
    lines: list[str] = []
    line, used = "", 0
    for word in para.split(" "):
        w = text_width(word)
        if line and used + 1 + w <= width:
            line, used = f"{line} {word}", used + 1 + w
            continue
        if line or used:
            lines.append(line)
        line, used = "", 0
        for ch in word:  # fold a word longer than the line; a wide char never splits
            cw = char_width(ch) or 0
            if used + cw > width:
                lines.append(line)
                line, used = "", 0
            line, used = line + ch, used + cw
    lines.append(line)
    return lines
