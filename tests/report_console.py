"""Helpers for the report tables' tests (bench, trace, eval): stdout piped in a terminal of a
given width, and a rich table's rows as cells."""

from __future__ import annotations


def piped(monkeypatch, columns: int = 80) -> None:
    """stdout not a terminal (pytest captures it), in a `columns`-wide terminal: rich takes
    that width for a pipe too (COLUMNS, or the terminal stdin is on)."""
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.setenv("COLUMNS", str(columns))


def in_terminal(monkeypatch, columns: int) -> None:
    """stdout a `columns`-wide terminal, as rich sees it."""
    piped(monkeypatch, columns)
    monkeypatch.setenv("TTY_COMPATIBLE", "1")


def table_rows(text: str) -> list[list[str]]:
    """The stripped cells of each body line of the rich tables in `text`."""
    return [[c.strip() for c in line.strip("│").split("│")] for line in text.splitlines()
            if line.startswith("│")]
