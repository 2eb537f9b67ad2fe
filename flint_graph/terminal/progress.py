"""Progress bars for long work (checkpoint writes and loads), always on stderr so that stdout
stays clean for `generate --json` and pipes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def progress_bar(enabled: bool, label: str, total: int,
                 unit: str = "bytes") -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr; yields `advance(n)` (a no-op when `enabled` is False).

    Args: label: shown left of the bar; total: amount of work; unit: "bytes" (shows sizes and
    transfer speed) or "steps" (shows n/total).
    """
    if not enabled:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress,
                               TextColumn, TimeRemainingColumn, TransferSpeedColumn)

    amount = (DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else \
        (MofNCompleteColumn(),)
    bar = Progress(TextColumn("{task.description}"), BarColumn(), *amount,
                   TimeRemainingColumn(), console=Console(stderr=True))
    with bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)
