"""BF16 safetensors checkpoints (flint_graph/checkpoints/hf_checkpoint.py, DESIGN §2): the write -> load
round trip is bit exact, the index and shards follow the HF layout, and every kind of bad input
is refused with a message naming the path or tensor, the expected and the found value.

All comparisons are exact (torch.equal): storing and reading BF16/F32 moves bits, it computes
nothing, so there is no tolerance to justify.
"""

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import CheckpointError
from flint_graph.checkpoints.hf_checkpoint import (INDEX_NAME, SINGLE_NAME, expected_tensors,
                                       load_safetensors, write_safetensors)
from flint_graph.checkpoints.synthetic import make_weights
from flint_graph.checkpoints.weights import MoEWeights

SEED = 1234
# small enough that the tiny model (~1.6 MB) spans several shards, so the index matters
SHARD_BYTES = 300_000


def named_tensors(w):
    """(name, tensor) for every tensor of FlintWeights, in a fixed order."""
    out = [("embed", w.embed), ("final_norm", w.final_norm), ("lm_head", w.lm_head)]
    for i, lw in enumerate(w.layers):
        for f in dataclasses.fields(lw):
            v = getattr(lw, f.name)
            if f.name != "ffn":
                out.append((f"{i}.{f.name}", v))
                continue
            for g in dataclasses.fields(v):
                sub = getattr(v, g.name)
                if g.name == "shared":
                    out += [(f"{i}.shared.{x}", getattr(sub, x)) for x in ("gate", "up", "down")]
                else:
                    out.append((f"{i}.ffn.{g.name}", sub))
    return out


@pytest.fixture(scope="module")
def cfg():
    return FlintConfig.preset("tiny")


@pytest.fixture(scope="module")
def weights(cfg):
    return make_weights(cfg, SEED)


@pytest.fixture(scope="module")
def written(cfg, weights, tmp_path_factory):
    d = tmp_path_factory.mktemp("bf16")
    paths = write_safetensors(d, cfg, weights, max_shard_bytes=SHARD_BYTES, progress=False)
    return d, paths


@pytest.fixture
def copy(written, tmp_path):
    """A private copy of the written checkpoint, free to corrupt."""
    d = tmp_path / "ckpt"
    shutil.copytree(written[0], d)
    return d


def rewrite_shard(d, tensor_name, edit):
    """Apply `edit(dict of tensors)` to the shard holding `tensor_name`; returns its path."""
    index = json.loads((d / INDEX_NAME).read_text())
    path = d / index["weight_map"][tensor_name]
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})
    return path


def test_round_trip_is_bit_exact(cfg, weights, written):
    loaded = load_safetensors(written[0], cfg, "cpu", progress=False)
    want, got = named_tensors(weights), named_tensors(loaded)
    assert [n for n, _ in want] == [n for n, _ in got]
    for (name, a), (_, b) in zip(want, got):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a, b), name
    moe = loaded.layers[cfg.first_k_dense_replace].ffn
    assert isinstance(moe, MoEWeights)
    e, m, h = cfg.n_routed_experts, cfg.moe_intermediate_size, cfg.hidden_size
    assert moe.gate.shape == (e, m, h) and moe.down.shape == (e, h, m)
    assert moe.router.dtype == torch.float32 and moe.router_bias.dtype == torch.float32


def test_index_and_shards_follow_hf_layout(cfg, weights, written):
    d, paths = written
    n = len(paths)
    assert n >= 3
    assert [p.name for p in paths] == [f"model-{k:05d}-of-{n:05d}.safetensors"
                                       for k in range(1, n + 1)]
    index = json.loads((d / INDEX_NAME).read_text())
    specs = expected_tensors(cfg)
    assert set(index["weight_map"]) == set(specs)
    total = 0
    for p in paths:
        with safe_open(str(p), framework="pt") as f:
            names = set(f.keys())
            assert names == {k for k, v in index["weight_map"].items() if v == p.name}
            for name in names:
                t = f.get_tensor(name)
                assert tuple(t.shape) == specs[name].shape
                assert t.dtype == {"BF16": torch.bfloat16, "F32": torch.float32}[
                    specs[name].dtype], name
                total += t.numel() * t.element_size()
    assert index["metadata"]["total_size"] == total
    # one tensor per routed expert, as HF stores them: expert 5 of layer 3 is the stack's slice
    name = "model.layers.3.mlp.experts.5.down_proj.weight"
    with safe_open(str(d / index["weight_map"][name]), framework="pt") as f:
        assert torch.equal(f.get_tensor(name), weights.layers[3].ffn.down[5])
    with safe_open(str(d / index["weight_map"]["model.layers.0.self_attn.sinks"]),
                   framework="pt") as f:
        assert f.get_slice("model.layers.0.self_attn.sinks").get_dtype() == "F32"


