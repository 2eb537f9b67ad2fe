"""Malformed JSON and safetensors headers in a checkpoint (issue 26 item 3): each refused with
one clean error naming the file, through the loader and the CLI (exit 2, no traceback).
JSON nested 100,000 deep in every JSON file a checkpoint carries (it raised RecursionError), a
safetensors header that is a list, entries whose offsets are short, negative, reversed,
overlapping, strings or bools, shapes that are not counts, dtypes that do not exist, a
non-string `__metadata__`, bytes after the last tensor, and a chat template that is not
UTF-8."""

import json
import shutil
import struct

import pytest

from flint_graph.checkpoints.checkpoint import load_checkpoint
from flint_graph.errors import FlintError

DEEP = "[" * 100_000 + "]" * 100_000
SHARD = "model-00001-of-00001.safetensors"


@pytest.fixture()
def ckpt(tiny_ckpt, tmp_path):
    d = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, d)
    (d / "model-nvfp4.gguf").unlink()  # the BF16 directory alone
    return d


def _load(d):
    from flint_graph import LLM

    return LLM(d, device="cpu", progress=False)


def _refused(d, path, *words):
    with pytest.raises(FlintError) as e:
        _load(d)
    msg = str(e.value)
    assert str(path) in msg and all(w in msg for w in words), msg
    return msg


@pytest.mark.parametrize("name", ["config.json", "generation_config.json",
                                  "tokenizer_config.json", "model.safetensors.index.json"])
def test_json_nested_too_deeply_is_one_clean_error(ckpt, name):
    (ckpt / name).write_text(DEEP)
    _refused(ckpt, ckpt / name)


def _rewrite_header(path, edit):
    """Replace the safetensors header of `path` by edit(header) (data unchanged, or with
    `extra` bytes appended when edit returns (header, extra))."""
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = edit(header)
    header, extra = out if isinstance(out, tuple) else (out, b"")
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n:] + extra)


def _first(header):
    return next(k for k in header if k != "__metadata__")


def _set(field, value):
    def edit(h):
        h[_first(h)][field] = value
        return h
    return edit


def _overlap(h):
    names = [k for k in h if k != "__metadata__"]
    a, b = sorted(names, key=lambda k: h[k]["data_offsets"][0])[:2]
    if h[a]["dtype"] == h[b]["dtype"] and h[a]["shape"] == h[b]["shape"]:
        h[b]["data_offsets"] = list(h[a]["data_offsets"])
    else:  # make b a copy of a's layout, placed on a's bytes
        h[b] = dict(h[a])
    return h


HEADERS = {
    "a list": (lambda h: [h], "expected a JSON object"),
    "nested too deeply": (lambda h: DEEP.encode(), "nested too deeply"),
    "short offsets": (_set("data_offsets", [0]), "data_offsets"),
    "negative offsets": (_set("data_offsets", [-8, 0]), "data_offsets"),
    "reversed offsets": (_set("data_offsets", [8, 0]), "data_offsets"),
    "string offsets": (_set("data_offsets", ["0", "8"]), "data_offsets"),
    "bool offsets": (_set("data_offsets", [False, True]), "data_offsets"),
    "offsets that disagree with the shape": (lambda h: _set("data_offsets", [
        h[_first(h)]["data_offsets"][0], h[_first(h)]["data_offsets"][1] + 2])(h),
        "needs"),
    "overlapping tensors": (_overlap, "overlap"),
    "a shape of strings": (_set("shape", ["2"]), "shape"),
    "an unknown dtype": (_set("dtype", "Q4_K"), "dtype"),
    "an entry that is a string": (lambda h: {**h, _first(h): "x"}, "expected an object"),
    "non-string __metadata__": (lambda h: {**h, "__metadata__": {"format": 1}}, "__metadata__"),
    "__metadata__ a list": (lambda h: {**h, "__metadata__": ["pt"]}, "__metadata__"),
    "trailing bytes": (lambda h: (h, b"\0" * 64), "bytes after the last tensor"),
}


@pytest.mark.parametrize("case", list(HEADERS))
def test_malformed_safetensors_headers_name_the_shard(ckpt, case):
    edit, word = HEADERS[case]
    shard = ckpt / SHARD
    _rewrite_header(shard, edit)
    _refused(ckpt, shard, word)


def test_a_chat_template_that_is_not_utf8_names_the_file(ckpt):
    path = ckpt / "chat_template.jinja"
    path.write_bytes(b"{{ messages }}\xff\xfe")
    _refused(ckpt, path, "UTF-8")


