"""A rich Console for standard output whose reader may leave (`flint-graph make-checkpoint |
head -1`): rich's own answer to a broken pipe is SystemExit(1), which the CLI reported as exit 1
where `generate | head` exits 0 (a bad-input trial, 2026-12-06). Here the BrokenPipeError goes
on to the CLI, whose handler treats it as the reader having left (exit 0)."""

from __future__ import annotations

from rich.console import Console


class StdoutConsole(Console):
    """rich.console.Console (same arguments) that raises BrokenPipeError when stdout's reader
    has gone, instead of exiting."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more to write to a pipe nobody reads
        raise BrokenPipeError("standard output closed by its reader")
