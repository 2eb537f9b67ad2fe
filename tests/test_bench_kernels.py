"""CPU tests of tools/bench_kernels.py: byte counts, rotation sizes, the plan, targets, tables
and files, and the whole run on the CPU with fake kernels (they write their reference's result,
or a wrong one) and a stubbed timer, so everything except the CUDA timing runs here."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from tool_module import TOOLS, tool_module

from flint_graph import reference
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.kernels import kernel_module
from flint_graph.kernels.decode.rmsnorm import KERNEL as RMSNORM
from flint_graph.kernels.toolchain.spec import KernelDef, Launch, Spec, TensorArg
from flint_graph.checkpoints.weights import NVFP4Weight

@pytest.fixture(scope="module")
def bench():
    return tool_module("bench_kernels")


def fake_gemv(name: str, nvfp4: bool, variants=(0, 1)) -> KernelDef:
    """A GEMV declared like kernels/gemv_*.py (x [B,K] input, weights, y [B,N] output)."""
    def args(spec):
        b, k = spec["B"], spec["K"]
        w = ((TensorArg("codes", "u8", ("N", k // 2), "weight"),
              TensorArg("scales", "u8", ("N", k // 16), "weight"),
              TensorArg("scale2", "f32", (1,), "weight")) if nvfp4
             else (TensorArg("w", "bf16", ("N", k), "weight"),))
        return (TensorArg("x", "bf16", (b, k), "input"), *w,
                TensorArg("y", "bf16", (b, "N"), "output"))

    def specs(cfg, buckets):
        ks = sorted({k for _, k in cfg.dense_linear_shapes().values()})
        return [Spec.of(name, B=b, K=k, V=v) for b in buckets for k in ks for v in variants]

    def ref(spec, x, *w):
        return reference.linear(x, NVFP4Weight(w[0], w[1], w[2].reshape(())) if nvfp4 else w[0])

    return KernelDef(name=name, args=args, specs=specs, build=None, reference=ref,
                     launch=lambda s: Launch(grid=(("N", 4), 1, 1), block=(128, 1, 1)))


class FakeKernel:
    """Writes its reference's outputs (times `scale`: 2 makes a wrong kernel)."""

    def __init__(self, kdef, spec, scale=1.0):
        self.kdef, self.spec, self.waits, self.scale, self.pdl = kdef, spec, True, scale, []

    def launch(self, *args, pdl=None):
        self.pdl.append(pdl)
        decls = list(self.kdef.args(self.spec))
        ins = [v for a, v in zip(decls, args) if getattr(a, "role", "") != "output"]
        refs = self.kdef.reference(self.spec, *ins)
        outs = [v for a, v in zip(decls, args) if getattr(a, "role", "") == "output"]
        for o, r in zip(outs, refs if isinstance(refs, tuple) else (refs,)):
            o.copy_(r * self.scale)


class FakeKernelSet:
    def __init__(self, defs, wrong=(), missing=()):
        self.defs, self.wrong, self.missing, self.loaded = defs, wrong, missing, {}
        self.arch, self.cache = "sm_90a", SimpleNamespace(root="fake-cache", manifest={})

    def get(self, name, **values):
        spec = self.defs[name].spec(**values)
        if spec.id in self.missing:
            raise RuntimeError(f"{spec.id}: missing from the cache")
        if spec not in self.loaded:
            self.loaded[spec] = FakeKernel(self.defs[name], spec,
                                           2.0 if spec.id in self.wrong else 1.0)
        return self.loaded[spec]


def defs_and_specs(cfg, buckets):
    defs = {"rmsnorm": RMSNORM, "gemv_bf16": fake_gemv("gemv_bf16", False),
            "gemv_nvfp4": fake_gemv("gemv_nvfp4", True)}
    return defs, {n: d.specs(cfg, buckets) for n, d in defs.items()}


