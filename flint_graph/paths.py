"""Where flint_graph keeps what it builds for the user: one per-user cache root."""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


def cache_root() -> Path:
    """$FLINT_GRAPH_CACHE, else $XDG_CACHE_HOME/flint_graph, else ~/.cache/flint_graph, as an
    absolute path.

    Holds the embedded default checkpoint and the compiled kernel cache. A leading "~" is the
    home directory (a value from a .env file or a systemd unit reaches us unexpanded: "~/x"
    made a directory named "~" in the working directory, a bad-input trial of 2026-12-06); a
    relative FLINT_GRAPH_CACHE is taken from the working directory once, and a relative
    XDG_CACHE_HOME is ignored, as the XDG base directory specification says."""
    root = os.environ.get("FLINT_GRAPH_CACHE")
    if root:
        return _expand_home(root).absolute()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = _expand_home(xdg) if xdg else None
    if base is None or not base.is_absolute():
        base = _home() / ".cache"
    return base / "flint_graph"


def _expand_home(value: str) -> Path:
    """`value` with a leading "~" or "~/" as the user's home (`_home`); "~user" forms too."""
    if value == "~" or value.startswith("~/"):
        return _home() / value[2:]
    return Path(value).expanduser()


def _home() -> Path:
    """The user's home: $HOME, or the account's home directory when HOME is unset or empty
    (Path.home() turns an empty HOME into "/": `HOME= flint-graph chat` unpacked flint-nano
    into /.cache, a bad-input trial of 2026-12-06)."""
    if os.environ.get("HOME"):
        return Path(os.environ["HOME"])
    import pwd

    return Path(pwd.getpwuid(os.getuid()).pw_dir)


NAME_MAX, PATH_MAX = 255, 4096  # bytes: Linux's limits for one part and a whole path


def name_problem(path: str | os.PathLike) -> str | None:
    """Why `path` cannot name a file at all, in words for an error message, or None: a NUL
    character in it, a name in it longer than the file system allows, or a directory on the
    way that this user may not search. Each made `Path.exists()` raise (a bare ValueError or
    OSError: "internal error: OSError: [Errno 36] File name too long" from the CLI and the
    API alike, a bad-input trial of 2026-12-07); a path that merely does not exist is None."""
    text = os.fsdecode(os.fspath(path))
    if "\0" in text:
        return "it holds a NUL character, which no file name can"
    try:
        parts = [len(os.fsencode(p)) for p in Path(text).parts] or [0]
        whole = len(os.fsencode(text))
    except UnicodeEncodeError:  # a lone surrogate on a file system that is not UTF-8
        return "it cannot be encoded as a file name on this system"
    too_long = (f"the name is too long for the file system ({whole:,} bytes, its longest part "
                f"{max(parts):,}; a part may have at most {NAME_MAX}, the whole at most "
                f"{PATH_MAX - 1:,})")
    if max(parts) > NAME_MAX or whole >= PATH_MAX:
        # checked before the lookup, which reports a missing directory first: `--json
        # missing/<300 characters>` passed, ran an hour-long eval and then lost its figures
        # (a re-trial, 2026-12-07)
        return too_long
    try:
        os.stat(text)
    except OSError as e:
        import errno

        if e.errno == errno.ENAMETOOLONG:  # a file system with smaller limits
            return too_long
        if e.errno == errno.EACCES:
            return "permission denied looking it up (a directory on its way is not searchable)"
    except ValueError:  # an unencodable path
        return "it cannot be encoded as a file name on this system"
    return None


def short_path(path: str | os.PathLike, limit: int = 80) -> str:
    """`path` for an error message: whole up to `limit` characters, else its start and end
    around "…" (a 5,000-character name filled the terminal)."""
    text = os.fspath(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    text = text.replace("\0", "\\0")
    return text if len(text) <= limit else text[:limit // 2] + "…" + text[-(limit // 2 - 1):]


def file_kind(path: Path) -> str:
    """What is at `path`: "file" (a regular one), "missing" (nothing, or nothing this user may
    stat), "loop" (a symbolic link that loops), "dangling" (a link to nothing), "directory", or
    "other" (a device, pipe or socket). exists() is False for a dangling or looping link, which
    read as plainly missing; the messages built on this one tell them apart."""
    try:
        st = Path(path).stat()
    except OSError as e:
        if os.path.islink(path):
            import errno

            return "loop" if e.errno == errno.ELOOP else "dangling"
        return "missing"
    return ("file" if stat.S_ISREG(st.st_mode) else
            "directory" if stat.S_ISDIR(st.st_mode) else "other")


def why_not_a_file(path: Path) -> str:
    """Why `path` is not a readable regular file, in words for an error message: "no such
    file or directory", "a symbolic link to a missing target", "a symbolic link that loops",
    "a directory, not a file", or "not a regular file" (`file_kind`)."""
    return {"missing": "no such file or directory", "dangling": "a symbolic link to a missing "
            "target", "loop": "a symbolic link that loops",
            "directory": "a directory, not a file"}.get(file_kind(path), "not a regular file")


def replace_file(path: Path, text: str, mode: int | None = None) -> None:
    """Write `text` to `path` so that a reader, or a failure half-way (a full disk, a file-size
    limit, a signal), sees the old file whole or the new one whole, never a truncated mix: a
    temporary file beside it, flushed and synced, then renamed over it. An existing file keeps
    its permission bits and, where this process may set them, its owner; a new one gets `mode`
    (default 0o666) less the umask, as open() would. An existing file this process may not
    write is not replaced (PermissionError), as an in-place write would not be. A path that
    exists and is no regular file (/dev/null) is written in place: a rename would replace the
    device. Raises OSError (the caller names its flag or command); no temporary file is left
    behind."""
    import tempfile

    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    # UTF-8 whatever the locale, and a surrogate-escaped byte of the user's (a report quotes
    # argv) written back as that byte: a strict encode was an internal error that lost the
    # run's figures, and the sha256 of a sealed report must be over what is written (a re-trial)
    if st is not None and not stat.S_ISREG(st.st_mode):
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        return
    if st is not None:
        with open(path, "a"):  # read-only: refused here as a write in place would be
            pass
        keep = stat.S_IMODE(st.st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        keep = (0o666 if mode is None else mode) & ~umask
    # the temporary name carries at most 40 characters of the user's: a legal name of up to
    # 255 characters must not fail for the temporary one's extra (a bad-input trial)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:40]}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, keep)  # mkstemp makes 0600
        if st is not None and (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
            with contextlib.suppress(OSError):  # only root may give a file away
                os.chown(tmp, st.st_uid, st.st_gid)
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
