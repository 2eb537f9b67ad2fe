"""load_checkpoint (flint_graph/checkpoints/checkpoint.py, DESIGN §2): the format comes from file content,
never from a name; bad paths are refused with a message that names them and says what to do.

Weights are compared exactly (torch.equal): loading moves bits and the synthetic checkpoint is
on the NVFP4 grid with power-of-two scale2, so BF16 and NVFP4 dequantise to the same values.
"""

import json
import shutil

import pytest
import torch

from flint_graph.checkpoints.checkpoint import (LoadedCheckpoint, WeightFormat, load_checkpoint,
                                    read_generation_config)
from flint_graph.checkpoints.config import FlintConfig
from flint_graph.errors import CheckpointError
from flint_graph.checkpoints.make_checkpoint import GGUF_NAME, write_checkpoint
from flint_graph.checkpoints.synthetic import make_layer_weights
from flint_graph.checkpoints.weights import NVFP4Weight

SEED = 7


@pytest.fixture(scope="module")
def ckpt_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt") / "tiny"
    write_checkpoint(FlintConfig.preset("tiny"), d, seed=SEED, device="cpu", progress=False)
    return d


def assert_same_model(a: LoadedCheckpoint, b: LoadedCheckpoint) -> None:
    """Every weight of `a` equals `b`'s bit for bit (NVFP4 compared after dequantisation)."""
    la, lb = a.weights.layers, b.weights.layers
    pairs = [(a.weights.embed, b.weights.embed), (a.weights.lm_head, b.weights.lm_head),
             (a.weights.final_norm, b.weights.final_norm)]
    for x, y in zip(la, lb):
        pairs += [(x.q_proj, y.q_proj), (x.o_proj, y.o_proj), (x.sinks, y.sinks),
                  (x.ffn.down, y.ffn.down), (x.ffn.gate, y.ffn.gate)]
    for x, y in pairs:
        x = x.dequantize() if isinstance(x, NVFP4Weight) else x
        y = y.dequantize() if isinstance(y, NVFP4Weight) else y
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_directory_loads_as_bf16(ckpt_dir):
    ck = load_checkpoint(ckpt_dir, progress=False)
    assert ck.format is WeightFormat.BF16
    assert ck.cfg == FlintConfig.preset("tiny")
    assert ck.config_dir == ckpt_dir
    assert ck.generation_config == json.loads((ckpt_dir / "generation_config.json").read_text())
    assert isinstance(ck.weights.layers[0].q_proj, torch.Tensor)


def test_gguf_file_loads_as_nvfp4_with_sibling_config(ckpt_dir):
    ck = load_checkpoint(ckpt_dir / GGUF_NAME, progress=False)
    assert ck.format is WeightFormat.NVFP4 and ck.config_dir == ckpt_dir
    assert isinstance(ck.weights.layers[3].ffn.up, NVFP4Weight)
    assert ck.timings["repack_s"] > 0  # the start-up report's repack phase
    assert_same_model(ck, load_checkpoint(ckpt_dir, progress=False))


def test_router_weights_and_bias_stay_fp32_in_both_loaders(ckpt_dir):
    """The correction bias only picks experts, by fractions of a percent: rounded to bf16 it
    changes which experts win (issue 8). Both loaders hand it over in fp32, bit for bit as
    written, and the synthetic bias really uses fp32's extra bits."""
    cfg = FlintConfig.preset("tiny")
    written = make_layer_weights(cfg, SEED, cfg.first_k_dense_replace).ffn
    assert not torch.equal(written.router_bias, written.router_bias.bfloat16().float())
    for path in (ckpt_dir, ckpt_dir / GGUF_NAME):
        ffn = load_checkpoint(path, progress=False).weights.layers[cfg.first_k_dense_replace].ffn
        for name in ("router", "router_bias"):
            got, want = getattr(ffn, name), getattr(written, name)
            assert got.dtype == torch.float32 and torch.equal(got, want), (path, name)


