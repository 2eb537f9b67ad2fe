"""Reading the small JSON files a checkpoint carries (config, generation_config, tokenizer_config)
with one error shape: the path, then what was wrong."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from flint_graph.errors import FlintError, kind as json_kind
from flint_graph.paths import file_kind


def loads(text: str | bytes, unique_keys: bool = False) -> Any:
    """json.loads for text from outside (checkpoint files, reports, request fields, tool
    results typed in a chat): every way it can fail is one ValueError whose text says why —
    invalid JSON (json.JSONDecodeError, passed on), nesting too deep for Python's parser (a
    RecursionError: 100,000 brackets must be one clean error, not a traceback) and an integer
    longer than Python's int-to-string limit (its own message tells a user to call
    sys.set_int_max_str_digits(); a request's tool-call arguments holding one was a 500 with a
    traceback, bad-input trial 2026-12-06). `unique_keys`: a key given twice in one object is
    a ValueError naming it (json keeps the last silently)."""
    try:
        return json.loads(text, object_pairs_hook=_unique if unique_keys else None)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except json.JSONDecodeError:
        raise
    except ValueError as e:
        if "integer string conversion" in str(e):
            raise ValueError(f"an integer with more than {sys.get_int_max_str_digits():,} "
                             "digits") from None
        raise


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"the key {k!r} appears twice in one object")
        out[k] = v
    return out


CHECKPOINT_JSON_MAX_BYTES = 64 << 20  # config / generation / tokenizer_config: a few KB each
# Memory a parsed file may take (estimated before parsing, `parsed_size`). Why: a file's size
# does not bound it: 40 MiB of `{},` parse into 1.3 GB of Python objects (a bad-input trial;
# eval's 1 GiB cap would have allowed ~30 GB), while real reports take 3-4 bytes a byte.
PARSED_MAX_BYTES = 2 << 30  # an estimate 2-4x above a real report's parse (traces ~4x)


MISSING = "file not found"


def file_problem(path: Path) -> str | None:
    """Why `path` is not a regular file, or None when it is: MISSING when nothing is there
    (not even a link), else the reason — a symbolic link loop, a link to nothing, or not a
    regular file (a directory, device or pipe): `paths.file_kind` in these files' words. A
    checkpoint's optional files (generation config, chat_template.jinja) are skipped only when
    MISSING; a directory or a link to
    /dev/zero in their place was skipped silently (a bad-input trial, 2026-12-06)."""
    kind = file_kind(Path(path))
    if kind == "file":
        return None
    if kind == "missing":
        return MISSING
    if kind == "loop":
        return "a symbolic link loop, not a file"
    if kind == "dangling":
        return f"a symbolic link to {os.readlink(path)}, which does not exist"
    return "not a regular file (a directory, device or pipe)"


def read_capped(path: Path, max_bytes: int, unique_keys: bool = False) -> Any:
    """The JSON value in `path`, a regular file of at most `max_bytes` bytes, read only that far:
    a device, a pipe or a huge file is refused before its JSON is parsed (`eval --compare
    /dev/zero` once filled 18 GB of memory; a pipe with no writer would block forever).

    Raises FileNotFoundError, OSError when it cannot be read, and ValueError whose text is the
    whole reason: not a regular file (or a link to nothing), larger than the cap,
    gzip-compressed, too many objects and arrays for PARSED_MAX_BYTES of memory, not UTF-8,
    or not valid JSON
    (nesting too deep and integers longer than Python's 4,300 digits included)."""
    path = Path(path)
    problem = file_problem(path)
    if problem == MISSING:
        raise FileNotFoundError(2, "No such file or directory", str(path))
    if problem is not None:
        raise ValueError(problem + (f"; expected a JSON file of at most {max_bytes >> 20} MiB"
                                    if problem.startswith("not a regular") else ""))
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"more than {max_bytes >> 20} MiB")
    if data[:2] == b"\x1f\x8b":  # reports are shipped gzipped in docs/
        raise ValueError("gzip-compressed; decompress it first (gunzip -k FILE)")
    if (need := parsed_size(data)) > PARSED_MAX_BYTES:
        raise ValueError(f"its objects and arrays could take up to about {_mb(need)} of memory "
                         f"parsed (an upper estimate); expected at most "
                         f"{_mb(PARSED_MAX_BYTES)}")
    try:
        # JSON is UTF-8 (RFC 8259), which lets a reader ignore a byte-order mark: files saved
        # by Windows editors often begin with one
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 text ({e})") from None
    try:
        return loads(text, unique_keys)
    except ValueError as e:  # JSONDecodeError, nesting, an integer past 4,300 digits
        raise ValueError(f"not valid JSON ({e})") from None


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def parsed_size(data: bytes) -> int:
    """An estimate, in bytes, of the memory `data`'s JSON takes while Python's json parses it,
    meant to be above it for any shape: ~200 bytes a container (a small dict is 184), ~48 a
    value after a comma, ~100 a key (its str and its slot), ~60 a string (a pair of quotes),
    and the text about four times over (the bytes, the decoded str, the strings parsed out of
    it, a margin) at 4 bytes a character when it holds a character beyond the BMP (Python then stores
    the whole str at that width: a 95 MB string with one emoji took 1 GB, a re-trial), else 2
    where it is not ASCII. Counted over the raw bytes (brackets and commas inside strings
    too): linear and done in C, unlike a scan that skips strings."""
    containers = data.count(b"{") + data.count(b"[")
    wide = 4 if re.search(rb"[\xf0-\xf4]|\\u[dD][89abAB]", data) else \
        2 if re.search(rb"[\x80-\xff]|\\u", data) else 1
    return (200 * containers + 48 * data.count(b",") + 100 * data.count(b":")
            + 30 * data.count(b'"') + len(data) * (2 + 2 * wide) + 4096)


def read_json_object(path: Path, error: type[FlintError], missing: str) -> dict[str, Any]:
    """The JSON object in `path`.

    Raises `error` naming the path with `missing` when the file is absent, and with the reason
    when `read_capped` refuses it (not a regular file, over 64 MiB, not UTF-8 JSON) or the top
    level is not an object."""
    if file_problem(path) == MISSING:
        raise error(f"{path}: {missing}")
    try:
        raw = read_capped(path, CHECKPOINT_JSON_MAX_BYTES)
    except ValueError as e:  # not a regular file, too large, not UTF-8, not JSON
        raise error(f"{path}: {e}") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e})") from None
    if not isinstance(raw, dict):
        raise error(f"{path}: expected a JSON object, found {json_kind(raw)}")
    return raw
