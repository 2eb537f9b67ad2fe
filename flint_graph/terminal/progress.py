"""Progress bars for long work (checkpoint writes and loads, long prompt prefills), always on
stderr so that stdout stays clean for `generate --json` and pipes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


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


@contextlib.contextmanager
def prefill_bar(engine, enabled: bool) -> Iterator[None]:
    """While the block runs, a prompt that takes more than one prefill chunk shows a transient
    bar on stderr ("prompt", tokens prefilled / prompt tokens), removed when its prefill ends,
    before the answer streams (the Engine's `prefill_progress` hook). Nothing when `enabled` is
    False (e.g. stderr is not a terminal) or for a prompt of one chunk."""
    if not enabled:
        yield
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
