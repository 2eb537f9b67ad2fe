"""Hostile GGUF structure (issue 26 item 1): the tiny checkpoint's GGUF with one field mutated
at a time, each refused before gguf's reader parses it, with one line naming the file and the
key or tensor (flint_graph/checkpoints/gguf_structure.py), through the loader and the CLI
(exit 2). Siblings of each reported input: counts past the end for string and scalar arrays
and for the header's counts, offsets that wrap, are unaligned, overlap or run past the end,
non-UTF-8 keys, values and names, unknown types, and metadata of the wrong type where a number
belongs."""

import shutil
import struct
import time

import pytest
from gguf import GGUFReader, GGUFWriter

from flint_graph.checkpoints.gguf_checkpoint import read_gguf_metadata
from flint_graph.checkpoints.gguf_structure import check_gguf_structure
from flint_graph.errors import CheckpointError, ConfigError

PATTERN = "flint.attention.sliding_window_pattern"


@pytest.fixture()
def ckpt(tiny_ckpt, tmp_path):
    """A private copy of the tiny checkpoint directory (its GGUF is mutated in place)."""
    d = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, d)
    return d


def _gguf(d):
    return d / "model-nvfp4.gguf"


def _value_at(path, key) -> int:
    """Byte offset of metadata `key`'s value (after its key and its u32 type)."""
    f = GGUFReader(path).fields[key]
    return f.offset + 8 + len(key.encode()) + 4


def _tensor_info(path, i=0):
    """(offset of tensor i's info, its name length, its dimension count)."""
    t = GGUFReader(path).tensors[i]
    return t.field.offset, len(t.name.encode()), len(t.shape)


def _poke(path, at: int, fmt: str, value) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(struct.pack("<" + fmt, value))


def _refused(path, *words) -> str:
    t0 = time.process_time()
    with pytest.raises(CheckpointError) as e:
        read_gguf_metadata(path)
    assert time.process_time() - t0 < 5, "took too long to refuse"
    msg = str(e.value)
    assert str(path) in msg and all(w in msg for w in words), msg
    assert "\n" not in msg
    return msg


def test_the_valid_file_passes(ckpt):
    check_gguf_structure(_gguf(ckpt))


@pytest.mark.parametrize("count", [2 ** 40, 2 ** 63, 2 ** 64 - 1, 10 ** 6])
def test_an_array_count_past_the_end_is_refused_at_once(ckpt, count):
    """The reported input: sliding_window_pattern's count 2^40 hung while memory climbed."""
    g = _gguf(ckpt)
    _poke(g, _value_at(g, PATTERN) + 4, "Q", count)  # after the u32 element type
    _refused(g, PATTERN)


def test_a_string_array_count_past_the_end_is_refused(tmp_path):
    g = tmp_path / "s.gguf"
    w = GGUFWriter(g, "flint")
    w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _poke(g, _value_at(g, "tokenizer.ggml.tokens") + 4, "Q", 2 ** 40)
    _refused(g, "tokenizer.ggml.tokens")


@pytest.mark.parametrize("field,value,word", [(16, 2 ** 62, "metadata"),
                                              (8, 2 ** 62, "tensor infos")])
def test_header_counts_that_cannot_fit_are_refused(ckpt, field, value, word):
    g = _gguf(ckpt)
    _poke(g, field, "Q", value)
    _refused(g, word)


@pytest.mark.parametrize("offset,word", [
    (2 ** 64 - 32, "past the end"),  # the reported wrap
    (2 ** 63, "past the end"),
    (1, "not a multiple of the alignment"),  # unaligned
    (32 * 10 ** 9, "past the end"),
])
def test_tensor_offsets_that_wrap_misalign_or_run_past_the_end(ckpt, offset, word):
    g = _gguf(ckpt)
    at, name_len, n_dims = _tensor_info(g, 1)
    _poke(g, at + 8 + name_len + 4 + 8 * n_dims + 4, "Q", offset)
    msg = _refused(g, word)
    assert GGUFReader.__name__ not in msg


def test_overlapping_tensors_are_refused(ckpt):
    g = _gguf(ckpt)
    r = GGUFReader(g)
    first_off = None
    for i in (0, 1):
        at, name_len, n_dims = _tensor_info(g, i)
        pos = at + 8 + name_len + 4 + 8 * n_dims + 4
        if first_off is None:
            first_off = struct.unpack("<Q", open(g, "rb").read()[pos:pos + 8])[0]
        else:
            _poke(g, pos, "Q", first_off)  # tensor 1 starts where tensor 0 does
    del r
    _refused(g, "overlaps")


