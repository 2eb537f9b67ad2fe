"""Synthetic checkpoints in the real formats (DESIGN §2 "Synthetic checkpoints") and the
embedded default checkpoint, plus the `make-checkpoint` command line.

Weights come from `synthetic.make_weights` and are snapped to the NVFP4 grid with power-of-two
scale2 (per tensor, per expert for stacks), so every NVFP4 value is exact in BF16: the BF16
safetensors and the NVFP4 GGUF of one run hold exactly the same model. A checkpoint is written
into a temporary sibling directory, config.json and a completion marker last, then renamed into
place, so an interrupted run never leaves a directory that looks complete.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from flint_graph.checkpoints import jsonfile, nvfp4
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.runtime.engine_config import pick_device
from flint_graph.errors import CheckpointError, ConfigError, FlintError, terminal_safe
from flint_graph.checkpoints.hf_checkpoint import write_safetensors
# The flags and their defaults live apart so the CLI can show --help without torch.
from flint_graph.checkpoints.make_checkpoint_args import (DEFAULT_FORMATS, DEFAULT_PRESET, DEFAULT_SEED,
                                              FORMATS, add_arguments)
from flint_graph.paths import cache_root
from flint_graph.terminal.progress import progress_bar
from flint_graph.chat.tokenizer import CHAT_STOP_TOKENS
from flint_graph.checkpoints.weights import FlintWeights, MLPWeights, NVFP4Weight

GGUF_NAME = "model-nvfp4.gguf"
MARKER_NAME = ".flint-checkpoint-complete.json"
MARKER_VERSION = 1  # bump when the generator's output changes, so stale caches are rebuilt
TOKENIZER_MAX_VOCAB = 8192  # a byte-level BPE this size trains in about a second
# DESIGN §1 sampling defaults (GLM-4.7 / vLLM day-0 recommendation)
SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 1.0, "top_p": 0.95, "top_k": 20}
PAD_TOKEN = "<|endoftext|>"  # GLM pads with end-of-text


def snap_to_nvfp4(w: torch.Tensor, per_expert: bool) -> NVFP4Weight:
    """NVFP4 form of a BF16 linear [N, K] (or stack [E, N, K] with per_expert: scale2 [E]).

    choose_scale2 returns a power of two, so `dequantize(...)` is exact in BF16 (E2M1 x E4M3
    needs at most 6 significant bits) and the BF16 and GGUF checkpoints hold the same values.
    """
    s2 = nvfp4.choose_scale2(w, per_expert)
    codes, scales = nvfp4.quantize(w, s2)
    return NVFP4Weight(codes, scales, s2)


def linear_slots(weights: FlintWeights) -> list[tuple[Any, str, bool]]:
    """Where the NVFP4 linears live: (owner object, attribute, per_expert) for q/k/v/o, the
    dense MLPs, the routed expert stacks (per-expert scale2) and the shared experts. The
    embedding, LM head, norms, sinks and router stay out (DESIGN §2)."""
    slots: list[tuple[Any, str, bool]] = []
    for lw in weights.layers:
        slots += [(lw, n, False) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        ffn = lw.ffn
        dense_mlp = ffn if isinstance(ffn, MLPWeights) else ffn.shared
        if not isinstance(ffn, MLPWeights):
            slots += [(ffn, n, True) for n in ("gate", "up", "down")]
        if dense_mlp is not None:
            slots += [(dense_mlp, n, False) for n in ("gate", "up", "down")]
    return slots


def quantize_weights(weights: FlintWeights, quantize_embeddings: bool = False,
                     progress: bool = True) -> FlintWeights:
    """Replace, in place and one tensor at a time, every linear of `weights` by its NVFP4 form
    (q/k/v/o, dense MLP, routed expert stacks with per-expert scale2, shared experts; embedding
    and LM head only with `quantize_embeddings`). Each BF16 tensor is freed once replaced, so
    peak memory is the BF16 model plus one tensor's temporaries. Returns `weights`."""
    slots = linear_slots(weights)
    if quantize_embeddings:
        slots += [(weights, "embed", False), (weights, "lm_head", False)]
    todo = [s for s in slots if isinstance(getattr(s[0], s[1]), torch.Tensor)]
    total = sum(getattr(o, n).numel() * 2 for o, n, _ in todo)
    with progress_bar(progress, "snapping to NVFP4", total) as advance:
        for owner, name, per_expert in todo:
            w = getattr(owner, name)
            setattr(owner, name, snap_to_nvfp4(w, per_expert))
            advance(w.numel() * 2)
            del w
    return weights


