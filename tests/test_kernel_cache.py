"""CPU (CI) tests of the kernel toolchain: every kernel compiles for sm_90a and sm_100a at the
tiny and full configs' shapes, the manifest holds what the launcher needs, the argument packing
matches the cubin's own parameter table, and the cache refuses stale, corrupt, foreign-arch and
missing entries by name. Skipped where the CuTe DSL is not installed (the GPU box)."""

import hashlib
import json
import shutil
import struct

import pytest
import torch

from flint_graph.config import FlintConfig
from flint_graph.kernels import MODEL_KERNELS, TEST_KERNELS, registry
from flint_graph.kernels.cache import (ARCHS, MANIFEST, KernelCache, KernelCacheError,
                                       cubin_name, dsl_version, entry_id)
from flint_graph.kernels.cubin import cubin_sm, read_cubin

pytestmark = pytest.mark.skipif(dsl_version() is None, reason="needs nvidia-cutlass-dsl")

REQUIRED = {"kernel", "key", "values", "arch", "symbol", "params", "param_bytes", "launch",
            "reqntid", "regs", "pdl_wait", "dsl_version", "source_hash", "cubin", "sha256",
            "build_s", "plain_loads_before_wait", "local_memory"}


def _todo():
    from flint_graph.kernels.build import model_specs

    todo = []
    for preset in ("tiny", "full"):
        todo += model_specs(FlintConfig.preset(preset))
    return todo + model_specs(None, (), registry(TEST_KERNELS))


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """One cache with every kernel of both configs and the test kernels, for both archs."""
    from flint_graph.kernels.build import build_cache

    root = tmp_path_factory.mktemp("kernels")
    todo = _todo()
    counts = build_cache(root, todo, ARCHS, progress=False)
    return root, todo, counts