def test_byte_counts_match_the_formula_and_the_declarations(bench):
    cfg = FlintConfig.preset("full")
    defs, _ = defs_and_specs(cfg, (1,))
    for fmt in ("bf16", "nvfp4"):
        kdef = defs[f"gemv_{fmt}"]
        for n, k in cfg.dense_linear_shapes().values():
            for b in (1, 8):
                spec = kdef.spec(B=b, K=k, V=0)
                assert bench.arg_bytes(kdef, spec, {"N": n}) == bench.gemv_bytes(fmt, n, k, b)
    assert bench.gemv_bytes("bf16", 151552, 2048, 1) == 2 * 151552 * 2048 + 2 * 2048 + 2 * 151552
    assert bench.gemv_bytes("nvfp4", 4096, 2048, 1) == 4096 * 1024 + 4096 * 128 + 4 \
        + 2 * 2048 + 2 * 4096
    assert bench.arg_bytes(RMSNORM, RMSNORM.spec(B=2, H=2048), {}) == 8 * 2 * 2048 + 2 * 2048
    assert bench.arg_bytes(defs["gemv_bf16"], defs["gemv_bf16"].spec(B=1, K=64, V=0),
                           {"N": 32}, roles=("weight",)) == 2 * 32 * 64


def test_rotation_exceeds_three_l2s_and_is_capped(bench):
    l2 = 50 * 10**6
    for wbytes in (1_000, 2 * 512 * 2048, 2 * 4096 * 2048, 621_000_000):
        n = bench.sets_for(wbytes, l2)
        assert n == bench.MAX_SETS or n * wbytes >= 3 * l2
        assert 1 <= n <= bench.MAX_SETS and (n == 1 or (n - 1) * wbytes < 3 * l2)
        r = bench.launches_for(n)
        assert r % n == 0 and r >= bench.MIN_LAUNCHES
    assert bench.sets_for(621_000_000, l2) == 1


def test_plan_has_every_shape_bucket_and_variant(bench):
    cfg = FlintConfig.preset("full")
    defs, specs = defs_and_specs(cfg, (1, 2, 4, 8))
    rows = bench.plan(cfg, defs, specs, (1, 2, 4, 8), tuple(cfg.dense_linear_shapes()))
    kinds = {(r["impl"], r["shape"], r["B"], r["variant"]) for r in rows}
    assert len(kinds) == len(rows)
    for impl in bench.GEMVS:
        for shape in cfg.dense_linear_shapes():
            for b in (1, 2, 4, 8):
                assert {(impl, shape, b, "V=0"), (impl, shape, b, "V=1")} <= kinds
                assert ("torch_bf16", shape, b, "-") in kinds
    assert [r["shape"] for r in rows][:8] == ["rmsnorm"] * 8
    assert all(r["status"] == "PLANNED" for r in rows)
    nodefs = bench.plan(cfg, {}, {}, (1,), ("lm_head",))
    assert [r["status"] for r in nodefs if r["impl"] in bench.GEMVS] == ["MISSING"] * 2
    assert all(r["bytes"] for r in nodefs if r["impl"] != "rmsnorm")


def fake_results(bench, buckets=(1, 8), shapes=None):
    """Rows and chains with made-up times: lm_head bf16 at 90% of copy BW (PASS), NVFP4 at
    50% (MISS); nvfp4 3x faster than torch at B=1 (PASS), 1.5x at B=8 (MISS)."""
    cfg, bw = FlintConfig.preset("full"), 4.25e12
    defs, specs = defs_and_specs(cfg, buckets)
    rows = bench.plan(cfg, defs, specs, buckets, shapes or bench.TARGET_SHAPES)
    bench.predictions(rows, bw)
    for r in rows:
        if r["status"] != "PLANNED":
            continue
        frac = {"gemv_bf16": 0.9, "gemv_nvfp4": 0.5}.get(r["impl"], 0.3)
        us = r["floor_us"] / frac + (0.1 if r["variant"] == "V=1" else 0)
        if r["impl"] == "torch_bf16":
            nv = next(x for x in rows if (x["impl"], x["shape"], x["B"], x["variant"])
                      == ("gemv_nvfp4", r["shape"], r["B"], "V=0"))
            us = nv["floor_us"] / 0.5 * (3.0 if r["B"] == 1 else 1.5)
        bench.finish(r, us, bw)
    chains = [{"kind": "layer", "name": f"q,k,v,o {i}", "impl": i, "B": b, "pdl": p,
               "status": "OK", "error": "", "launches": 196, "us": 10.0, "floor_us": 8.0,
               "ratio": 1.25 if b == 1 else 2.5, "us_per_launch": 2.5 - 0.2 * p}
              for i in bench.GEMVS for b in (1, 8) for p in (True, False)]
    chains.append({"kind": "norm", "name": "rmsnorm x6/layer", "impl": "rmsnorm", "B": 1,
                   "pdl": True, "status": "ERROR", "error": "RuntimeError: boom"})
    return rows, chains


