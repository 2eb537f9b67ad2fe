"""flint-nano as the embedded default checkpoint (issue 11).

The package ships flint-nano's NVFP4 GGUF with its side files (config.json, tokenizer,
generation_config.json) in `flint_graph/nano/flint-nano/`. On first use `ensure_nano_checkpoint`
copies them into the cache and writes the BF16 shards beside them, the exact dequantisation of
the GGUF (the export wrote the same bytes: tools/train_nano.py), so the cache directory is a
complete checkpoint in both formats: the directory loads as BF16, DIR/model-nvfp4.gguf as NVFP4.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from importlib import resources
from pathlib import Path

from flint_graph.checkpoints import jsonfile
from flint_graph.errors import CheckpointError
from flint_graph.paths import cache_root

GGUF_NAME = "model-nvfp4.gguf"
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
MARKER = ".flint-nano.json"
UNPACKED_MB = 45  # the unpacked directory: the GGUF, its BF16 safetensors and side files (~42 MB)


def packaged_dir() -> Path:
    """The package's flint-nano folder (GGUF + side files)."""
    return Path(str(resources.files("flint_graph.nano") / "flint-nano"))


def is_packaged() -> bool:
    """Whether this install carries flint-nano's files."""
    d = packaged_dir()
    return all((d / f).is_file() for f in (GGUF_NAME, *SIDE_FILES))


def _digest(src: Path) -> str:
    """SHA-256 over the packaged files (GGUF and side files), so that a changed side file
    (e.g. the sampling defaults) also unpacks afresh."""
    h = hashlib.sha256()
    for name in (GGUF_NAME, *SIDE_FILES):
        h.update(name.encode() + b"\0" + hashlib.sha256((src / name).read_bytes()).digest())
    return h.hexdigest()


def ensure_nano_checkpoint(progress: bool = True, fresh: bool = False) -> Path:
    """The cache directory holding flint-nano in both formats, made on first use (and again
    when the packaged GGUF changed, a cached file is missing or has another size, or `fresh`:
    the caller found the copy damaged in a way sizes do not show, `LLM()` when it fails to
    load). Returns the directory. Raises CheckpointError when the package lacks the files or
    the cache is not writable."""
    from rich.console import Console

    src = packaged_dir()
    if not is_packaged():
        raise CheckpointError(f"{src}: flint-nano's files are missing from this install "
                              f"(expected {GGUF_NAME} and {', '.join(SIDE_FILES)})")
    digest = _digest(src)
    out = cache_root() / f"flint-nano-{digest[:12]}"
    if fresh:
        shutil.rmtree(out, ignore_errors=True)
    elif _complete(out, digest):
        return out
    # one line even past 80 columns: the path is for copying (a pipe must not break it)
    Console(stderr=True, soft_wrap=True).print(
        f"flint-graph: unpacking flint-nano into {out}" + ("" if fresh else " (once)"))
    from safetensors import SafetensorError

    try:
        _build(src, out, digest, progress)
    except (OSError, SafetensorError) as e:  # safetensors reports a full disk as its own error
        if not _complete(out, digest):  # else another process finished it
            # HOME set to a file said "[Errno 20] Not a directory: '...partial-13997'"
            above = next((a for a in out.parents if os.path.lexists(a)), None)
            why = (f": {above} is a file, not a directory (the cache lives under "
                   "FLINT_GRAPH_CACHE, else XDG_CACHE_HOME, else HOME/.cache)"
                   if above is not None and not above.is_dir() else f" ({e})")
            raise CheckpointError(f"{out}: cannot unpack flint-nano{why}; set "
                                  "FLINT_GRAPH_CACHE to a writable directory with "
                                  f"{UNPACKED_MB} MB free") from None
    return out


def _complete(out: Path, digest: str) -> bool:
    try:
        m = jsonfile.loads((out / MARKER).read_text())
        return m["package_sha256"] == digest and all(
            (out / name).stat().st_size == size for name, size in m["files"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _sweep_abandoned(out: Path) -> None:
    """Remove `out`'s partial directories whose process is gone: a first run killed half-way
    (SIGTERM, a lost terminal) runs no cleanup, and its copy stayed for good (a bad-input
    trial, 2026-12-06: 67 MB where a clean cache holds 42)."""
    for d in out.parent.glob(f"{out.name}.partial-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (PermissionError, OverflowError, ValueError):  # alive (another user's) or odd
            pass


def _build(src: Path, out: Path, digest: str, progress: bool) -> None:
    from flint_graph.checkpoints.checkpoint import load_checkpoint
    from flint_graph.checkpoints.hf_checkpoint import write_safetensors

    # one partial directory per process: two first runs at once (two terminals, parallel
    # tests) must not delete each other's half-written files
    tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    _sweep_abandoned(out)
    tmp.mkdir(parents=True)
    try:
        for name in (GGUF_NAME, *SIDE_FILES):
            shutil.copyfile(src / name, tmp / name)
        ck = load_checkpoint(tmp / GGUF_NAME, tmp, "cpu", progress)
        write_safetensors(tmp, ck.cfg, ck.weights, progress=progress)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        (tmp / MARKER).write_text(json.dumps({"package_sha256": digest, "files": files},
                                             indent=1))
    except BaseException:
        # a full disk (or Ctrl-C) half-way: the partial copy would stay behind and keep the
        # disk full (a bad-input trial, 2026-12-06: 12 MB, then 8 MB more, never removed)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if _complete(out, digest):  # another process finished first: keep its copy
        shutil.rmtree(tmp, ignore_errors=True)
        return
    shutil.rmtree(out, ignore_errors=True)
    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