def _copy(built, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(built[0], root)
    return root


def test_every_kernel_compiles_for_both_archs(built):
    root, todo, counts = built
    assert counts == {"built": len(todo) * len(ARCHS), "reused": 0,
                      "total": len(todo) * len(ARCHS)}
    entries = json.loads((root / MANIFEST).read_text())["entries"]
    names = {kdef.name for kdef, _ in todo}
    assert names == set(MODEL_KERNELS) | set(TEST_KERNELS)
    for kdef, spec in todo:
        for arch in ARCHS:
            meta = entries[entry_id(spec, arch)]
            assert REQUIRED <= set(meta), sorted(REQUIRED - set(meta))
            cubin = (root / meta["cubin"]).read_bytes()
            assert hashlib.sha256(cubin).hexdigest() == meta["sha256"]
            assert f"sm_{cubin_sm(cubin)}a" == arch
            assert meta["pdl_wait"], f"{entry_id(spec, arch)} never waits on its predecessor"
            # early_reader breaks the rule on purpose: the PTX and SASS checks must see it.
            early, sass = meta["plain_loads_before_wait"], meta["sass_load_order"]
            assert sass is not None, "nvdisasm (the kernels extra) is missing"
            if kdef.name == "early_reader":
                assert early > 0 and sass["plain_loads_before_wait"] > 0
            else:
                assert early == 0 and sass["plain_loads_before_wait"] == 0, entry_id(spec, arch)
            if any(getattr(a, "role", "") == "weight" for a in kdef.args(spec)):
                # PDL's gain: the weights are in flight before the wait
                assert sass["weight_loads_before_wait"] > 0, entry_id(spec, arch)
            assert not meta["local_memory"], f"{entry_id(spec, arch)} spills to local memory"
            assert meta["reqntid"] == meta["launch"]["block"]


def test_param_layout_matches_the_cubins_own_table(built):
    root, todo, _ = built
    entries = json.loads((root / MANIFEST).read_text())["entries"]
    for meta in entries.values():
        info = read_cubin((root / meta["cubin"]).read_bytes())[meta["symbol"]]
        assert [(p["offset"], p["size"]) for p in meta["params"]] == \
            [(off, size) for _, off, size in info.params]
        assert info.param_bytes == meta["param_bytes"]
        last = meta["params"][-1]
        assert meta["param_bytes"] >= last["offset"] + last["size"]


def test_packing_follows_the_manifest(built):
    """The bytes the launcher packs for a tensor with a dynamic extent and a scalar."""
    from flint_graph.capture.launcher import check_args, pack_args

    root, _, _ = built
    kdef = registry(("slow_producer",))[0]
    meta = KernelCache(root).get(kdef, kdef.spec(), "sm_90a").meta
    src, dst = torch.arange(10, dtype=torch.int32), torch.zeros(10, dtype=torch.int32)
    assert check_args("t", kdef.args(kdef.spec()), [src, dst, 5000], "cpu") == {"N": 10}
    bufs = pack_args(meta["params"], [src, dst, 5000])
    assert struct.unpack("<Qi", bufs[0][:12]) == (src.data_ptr(), 10)
    assert struct.unpack("<Qi", bufs[1][:12]) == (dst.data_ptr(), 10)
    assert struct.unpack("<q", bufs[2]) == (5000,)
    gemv = registry(("gemv_bf16",))[0]
    spec = gemv.specs(FlintConfig.preset("tiny"), (2,))[0]
    k = spec["K"]
    meta = KernelCache(root).get(gemv, spec, "sm_90a").meta
    x, w, y = torch.randn(2, k).bfloat16(), torch.randn(40, k).bfloat16(), torch.empty(2, 40)
    y = y.bfloat16()
    assert check_args("t", gemv.args(spec), [x, w, y], "cpu") == {"N": 40}
    packed = b"".join(b.ljust(p["size"], b"\0") for b, p in zip(pack_args(meta["params"],
                                                                           [x, w, y]),
                                                                 meta["params"]))
    assert struct.pack("<Q", w.data_ptr()) in packed and struct.pack("<i", 40) in packed


def test_rebuild_reuses_every_valid_entry(built, tmp_path):
    from flint_graph.kernels.build import build_cache

    root = _copy(built, tmp_path)
    counts = build_cache(root, built[1][:6], ARCHS, progress=False)
    assert counts["built"] == 0 and counts["reused"] == 12


def _one(built):
    kdef = registry(("rmsnorm",))[0]
    return kdef, kdef.spec(B=1, H=FlintConfig.preset("tiny").hidden_size)


def test_corrupt_cubin_is_refused_by_name(built, tmp_path):
    root = _copy(built, tmp_path)
    kdef, spec = _one(built)
    path = root / cubin_name(spec, "sm_90a")
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(KernelCacheError, match=r"rmsnorm/B=1,H=64@sm_90a: corrupt"):
        KernelCache(root).get(kdef, spec, "sm_90a", build=False)


def test_foreign_arch_cubin_is_refused(built, tmp_path):
    root = _copy(built, tmp_path)
    kdef, spec = _one(built)
    other = (root / cubin_name(spec, "sm_100a")).read_bytes()
    (root / cubin_name(spec, "sm_90a")).write_bytes(other)
    man = json.loads((root / MANIFEST).read_text())
    man["entries"][entry_id(spec, "sm_90a")]["sha256"] = hashlib.sha256(other).hexdigest()
    (root / MANIFEST).write_text(json.dumps(man))
    with pytest.raises(KernelCacheError, match=r"sm_100 cubin, not sm_90a"):
        KernelCache(root).get(kdef, spec, "sm_90a", build=False)


def test_stale_entry_is_refused_then_rebuilt_on_demand(built, tmp_path):
    root = _copy(built, tmp_path)
    kdef, spec = _one(built)
    man = json.loads((root / MANIFEST).read_text())
    man["entries"][entry_id(spec, "sm_90a")]["source_hash"] = "0" * 64
    (root / MANIFEST).write_text(json.dumps(man))
    with pytest.raises(KernelCacheError, match=r"stale \(kernels/rmsnorm.py or what"):
        KernelCache(root).get(kdef, spec, "sm_90a", build=False)
    entry = KernelCache(root).get(kdef, spec, "sm_90a")  # the DSL is here: rebuilt and added
    assert entry.meta["source_hash"] != "0" * 64


def test_missing_entry_names_the_build_command(built, tmp_path):
    root = _copy(built, tmp_path)
    kdef = registry(("rmsnorm",))[0]
    spec = kdef.spec(B=3, H=64)
    with pytest.raises(KernelCacheError, match=r"rmsnorm/B=3,H=64@sm_90a: missing.*"
                                               r"flint-graph build-kernels --arch sm_90a"):
        KernelCache(root).get(kdef, spec, "sm_90a", build=False)


def test_unreadable_manifest_is_refused(tmp_path):
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(KernelCacheError, match="unreadable kernel manifest"):
        KernelCache(tmp_path)
    (tmp_path / MANIFEST).write_text("[]")
    with pytest.raises(KernelCacheError, match="not a version-1 kernel manifest"):
        KernelCache(tmp_path)


def test_build_kernels_command_reuses_the_cache(built, tmp_path, capsys):
    from flint_graph.cli import main

    root = _copy(built, tmp_path)
    argv = ["build-kernels", "--preset", "tiny", "--arch", "sm_90a", "--arch", "sm_100a",
            "--out", str(root), "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"kernel cache {root}: 0 built," in out and "for sm_90a, sm_100a" in out


def test_build_kernels_refuses_an_unwritable_out(tmp_path, capsys):
    from flint_graph.cli import main

    target = tmp_path / "a-file"
    target.write_text("x")
    assert main(["build-kernels", "--out", str(target), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"flint-graph: error: --out {target}: cannot write the kernel cache")
