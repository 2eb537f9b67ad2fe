"""NVFP4 GGUF write -> load (DESIGN §2): bit-exact round trips, naming and 3-D orientation checked
against gguf's own reader and NVFP4 dequantiser, and every kind of bad file refused by name.

Weights are random bytes and values (every scale byte, odd ones included), so any permutation,
orientation or dtype slip shows up; all comparisons are exact (torch.equal), no tolerances.
"""

import dataclasses
import re

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize as gguf_dequantize

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import CheckpointError, ConfigError
from flint_graph.checkpoints.gguf_checkpoint import load_gguf, read_gguf_metadata, write_gguf
from flint_graph.checkpoints.weights import FlintWeights, LayerWeights, MLPWeights, MoEWeights, NVFP4Weight

TINY = FlintConfig.preset("tiny")
# Expert width 128 != hidden 64, so an expert stack read as [E, H, M] instead of [E, M, H] fails.
WIDE = dataclasses.replace(TINY, moe_intermediate_size=128)


def _random_weights(cfg: FlintConfig, seed: int, embed_nvfp4: bool) -> FlintWeights:
    """Random FlintWeights: NVFP4 linears of random bytes with non-power-of-two scale2 (per
    expert for stacks), BF16 norms, FP32 sinks/router/bias; embed/lm_head BF16 or NVFP4."""
    g = torch.Generator().manual_seed(seed)

    def lin(*shape):
        *lead, n, k = shape
        u8 = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, generator=g)  # noqa: E731
        scale2 = torch.rand(tuple(lead[:1]), generator=g) * 3 + 0.01
        return NVFP4Weight(u8(*lead, n, k // 2), u8(*lead, n, k // 16), scale2)

    def bf16(*shape):
        return torch.randn(shape, generator=g).to(torch.bfloat16)

    def f32(*shape):
        return torch.randn(shape, generator=g)

    h, q, kv, d = cfg.hidden_size, cfg.q_dim, cfg.kv_dim, cfg.head_dim
    e, m, i_dense = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.intermediate_size
    f = cfg.n_shared_experts * m
    layers = []
    for i in range(cfg.num_hidden_layers):
        if cfg.is_moe(i):
            ffn = MoEWeights(f32(e, h), f32(e), lin(e, m, h), lin(e, m, h), lin(e, h, m),
                             MLPWeights(lin(f, h), lin(f, h), lin(h, f)))
        else:
            ffn = MLPWeights(lin(i_dense, h), lin(i_dense, h), lin(h, i_dense))
        layers.append(LayerWeights(bf16(h), lin(q, h), lin(kv, h), lin(kv, h), lin(h, q),
                                   bf16(d), bf16(d), f32(cfg.num_attention_heads), bf16(h), ffn))
    v = cfg.vocab_size
    embed, head = (lin(v, h), lin(v, h)) if embed_nvfp4 else (bf16(v, h), bf16(v, h))
    return FlintWeights(embed, layers, bf16(h), head)


def _named(w: FlintWeights) -> dict:
    """Test-side map of llama.cpp names to weights, written independently of the module."""
    out = {"token_embd": w.embed, "output": w.lm_head, "output_norm": w.final_norm}
    for i, lw in enumerate(w.layers):
        p = f"blk.{i}."
        out.update({p + "attn_norm": lw.attn_norm, p + "attn_q": lw.q_proj, p + "attn_k": lw.k_proj,
                    p + "attn_v": lw.v_proj, p + "attn_output": lw.o_proj,
                    p + "attn_q_norm": lw.q_norm, p + "attn_k_norm": lw.k_norm,
                    p + "attn_sinks": lw.sinks, p + "ffn_norm": lw.ffn_norm})
        if isinstance(lw.ffn, MoEWeights):
            out.update({p + "ffn_gate_inp": lw.ffn.router, p + "exp_probs_b": lw.ffn.router_bias,
                        p + "ffn_gate_exps": lw.ffn.gate, p + "ffn_up_exps": lw.ffn.up,
                        p + "ffn_down_exps": lw.ffn.down, p + "ffn_gate_shexp": lw.ffn.shared.gate,
                        p + "ffn_up_shexp": lw.ffn.shared.up,
                        p + "ffn_down_shexp": lw.ffn.shared.down})
        else:
            out.update({p + "ffn_gate": lw.ffn.gate, p + "ffn_up": lw.ffn.up,
                        p + "ffn_down": lw.ffn.down})
    return out


def _assert_same(a: FlintWeights, b: FlintWeights) -> None:
    na, nb = _named(a), _named(b)
    assert na.keys() == nb.keys()
    for name, x in na.items():
        y = nb[name]
        if isinstance(x, NVFP4Weight):
            assert isinstance(y, NVFP4Weight), name
            for part in ("codes", "scales", "scale2"):
                u, v = getattr(x, part), getattr(y, part)
                assert u.dtype == v.dtype and torch.equal(u, v), (name, part)
        else:
            assert x.dtype == y.dtype and torch.equal(x, y), name


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    weights = _random_weights(TINY, seed=0, embed_nvfp4=False)
    write_gguf(path, TINY, weights, progress=False)
    return path, weights


@pytest.mark.parametrize("embed_nvfp4", [False, True])
def test_round_trip_is_bit_exact(tmp_path, embed_nvfp4):
    weights = _random_weights(TINY, seed=1, embed_nvfp4=embed_nvfp4)
    write_gguf(tmp_path / "m.gguf", TINY, weights, progress=False)
    _assert_same(weights, load_gguf(tmp_path / "m.gguf", TINY, "cpu", progress=False))


def test_file_matches_gguf_oracle_names_and_orientation(tmp_path):
    weights = _random_weights(WIDE, seed=2, embed_nvfp4=True)
    write_gguf(tmp_path / "m.gguf", WIDE, weights, progress=False)
    reader = GGUFReader(tmp_path / "m.gguf")
    tensors = {t.name: t for t in reader.tensors}
    e, m, h = WIDE.n_routed_experts, WIDE.moe_intermediate_size, WIDE.hidden_size
    # GGUF dims are innermost-first: ffn_gate_exps [E, M, H] is listed as [H, M, E].
    assert tensors["blk.2.ffn_gate_exps.weight"].shape.tolist() == [h, m, e]
    assert tensors["blk.2.ffn_down_exps.weight"].shape.tolist() == [m, h, e]
    assert tensors["blk.2.exp_probs_b.bias"].tensor_type == GGMLQuantizationType.F32
    for name, w in _named(weights).items():
        suffix = ".bias" if name.endswith("exp_probs_b") else ".weight"
        t = tensors[name + suffix]
        if isinstance(w, NVFP4Weight):
            assert t.tensor_type == GGMLQuantizationType.NVFP4, name
            scale2 = tensors[name + ".scale"].data.astype(np.float32)
            scale2 = scale2.reshape(-1, 1, 1) if scale2.size > 1 else scale2.reshape(())
            ref = gguf_dequantize(np.array(t.data), GGMLQuantizationType.NVFP4) * scale2
            assert torch.equal(w.dequantize(torch.float32), torch.from_numpy(ref)), name
        else:  # norms and sinks written as F32 (exact for BF16 values)
            assert t.tensor_type == GGMLQuantizationType.F32, name
            assert torch.equal(torch.from_numpy(np.array(t.data)), w.float()), name
    _assert_same(weights, load_gguf(tmp_path / "m.gguf", WIDE, "cpu", progress=False))


def test_metadata_mirrors_config(tiny_file):
    meta = read_gguf_metadata(tiny_file[0])
    assert meta["general.architecture"] == "flint"
    for key, want in TINY.gguf_metadata().items():
        got = meta[key]
        assert got == pytest.approx(want, rel=1e-7) if isinstance(want, float) else got == want


def test_missing_scale_sidecars_load_as_one(tmp_path):
    weights = _random_weights(TINY, seed=3, embed_nvfp4=True)
    write_gguf(tmp_path / "m.gguf", TINY, weights, progress=False, write_scales=False)
    assert not any(t.name.endswith(".scale") for t in GGUFReader(tmp_path / "m.gguf").tensors)
    loaded = load_gguf(tmp_path / "m.gguf", TINY, "cpu", progress=False)
    for name, w in _named(weights).items():
        if isinstance(w, NVFP4Weight):
            got = _named(loaded)[name]
            assert got.scale2.dtype == torch.float32 and got.scale2.tolist() == 1.0, name
            assert torch.equal(got.codes, w.codes) and torch.equal(got.scales, w.scales), name


def _rewrite(src, dst, arch="flint", meta=None, drop=(), replace=None, add=None):
    """Copy a GGUF through gguf's own writer, changing metadata or tensors on the way."""
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        value = (meta or {}).get(key, field.contents())
        writer.add_key_value(key, value, field.types[0], sub)
    for t in reader.tensors:
        if t.name not in drop:
            arr, raw = (replace or {}).get(t.name, (np.array(t.data), t.tensor_type))
            writer.add_tensor(t.name, arr, raw_dtype=raw)
    for name, (arr, raw) in (add or {}).items():
        writer.add_tensor(name, arr, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _load(path):
    return load_gguf(path, TINY, "cpu", progress=False)


def test_missing_file_names_path(tmp_path):
    path = tmp_path / "nowhere" / "model.gguf"
    with pytest.raises(CheckpointError, match=str(path)):
        _load(path)
    with pytest.raises(CheckpointError, match=str(path)):
        read_gguf_metadata(path)


@pytest.mark.parametrize("keep_bytes", [-1000, 200, 0])  # cut data, cut header, empty file
def test_truncated_file_is_refused(tiny_file, tmp_path, keep_bytes):
    data = tiny_file[0].read_bytes()
    path = tmp_path / "cut.gguf"
    path.write_bytes(data[:keep_bytes] if keep_bytes else b"")
    with pytest.raises(CheckpointError, match=f"{path}.*truncated or corrupt"):
        _load(path)


def test_bad_magic_and_corrupt_header_are_refused(tiny_file, tmp_path):
    data = bytearray(tiny_file[0].read_bytes())
    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGML" + data[4:])
    with pytest.raises(CheckpointError, match=f"{bad}.*magic"):
        _load(bad)
    data[24:32] = b"\xff" * 8  # length of the first metadata key: 2^64 - 1
    bad = tmp_path / "header.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=str(bad)):
        _load(bad)


def test_wrong_tensor_type_names_tensor(tiny_file, tmp_path):
    rng = np.random.default_rng(4)
    f16 = rng.standard_normal((TINY.q_dim, TINY.hidden_size)).astype(np.float16)
    path = _rewrite(tiny_file[0], tmp_path / "f16.gguf",
                    replace={"blk.0.attn_q.weight": (f16, GGMLQuantizationType.F16)})
    with pytest.raises(CheckpointError, match=r"'blk\.0\.attn_q\.weight' has type F16; "
                                              r"expected NVFP4 or BF16"):
        _load(path)
    router = np.zeros((TINY.n_routed_experts, TINY.hidden_size), dtype=np.float16) + 1
    path = _rewrite(tiny_file[0], tmp_path / "router.gguf",
                    replace={"blk.3.ffn_gate_inp.weight": (router, GGMLQuantizationType.F16)})
    with pytest.raises(CheckpointError, match=r"'blk\.3\.ffn_gate_inp\.weight' has type F16; "
                                              r"expected F32"):
        _load(path)


def test_wrong_shape_names_tensor_expected_and_found(tiny_file, tmp_path):
    name = "blk.4.ffn_up_exps.weight"
    blocks = np.array(GGUFReader(tiny_file[0]).get_tensor(
        [t.name for t in GGUFReader(tiny_file[0]).tensors].index(name)).data)
    path = _rewrite(tiny_file[0], tmp_path / "shape.gguf",
                    replace={name: (blocks[:-1], GGMLQuantizationType.NVFP4)})
    with pytest.raises(CheckpointError, match=r"'blk\.4\.ffn_up_exps\.weight' has shape "
                                              r"\[7, 64, 64\]; expected \[8, 64, 64\]"):
        _load(path)


def test_missing_and_unexpected_tensors_are_named(tiny_file, tmp_path):
    path = _rewrite(tiny_file[0], tmp_path / "drop.gguf", drop={"blk.5.attn_k_norm.weight"})
    with pytest.raises(CheckpointError, match=r"missing tensors.*blk\.5\.attn_k_norm\.weight"):
        _load(path)
    extra = np.ones(4, dtype=np.float32)
    path = _rewrite(tiny_file[0], tmp_path / "extra.gguf",
                    add={"blk.0.attn_bias.weight": (extra, GGMLQuantizationType.F32)})
    with pytest.raises(CheckpointError, match=r"unexpected tensors.*blk\.0\.attn_bias\.weight"):
        _load(path)


def test_metadata_disagreeing_with_config_names_key(tiny_file, tmp_path):
    path = _rewrite(tiny_file[0], tmp_path / "meta.gguf", meta={"flint.block_count": 5})
    with pytest.raises(ConfigError, match=r"flint\.block_count = 5 disagrees.*\(6\)"):
        _load(path)


def test_unknown_architecture_is_refused(tiny_file, tmp_path):
    path = _rewrite(tiny_file[0], tmp_path / "llama.gguf", arch="llama")
    with pytest.raises(CheckpointError, match="unknown architecture 'llama'"):
        _load(path)


def test_writer_refuses_weights_that_do_not_fit_config(tmp_path):
    weights = _random_weights(TINY, seed=5, embed_nvfp4=False)
    weights.layers[1].k_proj = weights.layers[1].q_proj
    with pytest.raises(CheckpointError, match=r"'blk\.1\.attn_k\.weight': shape \[128, 64\]; "
                                              r"expected \[64, 64\]"):
        write_gguf(tmp_path / "w.gguf", TINY, weights, progress=False)
    assert not (tmp_path / "w.gguf").exists()


# -- scale2 sidecars: all or none (issue 6, item 9) -------------------------------------------

LOST_SCALE = "blk.2.ffn_gate_exps.scale"  # 2^-12 per expert in the tiny checkpoint


@pytest.fixture(scope="module")
def tiny_ckpt_gguf(tiny_ckpt):
    """The tiny synthetic checkpoint's GGUF: every NVFP4 tensor has its `.scale` sidecar."""
    return tiny_ckpt / "model-nvfp4.gguf"


def _sidecars(path) -> list[str]:
    return [t.name for t in GGUFReader(path).tensors if t.name.endswith(".scale")]


def test_all_sidecars_present_load_their_values(tiny_ckpt_gguf):
    names = _sidecars(tiny_ckpt_gguf)
    nvfp4 = [t.name for t in GGUFReader(tiny_ckpt_gguf).tensors
             if t.tensor_type == GGMLQuantizationType.NVFP4]
    assert len(names) == len(nvfp4) > 0
    gate = _load(tiny_ckpt_gguf).layers[2].ffn.gate
    assert gate.scale2.tolist() == [2.0**-12] * TINY.n_routed_experts


def test_one_missing_sidecar_is_refused_by_name(tiny_ckpt, tiny_ckpt_gguf, tmp_path):
    # Loaded as 1.0, the lost 2^-12 made layer 2's routed experts ~4,800x the BF16 path's.
    num_nvfp4 = len(_sidecars(tiny_ckpt_gguf))
    path = _rewrite(tiny_ckpt_gguf, tmp_path / "lost.gguf", drop={LOST_SCALE})
    want = (rf"{path}: 1 of {num_nvfp4} NVFP4 tensors lack their scale2 sidecar while the "
            rf"others have one; missing: blk\.2\.ffn_gate_exps\.scale \(")
    with pytest.raises(CheckpointError, match=want):
        _load(path)
    # The public entry point refuses it the same way (validation runs before any tensor loads).
    from flint_graph.checkpoints.checkpoint import load_checkpoint

    with pytest.raises(CheckpointError, match=r"missing: blk\.2\.ffn_gate_exps\.scale \("):
        load_checkpoint(path, hf_config_path=tiny_ckpt, device="cpu", progress=False)


def test_many_missing_sidecars_name_the_first_eight_and_count(tiny_ckpt_gguf, tmp_path):
    names = _sidecars(tiny_ckpt_gguf)
    kept = names[len(names) // 2]
    path = _rewrite(tiny_ckpt_gguf, tmp_path / "half.gguf", drop=set(names) - {kept})
    lost = [n for n in names if n != kept]
    want = (rf"{len(lost)} of {len(names)} NVFP4 tensors lack .*missing: "
            + re.escape(", ".join(lost[:8])) + rf" and {len(lost) - 8} more \(")
    with pytest.raises(CheckpointError, match=want):
        _load(path)


def test_no_sidecars_at_all_load_as_one(tiny_ckpt_gguf, tmp_path):
    path = _rewrite(tiny_ckpt_gguf, tmp_path / "none.gguf", drop=set(_sidecars(tiny_ckpt_gguf)))
    loaded, full = _load(path), _load(tiny_ckpt_gguf)
    for name, w in _named(loaded).items():
        if isinstance(w, NVFP4Weight):
            assert w.scale2.dtype == torch.float32 and w.scale2.tolist() == 1.0, name
            ref = _named(full)[name]
            assert torch.equal(w.codes, ref.codes) and torch.equal(w.scales, ref.scales), name


@pytest.mark.parametrize("name", ["blk.0.attn_bias.scale", "blk.0.attn_norm.scale",
                                  "token_embd.scale"])  # no such tensor, F32 norm, BF16 linear
def test_sidecar_of_no_nvfp4_tensor_is_refused(tiny_ckpt_gguf, tmp_path, name):
    one = np.ones(1, dtype=np.float32)
    path = _rewrite(tiny_ckpt_gguf, tmp_path / "odd.gguf",
                    add={name: (one, GGMLQuantizationType.F32)})
    want = (r"unexpected tensors for this config: " + re.escape(name) + r" \(a \.scale "
            r"sidecar belongs only to an NVFP4 tensor of the same base name\)")
    with pytest.raises(CheckpointError, match=want):
        _load(path)


_F32 = GGMLQuantizationType.F32


@pytest.mark.parametrize("name, arr, raw, want", [
    ("blk.2.attn_q.scale", np.ones(1, np.float16), GGMLQuantizationType.F16,
     r"has type F16 and shape \[1\]; expected F32 of shape \[1\]$"),
    ("blk.2.attn_q.scale", np.ones(2, np.float32), _F32,
     r"has type F32 and shape \[2\]; expected F32 of shape \[1\]$"),
    (LOST_SCALE, np.ones(3, np.float32), _F32,
     r"shape \[3\]; expected F32 of shape \[1\] or \[8\]$"),
    (LOST_SCALE, np.full(8, 2.0**-12, np.float32) * np.array([1, 1, 1, 0, 1, 1, 1, 1]), _F32,
     "not a positive finite number"),
    ("blk.2.attn_q.scale", np.array([-1.0], np.float32), _F32, "not a positive finite number"),
    ("blk.2.attn_q.scale", np.array([np.nan], np.float32), _F32, "not a positive finite number"),
    ("blk.2.attn_q.scale", np.array([np.inf], np.float32), _F32, "not a positive finite number"),
    # finite, but 6 · 448 · 3e38 overflows: every logit would be NaN and the output token 0
    ("blk.2.attn_q.scale", np.array([3e38], np.float32), _F32,
     r"holds a scale2 of 3e\+38; expected at most 1.26e\+35, so that the largest NVFP4 weight"),
])  # fmt: skip
def test_bad_sidecar_is_refused_by_name(tiny_ckpt_gguf, tmp_path, name, arr, raw, want):
    path = _rewrite(tiny_ckpt_gguf, tmp_path / "bad.gguf", replace={name: (arr, raw)})
    with pytest.raises(CheckpointError, match=rf"{path}: tensor {re.escape(repr(name))}.*{want}"):
        _load(path)


@pytest.mark.parametrize("name, arr, want", [
    # a huge but finite scale2 (below MAX_SCALE2): the largest weight 6 · block scale · scale2
    # passes the ±1e6 the BF16 path enforces; it loaded and answered id 0 throughout
    ("blk.0.attn_output.scale", np.array([1e30], np.float32),
     r"blk\.0\.attn_output\.weight \(NVFP4: 6 · block scale · scale2 past the bound\);"),
    ("blk.2.attn_q.scale", np.array([1e4], np.float32), r"blk\.2\.attn_q\.weight \(NVFP4"),
    # one expert of a stack: named with the count of experts
    (LOST_SCALE, np.array([2.0**-12] * 7 + [1e9], np.float32),
     r"blk\.2\.ffn_gate_exps\.weight \(NVFP4: 6 · block scale · scale2 past the bound in 1 "
     r"of 8 experts\);"),
])  # fmt: skip
def test_an_nvfp4_tensor_whose_largest_weight_passes_the_bound_is_refused(
        tiny_ckpt_gguf, tmp_path, name, arr, want):
    """The bound every floating weight is held to (|w| ≤ WEIGHT_ABS_MAX), for NVFP4 tensors:
    E2M1's 6 · the largest E4M3 block scale · scale2, per expert for a stack (a bad-input
    trial, 2026-12-06)."""
    path = _rewrite(tiny_ckpt_gguf, tmp_path / "big.gguf", replace={name: (arr, _F32)})
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: NaN, infinite or "
                                              rf"out-of-range \(\|w\| > 1e\+06\) weights in .*{want}"):
        _load(path)


def test_an_nvfp4_scale2_that_keeps_weights_in_range_loads(tiny_ckpt_gguf, tmp_path):
    """The bound's other side: a scale2 larger than the file's (2.0 instead of ~1e-3) whose
    largest weight stays within ±1e6 still loads."""
    path = _rewrite(tiny_ckpt_gguf, tmp_path / "ok.gguf",
                    replace={"blk.0.attn_output.scale": (np.array([2.0], np.float32), _F32)})
    assert float(_load(path).layers[0].o_proj.scale2) == 2.0


@pytest.mark.gpu
def test_cuda_load_matches_cpu_and_frees_on_failure(tiny_file, monkeypatch):
    from flint_graph.checkpoints import nvfp4

    path, weights = tiny_file
    _assert_same(weights, load_gguf(path, TINY, "cuda", progress=False).to("cpu"))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    real, calls = nvfp4.from_ggml_blocks, []

    def failing(blocks):  # fail part way, after several tensors are on the GPU
        calls.append(1)
        if len(calls) > 20:
            raise RuntimeError("injected failure")
        return real(blocks)

    monkeypatch.setattr(nvfp4, "from_ggml_blocks", failing)
    with pytest.raises(RuntimeError, match="injected"):
        load_gguf(path, TINY, "cuda", progress=False)
    assert torch.cuda.memory_allocated() == before


@pytest.mark.parametrize("field", ["qk_norm", "attention_sinks"])
def test_tensors_the_config_says_do_not_exist_are_refused(tiny_file, field):
    """Issue 26 item 2: a GGUF with q/k norms (or sinks) under a config with qk_norm (or
    attention_sinks) false loaded and ignored them; now, as the BF16 path, the file's extra
    tensors are refused by name; the other way round they are missing."""
    path, _ = tiny_file
    cfg = dataclasses.replace(TINY, **{field: False})
    word = "attn_q_norm" if field == "qk_norm" else "attn_sinks"
    with pytest.raises(CheckpointError, match=f"unexpected tensors.*{word}"):
        load_gguf(path, cfg, "cpu", progress=False)


@pytest.mark.parametrize("field", ["qk_norm", "attention_sinks"])
def test_a_config_without_them_round_trips(tmp_path, field):
    """Written under such a config, the file has no such tensors and loads with the neutral
    ones (identity norms, sinks at -inf); under the full config they are missing by name."""
    cfg = dataclasses.replace(TINY, **{field: False})
    weights = _random_weights(cfg, seed=2, embed_nvfp4=False)
    write_gguf(tmp_path / "m.gguf", cfg, weights, progress=False)
    names = {t.name for t in GGUFReader(tmp_path / "m.gguf").tensors}
    word = "attn_q_norm" if field == "qk_norm" else "attn_sinks"
    assert not any(word in n for n in names)
    got = load_gguf(tmp_path / "m.gguf", cfg, "cpu", progress=False)
    lw = got.layers[0]
    if field == "qk_norm":
        assert torch.equal(lw.q_norm, torch.ones_like(lw.q_norm))
    else:
        assert torch.isneginf(lw.sinks).all()
    with pytest.raises(CheckpointError, match=f"missing tensors.*{word}"):
        load_gguf(tmp_path / "m.gguf", TINY, "cpu", progress=False)
