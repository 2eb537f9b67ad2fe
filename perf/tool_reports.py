"""The output folders of the developer tools (tools/bench_prefill.py, tools/probe_attn_speed.py):
whether a run may write its reports there, checked before any GPU work, and which earlier
files it may replace: only its own reports, unchanged since it wrote them.

Why: bad-input trials (2026-12-07) saw `--out DIR` replace a user's prefill.json and
attn_speed.json without a word, then a FIFO of that name hang the check, a link to /dev/zero
fill memory, a forged or edited report pass as the tool's own, and a name too long for the
file system end in a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import stat
from pathlib import Path

REPORT_MAX_BYTES = 64 << 20  # a report is a few hundred KB


def count_arg(text: str) -> int:
    """argparse type of the tools' counts: plain ASCII digits, at most 10 of them (int() also
    reads "٣", " 3" and "1_0", and 23 digits looped a check for minutes: a re-trial,
    2026-12-07). Raises argparse.ArgumentTypeError naming the text."""
    from flint_graph.cli_args import plain_int, shown

    try:
        if len(text) > 10 or text != text.strip():  # " 3" too, as the docstring says
            raise ValueError(text)
        return plain_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a count of plain digits (at most 10), got {shown(text)}") from None


def sealed_json(obj: dict, tool: str) -> str:
    """The JSON text of `obj` naming `tool` and ending in the sha256 of the text without that
    field: what `is_own_json` recognises as this tool's report, unchanged."""
    body = {"tool": tool, **obj}
    digest = hashlib.sha256(json.dumps(body, indent=1).encode()).hexdigest()
    return json.dumps({**body, "sha256": digest}, indent=1)


def is_own_json(path: Path, tool: str) -> bool:
    """Whether `path` is a report `sealed_json(…, tool)` wrote, unchanged since. Reads only a
    regular file of at most REPORT_MAX_BYTES (the caller has refused anything else)."""
    try:
        with open(path, "rb") as f:
            data = f.read(REPORT_MAX_BYTES + 1)
        obj = json.loads(data)
        digest = obj.pop("sha256")
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return False
    return (len(data) <= REPORT_MAX_BYTES and obj.get("tool") == tool
            and hashlib.sha256(json.dumps(obj, indent=1).encode()).hexdigest() == digest)


def out_problem(out: Path, reports: dict[str, object]) -> str | None:
    """What stops a run from writing its reports into folder `out` (created if missing), or
    None. `reports`: file name -> a recogniser (path -> bool) of the tool's own report of
    that name, which alone may be replaced. Refused: a path the file system will not take, an
    `out` that is not a folder or sits under one this user cannot write, and a report name
    that is a link, not a regular file, or a file the tool did not write (unchanged)."""
    try:
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            return f"{out} is not a folder"
        near = next(d for d in (out, *out.absolute().parents) if d.exists())
        if not (near.is_dir() and os.access(near, os.W_OK | os.X_OK)):
            return f"{near} is not a folder this user can write to"
        for name, ours in reports.items():
            path = out / name
            if path.is_symlink():
                return f"{path} is a link; the report is not written through one"
            if not path.exists():
                continue
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                return f"{path} exists and is not a regular file"
            if st.st_size > REPORT_MAX_BYTES or not ours(path):
                return (f"{path} exists and is not a report this tool wrote (unchanged); move "
                        "it or choose another folder")
    except OSError as e:  # a name too long, a component that is not a folder, …
        return f"{out}: {e.strerror or e}"
    return None
