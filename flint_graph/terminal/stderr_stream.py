"""Standard error that goes quiet when its reader leaves, so the answer on standard output
survives: `flint-graph generate --prompt … 2>&1 >ans.txt | head -c 5` exited 0 with ans.txt
empty, since the BrokenPipeError of a reasoning write on stderr ended the command as if stdout's
reader had left (a bad-input trial, 2026-12-06); the server exited 1 without a word when its
log's pipe closed. Diagnostics nobody reads are dropped; the work and its output go on."""

from __future__ import annotations

import os
from typing import Any, TextIO


class QuietWhenReaderLeaves:
    """A text stream (sys.stderr's stand-in, `install`) that passes every write and flush to
    `stream`, and when one fails (BrokenPipeError; any OSError: `2>/dev/full` lost the answer
    too) points the stream's file descriptor at /dev/null (so the stream's buffer and every
    later write go there) and carries on. Other attributes
    (fileno, isatty, encoding, …) are the stream's own."""

    def __init__(self, stream: TextIO):
        self._stream = stream
        self.reader_left = False

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError:
            self._to_devnull()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError:
            self._to_devnull()

    def _to_devnull(self) -> None:
        self.reader_left = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
            self._stream.flush()  # what was buffered goes to /dev/null now
        except (OSError, ValueError):  # no file descriptor (a StringIO): drop the text
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def install() -> TextIO:
    """Make sys.stderr a QuietWhenReaderLeaves over the current one; returns the one replaced
    (the caller puts it back when done)."""
    import sys

    previous = sys.stderr
    if not isinstance(previous, QuietWhenReaderLeaves):
        sys.stderr = QuietWhenReaderLeaves(previous)  # type: ignore[assignment]
    return previous