def test_single_file_without_index_loads(cfg, weights, tmp_path):
    write_safetensors(tmp_path, cfg, weights, progress=False)
    (tmp_path / "model-00001-of-00001.safetensors").rename(tmp_path / SINGLE_NAME)
    (tmp_path / INDEX_NAME).unlink()
    loaded = load_safetensors(tmp_path, cfg, progress=False)
    assert torch.equal(loaded.layers[4].ffn.up, weights.layers[4].ffn.up)
    assert torch.equal(loaded.lm_head, weights.lm_head)


def test_missing_shard_names_path(cfg, copy):
    victim = sorted(copy.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=str(victim)):
        load_safetensors(copy, cfg, progress=False)


def test_no_index_no_single_file(cfg, tmp_path):
    with pytest.raises(CheckpointError, match=INDEX_NAME):
        load_safetensors(tmp_path, cfg, progress=False)


def test_wrong_shape_in_file_names_tensor_expected_found(cfg, copy):
    name = "model.layers.1.self_attn.k_proj.weight"
    rewrite_shard(copy, name, lambda t: t.__setitem__(name, torch.randn(32, 64).bfloat16()))
    with pytest.raises(CheckpointError) as e:
        load_safetensors(copy, cfg, progress=False)
    msg = str(e.value)
    assert name in msg and "[32, 64]" in msg and "[64, 64]" in msg
    assert "num_key_value_heads * head_dim = 64" in msg and "hidden_size = 64" in msg


def test_config_inconsistent_with_tensors_names_field(cfg, written):
    other = dataclasses.replace(cfg, intermediate_size=256)
    with pytest.raises(CheckpointError) as e:
        load_safetensors(written[0], other, progress=False)
    msg = str(e.value)
    assert "model.layers.0.mlp.gate_proj.weight" in msg
    assert "[192, 64]" in msg and "[256, 64]" in msg and "intermediate_size = 256" in msg


def test_missing_tensor_named(cfg, copy):
    name = "model.layers.4.mlp.experts.6.up_proj.weight"
    rewrite_shard(copy, name, lambda t: t.pop(name))
    index = json.loads((copy / INDEX_NAME).read_text())
    with pytest.raises(CheckpointError, match=f"does not hold tensor {name}"):
        load_safetensors(copy, cfg, progress=False)
    del index["weight_map"][name]
    (copy / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"1 expected tensor.*missing: {name}"):
        load_safetensors(copy, cfg, progress=False)


def test_unexpected_tensor_named(cfg, copy):
    name = "model.layers.9.self_attn.q_proj.weight"
    path = rewrite_shard(copy, "model.norm.weight",
                         lambda t: t.__setitem__(name, torch.randn(4, 4).bfloat16()))
    index = json.loads((copy / INDEX_NAME).read_text())
    index["weight_map"][name] = path.name
    (copy / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"unexpected tensor.*{name}"):
        load_safetensors(copy, cfg, progress=False)


def test_wrong_dtype_refused_f32_parameter_widened(cfg, weights, copy):
    router = "model.layers.2.mlp.gate.weight"
    rewrite_shard(copy, router, lambda t: t.__setitem__(router, t[router].bfloat16()))
    loaded = load_safetensors(copy, cfg, progress=False)  # BF16 -> F32 is exact: accepted
    assert loaded.layers[2].ffn.router.dtype == torch.float32
    assert torch.equal(loaded.layers[2].ffn.router, weights.layers[2].ffn.router.bfloat16().float())
    name = "model.layers.0.self_attn.q_proj.weight"
    rewrite_shard(copy, name, lambda t: t.__setitem__(name, t[name].float()))
    with pytest.raises(CheckpointError, match=f"{name} has dtype F32; expected BF16"):
        load_safetensors(copy, cfg, progress=False)