def test_gguf_detected_by_content_not_name(ckpt_dir, tmp_path):
    disguised = tmp_path / "model.safetensors"
    shutil.copy(ckpt_dir / GGUF_NAME, disguised)
    ck = load_checkpoint(disguised, hf_config_path=ckpt_dir, progress=False)
    assert ck.format is WeightFormat.NVFP4 and ck.config_dir == ckpt_dir
    # a directory holding only a (renamed) GGUF and its config files is an NVFP4 checkpoint
    for name in ("config.json", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        shutil.copy(ckpt_dir / name, tmp_path / name)
    (tmp_path / "weights.bin").write_bytes(disguised.read_bytes())
    disguised.unlink()
    ck2 = load_checkpoint(tmp_path, progress=False)
    assert ck2.format is WeightFormat.NVFP4
    assert_same_model(ck, ck2)


def test_gguf_without_config_dir_explains_hf_config_path(ckpt_dir, tmp_path):
    lone = tmp_path / "flint.gguf"
    shutil.copy(ckpt_dir / GGUF_NAME, lone)
    with pytest.raises(CheckpointError, match="--hf-config-path") as e:
        load_checkpoint(lone, progress=False)
    assert str(lone) in str(e.value)
    with pytest.raises(CheckpointError,
                       match=f"{tmp_path}: hf_config_path \\(--hf-config-path\\) has no config.json"):
        load_checkpoint(lone, hf_config_path=tmp_path, progress=False)
    ck = load_checkpoint(lone, hf_config_path=ckpt_dir / "config.json", progress=False)
    assert ck.config_dir == ckpt_dir and ck.format is WeightFormat.NVFP4


@pytest.mark.parametrize("damage", ["truncated", "header"])
def test_corrupt_gguf_without_config_dir_says_corrupt_first(ckpt_dir, tmp_path, damage):
    # a broken file is the user's first problem: asking for --hf-config-path before saying so
    # sent them to fetch a config for a file that could never load (a bad-input trial)
    data = bytearray((ckpt_dir / GGUF_NAME).read_bytes())
    if damage == "truncated":
        data = data[:200]
    else:
        data[24:32] = b"\xff" * 8  # the first metadata key's length: 2^64 - 1
    lone = tmp_path / "flint.gguf"
    lone.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=str(lone)) as e:
        load_checkpoint(lone, progress=False)
    assert "--hf-config-path" not in str(e.value) and "config.json" not in str(e.value)


def test_random_file_refused(tmp_path):
    junk = tmp_path / "model.gguf"
    junk.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(3),
                                   dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(CheckpointError, match=f"{junk}: not a GGUF file"):
        load_checkpoint(junk, progress=False)


def test_safetensors_file_says_pass_directory(ckpt_dir):
    shard = next(ckpt_dir.glob("model-*.safetensors"))
    with pytest.raises(CheckpointError, match="a safetensors file.*pass the directory"):
        load_checkpoint(shard, progress=False)


def test_missing_path_and_missing_config(ckpt_dir, tmp_path):
    nowhere = tmp_path / "nope"
    with pytest.raises(CheckpointError, match=f"{nowhere}: no such file or directory"):
        load_checkpoint(nowhere, progress=False)
    d = tmp_path / "noconfig"
    shutil.copytree(ckpt_dir, d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match=f"{d}: no config.json"):
        load_checkpoint(d, progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match=f"{empty}: no config.json"):
        load_checkpoint(empty, progress=False)


def test_missing_shard_named(ckpt_dir, tmp_path):
    d = tmp_path / "noshard"
    shutil.copytree(ckpt_dir, d)
    shard = next(d.glob("model-*.safetensors"))
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard}: shard listed"):
        load_checkpoint(d, progress=False)


def test_read_generation_config(ckpt_dir, tmp_path):
    assert read_generation_config(ckpt_dir)["top_k"] == 20
    assert read_generation_config(tmp_path) == {}  # absent: many HF checkpoints ship none
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        read_generation_config(tmp_path)


