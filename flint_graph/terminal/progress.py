"""Progress bars for long work (checkpoint writes and loads, long prompt prefills), always on
stderr so that stdout stays clean for `generate --json` and pipes; a long prefill writes plain
lines where stderr is not a terminal."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

# a prefill whose progress is written as plain lines (stderr not a terminal: a log, a pipe) gets
# its first line after this many seconds and one more at most this often: nothing for prompts
# that take less, and a few lines for one that takes minutes (on 2 CPU cores a 21K-token
# prompt prefilled for 194 s with nothing shown: a new user's trial, 2026-12-05)
PLAIN_EVERY_S = 10.0


@contextlib.contextmanager
def progress_bar(enabled: bool, label: str, total: int,
                 unit: str = "bytes") -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr; yields `advance(n)` (a no-op when `enabled` is False or
    stderr is not a terminal).

    Args: label: shown left of the bar; total: amount of work; unit: "bytes" (shows sizes and
    transfer speed) or "steps" (shows n/total).
    """
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled or not console.is_terminal:  # a log or a pipe gets no bar drawings
        yield lambda n: None
        return
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress,
                               TextColumn, TimeRemainingColumn, TransferSpeedColumn)

    amount = (DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else \
        (MofNCompleteColumn(),)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), *amount,
                   TimeRemainingColumn(), console=console)
    with bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def plain_prefill_lines(write: Callable[[str], None] | None = None,
                        every_s: float | None = None,
                        clock: Callable[[], float] = time.monotonic):
    """A `prefill_progress` hook for output that is not a terminal: one plain line through
    `write` (default: to stderr, flushed), "prompt: 4,096 of 21,230 tokens prefilled (19%),
    12 s", once a prompt's prefill has run `every_s` seconds (default PLAIN_EVERY_S), and at
    most one per `every_s` after that; nothing for a prefill that ends sooner. Returns
    hook(req, done, total) (done, total: prompt tokens)."""
    write = write or _stderr_line
    every_s = PLAIN_EVERY_S if every_s is None else every_s
    state = {"start": None, "next": None}

    def hook(req, done: int, total: int) -> None:
        now = clock()
        if done == 0 or state["start"] is None:  # a new prefill (or the hook's first call)
            state["start"], state["next"] = now, now + every_s
        if done == 0 or done >= total or now < state["next"]:
            return
        state["next"] = now + every_s
        write(f"prompt: {done:,} of {total:,} tokens prefilled ({100 * done // total}%), "
              f"{now - state['start']:.0f} s\n")

    return hook


def _stderr_line(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


@contextlib.contextmanager
def prefill_bar(engine, enabled: bool, terminal: bool | None = None) -> Iterator[None]:
    """While the block runs, a prompt that takes more than one prefill chunk shows its
    progress on stderr (the Engine's `prefill_progress` hook): on a terminal a transient bar
    ("prompt", tokens prefilled / prompt tokens), removed when its prefill ends, before the
    answer streams; elsewhere (a log, a pipe) plain lines, the first after PLAIN_EVERY_S
    seconds of prefill (`plain_prefill_lines`). Nothing when `enabled` is False or for a prompt
    of one chunk. `terminal`: whether stderr is a terminal (default: asked)."""
    if not enabled:
        yield
        return
    if not (sys.stderr.isatty() if terminal is None else terminal):
        engine.prefill_progress = plain_prefill_lines()
        try:
            yield
        finally:
            engine.prefill_progress = None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn)

    state: dict = {"bar": None}

    def stop() -> None:
        if state["bar"] is not None:
            state["bar"].stop()
            state["bar"] = None

    def hook(req, done: int, total: int) -> None:
        if done >= total:
            stop()
            return
        if state["bar"] is None:
            bar = Progress(TextColumn("prompt"), BarColumn(), MofNCompleteColumn(),
                           TextColumn("tokens"), TimeElapsedColumn(),
                           console=Console(stderr=True), transient=True)
            bar.start()
            state["bar"], state["task"] = bar, bar.add_task("prompt", total=total)
        state["bar"].update(state["task"], completed=done, total=total)

    engine.prefill_progress = hook
    try:
        yield
    finally:
        engine.prefill_progress = None
        stop()
