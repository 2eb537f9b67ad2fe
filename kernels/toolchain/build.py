"""Ahead-of-time build: every kernel specialisation a model needs -> cubins + manifest.json.

Runs without a GPU (DESIGN §3, ../shared/cute-dsl-aot.md): each declared argument becomes a fake
tensor or scalar, `cute.compile` with `--gpu-arch <arch> --keep-cubin --keep-ptx` gives the
cubin and PTX, and the cubin's own parameter table is checked against the layout we derive
from the declaration, so the launcher packs exactly what the kernel reads. Incremental: an entry
whose source hash, DSL version and cubin sha256 still match is not rebuilt.
"""

from __future__ import annotations

import contextlib
import os
import hashlib
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

# torch (the kernels' references import it) is imported with this module rather than later in
# run(): the CLI imports this module during start-up, where Ctrl-C exits at once, whereas a
# KeyboardInterrupt raised inside torch's import can be swallowed by its C code (the build then
# runs on) or abort the process.
import torch  # noqa: F401

from flint_graph.kernels import registry
from flint_graph.kernels.toolchain.cache import (ARCHS, MANIFEST, KernelCache, KernelCacheError,
                                       cubin_name, dsl_version, entry_id, source_hash,
                                       write_manifest)
from flint_graph.kernels.toolchain.cubin import read_cubin
from flint_graph.kernels.toolchain.sass import pdl_load_order
from flint_graph.kernels.toolchain.spec import (KernelDef, ScalarArg, Spec, TensorArg, check_spec,
                                      param_layout, unique_specs)
from flint_graph.terminal.progress import progress_bar

__all__ = ["KernelBuildError", "build_cache", "compile_spec", "model_specs", "param_layout", "run"]

LOCK = ".build.lock"  # held while a build writes the directory (one builder at a time)


class KernelBuildError(KernelCacheError):
    """A specialisation failed to compile or its cubin does not match its declaration."""


def _fake_args(args: Sequence[TensorArg | ScalarArg]) -> list[Any]:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    dsl = {"bf16": cutlass.BFloat16, "f32": cutlass.Float32, "f64": cutlass.Float64,
           "u8": cutlass.Uint8, "u32": cutlass.Uint32, "i32": cutlass.Int32, "i64": cutlass.Int64}
    out: list[Any] = []
    for a in args:
        if isinstance(a, ScalarArg):
            out.append(dsl[a.dtype](0))
            continue
        syms: dict[str, Any] = {}
        shape = tuple(syms.setdefault(d, cute.sym_int32()) if isinstance(d, str) else d
                      for d in a.shape)
        out.append(make_fake_compact_tensor(dsl[a.dtype], shape,
                                            stride_order=tuple(reversed(range(len(shape)))),
                                            assumed_align=a.align))
    out.append(make_fake_stream())
    return out


