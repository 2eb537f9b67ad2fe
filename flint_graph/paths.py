"""Where flint_graph keeps what it builds for the user: one per-user cache root."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$FLINT_GRAPH_CACHE, else $XDG_CACHE_HOME/flint_graph, else ~/.cache/flint_graph.

    Holds the embedded default checkpoint and the compiled kernel cache."""
    root = os.environ.get("FLINT_GRAPH_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or _home() / ".cache") / "flint_graph"


def _home() -> Path:
    """The user's home: $HOME, or the account's home directory when HOME is unset or empty
    (Path.home() turns an empty HOME into "/": `HOME= flint-graph chat` unpacked flint-nano
    into /.cache, a bad-input trial of 2026-12-06)."""
    if os.environ.get("HOME"):
        return Path(os.environ["HOME"])
    import pwd

    return Path(pwd.getpwuid(os.getuid()).pw_dir)


def why_not_a_file(path: Path) -> str:
    """Why `path` is not a readable regular file, in words for an error message: "no such
    file or directory", "a symbolic link to a missing target", "a symbolic link that loops",
    "a directory, not a file", or "not a regular file". (exists() is False for a dangling or
    looping link, which read as plainly missing.)"""
    try:
        path.stat()
    except OSError as e:
        if os.path.islink(path):
            import errno

            return ("a symbolic link that loops" if e.errno == errno.ELOOP else
                    "a symbolic link to a missing target")
        return "no such file or directory"
    return "a directory, not a file" if path.is_dir() else "not a regular file"