def test_shards_without_index_are_refused_not_silently_swapped_for_the_gguf(tmp_path):
    from flint_graph.checkpoints.checkpoint import load_checkpoint
    from flint_graph.checkpoints.config import FlintConfig
    from flint_graph.errors import CheckpointError
    from flint_graph.checkpoints.make_checkpoint import write_checkpoint

    out = tmp_path / "ck"
    write_checkpoint(FlintConfig.preset("tiny"), out, progress=False, device="cpu")
    (out / "model.safetensors.index.json").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors.index.json"):
        load_checkpoint(out, progress=False)


def test_nan_or_inf_weights_are_refused_naming_the_tensor(ckpt_dir, tmp_path):
    """A shard whose header is intact but whose floats were damaged (here: one NaN and one inf
    written into two tensors) must not load and decode to NaN logits."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(ckpt_dir, bad)
    shard = next(p for p in bad.glob("*.safetensors"))
    tensors = load_file(str(shard))
    name = next(n for n in tensors if n.endswith("self_attn.o_proj.weight"))
    tensors[name][0, 0] = float("nan")
    other = next(n for n in tensors if n.endswith("input_layernorm.weight"))
    tensors[other][1] = float("inf")
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"{bad}: NaN, infinite or out-of-range .*"
                                              rf"({name}|{other}) \(1 values\)") as e:
        load_checkpoint(bad, progress=False)
    assert f"in {shard.name};" in str(e.value)  # the shard, not only the directory


def test_finite_but_impossibly_large_weights_are_refused(ckpt_dir, tmp_path):
    """A new user's trial (2026-12-06): text written over the middle of a shard decoded to
    finite values up to 3e32, which passed the NaN check; the model answered "!!!!" (logits
    flattened by an overflowing norm) with exit 0. Values past WEIGHT_ABS_MAX are refused; the
    largest a checkpoint may hold still loads."""
    from safetensors.torch import load_file, save_file

    from flint_graph.checkpoints.weights import WEIGHT_ABS_MAX

    for value, refused in ((3e32, True), (-2 * WEIGHT_ABS_MAX, True), (WEIGHT_ABS_MAX / 2, False)):
        bad = tmp_path / f"bad{value:g}"
        shutil.copytree(ckpt_dir, bad)
        shard = next(p for p in bad.glob("*.safetensors"))
        tensors = load_file(str(shard))
        name = next(n for n in tensors if n.endswith("mlp.down_proj.weight"))
        tensors[name][0, :3] = value
        save_file(tensors, str(shard), metadata={"format": "pt"})
        if refused:
            with pytest.raises(CheckpointError, match=rf"out-of-range.*{name} \(3 values\)"):
                load_checkpoint(bad, progress=False)
        else:
            load_checkpoint(bad, progress=False)


def test_a_checkpoint_file_that_cannot_be_read_is_named(tmp_path, monkeypatch):
    """A bad-input trial passed /proc/self/mem (reading it fails with EIO): the CLI printed
    "internal error: OSError: [Errno 5] Input/output error" without naming the file."""
    from pathlib import Path

    from flint_graph.checkpoints.checkpoint import is_gguf

    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    real = Path.open

    def failing(self, *a, **k):
        if self == path:
            raise OSError(5, "Input/output error")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "open", failing)
    with pytest.raises(CheckpointError, match=r"model.gguf: cannot read it \(Input/output"):
        is_gguf(path)


@pytest.mark.parametrize("path, problem", [("ba\0se", "NUL character"),
                                           ("x" * 5000, "too long for the file system")])
def test_a_path_no_file_can_have_is_named_not_a_bare_os_error(path, problem):
    """A bad-input trial (2026-12-07): LLM("ba\\0se") raised a bare ValueError and a 5,000-
    character name a bare OSError from Path.exists()."""
    from flint_graph import LLM

    with pytest.raises(CheckpointError, match=f"checkpoint path: .*{problem}"):
        LLM(path, device="cpu", progress=False)
    with pytest.raises(CheckpointError, match=f"hf_config_path path: .*{problem}"):
        load_checkpoint("nowhere.gguf", hf_config_path=path, progress=False)