def test_targets_tables_and_files_with_fake_timings(bench, tmp_path):
    rows, chains = fake_results(bench)
    tg = {t["target"]: t["result"] for t in bench.targets(rows, chains)}
    assert tg["gemv_bf16 lm_head B=1 fraction of copy BW"] == "PASS"
    assert tg["gemv_nvfp4 lm_head B=1 fraction of copy BW"] == "MISS"
    assert tg["gemv_bf16 q,k,v,o layer B=1 PDL on time / floor"] == "PASS"
    assert tg["gemv_nvfp4 q,k,v,o layer B=8 PDL off time / floor"] == "MISS"
    for shape in bench.TARGET_SHAPES:
        assert tg[f"gemv_nvfp4 {shape} B=1 speed-up over torch bf16"] == "PASS"
        assert tg[f"gemv_nvfp4 {shape} B=8 speed-up over torch bf16"] == "MISS"
    assert bench.best(rows, "gemv_bf16", "q_proj", 1)["variant"] == "V=0"
    meta = {"gpu": "FakeGPU", "torch": "x", "cuda_bindings": "y", "preset": "full",
            "quick": True, "copy_bw": 4.25e12, "date": "today"}
    lines = bench.write_outputs(tmp_path, meta, rows, chains, bench.targets(rows, chains))
    text = "\n".join(lines)
    assert "| lm_head | 151552×2048 | 1 | 146.13 | 162.37 (90%) | V=0 | 41.15 | 82.30 (50%)" \
        in text
    assert "PDL saves 0.200 µs per kernel boundary" in text and "RuntimeError: boom" in text
    rows, chains = fake_results(bench, (1, 2, 4, 8), tuple(FlintConfig.preset("full")
                                                           .dense_linear_shapes()))
    full = bench.summary_lines(meta, rows, chains, bench.targets(rows, chains))
    assert len("\n".join(full)) < 11_000  # the device call returns the last ~12,000 characters
    rows, chains = fake_results(bench)
    body = json.loads((tmp_path / "bench_kernels.json").read_text())
    assert body["meta"]["gpu"] == "FakeGPU" and len(body["rows"]) == len(rows)
    assert not any(k.startswith("_") for r in body["rows"] for k in r)
    assert (tmp_path / "bench_kernels.md").read_text().strip() == text.strip()
    assert len((tmp_path / "bench_kernels_rows.md").read_text().splitlines()) == len(rows) + 2


def run_fake(bench, monkeypatch, tmp_path, argv, wrong=(), missing=(), load=None):
    """main() on the CPU: fake kernels, stub timer (5 µs per launch), 4.25 TB/s copy."""
    def fake_load(cfg, buckets, cache):
        defs, specs = defs_and_specs(cfg, buckets)
        pick = {n: (lambda b, k, n, name=n: defs[name].spec(B=b, K=k, V=1)) for n in bench.GEMVS}
        return FakeKernelSet(defs, wrong, missing), defs, specs, pick, None

    def time_graph(body, reset=None):
        body()  # the eager warm-up, then the "replays" after the outputs are poisoned again
        if reset:
            reset()
        return [0.005 * len(body())] * 12

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.setattr(bench.bench_report, "MAX_SETS", 2)
    monkeypatch.setattr(bench.bench_report, "MIN_LAUNCHES", 3)
    for name, fn in {"load_kernels": load or fake_load, "time_graph": time_graph,
                     "copy_bandwidth": lambda: 4.25e12,
                     "gpu_props": lambda: {"gpu": "FakeGPU", "l2_bytes": 50 * 10**6}}.items():
        monkeypatch.setattr(bench, name, fn)
    assert bench.main(["--out", str(tmp_path), *argv]) == 0
    return json.loads((tmp_path / "bench_kernels.json").read_text())