def test_non_utf8_strings_are_refused_naming_them(ckpt):
    g = _gguf(ckpt)
    f = GGUFReader(g).fields["general.architecture"]
    key_at = f.offset + 8
    value_at = _value_at(g, "general.architecture") + 8  # after the string's length
    _poke(g, value_at, "B", 0xFF)
    _refused(g, "general.architecture", "UTF-8")
    shutil.copy(g, g.with_suffix(".bak"))
    _poke(g, value_at, "B", ord("f"))
    _poke(g, key_at, "B", 0xC3)  # a key whose first byte starts a sequence it does not finish
    _refused(g, "UTF-8")
    _poke(g, key_at, "B", ord("g"))
    at, name_len, _ = _tensor_info(g, 2)
    _poke(g, at + 8, "B", 0xFE)  # a tensor name
    _refused(g, "tensor name", "UTF-8")


@pytest.mark.parametrize("what,delta,value,word", [
    ("value type", 0, 77, "unknown value type"),
    ("element type", 4, 99, "unknown array element type"),
])
def test_unknown_types_are_refused(ckpt, what, delta, value, word):
    g = _gguf(ckpt)
    key = PATTERN
    at = _value_at(g, key) - 4 if what == "value type" else _value_at(g, key)
    _poke(g, at, "I", value)
    _refused(g, word)


def test_an_unknown_tensor_type_is_refused(ckpt):
    g = _gguf(ckpt)
    at, name_len, n_dims = _tensor_info(g, 0)
    _poke(g, at + 8 + name_len + 4 + 8 * n_dims, "I", 1000)
    _refused(g, "unknown GGML type 1000")


def test_bad_magic_version_and_short_files(ckpt, tmp_path):
    g = _gguf(ckpt)
    data = g.read_bytes()
    for name, blob, word in (("magic", b"GGUX" + data[4:], "magic"),
                             ("version", data[:4] + struct.pack("<I", 9) + data[8:], "version"),
                             ("short", data[:10], "shorter than its header"),
                             ("cut", data[:len(data) // 3], "past the end")):
        p = tmp_path / f"{name}.gguf"
        p.write_bytes(blob)
        _refused(p, word)


@pytest.mark.parametrize("key,value", [
    ("flint.rope.freq_base", "ten thousand"),
    ("flint.attention.layer_norm_rms_epsilon", [1, 2]),
    ("flint.expert_weights_scale", True),
    ("flint.block_count", 2.5),
])
def test_metadata_of_the_wrong_type_names_the_key(tiny_ckpt, tmp_path, key, value):
    """A string, list or bool where a number belongs was an internal error (exit 1): now a
    ConfigError naming the key and the kind expected."""
    from flint_graph.checkpoints.config import FlintConfig

    cfg = FlintConfig.preset("tiny")
    found = dict(cfg.gguf_metadata())
    found[key] = value
    with pytest.raises(ConfigError, match=key.replace(".", r"\.") + ".*expected"):
        cfg.check_gguf_metadata(found, "x.gguf")


def test_the_cli_exits_2_naming_the_key(ckpt, capsys):
    from flint_graph.cli import main

    g = _gguf(ckpt)
    _poke(g, _value_at(g, PATTERN) + 4, "Q", 2 ** 40)
    code = main(["generate", str(g), "--prompt", "hi", "--max-tokens", "2", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and PATTERN in err and "Traceback" not in err, err


@pytest.mark.parametrize("byte", [7, 9, 255])
def test_a_bool_that_is_no_0_or_1_is_refused(tmp_path, byte):
    """A bad-input trial (2026-12-07): a flag's byte of 7 or 9 (e.g. expert_weights_norm) read
    as true. A GGUF bool is one byte, 0 or 1; others are refused naming the key, alone or in
    an array."""
    g = tmp_path / "b.gguf"
    w = GGUFWriter(g, "flint")
    w.add_bool("flint.expert_weights_norm", True)
    w.add_array("flint.sliding_window_pattern", [True, False, True])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    check_gguf_structure(g)
    data = g.read_bytes()
    _poke(g, _value_at(g, "flint.expert_weights_norm"), "B", byte)
    _refused(g, "flint.expert_weights_norm", f"the byte {byte} is no bool")
    g.write_bytes(data)
    _poke(g, _value_at(g, "flint.sliding_window_pattern") + 12 + 2, "B", byte)
    _refused(g, "flint.sliding_window_pattern", f"element 2 is the byte {byte}")
