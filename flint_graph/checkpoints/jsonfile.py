"""Reading the small JSON files a checkpoint carries (config, generation_config, tokenizer_config)
with one error shape: the path, then what was wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flint_graph.errors import FlintError


def loads(text: str | bytes) -> Any:
    """json.loads, with nesting too deep for Python's parser (RecursionError) reported as the
    ValueError a malformed document gives: a checkpoint's JSON never nests more than a few
    levels, and 100,000 brackets must be one clean error, not a traceback."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def read_json_object(path: Path, error: type[FlintError], missing: str) -> dict[str, Any]:
    """The JSON object in `path`.

    Raises `error` naming the path with `missing` when the file is absent, when it is not UTF-8
    JSON, or when the top level is not an object."""
    if not path.is_file():
        raise error(f"{path}: {missing}")
    try:
        raw = loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, nesting (`loads`)
        raise error(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a JSON object, found {type(raw).__name__}")
    return raw