def compile_spec(kdef: KernelDef, spec: Spec, arch: str) -> tuple[dict[str, Any], bytes]:
    """Compile one specialisation for one arch -> (manifest entry without file fields, cubin).

    Raises KernelBuildError when the compile fails, yields other than one kernel, or the
    cubin's parameter table disagrees with the declared arguments."""
    os.environ.setdefault("CUTE_DSL_ARCH", arch)  # read once when cutlass is first imported
    import cutlass.cute as cute

    eid = entry_id(spec, arch)
    try:
        args, launch = check_spec(kdef, spec)
    except ValueError as e:
        raise KernelBuildError(f"{eid}: {e}") from None
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as dump:
        try:
            fn = kdef.build(spec, arch) if kdef.build_takes_arch else kdef.build(spec)
            compiled = cute.compile(fn, *_fake_args(args), options=(
                f"--gpu-arch {arch} --keep-cubin --keep-ptx --dump-dir={dump}"))
        except Exception as e:
            raise KernelBuildError(f"{eid}: compile failed: {type(e).__name__}: {e}") from e
        cubin, ptx = compiled.artifacts.CUBIN, compiled.artifacts.PTX
    seconds = time.perf_counter() - t0
    # A missing dump dir leaves these as path strings without an error (aot.md §6.4).
    if not isinstance(cubin, bytes) or cubin[:4] != b"\x7fELF" or f".target {arch}" not in ptx:
        raise KernelBuildError(f"{eid}: the DSL returned no {arch} cubin")
    symbols = list(compiled.kernel_info)
    if len(symbols) != 1:
        raise KernelBuildError(f"{eid}: expected one kernel, the DSL traced {symbols}")
    info = read_cubin(cubin)[symbols[0]]
    params = []
    for arg, (ordinal, offset, size) in zip(args, info.params):
        fields, want = param_layout(arg)
        if size != want:
            raise KernelBuildError(f"{eid}: argument {arg.name}: cubin parameter {ordinal} is "
                                   f"{size} bytes, the declaration gives {want}")
        params.append({"arg": arg.name, "offset": offset, "size": size, "fields": fields})
    if len(info.params) != len(args):
        raise KernelBuildError(f"{eid}: cubin has {len(info.params)} parameters for "
                               f"{len(args)} declared arguments (is the @cute.jit a pass-through?)")
    if info.reqntid not in (None, list(launch.block)):
        raise KernelBuildError(f"{eid}: cubin requires block {info.reqntid}, declared "
                               f"{list(launch.block)}")
    body = ptx[ptx.index(".entry"):]
    # Plain (non-.nc) global loads read what a predecessor may still be writing: none may come
    # before the wait, in the PTX and (where nvdisasm is installed) in the SASS, where ptxas
    # may have moved the wait (kernels/toolchain/sass.py). The GPU slow-producer test is the proof.
    head = body.split("griddepcontrol.wait", 1)[0] if "griddepcontrol.wait" in body else ""
    early = len(re.findall(r"\bld\.global(?!\.nc)[\w:.]*", head))
    try:
        sass = pdl_load_order(cubin)
    except (OSError, subprocess.CalledProcessError) as e:
        raise KernelBuildError(f"{eid}: nvdisasm failed on the cubin: {e}") from e
    meta = {
        "kernel": kdef.name, "key": spec.key, "values": spec.as_dict(), "arch": arch,
        "symbol": symbols[0], "params": params, "param_bytes": info.param_bytes,
        "launch": launch.to_json(), "reqntid": info.reqntid, "regs": info.regs,
        "static_smem": info.static_smem, "pdl_wait": "griddepcontrol.wait" in body,
        # ptxas spills show only in the cubin's frame size, not in the PTX
        "local_memory": bool(re.search(r"\bld\.local|\bst\.local", body)) or info.frame_size > 0,
        "local_bytes": info.frame_size,
        "plain_loads_before_wait": early, "sass_load_order": sass,
        "dsl_version": dsl_version(), "source_hash": source_hash(kdef),
        "build_s": round(seconds, 3),
    }
    return meta, cubin


def model_specs(cfg: Any, buckets: Sequence[int] = (1, 2, 4, 8),
                kernels: Sequence[KernelDef] | None = None) -> list[tuple[KernelDef, Spec]]:
    """Every (kernel, specialisation) the model `cfg` needs for the given batch buckets."""
    out = []
    for kdef in kernels or registry():
        out += [(kdef, s) for s in unique_specs(kdef.specs(cfg, buckets))]
    return out


def build_cache(root: str | Path, todo: Sequence[tuple[KernelDef, Spec]],
                archs: Sequence[str] = ARCHS, *, progress: bool = True,
                force: bool = False, workers: int | None = None) -> dict[str, int]:
    """Compile what `todo` needs for each arch into `root`; reuse valid entries.

    `workers` compile processes (default: one per CPU, at most 8) run the compiles; this process
    writes the results; they are spawned processes, so a script that calls this needs the
    `if __name__ == "__main__":` guard.
    Returns counts {"built", "reused", "total"}. The manifest is rewritten after every build, so
    an interrupted run keeps what it finished; files are replaced atomically, and one build at
    a time writes a directory (a second waits for the first, then reuses what it built). A
    directory without a manifest must be empty or hold only cubins, so that a mistyped --out
    never mixes the cache into someone else's files. Raises KernelBuildError,
    KernelCacheError."""
    if dsl_version() is None:
        raise KernelBuildError("building kernels needs the CuTe DSL: pip install '.[kernels]' "
                               "(nvidia-cutlass-dsl, cuda-python)")
    for arch in archs:
        if arch not in ARCHS:
            raise KernelBuildError(f"--arch {arch}: expected one of {', '.join(ARCHS)}")
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise KernelBuildError(f"--out {root}: a file, not a directory; expected a new or empty "
                               "directory or an existing kernel cache")
    try:
        root.mkdir(parents=True, exist_ok=True)
        others = [] if (root / MANIFEST).exists() else sorted(
            f.name for f in root.iterdir() if not _ours(f.name))
        probe = root / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise KernelBuildError(f"--out {root}: cannot write the kernel cache there "
                               f"({e.strerror or e}); expected a writable directory") from None
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise KernelBuildError(f"--out {root}: holds other files ({shown}) and no {MANIFEST}; "
                               f"expected a new or empty directory or an existing kernel cache")
    with _exclusive(root):
        cache = KernelCache(root)  # read under the lock: what an earlier build added is kept
        # one job per cache entry: specs repeat across configs (a planted config shares most
        # of its model's kernels), and a repeat would compile again
        jobs = list({entry_id(s, a): (k, s, a) for a in archs for k, s in todo}.values())
        stale = [j for j in jobs if force or cache.problem(*j) is not None]
        counts = {"built": 0, "reused": len(jobs) - len(stale), "total": len(jobs)}
        with progress_bar(progress, "compiling kernels", len(jobs), unit="steps") as advance:
            advance(counts["reused"])
            for spec, arch, meta, cubin in _compiled(stale, workers):
                name = cubin_name(spec, arch)
                meta.update(cubin=name, sha256=hashlib.sha256(cubin).hexdigest())
                try:
                    _write_atomic(root / name, cubin)
                    cache.manifest[entry_id(spec, arch)] = meta
                    write_manifest(root, cache.manifest)
                except OSError as e:
                    raise KernelBuildError(f"--out {root}: cannot write {name} or "
                                           f"{MANIFEST} ({e.strerror or e})") from None
                counts["built"] += 1
                advance(1)
    return counts


