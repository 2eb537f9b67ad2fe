"""Where a cubin's loads sit relative to its PDL wait, read from the SASS (nvdisasm).

PTX order is not enough: ptxas schedules a bare `griddepcontrol.wait` (SASS ACQBULK) near the
top of the kernel, above weight loads written before it, and could in principle move other
loads too (../shared/kernel-reading.md lists hoisted loads among the PDL bugs seen in public
kernels). So the build disassembles each cubin and records, in program text order: weight loads
(read-only `LDG...CONSTANT`) before the wait, i.e. what PDL prefetches, and plain loads before
the wait, which may read what a predecessor is still writing and must be zero. Text order is a
proxy for execution order (ACQBULK sits in straight-line code at the kernel's top); the GPU
slow-producer test is the proof. Needs nvdisasm (pip package nvidia-cuda-nvdisasm, part of the
`kernels` extra); without it the fields are None.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_LOAD = re.compile(r"\bLDG\.[\w.]*")


def nvdisasm() -> str | None:
    """Path of nvdisasm: on PATH, else from the nvidia-cuda-nvdisasm wheel, else None."""
    found = shutil.which("nvdisasm")
    if found:
        return found
    for site in map(Path, sys.path):
        for sub in ("cu13", "cu12", "cuda_nvdisasm"):
            cand = site / "nvidia" / sub / "bin" / "nvdisasm"
            if cand.is_file():
                return str(cand)
    return None


def pdl_load_order(cubin: bytes) -> dict[str, int] | None:
    """{"weight_loads_before_wait", "plain_loads_before_wait", "loads_after_wait"} counted in
    the SASS text of a one-kernel cubin; None without nvdisasm or without an ACQBULK."""
    tool = nvdisasm()
    if tool is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    lines = [ln for ln in sass.splitlines() if "/*" in ln and ";" in ln]
    wait = next((i for i, ln in enumerate(lines) if "ACQBULK" in ln), None)
    if wait is None:
        return None
    before = [m.group(0) for ln in lines[:wait] for m in [_LOAD.search(ln)] if m]
    after = [ln for ln in lines[wait:] if _LOAD.search(ln)]
    weights = sum("CONSTANT" in op for op in before)
    return {"weight_loads_before_wait": weights,
            "plain_loads_before_wait": len(before) - weights, "loads_after_wait": len(after)}
