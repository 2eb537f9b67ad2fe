"""What a benchmark or trace ran on and what it ran: machine, versions, git revision, config
hash — so two saved runs can be compared knowing whether they are comparable."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import torch

from flint_graph.checkpoints.config import FlintConfig

REPO = Path(__file__).resolve().parent.parent


def _version(*dists: str) -> str | None:
    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def machine_info(device: torch.device) -> dict:
    """GPU name and driver (None on the CPU), torch / CUDA / cuda-bindings / CuTe DSL versions,
    Python and the CPU."""
    cuda = device.type == "cuda"
    return {"device": device.type,
            "gpu": torch.cuda.get_device_name(device) if cuda else None,
            "driver": _driver() if cuda else None,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_bindings": _version("cuda-bindings", "cuda-python"),
            "cutlass_dsl": _version("nvidia-cutlass-dsl"),
            "python": platform.python_version(),
            "cpu": f"{platform.machine()} ({os.cpu_count()} threads, torch uses "
                   f"{torch.get_num_threads()})"}


def git_rev() -> str | None:
    """$FLINT_GIT_REV when set (a copied tree, e.g. on the device machine, may carry a stale
    .git or none), else the short revision of the checkout this code runs from ("+dirty" with
    uncommitted changes to tracked files), else None."""
    if os.environ.get("FLINT_GIT_REV"):
        return os.environ["FLINT_GIT_REV"]
    try:
        rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain",
                                    "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def config_hash(cfg: FlintConfig) -> str:
    """12 hex digits of the SHA-256 of the config's canonical JSON: equal for the same model
    shape, whatever the checkpoint's path or format."""
    text = json.dumps(cfg.to_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def header(schema: str, cfg: FlintConfig, source: str, device: torch.device,
           command: str) -> dict:
    """The fields every bench and trace JSON starts with (see perf/bench_report.py)."""
    return {"schema": schema, "version": 1,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "command": command,
            "machine": machine_info(device), "git_rev": git_rev(),
            "model": {"source": source, "config_hash": config_hash(cfg),
                      "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size}}


def rss_anon() -> int:
    """This process's anonymous resident memory (RssAnon from /proc/self/status, bytes): the heap
    and tensors, without the file pages of mapped checkpoints and libraries that VmRSS also
    counts. 0 where /proc has no such line (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def note_no_gpu(dev, what: str) -> None:
    """On a device other than CUDA, a stderr note that `what` ("every row", "the trace") is the
    reference engine's, and why: bench and trace on a CPU said nothing of it (a new user's
    trial, 2026-12-07)."""
    if dev.type != "cuda":
        print(f"flint-graph: note: no CUDA GPU ({dev}): {what} is the reference engine's; the "
              "graph engine (AOT kernels in CUDA graphs, the figures in docs/perf-log.md) needs "
              "an NVIDIA GPU", file=sys.stderr)


def note_unused_fold(dev, engine: str, attn_fold, prefill: bool = False) -> None:
    """A stderr note when --attn-fold was given but the graph engine's decode step, the only
    thing it sets, does not run (no CUDA GPU, --engine reference, or a `prefill` trace)."""
    if attn_fold is not None and (dev.type != "cuda" or engine == "reference" or prefill):
        print(f"flint-graph: note: --attn-fold {'on' if attn_fold else 'off'} concerns the "
              "graph engine's decode step, which does not run here; it changes nothing",
              file=sys.stderr)