def _init_worker(arch: str) -> None:
    os.environ["CUTE_DSL_ARCH"] = arch  # before the worker first imports cutlass


def _compile_job(kernel: str, spec: Spec, arch: str) -> tuple[Spec, str, dict[str, Any], bytes]:
    (kdef,) = registry((kernel,))
    meta, cubin = compile_spec(kdef, spec, arch)
    return spec, arch, meta, cubin


def _compiled(jobs: Sequence[tuple[KernelDef, Spec, str]],
              workers: int | None) -> Iterator[tuple[Spec, str, dict[str, Any], bytes]]:
    """(spec, arch, manifest entry, cubin) of each job as it finishes. Compiles run in worker
    processes (spawned: the DSL reads its target arch once per process, so one pool per arch)
    when there are more jobs than one; the first failure stops the rest."""
    workers = min(workers or min(os.cpu_count() or 1, 8), len(jobs))
    if workers <= 1:
        for kdef, spec, arch in jobs:
            yield (spec, arch, *compile_spec(kdef, spec, arch))
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    ctx = multiprocessing.get_context("spawn")
    for arch in dict.fromkeys(a for _, _, a in jobs):
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(arch,)) as pool:
            pending = {pool.submit(_compile_job, k.name, s, a) for k, s, a in jobs if a == arch}
            try:
                while pending:
                    # each result as it lands, so an interrupted build keeps what finished
                    # (FIRST_EXCEPTION waited for all of them when none failed)
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    for f in done:
                        yield f.result()
            finally:
                for f in pending:
                    f.cancel()


def _ours(name: str) -> bool:
    """A file name the build writes into a cache directory (cubins, lock, temporary files)."""
    return name.endswith(".cubin") or name in (LOCK, ".write-test") \
        or (name.startswith((".manifest-", ".cubin-")) and name.endswith(".tmp"))


def _write_atomic(path: Path, data: bytes) -> None:
    """Write `path` so that a reader sees the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".cubin-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    """Hold the directory's build lock (a second builder waits, saying so on stderr)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        yield
        return
    with open(root / LOCK, "a") as f:  # closing the file releases the lock
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"flint-graph: note: another build is writing {root}; waiting for it",
                  file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def run(args: Any) -> int:
    """`flint-graph build-kernels`: compile the model's kernels (and the test-only ones) for
    each --arch into --out. Prints one summary line; raises KernelBuildError, ConfigError."""
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.kernels import TEST_KERNELS
    from flint_graph.kernels.toolchain.cache import default_cache_dir

    cfg = FlintConfig.from_json(args.config) if args.config else FlintConfig.preset(args.preset)
    archs = args.arch or ["sm_90a"]
    todo = model_specs(cfg, args.buckets) + model_specs(cfg, (), registry(TEST_KERNELS))
    root = Path(args.out) if args.out else default_cache_dir()
    t0 = time.perf_counter()
    counts = build_cache(root, todo, archs, progress=args.progress, force=args.force,
                         workers=getattr(args, "jobs", None))
    print(f"kernel cache {root}: {counts['built']} built, {counts['reused']} up to date, "
          f"{counts['total']} entries for {', '.join(archs)} "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0
