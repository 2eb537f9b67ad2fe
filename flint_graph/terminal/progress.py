"""Progress bars for long work (checkpoint writes and loads, long prompt prefills, eval), always
on stderr so that stdout stays clean for `generate --json` and pipes; a long prefill and an
eval write plain lines where stderr is not a terminal."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

# a prefill whose progress is written as plain lines (stderr not a terminal: a log, a pipe) gets
# its first line after this many seconds and one more this often: nothing for prompts that
# take less, and a few lines for one that takes minutes (on 2 CPU cores a 21K-token
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


@contextlib.contextmanager
def weighted_progress_bar(enabled: bool, label: str, weights: Callable[[], list[float]],
                          noun: str = "cases") -> Iterator[Callable[[int], None]]:
    """A rich progress bar on stderr over items of unequal cost: yields `advance(k)` (the next k
    items are done, in order). The bar and its time remaining follow the items' weights
    (`weights()`, called only when the bar is drawn: estimated seconds, or any unit in
    proportion), the count column the items ("80/400 cases"); a no-op as `progress_bar`'s.
    Why: eval's cases range from a 300-token sum to a 16K-token recall list, ~150x the time on
    a CPU, and a bar by count said ~3 minutes left of a run of more than an hour (a new user's
    trial, 2026-12-07)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not enabled:
        yield lambda k: None
        return
    if not console.is_terminal:  # a log or a pipe: plain lines (`plain_count_lines`)
        with plain_count_lines(label, weights, noun) as advance:
            yield advance
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    weights = weights()
    n = len(weights)
    bar = Progress(TextColumn("{task.description}"), BarColumn(),
                   TextColumn(f"{{task.fields[items]}}/{n} {noun}"), TimeRemainingColumn(),
                   console=console)
    done = [0]
    with bar:
        task = bar.add_task(label, total=max(sum(weights), 1e-9), items=0)

        def advance(k: int) -> None:
            w = sum(weights[done[0]:done[0] + k])
            done[0] = min(n, done[0] + k)
            bar.update(task, advance=w, items=done[0])

        yield advance


# the plain lines of `weighted_progress_bar` where stderr is not a terminal: the first after
# this many seconds, then one this often (an eval of minutes gets a few lines)
PLAIN_COUNT_EVERY_S = 30.0


@contextlib.contextmanager
def plain_count_lines(label: str, weights: Callable[[], list[float]], noun: str = "cases",
                      every_s: float | None = None, write: Callable[[str], None] | None = None,
                      clock: Callable[[], float] = time.monotonic
                      ) -> Iterator[Callable[[int], None]]:
    """`weighted_progress_bar` for a log or a pipe: yields `advance(k)`; a background timer
    writes "eval: 40 of 480 cases done (12% of the estimated work), 2 min 10 s" through `write`
    (default: stderr, flushed) every `every_s` seconds (PLAIN_COUNT_EVERY_S), the first after
    as long: nothing for work that ends sooner. `weights()` is called once, at the first
    line. Why: `eval --n 10 2>err.log` ran 2.6 minutes and wrote nothing, so from a pipe or a
    CI log it looked hung (a new user's trial, 2026-12-07)."""
    every = PLAIN_COUNT_EVERY_S if every_s is None else every_s
    write = write or _stderr_line
    start, done, stop = clock(), [0], threading.Event()
    state: dict = {}

    def line() -> str:
        if "w" not in state:
            state["w"] = weights()
        w = state["w"]
        share = sum(w[:done[0]]) / max(sum(w), 1e-9)
        secs = int(clock() - start)
        took = f"{secs // 60} min {secs % 60} s" if secs >= 60 else f"{secs} s"
        return (f"{label}: {done[0]:,} of {len(w):,} {noun} done ({100 * share:.0f}% of the "
                f"estimated work), {took}\n")

    def run() -> None:
        while not stop.wait(every):
            write(line())

    thread = threading.Thread(target=run, name=f"{label}-progress", daemon=True)
    thread.start()

    def advance(k: int) -> None:
        done[0] += k

    try:
        yield advance
    finally:
        stop.set()
        thread.join(timeout=2)


class PlainPrefillLines:
    """A `prefill_progress` hook for output that is not a terminal: while a prompt prefills,
    a background timer writes one plain line through `write` (default: to stderr, flushed),
    "prompt: 4,096 of 21,230 tokens prefilled (19%), 12 s", once the prefill has run `every_s`
    seconds (default PLAIN_EVERY_S) and every `every_s` after that, whether or not a chunk
    ended meanwhile (a chunk of a long prompt on 2 CPU cores takes 10-20 s: lines written only
    at chunk ends came 18 s apart and never during the last one, a new user's trial); nothing
    for a prefill that ends sooner. Call it as hook(req, done, total) (prompt tokens; the
    engine does after each chunk, and with 0 first); `close()` stops the timer."""

    def __init__(self, write: Callable[[str], None] | None = None,
                 every_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self._write = write or _stderr_line
        self._every = PLAIN_EVERY_S if every_s is None else every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._state: list | None = None  # [start, last line, done, total] of the prefill
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __call__(self, req, done: int, total: int) -> None:
        with self._lock:
            if done >= total:
                self._state = None
                return
            if self._state is None or done == 0:
                now = self._clock()
                self._state = [now, now, done, total]
            else:
                self._state[2:] = [done, total]
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="prefill-progress",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(1.0, max(0.01, self._every / 4))):
            with self._lock:
                now, st = self._clock(), self._state
                if st is None or now - st[1] < self._every:
                    continue
                st[1] = now
                line = (f"prompt: {st[2]:,} of {st[3]:,} tokens prefilled "
                        f"({100 * st[2] // st[3]}%), {now - st[0]:.0f} s\n")
            self._write(line)

    def close(self) -> None:
        """Stop the timer (no line after this returns)."""
        self._stop.set()
        with self._lock:
            self._state = None
        if self._thread is not None:
            self._thread.join(timeout=2)


def _stderr_line(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


@contextlib.contextmanager
def prefill_bar(engine, enabled: bool, terminal: bool | None = None) -> Iterator[None]:
    """While the block runs, a prompt that takes more than one prefill chunk shows its
    progress on stderr (the Engine's `prefill_progress` hook): on a terminal a transient bar
    ("prompt", tokens prefilled / prompt tokens), removed when its prefill ends, before the
    answer streams; elsewhere (a log, a pipe) plain lines, the first after PLAIN_EVERY_S
    seconds of prefill (`PlainPrefillLines`). Nothing when `enabled` is False or for a prompt
    of one chunk. `terminal`: whether stderr is a terminal (default: asked)."""
    if not enabled:
        yield
        return
    if not (sys.stderr.isatty() if terminal is None else terminal):
        engine.prefill_progress = hook = PlainPrefillLines()
        try:
            yield
        finally:
            engine.prefill_progress = None
            hook.close()
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