def make_nvfp4_weights(cfg: FlintConfig, seed: int, device: torch.device | str = "cpu",
                       progress: bool = False) -> FlintWeights:
    """`make_weights` then `quantize_weights`, bit for bit, but each layer is snapped to NVFP4
    as soon as it is made: peak memory is the NVFP4 model plus one BF16 layer (~25 GB for the
    full config instead of ~80 GB, so an 80 GB GPU can hold it). Embedding and LM head stay
    BF16, as in `quantize_weights`' default."""
    from types import SimpleNamespace

    from flint_graph.checkpoints.synthetic import make_weights

    def snap(lw) -> None:
        quantize_weights(SimpleNamespace(layers=[lw]), progress=False)

    return make_weights(cfg, seed, device, progress=progress, layer_hook=snap)


def weights_bytes(cfg: FlintConfig, fmt: str = "bf16") -> int:
    """Bytes the synthetic weights of `cfg` take at their peak while being made: BF16 (2 bytes a
    parameter) or, for "nvfp4" made by `make_nvfp4_weights`, the snapped linears at 9/16 byte a
    parameter (4-bit codes and an E4M3 scale per 16), everything else BF16, plus one BF16 layer
    being snapped (the largest). An estimate for refusing early, not an exact count."""
    if fmt == "bf16":
        return cfg.total_params * 2
    c = cfg.param_counts()
    linear = c["attention"] + c["dense_mlp"] + c["routed"] + c["shared"]
    n_moe = cfg.num_hidden_layers - cfg.first_k_dense_replace
    layer = max(c["dense_mlp"] // max(cfg.first_k_dense_replace, 1),
                (c["routed"] + c["shared"]) // max(n_moe, 1)) + c["attention"] // cfg.num_hidden_layers
    return linear * 9 // 16 + (cfg.total_params - linear) * 2 + layer * 2


# how libraries without an errno say a write ran out of room: safetensors and tokenizers
# (Rust: "No space left on device (os error 28)", "File too large (os error 27)") and numpy's
# tofile ("4608 requested and 1024 written")
_NO_ROOM = re.compile(r"No space left|os error (?:27|28|122)|File too large|quota exceeded"
                      r"|\d+ requested and \d+ written", re.IGNORECASE)


def _disk_full(e: BaseException) -> bool:
    """Whether a write failed for want of room: ENOSPC, EDQUOT or EFBIG (a file-size limit),
    or a library's own error for the same (`_NO_ROOM`: bad-input trials, 2026-12-06)."""
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    return isinstance(e, Exception) and bool(_NO_ROOM.search(str(e)))


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:,.1f} GB" if nbytes >= 1e9 else f"{max(nbytes / 1e6, 0.1):,.1f} MB"


def _check_destination(out_dir: Path) -> None:
    """Refuse, before any work, an output the final rename cannot take: a symbolic link (it
    ended in NotADirectoryError after the whole run), a mount point (EBUSY), a path whose
    nearest existing parent is a file. Raises CheckpointError saying what to pass instead."""
    if out_dir.is_symlink():
        raise CheckpointError(f"{out_dir}: is a symbolic link; pass the directory it points to "
                              f"({os.path.realpath(out_dir)}) or a new name")
    if out_dir.is_dir() and os.path.ismount(out_dir):
        raise CheckpointError(f"{out_dir}: is a mount point, which cannot be replaced; write "
                              f"into a directory inside it (e.g. {out_dir / 'checkpoint'})")
    above = next((a for a in out_dir.parents if a.exists()), None)
    if above is not None and not above.is_dir():
        raise CheckpointError(f"{out_dir}: cannot write there ({above} is a file, not a "
                              "directory)")