PLACES = {  # what sits where a file should be -> words the error must say
    "directory": (lambda p: p.mkdir(), "not a regular file"),
    "device": (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
    "dangling link": (lambda p: p.symlink_to(p.parent / "gone"), "which does not exist"),
    "link loop": (lambda p: p.symlink_to(p), "symbolic link loop"),
}


@pytest.mark.parametrize("name", ["generation_config.json", "chat_template.jinja",
                                  "tokenizer.json", "tokenizer_config.json",
                                  "model.safetensors.index.json"])
@pytest.mark.parametrize("place", list(PLACES))
def test_a_checkpoint_file_that_is_not_a_regular_file_is_named(ckpt, name, place):
    """The optional files (generation_config.json, chat_template.jinja) are skipped only when
    nothing is there: a directory, a device or a broken link in their place was skipped in
    silence, losing the checkpoint's sampling defaults, EOS ids and max_new_tokens or its
    template (a bad-input trial, 2026-12-06); tokenizer.json's error said "file not found"
    for a file that was there. Each is named with what is wrong."""
    path = ckpt / name
    if path.exists():
        path.unlink()
    make, words = PLACES[place]
    make(path)
    _refused(ckpt, path, words)


@pytest.mark.parametrize("name", ["generation_config.json", "chat_template.jinja"])
def test_an_optional_file_that_is_absent_is_no_error(ckpt, name):
    (ckpt / name).unlink(missing_ok=True)
    assert _load(ckpt).tokenizer.vocab_size > 0


def test_an_index_mapping_to_non_strings_names_the_index(ckpt):
    index = ckpt / "model.safetensors.index.json"
    obj = json.loads(index.read_text())
    obj["weight_map"][next(iter(obj["weight_map"]))] = 5
    index.write_text(json.dumps(obj))
    _refused(ckpt, index, "weight_map")


def test_the_cli_exits_2_without_a_traceback(ckpt, capsys):
    from flint_graph.cli import main

    (ckpt / "config.json").write_text(DEEP)
    code = main(["generate", str(ckpt), "--prompt", "hi", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and "config.json" in err and "Traceback" not in err, err


def test_load_checkpoint_still_loads_the_clean_copy(ckpt):
    assert load_checkpoint(ckpt, progress=False).cfg.num_hidden_layers >= 1


def _shifted(entries, drop):
    """The added tokens without `drop`, every later one moved down one id (what a converter
    that skipped a token writes)."""
    out, shift = [], 0
    for a in entries:
        if a["content"] == drop:
            shift = 1
            continue
        out.append({**a, "id": a["id"] - shift})
    return out


@pytest.mark.parametrize("drop", ["[MASK]", "[sMASK]", "<eop>"])
def test_added_tokens_that_moved_are_refused_naming_the_token(ckpt, drop):
    """Issue 26 item 2: a tokenizer.json missing one added token shifted every later id
    (`<|user|>` 1011 -> 1010), so the template and generation_config named other tokens;
    now the ids are checked against tokenizer_config.json's added_tokens_decoder."""
    path = ckpt / "tokenizer.json"
    t = json.loads(path.read_text())
    t["added_tokens"] = _shifted(t["added_tokens"], drop)
    path.write_text(json.dumps(t))
    with pytest.raises(FlintError, match=r"tokenizer\.json has the added token"):
        _load(ckpt)


def test_a_decoder_entry_at_another_id_is_refused(ckpt):
    path = ckpt / "tokenizer_config.json"
    c = json.loads(path.read_text())
    dec = c["added_tokens_decoder"]
    key = next(k for k, v in dec.items() if v["content"] == "<|user|>")
    dec[str(int(key) + 100)] = dec.pop(key)
    path.write_text(json.dumps(c))
    _refused(ckpt, "tokenizer_config.json", "<|user|>", str(int(key) + 100))


@pytest.mark.parametrize("template, words", [
    ("{{ messages[1].content }}", "chat template failed"),
    ("{% if true %}", "chat template"),
    ("   ", "rendered an empty prompt")], ids=["raises", "does-not-compile", "empty"])
def test_template_errors_name_chat_template_jinja_when_it_was_read_from_there(
        ckpt, template, words):
    """A bad-input trial (2026-12-06): every error of a template read from chat_template.jinja
    (compile, raise, render, empty prompt) was reported against DIR/tokenizer_config.json, in
    the CLI and over HTTP."""
    from flint_graph.api import LLM

    (ckpt / "chat_template.jinja").write_text(template)
    llm = LLM(str(ckpt), device="cpu", progress=False)
    with pytest.raises(FlintError) as e:
        llm.render([{"role": "user", "content": "hi"}])
    assert str(e.value).startswith(f"{ckpt / 'chat_template.jinja'}: ") and words in str(e.value)


def test_generation_config_keys_not_applied_get_a_note(ckpt, capsys):
    """repetition_penalty, min_p or max_length in generation_config.json were dropped without a
    word (a bad-input trial, 2026-12-06); the CLI now names them once at start-up."""
    from flint_graph.cli import main

    path = ckpt / "generation_config.json"
    gen = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**gen, "repetition_penalty": 1.2, "max_length": 4096}))
    assert main(["generate", str(ckpt), "--prompt", "hi", "--max-tokens", "1",
                 "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert (f"note: {path} sets repetition_penalty, max_length, which flint-graph does not "
            "apply") in err
