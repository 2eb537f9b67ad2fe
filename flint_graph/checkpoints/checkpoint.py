"""One entry point for every checkpoint: the format is decided by file content (DESIGN §2).

A directory holding config.json plus safetensors is a BF16 HF checkpoint; a file that starts
with the GGUF magic is an NVFP4 GGUF, whose config, tokenizer and generation_config come from a
BF16-style directory (`hf_config_path`, as vLLM's --hf-config-path; default: the GGUF's own
directory when it holds a config.json). Names and extensions never decide anything.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.paths import why_not_a_file
from flint_graph.errors import CheckpointError
from flint_graph.checkpoints.jsonfile import MISSING, file_problem, read_json_object
from flint_graph.checkpoints.weights import FlintWeights, NVFP4Weight

GGUF_MAGIC = b"GGUF"
CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"


class WeightFormat(enum.Enum):
    """How the linears are stored: BF16 safetensors, or NVFP4 blocks in one GGUF file."""

    BF16 = "bf16"
    NVFP4 = "nvfp4"


@dataclass
class LoadedCheckpoint:
    """A loaded model: config, weights on the requested device, and where its side files live.

    config_dir holds config.json, tokenizer.json, tokenizer_config.json and (optionally)
    generation_config.json; generation_config is that file parsed ({} when absent). timings:
    seconds of the load's phases that are not the file read ("repack_s" for a GGUF).
    """

    cfg: FlintConfig
    weights: FlintWeights
    format: WeightFormat
    config_dir: Path
    generation_config: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)  # "repack_s" (NVFP4), seconds


def read_generation_config(config_dir: str | Path) -> dict[str, Any]:
    """generation_config.json of `config_dir` as a dict ({} when the file is absent: many HF
    checkpoints ship none). Raises CheckpointError naming the file when it is not a regular
    file (a directory, a device, a dangling link) or not a JSON object."""
    path = Path(config_dir) / GENERATION_CONFIG_NAME
    if file_problem(path) == MISSING:  # a directory or a dangling link in its place is named
        return {}
    return read_json_object(path, CheckpointError, "file not found")


def is_gguf(path: Path) -> bool:
    """True when the regular file `path` starts with the GGUF magic bytes. Raises
    CheckpointError naming it when it cannot be read (a bad-input trial passed
    /proc/self/mem, whose read fails with EIO: a bare "internal error: OSError")."""
    if not path.is_file():  # a FIFO or device would block or never end
        return False
    try:
        with path.open("rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it ({e.strerror or e})") from None


def _config_dir(hf_config_path: str | Path | None, fallback: Path, gguf: Path | None) -> Path:
    """The directory holding config.json: `hf_config_path` (a directory or its config.json)
    when given, else `fallback`. Raises CheckpointError explaining what is missing."""
    if hf_config_path is not None:
        d = Path(hf_config_path)
        if not d.exists():
            raise CheckpointError(f"{d}: hf_config_path (--hf-config-path) does not exist; "
                                  "expected a directory with config.json, tokenizer.json, "
                                  "tokenizer_config.json and generation_config.json (or its "
                                  "config.json)")
        if d.is_file() and d.name == CONFIG_NAME:
            d = d.parent
        elif not d.is_dir():
            raise CheckpointError(f"{d}: hf_config_path (--hf-config-path) is a file, not a directory; expected "
                                  "a directory with config.json, tokenizer.json, "
                                  "tokenizer_config.json and generation_config.json (or its "
                                  "config.json)")
        if not (d / CONFIG_NAME).is_file():
            raise CheckpointError(f"{d}: hf_config_path (--hf-config-path) has no {CONFIG_NAME}; expected a "
                                  "directory with config.json, tokenizer.json, "
                                  "tokenizer_config.json and generation_config.json")
        return d
    if not (fallback / CONFIG_NAME).is_file():
        if gguf is not None:
            raise CheckpointError(
                f"{gguf}: an NVFP4 GGUF takes its config, tokenizer and generation_config from a "
                f"BF16-style directory, and {fallback} has no {CONFIG_NAME}; pass a directory "
                "that holds them as hf_config_path (CLI: --hf-config-path DIR)")
        what = "no" if not os.path.lexists(fallback / CONFIG_NAME) else \
            f"{why_not_a_file(fallback / CONFIG_NAME)} for"
        raise CheckpointError(f"{fallback}: {what} {CONFIG_NAME}; a BF16 checkpoint directory "
                              "holds config.json, tokenizer files and safetensors shards")
    return fallback


def _describe_non_gguf(path: Path) -> str:
    with path.open("rb") as f:
        head = f.read(16)
    if len(head) >= 9 and head[8:9] == b"{":  # 8-byte length then a JSON header: safetensors
        return (f"{path}: a safetensors file, not a checkpoint; pass the directory that holds "
                "it with config.json (BF16) or an NVFP4 GGUF file")
    start = "empty" if not head else f"starts with {head[:4]!r}"
    return (f"{path}: not a GGUF file ({start}, expected {GGUF_MAGIC!r}) and "
            "not a directory; expected a BF16 checkpoint directory or an NVFP4 GGUF file")


def _readable_gguf(path: Path) -> bool:
    """is_gguf, False for a file that cannot be read: looking for the GGUF among a directory's
    files, an unreadable one is not it (`generate /proc/self` named /proc/self/clear_refs
    instead of saying the directory has no config.json, a bad-input trial)."""
    try:
        return is_gguf(path)
    except CheckpointError:
        return False


def _gguf_in_dir(d: Path) -> Path | None:
    """The one GGUF file (by content) directly inside `d`, or None; several are refused."""
    found = [p for p in sorted(d.iterdir()) if p.is_file() and _readable_gguf(p)]
    if len(found) > 1:
        raise CheckpointError(f"{d}: holds several GGUF files ({', '.join(p.name for p in found)})"
                              "; pass the one to load")
    return found[0] if found else None


def load_checkpoint(path: str | Path, hf_config_path: str | Path | None = None,
                    device: torch.device | str = "cpu", progress: bool = True
                    ) -> LoadedCheckpoint:
    """Load a BF16 directory or an NVFP4 GGUF file onto `device`, deciding the format by content.

    - directory with safetensors (model.safetensors.index.json or model.safetensors):
      BF16; config from `hf_config_path` when given, else from the directory itself.
    - directory without safetensors that holds exactly one GGUF file: that GGUF.
    - file starting with b"GGUF": NVFP4; config dir = `hf_config_path`, else the file's own
      directory when it holds config.json.
    Raises CheckpointError naming the path when it does not exist, is neither format, or a GGUF
    has no config directory (the message explains --hf-config-path); ConfigError for a bad
    config.json or a file this user may not read; loader errors (shapes, dtypes, metadata
    mismatch) propagate.
    """
    from flint_graph.paths import name_problem, short_path

    for given, what in ((path, "checkpoint"), (hf_config_path, "hf_config_path")):
        # a NUL, a name too long or a lookup refused: Path.exists() raised ValueError /
        # OSError from deep in the loader (a bad-input trial, 2026-12-07)
        problem = None if given is None else name_problem(given)
        if problem:
            raise CheckpointError(f"{short_path(given)}: {what} path: {problem}")
    try:
        return _load(path, hf_config_path, device, progress)
    except PermissionError as e:
        # a file or directory the user cannot read gave "internal error: PermissionError"
        # from whichever reader met it first (a bad-input trial, 2026-12-06)
        raise CheckpointError(f"{e.filename or path}: cannot read it (permission denied); "
                              "a checkpoint's files must be readable by this user") from None


def _load(path: str | Path, hf_config_path: str | Path | None, device: torch.device | str,
          progress: bool) -> LoadedCheckpoint:
    """`load_checkpoint` without its PermissionError translation."""
    from flint_graph.checkpoints.hf_checkpoint import INDEX_NAME, SINGLE_NAME, load_safetensors

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: {why_not_a_file(path)} (expected a BF16 checkpoint "
                              "directory or an NVFP4 GGUF file)")
    gguf: Path | None = None
    if path.is_dir():
        has_st = (path / INDEX_NAME).is_file() or (path / SINGLE_NAME).is_file()
        for name, what in ((INDEX_NAME, "safetensors index (JSON)"),
                           (SINGLE_NAME, "safetensors file")):
            # something other than a file under the name (a directory, a link to nothing, a
            # loop) was "holds safetensors shards but no index" (a bad-input trial, 2026-12-06)
            problem = None if has_st else file_problem(path / name)
            if problem not in (None, MISSING):
                raise CheckpointError(f"{path / name}: {problem}; expected the {what}")
        if not has_st and any(path.glob("*.safetensors")):
            raise CheckpointError(f"{path}: holds safetensors shards but no {INDEX_NAME}; "
                                  "the index maps each tensor to its shard")
        if not has_st:
            gguf = _gguf_in_dir(path)
            if gguf is None:
                _config_dir(hf_config_path, path, None)  # names a missing config.json first
                raise CheckpointError(f"{path}: no {INDEX_NAME}, no {SINGLE_NAME} and no GGUF "
                                      "file; not a checkpoint directory")
    elif not path.is_file():
        raise CheckpointError(f"{path}: not a regular file or directory (expected a BF16 "
                              "checkpoint directory or an NVFP4 GGUF file)")
    elif is_gguf(path):
        gguf = path
    else:
        raise CheckpointError(_describe_non_gguf(path))
    try:
        config_dir = _config_dir(hf_config_path, gguf.parent if gguf else path, gguf)
    except CheckpointError:
        if gguf is not None:
            # a corrupt GGUF with no config beside it asked for --hf-config-path first, and
            # only once given one said the file was broken (a bad-input trial, 2026-12-07);
            # checked here only, since the loader checks it again on the way in
            from flint_graph.checkpoints.gguf_structure import check_gguf_structure

            check_gguf_structure(gguf)
        raise
    cfg = FlintConfig.from_json(config_dir / CONFIG_NAME)
    generation_config = read_generation_config(config_dir)
    if gguf is None:
        weights = load_safetensors(path, cfg, device, progress)
        fmt = WeightFormat.BF16
    else:
        from flint_graph.checkpoints.gguf_checkpoint import load_gguf

        timings: dict[str, float] = {}
        weights = load_gguf(gguf, cfg, device, progress, timings)
        # a GGUF may hold BF16 linears too: report what was loaded, not what the file type hints
        is_fp4 = isinstance(weights.layers[0].q_proj, NVFP4Weight) if weights.layers else True
        fmt = WeightFormat.NVFP4 if is_fp4 else WeightFormat.BF16
    return LoadedCheckpoint(cfg, weights, fmt, config_dir, generation_config,
                            timings if gguf is not None else {})
