"""The kernel cache on disk: `DIR/manifest.json` plus one cubin per (specialisation, arch).

This side needs no DSL: the GPU box reads the cache that a CPU machine built (DESIGN §3,
../shared/device.md). Each manifest entry is keyed "kernel/key@arch", e.g.
"gemv_bf16/B=1,K=2048@sm_90a", and holds: kernel, key, values, arch, symbol, params (the
launcher's packing layout, checked against the cubin at build time and on load), param_bytes,
launch (grid/block/smem), reqntid, regs, static_smem, local_memory and local_bytes (spills:
the cubin's frame size), pdl_wait (the PTX calls griddepcontrol.wait), plain_loads_before_wait,
sass_load_order, dsl_version, source_hash, cubin (file name), sha256, build_s.

An entry is only handed out after checks: present, built from the current kernel source, its
cubin the file this specialisation's build writes (a plain name inside the cache directory),
with the recorded sha256, made for the requested arch, holding the recorded symbol, and the
entry's launch shape and parameter layout those of the declaration and of the cubin's own
parameter table. Anything else raises `KernelCacheError` naming the entry and what to run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from flint_graph.errors import FlintError
from flint_graph.kernels.toolchain.cubin import CubinFormatError, cubin_sm, read_cubin
from flint_graph.kernels.toolchain.spec import KernelDef, Spec, check_spec, param_layout
from flint_graph.paths import cache_root

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
ARCHS = ("sm_90a", "sm_100a")  # what CI compiles; the H200 needs sm_90a
DSL_DIST = "nvidia-cutlass-dsl"


class KernelCacheError(FlintError):
    """A kernel cache entry is missing, stale, corrupt or built for another GPU."""


def default_cache_dir() -> Path:
    """The per-user kernel cache: <cache root>/kernels (see flint_graph.paths.cache_root)."""
    return cache_root() / "kernels"


def entry_id(spec: Spec, arch: str) -> str:
    """Manifest key of one specialisation for one arch."""
    return f"{spec.id}@{arch}"


def cubin_name(spec: Spec, arch: str) -> str:
    """File name of the cubin, e.g. gemv_bf16.B1-K2048.sm_90a.cubin."""
    key = "-".join(f"{k}{v}" for k, v in spec.values) or "any"
    return f"{spec.kernel}.{key}.{arch}.cubin"


def dsl_version() -> str | None:
    """Installed nvidia-cutlass-dsl version, None where the DSL is absent (the GPU box)."""
    try:
        return metadata.version(DSL_DIST)
    except metadata.PackageNotFoundError:
        return None


# The builder's own files: what they record in a manifest entry changes with them.
BUILDER_FILES = ("toolchain/build.py", "toolchain/sass.py", "toolchain/cubin.py")


def source_hash(kdef: KernelDef) -> str:
    """sha256 over the kernel's module file, its declared extra source files and the builder's
    files: a change in any of them makes its cubins stale."""
    from flint_graph.kernels import source_path

    here = Path(__file__).parent.parent  # the kernels package: names are relative to it
    h = hashlib.sha256()
    for name in (source_path(kdef.name), *kdef.source_files, *BUILDER_FILES):
        h.update(name.encode() + b"\0" + (here / name).read_bytes())
    return h.hexdigest()


def arch_for_capability(major: int, minor: int) -> str:
    """The cubin arch for a CUDA device capability: (9, 0) -> sm_90a, (10, 0) -> sm_100a.

    Raises KernelCacheError for a GPU our kernels are not built for."""
    arch = {(9, 0): "sm_90a", (10, 0): "sm_100a"}.get((major, minor))
    if arch is None:
        raise KernelCacheError(f"GPU compute capability {major}.{minor}: no kernels are built for "
                               f"it (supported: 9.0 -> sm_90a, 10.0 -> sm_100a)")
    return arch


def build_command(arch: str, preset: str | None = None) -> str:
    """The command that builds missing entries, for error messages."""
    what = f"--preset {preset}" if preset else "--preset tiny|full or --config CONFIG.json"
    return f"flint-graph build-kernels --arch {arch} {what}"


@dataclass
class CacheEntry:
    """One verified entry: its manifest record and its cubin bytes."""

    meta: dict[str, Any]
    cubin: bytes


class KernelCache:
    """A cache directory. `read_manifest` on open; `get` verifies and returns an entry."""

    def __init__(self, root: str | Path | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.manifest = read_manifest(self.root)

    def problem(self, kdef: KernelDef, spec: Spec, arch: str) -> str | None:
        """Why (kdef, spec, arch) cannot be loaded as is, or None when it can."""
        return self._verify(kdef, spec, arch)[0]

    def _verify(self, kdef: KernelDef, spec: Spec, arch: str) -> tuple[str | None, bytes]:
        """(why the entry cannot be loaded or None, the cubin bytes that were checked)."""
        eid = entry_id(spec, arch)
        try:
            args, launch = check_spec(kdef, spec)
        except ValueError as e:
            return f"{eid}: {e}", b""
        meta = self.manifest.get(eid)
        if meta is None:
            return f"{eid}: missing from {self.root / MANIFEST}", b""
        if not isinstance(meta, dict):
            return f"{eid}: not a manifest entry (a JSON {type(meta).__name__})", b""
        if meta.get("arch") != arch:
            return f"{eid}: recorded arch {meta.get('arch')!r}, expected {arch}", b""
        if [meta.get("kernel"), meta.get("key"), meta.get("values")] != \
                [kdef.name, spec.key, spec.as_dict()]:
            return (f"{eid}: the entry records kernel {meta.get('kernel')!r}, key "
                    f"{meta.get('key')!r}, values {meta.get('values')!r}"), b""
        if meta.get("source_hash") != source_hash(kdef):
            from flint_graph.kernels import source_path

            return (f"{eid}: stale (kernels/{source_path(kdef.name)} or what it builds with "
                    "changed)", b"")
        here = dsl_version()
        if here is not None and meta.get("dsl_version") != here:
            return f"{eid}: stale (built with DSL {meta.get('dsl_version')}, installed {here})", b""
        name = cubin_name(spec, arch)
        if meta.get("cubin") != name:  # also: never a path outside the cache directory
            return f"{eid}: names cubin file {meta.get('cubin')!r}, expected {name!r}", b""
        path = self.root / name
        if not path.is_file():
            return f"{eid}: cubin file {path} is missing", b""
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            return f"{eid}: corrupt ({path} does not match the sha256 in the manifest)", b""
        try:
            sm = cubin_sm(data)
            kernels = read_cubin(data)
        except CubinFormatError as e:
            return f"{eid}: corrupt ({path}: {e})", b""
        if f"sm_{sm}a" != arch:
            return f"{eid}: {path} is an sm_{sm} cubin, not {arch}", b""
        symbol = meta.get("symbol")
        info = kernels.get(symbol) if isinstance(symbol, str) else None
        if info is None:
            return f"{eid}: {path} holds no kernel {symbol!r} (is it another entry's cubin?)", b""
        if meta.get("launch") != launch.to_json():
            return (f"{eid}: launch {meta.get('launch')!r} in the manifest, the declaration "
                    f"gives {launch.to_json()}"), b""
        if info.reqntid not in (None, list(launch.block)):
            return (f"{eid}: {path} requires block {info.reqntid}, declared "
                    f"{list(launch.block)}"), b""
        params = [{"arg": a.name, "offset": off, "size": size, "fields": param_layout(a)[0]}
                  for a, (_, off, size) in zip(args, info.params)]
        if len(info.params) != len(args) or meta.get("params") != params \
                or meta.get("param_bytes") != info.param_bytes \
                or any(param_layout(a)[1] != p["size"] for a, p in zip(args, params)):
            return (f"{eid}: the manifest's parameter layout does not match the declared "
                    f"arguments and {path}'s parameter table"), b""
        if not isinstance(meta.get("pdl_wait"), bool):
            return f"{eid}: pdl_wait = {meta.get('pdl_wait')!r}, expected true or false", b""
        return None, data

    def get(self, kdef: KernelDef, spec: Spec, arch: str, *, build: bool = True) -> CacheEntry:
        """The verified entry. Where the CuTe DSL is installed and `build` is set, a missing or
        invalid entry is compiled now and added. Raises KernelCacheError naming the entry and
        the command that builds it."""
        why, data = self._verify(kdef, spec, arch)
        if why is not None and build and dsl_version() is not None:
            from flint_graph.kernels.toolchain.build import build_cache

            build_cache(self.root, [(kdef, spec)], [arch], progress=False)
            self.manifest = read_manifest(self.root)
            why, data = self._verify(kdef, spec, arch)
        if why is not None:
            raise KernelCacheError(f"kernel cache {self.root}: {why}; rebuild with "
                                   f"`{build_command(arch)} --out {self.root}` on a machine with "
                                   f"the CuTe DSL (pip install '.[kernels]')")
        return CacheEntry(self.manifest[entry_id(spec, arch)], data)


def read_manifest(root: Path) -> dict[str, dict[str, Any]]:
    """The manifest's entries ({} when the directory or file does not exist).

    Raises KernelCacheError for a manifest that is not a JSON object of the expected version."""
    path = root / MANIFEST
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise KernelCacheError(f"{path}: unreadable kernel manifest ({e}); delete it and rebuild "
                               f"with `flint-graph build-kernels`") from None
    if not isinstance(raw, dict) or type(raw.get("version")) is not int \
            or raw.get("version") != MANIFEST_VERSION or not isinstance(raw.get("entries"), dict):
        raise KernelCacheError(f"{path}: not a version-{MANIFEST_VERSION} kernel manifest; delete "
                               f"it and rebuild with `flint-graph build-kernels`")
    return raw["entries"]


def write_manifest(root: Path, entries: dict[str, dict[str, Any]]) -> None:
    """Write the manifest atomically (a reader never sees half a file)."""
    root.mkdir(parents=True, exist_ok=True)
    body = json.dumps({"version": MANIFEST_VERSION, "entries": dict(sorted(entries.items()))},
                      indent=1)
    fd, tmp = tempfile.mkstemp(dir=root, prefix=".manifest-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(body + "\n")
        os.replace(tmp, root / MANIFEST)
    except BaseException:  # Ctrl-C or a full disk: leave no temporary file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
