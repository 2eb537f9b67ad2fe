"""Ctrl-C and SIGTERM held over the engine's bookkeeping, so that a request is never half
admitted or half retired.

Python raises KeyboardInterrupt (and the CLI's `Terminated`) between any two bytecodes of the
main thread. The engine's admission (a request popped from the queue, its KV taken or copied
from a retained sequence) and retirement (its KV retained, then the request dropped from the
running rows) are several statements each; a bad-input trial (2026-12-07) landed Ctrl-C
inside both: a request popped but never admitted, whose stream then stepped forever, and one
retained after `PrefixCache.add` but left among the running rows, retired again by the next
step, so two retained entries shared one KV and a later prompt resumed from rings another
had overwritten (wrong tokens). While `signals_held()` runs, those signals are recorded and
delivered, through the handlers that were set, when it ends. Only the main thread gets
Python signal handlers, so elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

HELD = (signal.SIGINT, signal.SIGTERM)


class _Recorder:
    """A signal handler that only records (signum, frame)."""

    def __init__(self) -> None:
        self.got: list = []

    def __call__(self, signum, frame) -> None:
        self.got.append((signum, frame))


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the block where a Python handler is set for them (the
    default Ctrl-C handler raises KeyboardInterrupt; SIG_DFL and SIG_IGN are left alone: a
    process the signal kills leaves no state behind), then call that handler for each signal
    that came, in order, so it raises where it would have, just after the block. Nests (an
    inner block holds nothing more). Off the main thread it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    rec, saved = _Recorder(), {}
    for s in HELD:
        handler = signal.getsignal(s)
        if callable(handler) and not isinstance(handler, _Recorder):
            saved[s] = handler
            signal.signal(s, rec)
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        for signum, frame in rec.got:
            saved[signum](signum, frame)