def test_truncated_shard_and_bad_index(cfg, copy):
    shard = sorted(copy.glob("model-*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match=f"{shard}: truncated"):
        load_safetensors(copy, cfg, progress=False)
    (copy / INDEX_NAME).write_text("{not json")
    with pytest.raises(CheckpointError, match=f"{copy / INDEX_NAME}: malformed index"):
        load_safetensors(copy, cfg, progress=False)
    (copy / INDEX_NAME).write_text('{"weight_map": 5}')  # a new-user trial: AttributeError
    with pytest.raises(CheckpointError, match="weight_map is int, not an object") as e:
        load_safetensors(copy, cfg, progress=False)
    assert "AttributeError" not in str(e.value)


@pytest.mark.gpu
def test_load_onto_cuda_matches_cpu(cfg, weights, written):
    loaded = load_safetensors(written[0], cfg, "cuda", progress=False)
    assert loaded.layers[3].ffn.gate.device.type == "cuda"
    for (name, a), (_, b) in zip(named_tensors(weights), named_tensors(loaded)):
        assert torch.equal(a, b.cpu()), name


@pytest.mark.parametrize("where", ["/etc/passwd", "../elsewhere/model.safetensors",
                                   "sub/model-00001.safetensors", "..", ""])
def test_an_index_naming_a_shard_outside_its_directory_is_refused(cfg, copy, where):
    """A bad-input trial (2026-12-06): the index's weight_map could send the loader to any
    file on the machine (an absolute path, `../..`); shards are files beside the index."""
    import json

    index = json.loads((copy / INDEX_NAME).read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = where
    (copy / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=f"tensor '{name}' maps to .*expected the file "
                                              "name of a shard in the same directory"):
        load_safetensors(copy, cfg, progress=False)


def test_loaded_weights_do_not_follow_the_files_afterwards(cfg, weights, copy):
    """The CPU load copies every tensor out of the shards' memory maps: a shard overwritten in
    place (same size) or truncated after loading changes no weight and cannot fault a later
    read (a bad-input trial, 2026-12-06: `serve` switched to unchecked weights, or died of
    SIGBUS on the next request after `: > shard`)."""
    loaded = load_safetensors(copy, cfg, progress=False)
    before = [(n, t.clone()) for n, t in named_tensors(loaded)]
    shards = sorted(copy.glob("model-*.safetensors"))
    for path in shards:  # every data byte past the header zeroed, in place
        with open(path, "r+b") as f:
            head = 8 + int.from_bytes(f.read(8), "little")
            f.seek(0, 2)
            size = f.tell()
            f.seek(head)
            f.write(bytes(size - head))
    for (name, want), (_, got) in zip(before, named_tensors(loaded)):
        assert torch.equal(got, want), f"{name} changed with its file"
    for path in shards:
        path.write_bytes(b"")
    assert all(torch.equal(got, want)  # reading every tensor again: no SIGBUS
               for (_, want), (_, got) in zip(before, named_tensors(loaded)))


def test_an_index_with_a_byte_order_mark_loads_and_a_nul_in_a_shard_name_is_named(cfg, copy):
    """A bad-input trial (2026-12-07): a BOM in the index was refused in Python's words
    ("Unexpected UTF-8 BOM (decode using utf-8-sig)"), as no other JSON file of the checkpoint
    is, and a NUL in a shard name was "internal error: ValueError: embedded null byte"."""
    import json

    index = copy / INDEX_NAME
    text = index.read_text(encoding="utf-8")
    index.write_text("\ufeff" + text, encoding="utf-8")
    load_safetensors(copy, cfg, progress=False)
    data = json.loads(text)
    name, shard = next(iter(data["weight_map"].items()))
    data["weight_map"][name] = shard + "\u0000x"
    index.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=f'{index}: tensor "{name}" maps to .*NUL'):
        load_safetensors(copy, cfg, progress=False)
