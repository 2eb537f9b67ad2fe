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
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flint_graph"
