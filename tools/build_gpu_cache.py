#!/usr/bin/env python3
"""Build the kernel cache the H200 runs carry (it has no CuTe DSL and never compiles there,
../shared/device.md): every model specialisation of the tiny, nano (flint-nano, issue 11) and
full configs, flint-nano with the planted config bugs of `flint-graph eval --plant` (window-1,
rope-on-nope), every variant a kernel module lists in `bench_specs`, and the test-only kernels,
for sm_90a, into .kcache/kernels (what tools/gpu_check.sh points FLINT_GRAPH_CACHE at).

    python tools/build_gpu_cache.py [--out .kcache/kernels] [--arch sm_90a] [--jobs N]
                                    [--preset nano]
Incremental: entries already up to date are kept. The whole cache is about 750 compiles (over an
hour on 2 cores); `--preset nano` builds only what `tools/gpu_eval_nano.sh` runs (flint-nano and
its planted configs: 104 compiles, about 2 minutes on 2 cores).

`--export DIR` then copies only the model specialisations of the presets asked for (no bench
variants) and the test kernels into DIR/kernels, a cache to point FLINT_GRAPH_CACHE at: the
whole cache (~27 MB) and a candidate flint-nano GGUF (~12 MB) together pass the 64 MiB a device
call may carry, and the three presets' model kernels are ~11 MB (thirty-fifth session). `--with-bench KERNEL`
adds one kernel's bench variants to the export (e.g. moe_gate_up for tools/probe_moe_pd.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from flint_graph.cli_args import ValueParser

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import MODEL_KERNELS, TEST_KERNELS, kernel_module, registry
from flint_graph.kernels.toolchain.build import _exclusive, build_cache, model_specs
from flint_graph.kernels.toolchain.cache import (MANIFEST, KernelCacheError, entry_id,
                                                 read_manifest, write_manifest)
from flint_graph.kernels.toolchain.spec import BUCKETS, unique_specs
from flint_graph.nano.plants import planted_config


PRESETS = ("tiny", "nano", "full")


def todo(presets: tuple[str, ...] = PRESETS) -> list:
    """(KernelDef, Spec) pairs: model specs of `presets` (nano's planted configs with nano), and,
    when all presets are asked for, the bench variants and the test kernels."""
    everything = set(presets) == set(PRESETS)
    out = []
    for name in MODEL_KERNELS:
        (kdef,) = registry((name,))
        module = kernel_module(name)
        for preset in presets:
            cfg = FlintConfig.preset(preset)
            specs = kdef.specs(cfg, BUCKETS)
            if everything:
                specs += getattr(module, "bench_specs", lambda c, b: [])(cfg, BUCKETS)
            out += [(kdef, s) for s in unique_specs(specs)]
        if "nano" in presets:
            for bug in ("window-1", "rope-on-nope"):  # `eval --plant` on the graph engine
                cfg = planted_config(FlintConfig.preset("nano"), bug)
                out += [(kdef, s) for s in kdef.specs(cfg, BUCKETS)]
    if everything:
        out += model_specs(None, (), registry(TEST_KERNELS))
    return out


def main() -> int:
    p = ValueParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=".kcache/kernels", help="cache directory")
    p.add_argument("--arch", action="append", choices=("sm_90a", "sm_100a"))
    p.add_argument("--jobs", type=int, help="compile processes (default: one per CPU)")
    p.add_argument("--preset", action="append", choices=PRESETS,
                   help="build only this config's kernels (repeatable; default: every preset, "
                        "the bench variants and the test kernels)")
    p.add_argument("--prune", action="store_true",
                   help="afterwards remove the entries and cubins this command does not "
                        "build (variants since removed, other --arch), so the cache a device "
                        "call carries stays small; only with every preset")
    p.add_argument("--export", metavar="DIR",
                   help="afterwards copy the model specialisations of the presets (no bench "
                        "variants) and the test kernels into DIR/kernels: a smaller cache for "
                        "FLINT_GRAPH_CACHE=DIR")
    p.add_argument("--with-bench", action="append", metavar="KERNEL", default=[],
                   choices=MODEL_KERNELS,
                   help="with --export, also copy this kernel's bench variants (repeatable; "
                        "e.g. moe_gate_up for tools/probe_moe_pd.py)")
    args = p.parse_args()
    if args.with_bench and not args.export:
        p.error("--with-bench chooses what --export copies; give --export DIR too")
    if args.prune and args.preset and set(args.preset) != set(PRESETS):
        p.error("--prune needs every preset (without --preset): it keeps only what they build")
    if args.jobs is not None and args.jobs < 1:
        p.error(f"--jobs {args.jobs}: expected at least 1 compile process")
    t0 = time.perf_counter()
    work = todo(tuple(dict.fromkeys(args.preset or PRESETS)))
    try:
        counts = build_cache(args.out, work, args.arch or ["sm_90a"], workers=args.jobs)
    except KernelCacheError as e:
        print(f"build_gpu_cache: {e}", file=sys.stderr)
        return 2
    print(f"{args.out}: {counts} in {time.perf_counter() - t0:.0f} s")
    if args.prune:
        try:
            gone = prune(Path(args.out), work, args.arch or ["sm_90a"])
        except KernelCacheError as e:
            print(f"build_gpu_cache: {e}", file=sys.stderr)
            return 2
        print(f"{args.out}: pruned {gone} entries of specs no longer built")
    if args.export:
        presets = tuple(dict.fromkeys(args.preset or PRESETS))
        subset = [w for preset in presets for w in todo((preset,))]
        subset += model_specs(None, (), registry(TEST_KERNELS))
        subset += bench_variants(args.with_bench, presets)
        try:
            n, size = export(Path(args.out), Path(args.export) / "kernels", subset,
                             args.arch or ["sm_90a"])
        except KernelCacheError as e:
            print(f"build_gpu_cache: {e}", file=sys.stderr)
            return 2
        print(f"{args.export}/kernels: {n} entries, {size / 1e6:.1f} MB")
    return 0


def bench_variants(names: list[str], presets: tuple[str, ...]) -> list:
    """(KernelDef, Spec) pairs of the `bench_specs` of the kernels `names` for `presets`:
    what `--with-bench` adds to an export (the thirty-seventh session's PD probe found them
    missing from the model-only cache a device call carried)."""
    out = []
    for name in dict.fromkeys(names):
        (kdef,) = registry((name,))
        bench = getattr(kernel_module(name), "bench_specs", lambda c, b: [])
        for preset in presets:
            out += [(kdef, s) for s in unique_specs(bench(FlintConfig.preset(preset), BUCKETS))]
    return out


def export(root: Path, dest: Path, work: list, archs: list[str]) -> tuple[int, int]:
    """Copy the entries of `work` × `archs` and their cubins from the cache `root` into a fresh
    cache `dest` (emptied first); returns (entries, bytes of cubins). Raises KernelCacheError
    when `root` lacks one of them (build it first), an entry names no plain cubin file of
    `root`, or `dest` is `root`."""
    import shutil

    if dest.resolve() == root.resolve():
        raise KernelCacheError(f"--export {dest.parent}: the export must not be the cache itself")
    with _exclusive(root):
        entries = read_manifest(root)
        want = {entry_id(spec, arch) for _, spec in work for arch in archs}
        missing = sorted(want - entries.keys())
        if missing:
            raise KernelCacheError(f"{root}: {len(missing)} entries to export are not built "
                                   f"(first: {missing[0]})")
        names = {eid: _own_cubin(entries[eid]) for eid in want}
        bad = next((eid for eid, name in names.items() if name is None), None)
        if bad is not None:
            raise KernelCacheError(f"{root}: entry {bad} names no cubin of the cache "
                                   f"({entries[bad]!r:.80})")
        if dest.exists():  # only an earlier export is replaced, never someone's folder
            if any(f.name != MANIFEST and not f.name.endswith((".cubin", ".lock"))
                   for f in dest.iterdir()):
                raise KernelCacheError(f"--export {dest.parent}: {dest} holds files other than "
                                       "a kernel cache's; choose another directory")
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        size = 0
        for eid, name in names.items():
            shutil.copyfile(root / name, dest / name)
            size += (dest / name).stat().st_size
        write_manifest(dest, {eid: entries[eid] for eid in want})
    return len(want), size


def prune(root: Path, work: list, archs: list[str]) -> int:
    """Drop from `root`'s manifest every entry whose (spec, arch) is not in `work` × `archs`,
    and its cubin; returns how many went. Under the build lock, as a build writes. A cubin is
    deleted only where the entry names a plain `.cubin` file in `root` (the manifest is data:
    an entry naming "../x" or "/x" is dropped but nothing outside the directory is touched); a
    malformed entry is dropped the same way. Raises KernelCacheError for a file that is not a
    kernel manifest."""
    with _exclusive(root):
        entries = read_manifest(root)
        keep = {entry_id(spec, arch) for _, spec in work for arch in archs}
        gone = [eid for eid in entries if eid not in keep]
        for eid in gone:
            name = _own_cubin(entries.pop(eid))
            if name is not None:
                (root / name).unlink(missing_ok=True)
        write_manifest(root, entries)
    return len(gone)


def _own_cubin(meta) -> str | None:
    """The cubin file an entry names when it is a plain `.cubin` name inside the cache (the
    manifest is data: "../x" or "/x" must never be touched), else None."""
    name = meta.get("cubin") if isinstance(meta, dict) else None
    ok = isinstance(name, str) and name.endswith(".cubin") and "/" not in name \
        and "\\" not in name
    return name if ok else None


if __name__ == "__main__":
    sys.exit(main())