def test_whole_run_on_cpu_with_fake_kernels(bench, monkeypatch, tmp_path, capsys):
    body = run_fake(bench, monkeypatch, tmp_path, ["--preset", "tiny", "--quick"],
                    wrong={"gemv_nvfp4/B=8,K=64,V=1"}, missing={"gemv_bf16/B=1,K=64,V=1"})
    rows = body["rows"]
    status = {(r["impl"], r["shape"], r["B"], r["variant"]): r["status"] for r in rows}
    assert status[("gemv_nvfp4", "q_proj", 8, "V=1")] == "BAD"
    assert status[("gemv_bf16", "q_proj", 1, "V=1")] == "MISSING"
    assert status[("gemv_bf16", "q_proj", 1, "V=0")] == "OK"
    assert status[("torch_bf16", "lm_head", 8, "-")] == "OK"
    assert status[("rmsnorm", "rmsnorm", 1, "-")] == "OK"
    assert all(r["model_variant"] == (r["variant"] == "V=1") for r in rows
               if r["impl"] in bench.GEMVS)
    ok = [r for r in rows if r["status"] == "OK"]
    assert all(r["us"] == pytest.approx(5.0) and r["rel_err"] is not None or
               r["impl"].startswith("torch") for r in ok)
    assert all(r["sets"] == 2 and r["launches"] == 4 for r in ok)
    chains = {(c["name"], c["B"], c["pdl"]): c for c in body["chains"]}
    assert len(chains) == 18 and all(c["status"] == "OK" for c in chains.values()), chains
    layers = FlintConfig.preset("tiny").num_hidden_layers
    c = chains[("q,k,v,o gemv_bf16", 1, True)]
    assert c["launches"] == 4 * layers and c["us"] == pytest.approx(20.0)
    assert chains[("qkv,o gemv_nvfp4", 8, False)]["launches"] == 2 * layers
    assert chains[("rmsnorm x6/layer", 1, False)]["launches"] == 6 * layers
    out = capsys.readouterr().out
    assert out.index("predict gemv_bf16") < out.index("[1/")  # floors before any timing
    assert out.rstrip().endswith(open(tmp_path / "bench_kernels.md").read().rstrip())


def test_missing_kernel_set_still_writes_a_report(bench, monkeypatch, tmp_path):
    body = run_fake(bench, monkeypatch, tmp_path, ["--preset", "tiny", "--quick"],
                    load=lambda *a: (None, {}, {}, {}, "no kernel set (x)"))
    assert {r["status"] for r in body["rows"] if not r["impl"].startswith("torch")} \
        == {"MISSING"}


def test_help_runs_without_a_gpu():
    out = subprocess.run([sys.executable, str(TOOLS / "bench_kernels.py"), "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "--quick" in out.stdout


def test_real_kernel_declarations_plan_and_count_bytes(bench):
    """load_kernels on the CPU (no GPU: no kernel set, but every importable declaration, its
    bench_specs variants and spec_for), then the full plan's byte counts by formula."""
    cfg = FlintConfig.preset("full")
    kset, defs, specs, picks, err = bench.load_kernels(cfg, (1, 8), None)
    assert "rmsnorm" in defs and (kset is None) == (err is not None)
    rows = bench.plan(cfg, defs, specs, (1, 8), tuple(cfg.dense_linear_shapes()), picks)
    for impl in set(defs) & set(bench.GEMVS):
        mod = kernel_module(impl)
        if hasattr(mod, "bench_specs"):
            assert set(mod.bench_specs(cfg, (1, 8))) <= set(specs[impl])
        mine = [r for r in rows if r["impl"] == impl]
        assert mine and all(r["status"] == "PLANNED" for r in mine)
        assert all(r["bytes"] == bench.gemv_bytes(impl[5:], r["N"], r["K"], r["B"]) for r in mine)
        if picks.get(impl):
            assert sum(r["model_variant"] for r in mine) == 2 * len(cfg.dense_linear_shapes())