def _remove_empty(dirs: list[Path]) -> None:
    """Remove the directories made for an output that was not written (deepest first)."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            break


def generation_config(special_ids: dict[str, int]) -> dict[str, Any]:
    """generation_config.json: DESIGN §1 sampling defaults, EOS ids = the tokenizer's ids of
    <|endoftext|>, <|user|>, <|observation|>, pad = <|endoftext|>. Raises CheckpointError
    naming a stop token the tokenizer lacks."""
    for tok in CHAT_STOP_TOKENS:
        if tok not in special_ids:
            raise CheckpointError(f"tokenizer has no special token {tok!r} (needed as EOS)")
    return {**SAMPLING_DEFAULTS, "eos_token_id": [special_ids[t] for t in CHAT_STOP_TOKENS],
            "pad_token_id": special_ids[PAD_TOKEN]}


def _is_occupied(out_dir: Path, overwrite: bool) -> bool:
    """True when `out_dir` holds something; raises CheckpointError then unless `overwrite`."""
    if out_dir.exists() and not out_dir.is_dir():
        raise CheckpointError(f"{out_dir}: exists and is not a directory; choose another "
                              "output directory")
    occupied = out_dir.exists() and any(out_dir.iterdir())
    if occupied and not overwrite:
        raise CheckpointError(f"{out_dir}: already exists and is not empty; choose another "
                              "output directory or overwrite it (--overwrite)")
    if occupied and out_dir.is_symlink():
        raise CheckpointError(f"{out_dir}: is a symbolic link; --overwrite replaces a "
                              f"checkpoint directory itself: pass the directory it points to "
                              f"({os.path.realpath(out_dir)})")
    if occupied and not (out_dir / MARKER_NAME).is_file():
        # --overwrite replaces a checkpoint we wrote, never a directory of the user's files.
        raise CheckpointError(f"{out_dir}: --overwrite only replaces a checkpoint written by "
                              f"make-checkpoint (it has {MARKER_NAME}); this directory holds "
                              "other files, so it is left alone")
    if occupied:
        # ...nor one where the user has since put files of their own
        ours = _marker_files(out_dir)
        extra = sorted(p.name for p in out_dir.iterdir()
                       if p.name != MARKER_NAME and (p.name not in ours or not p.is_file()
                                                     or p.is_symlink()))
        if extra:
            shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5
                                             else "")
            raise CheckpointError(f"{out_dir}: --overwrite would delete files make-checkpoint "
                                  f"did not write ({shown}); move them out first or choose "
                                  "another output directory")
    return occupied


def _marker_files(out_dir: Path) -> set[str]:
    """The names of the files make-checkpoint wrote into `out_dir` (its marker's "files"; none
    when the marker cannot be read)."""
    try:
        files = jsonfile.loads((out_dir / MARKER_NAME).read_text()).get("files", {})
    except (OSError, ValueError, AttributeError):
        return set()
    return set(files) if isinstance(files, dict) else set()


def _install(tmp: Path, out_dir: Path, overwrite: bool) -> None:
    """Rename the finished `tmp` to `out_dir` (replacing an old one only with `overwrite`).
    The old checkpoint steps aside and the new one takes its name with Ctrl-C and SIGTERM held
    (a trial's interrupt between the two renames left no checkpoint at `out_dir`, the old one
    under a hidden name) until the old one is deleted, and steps back if the second rename
    fails."""
    from flint_graph.runtime.held_signals import signals_held

    if _is_occupied(out_dir, overwrite):
        old = out_dir.with_name(f"{tmp.name}.old")
        with signals_held():
            out_dir.rename(old)
            try:
                tmp.rename(out_dir)
            except BaseException:
                old.rename(out_dir)
                raise
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        return
    os.replace(tmp, out_dir)  # rename(2) replaces an empty directory atomically


def write_side_files(cfg: FlintConfig, out_dir: Path, seed: int = DEFAULT_SEED,
                     corpus=None, split_digits: bool = False) -> None:
    """What a checkpoint holds besides its weights, into `out_dir`: config.json, the tokenizer
    (tokenizer.json, tokenizer_config.json with the GLM-4.7 chat template; min(vocab_size,
    TOKENIZER_MAX_VOCAB) tokens, trained from `seed` on `corpus`, default the built-in one,
    digits split with `split_digits`) and generation_config.json."""
    from flint_graph.chat.chat_template import GLM47_CHAT_TEMPLATE
    from flint_graph.chat.tokenizer import write_tokenizer_files

    ids = write_tokenizer_files(out_dir, min(cfg.vocab_size, TOKENIZER_MAX_VOCAB),
                                GLM47_CHAT_TEMPLATE, seed=seed, corpus=corpus,
                                split_digits=split_digits)
    (out_dir / "generation_config.json").write_text(
        json.dumps(generation_config(ids), indent=2) + "\n")
    (out_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")


def write_checkpoint(cfg: FlintConfig, out_dir: str | Path,
                     formats: tuple[str, ...] | list[str] = DEFAULT_FORMATS,
                     seed: int = DEFAULT_SEED, device: torch.device | str | None = None,
                     progress: bool = True, quantize_embeddings: bool = False,
                     overwrite: bool = False) -> dict[str, Any]:
    """Write a complete synthetic checkpoint of `cfg` into `out_dir`.

    Files: config.json, generation_config.json, tokenizer.json, tokenizer_config.json (GLM-4.7
    chat template, min(vocab_size, 8192) tokens), then with "bf16" the safetensors shards and
    index, with "gguf" `model-nvfp4.gguf`, and a completion marker. Weights: make_weights(cfg,
    seed) on `device` (None: cuda if available, else cpu), snapped to NVFP4 (see module doc).
    The same (cfg, seed, device type) gives byte-identical files.
    Returns {"out_dir", "formats", "seed", "device", "files": {name: bytes}, "total_bytes",
    "seconds": {step: s}}. Raises ConfigError for a bad `formats`/`device`, CheckpointError when
    `out_dir` exists non-empty without `overwrite`, or when the disk fills up while writing
    (the partial output removed; the message gives the room the formats need).
    """
    from flint_graph.checkpoints.gguf_checkpoint import write_gguf
    from flint_graph.checkpoints.synthetic import make_weights

    formats = tuple(formats)
    if not formats or any(f not in FORMATS for f in formats):
        raise ConfigError(f"formats {list(formats)}; expected a non-empty subset of {FORMATS}")
    # absolute (links kept): `--out .` made its temporary directory inside the directory it
    # was to replace (Path('.').parent is '.'), and --overwrite then refused it (a trial)
    dev, out_dir, t0 = pick_device(device), Path(os.path.abspath(out_dir)), time.perf_counter()
    _check_destination(out_dir)
    _is_occupied(out_dir, overwrite)  # refuse before any work, not after minutes of it
    made = [d for d in out_dir.parents if not d.exists()]  # removed again if the write fails
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    except OSError as e:
        _remove_empty(made)
        raise CheckpointError(f"{out_dir}: cannot write there ({e.strerror or e})") from None
    seconds: dict[str, float] = {}

    def lap(step: str, start: float) -> float:
        now = time.perf_counter()
        seconds[step] = round(now - start, 3)
        return now

    try:
        tmp.chmod(0o755)
        write_side_files(cfg, tmp, seed)
        t = lap("tokenizer", t0)
        if "bf16" in formats:
            weights = make_weights(cfg, seed, dev, progress=progress)
            t = lap("weights", t)
            quantize_weights(weights, quantize_embeddings, progress)
        else:  # GGUF alone: snapped layer by layer, the same bytes without the BF16 model
            weights = make_nvfp4_weights(cfg, seed, dev, progress=progress)
            t = lap("weights", t)
            if quantize_embeddings:
                quantize_weights(weights, quantize_embeddings, progress)
        t = lap("quantize", t)
        if "bf16" in formats:
            write_safetensors(tmp, cfg, weights, progress=progress)
            t = lap("bf16", t)
        if "gguf" in formats:
            write_gguf(tmp / GGUF_NAME, cfg, weights, progress=progress)
            t = lap("gguf", t)
        del weights
        files = {p.name: p.stat().st_size for p in sorted(tmp.iterdir())}
        marker = {"version": MARKER_VERSION, "seed": seed, "formats": list(formats),
                  "quantize_embeddings": quantize_embeddings, "device_type": dev.type,
                  "config": cfg.to_dict(), "files": files}
        (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
        _install(tmp, out_dir, overwrite)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        _remove_empty(made)
        if _disk_full(e):  # the machine's state, not a bug: it said "internal error" (trial)
            need = sum(weights_bytes(cfg, "bf16" if f == "bf16" else "nvfp4") for f in formats)
            raise CheckpointError(
                f"{out_dir}: cannot write the checkpoint ({e}); the partial output was removed. "
                f"These formats need about {_size(need)} free on that disk (and no file-size "
                "limit below it: ulimit -f)") from None
        if isinstance(e, OSError):  # the machine's or the path's state: named, not a traceback
            raise CheckpointError(f"{out_dir}: cannot write the checkpoint "
                                  f"({e.strerror or e}); the partial output was "
                                  "removed") from None
        raise
    lap("total", t0)
    return {"out_dir": out_dir, "formats": list(formats), "seed": seed, "device": str(dev),
            "files": files, "total_bytes": sum(files.values()), "seconds": seconds}


# -- the embedded default -------------------------------------------------------------------

def tiny_checkpoint_dir() -> Path:
    """Where the tiny synthetic checkpoint lives: $FLINT_GRAPH_CACHE/tiny-seed0, else
    $XDG_CACHE_HOME/flint_graph/tiny-seed0, else ~/.cache/flint_graph/tiny-seed0."""
    return cache_root() / f"{DEFAULT_PRESET}-seed{DEFAULT_SEED}"


def is_complete(out_dir: Path, cfg: FlintConfig, seed: int, formats: tuple[str, ...]) -> bool:
    """True when `out_dir` holds a finished checkpoint of (cfg, seed) with every format: its
    marker matches and every file it lists is there with the size it recorded."""
    try:
        m = jsonfile.loads((out_dir / MARKER_NAME).read_text())
        return (m["version"] == MARKER_VERSION and m["seed"] == seed
                and m["config"] == cfg.to_dict() and set(formats) <= set(m["formats"])
                and all((out_dir / n).is_file() and (out_dir / n).stat().st_size == size
                        for n, size in m["files"].items()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def ensure_default_checkpoint(progress: bool = True, fresh: bool = False) -> Path:
    """The embedded default checkpoint: flint-nano, the trained miniature Flint that ships in
    the package (nano/embedded.py), unpacked into the cache with both formats on first use
    (`fresh`: unpacked again, over a copy found damaged). Returns its directory. Raises
    CheckpointError if it cannot be unpacked."""
    from flint_graph.nano.embedded import ensure_nano_checkpoint

    return ensure_nano_checkpoint(progress, fresh)


def ensure_tiny_checkpoint(progress: bool = True) -> Path:
    """The tiny synthetic checkpoint (tiny preset, seed 0, BF16 + GGUF, built on the CPU so
    every machine gets the same bytes), for tests and the graph engine's small checks: reused
    when complete, else built now (saying so and where on stderr). Returns its directory.
    Raises CheckpointError if it cannot be written."""
    from rich.console import Console

    out_dir, cfg = tiny_checkpoint_dir(), FlintConfig.preset(DEFAULT_PRESET)
    if is_complete(out_dir, cfg, DEFAULT_SEED, FORMATS):
        return out_dir
    Console(stderr=True).print(f"flint-graph: building the {DEFAULT_PRESET} checkpoint "
                               f"(seed {DEFAULT_SEED}) in {out_dir} (once)")
    try:
        write_checkpoint(cfg, out_dir, FORMATS, DEFAULT_SEED, "cpu", progress, overwrite=True)
    except OSError as e:
        if not is_complete(out_dir, cfg, DEFAULT_SEED, FORMATS):  # else another process won
            raise CheckpointError(f"{out_dir}: cannot build the tiny checkpoint ({e}); set "
                                  "FLINT_GRAPH_CACHE to a writable directory") from None
    return out_dir


# -- command line ---------------------------------------------------------------------------

def check_memory(cfg: FlintConfig, device: torch.device, fmt: str = "bf16",
                 nvfp4_flag: str = "") -> None:
    """Refuse up front when the weights (`weights_bytes`: BF16, or NVFP4 made layer by layer)
    cannot fit where they are generated (the `full` preset needs ~80 GB in BF16, ~25 GB as
    NVFP4), instead of swapping for minutes and dying. Raises ConfigError naming both sizes
    and, for BF16, `nvfp4_flag` (the caller's flag that asks for NVFP4 alone)."""
    need = weights_bytes(cfg, fmt)
    if device.type == "cuda":
        have = torch.cuda.get_device_properties(device).total_memory
    else:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > 0.9 * have:
        name = "BF16" if fmt == "bf16" else "NVFP4"
        small = weights_bytes(cfg, "nvfp4")
        hint = ""
        if fmt == "bf16" and small <= 0.9 * have:  # offer NVFP4 alone only where it fits
            hint = (f"; NVFP4 weights alone, made layer by layer, need {small / 1e9:.1f} GB"
                    f"{' (' + nvfp4_flag + ')' if nvfp4_flag else ''}")
        raise ConfigError(
            f"this config's {name} weights need {need / 1e9:.1f} GB, more than 90% of the "
            f"{have / 1e9:.1f} GB that {device} has{hint}; use a device with more memory "
            f"(--device cuda on a large GPU)")


def parse_formats(text: str) -> tuple[str, ...]:
    """--format's comma-separated list, e.g. "bf16,gguf". Raises ConfigError naming the flag
    for an empty list or item, an unknown format or one given twice (its message spoke of
    `formats ['BF16']` before: a bad-input trial, 2026-12-06)."""
    formats = [f.strip() for f in text.split(",")]
    # an empty item ("gguf," or "gguf,,bf16") is refused as bench's and eval's lists refuse
    # one; it was dropped without a word (a bad-input trial)
    empty = not text.strip() or "" in formats
    wrong = [f for f in formats if f and f not in FORMATS]
    twice = sorted({f for f in formats if f and formats.count(f) > 1})
    if empty or wrong or twice:
        why = (f"{', '.join(repr(f) for f in wrong)} unknown" if wrong
               else f"{', '.join(twice)} given twice" if twice
               else "empty" if not text.strip() else "an empty item")
        raise ConfigError(f"--format {text!r}: {why}; expected a comma-separated list of "
                          f"{' and '.join(FORMATS)} (each at most once)")
    return tuple(formats)


def run(args: argparse.Namespace) -> int:
    """Write the checkpoint `args` (from `add_arguments`) describe and print a summary; 0 on
    success. Raises FlintError for bad input (the caller prints it on one line)."""
    from flint_graph.terminal.stdout_console import StdoutConsole

    if args.seed < 0:
        raise ConfigError(f"--seed {args.seed}: expected a non-negative integer")
    cfg = (FlintConfig.from_json(args.config_path) if args.config_path
           else FlintConfig.preset(args.preset or DEFAULT_PRESET))
    from flint_graph.chat.tokenizer import min_trained_vocab_size

    if cfg.vocab_size < min_trained_vocab_size():  # the error came from deep in the write,
        # naming no file (a bad-input trial, 2026-12-06)
        raise ConfigError(f"{args.config_path or 'preset'}: vocab_size {cfg.vocab_size}: a "
                          "synthetic checkpoint's tokenizer needs at least "
                          f"{min_trained_vocab_size()} ids (256 bytes and the GLM-4.7 added "
                          "tokens)")
    formats = parse_formats(args.formats)
    if args.quantize_embeddings and "gguf" not in formats:
        raise ConfigError("--quantize-embeddings stores the embedding and LM head as NVFP4 in "
                          "the GGUF; --format has no gguf (add it, or leave the flag out)")
    check_memory(cfg, pick_device(args.device), "bf16" if "bf16" in formats else "nvfp4",
                 "--format gguf")
    summary = write_checkpoint(cfg, args.out_dir, formats, args.seed, args.device,
                               args.progress, args.quantize_embeddings, args.overwrite)
    out = StdoutConsole()
    out.print(terminal_safe(f"wrote {summary['out_dir']} ({summary['total_bytes'] / 1e6:,.1f} "
                            f"MB, {summary['seconds']['total']:.1f} s on {summary['device']})"),
              markup=False, emoji=False)
    for name, size in summary["files"].items():
        out.print(f"  {name:<40} {size:>16,} bytes", highlight=False)
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in summary["seconds"].items() if k != "total")
    out.print(f"  steps: {steps}", highlight=False)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`tools/make_checkpoint.py`: parse `argv`, write; FlintError -> one line on stderr, 2."""
    parser = argparse.ArgumentParser(
        prog="make_checkpoint.py",
        description="Write a seeded synthetic Flint checkpoint in the real formats: a BF16 "
                    "HF-style directory and/or one NVFP4 GGUF, with config, tokenizer and "
                    "generation_config. Both formats hold the same NVFP4-exact weights.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except FlintError as e:
        print(f"make_checkpoint: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("make_checkpoint: interrupted (no partial checkpoint was left)", file=sys.stderr)
        return 130
