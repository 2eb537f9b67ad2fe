"""Tokenizer training/loading and streaming detokenization (glm47-format.md "Tokens", DESIGN §2-3).

The reference for every streamed result is a one-shot `decode` of the same ids; comparisons are
exact string equality (text has no tolerance).
"""

import json
import random
import shutil

import pytest

from flint_graph.chat.chat_template import GLM47_CHAT_TEMPLATE, render_chat
from flint_graph.errors import CheckpointError, ConfigError
from flint_graph.chat.tokenizer import (
    GLM47_CONTROL_TOKENS,
    GLM47_SPECIAL_TOKENS,
    GLM47_TEXT_TAGS,
    FlintTokenizer,
    IncrementalDetokenizer,
    train_tokenizer,
    write_tokenizer_files,
)

VOCAB = 1024  # the tiny preset's vocab: small enough that many characters split over tokens
# Pieces for random texts. The rare CJK / emoji are absent from the training corpus, so they stay
# 2-4 byte tokens and random prompt cuts land inside characters.
PIECES = ("hello", " world", "\n", "  ", "print('hi')", '{"a": 1}', "你好", "龘", "𠀋", "🦀",
          "😀", "Zürich", "Привет", "<think>", "</think>", "<tool_call>", "<arg_key>",
          "<|user|>", "<|endoftext|>", "[gMASK]", "<sop>")  # fmt: skip


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    ids = write_tokenizer_files(path, VOCAB, GLM47_CHAT_TEMPLATE, seed=0)
    return path, ids


@pytest.fixture(scope="module")
def tok(tok_dir):
    return FlintTokenizer.from_dir(tok_dir[0])


def random_text(rng: random.Random, num_pieces: int) -> str:
    return "".join(rng.choice(PIECES) for _ in range(num_pieces))


def stream(tok, prompt_ids, new_ids):
    detok = IncrementalDetokenizer(tok, prompt_ids)
    pieces = [detok.push(i) for i in new_ids]
    pieces.append(detok.flush())
    return pieces


def test_training_is_deterministic_and_sized():
    first, again, other = train_tokenizer(VOCAB), train_tokenizer(VOCAB), train_tokenizer(VOCAB, 1)
    assert first.to_str() == again.to_str()
    assert first.to_str() != other.to_str()
    assert first.get_vocab_size(with_added_tokens=True) == VOCAB
    # The added tokens follow the BPE vocab, in GLM47_SPECIAL_TOKENS order.
    base = VOCAB - len(GLM47_SPECIAL_TOKENS)
    assert [first.token_to_id(t) for t in GLM47_SPECIAL_TOKENS] == list(range(base, VOCAB))
    with pytest.raises(ConfigError, match=r"vocab_size: expected >= 276 .*found 200"):
        train_tokenizer(200)


def test_written_files(tok_dir, tok):
    path, ids = tok_dir
    config = json.loads((path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|endoftext|>" and config["pad_token"] == "<|endoftext|>"
    assert config["chat_template"] == GLM47_CHAT_TEMPLATE == tok.chat_template
    entries = config["added_tokens_decoder"].items()
    decoder = {v["content"]: (int(k), v["special"]) for k, v in entries}
    assert decoder == {t: (ids[t], t in GLM47_CONTROL_TOKENS) for t in GLM47_SPECIAL_TOKENS}
    assert tok.vocab_size == VOCAB
    assert tok.eos_id == ids["<|endoftext|>"] == tok.token_id("<|endoftext|>")
    assert tok.chat_stop_ids == (ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"])
    assert tok.special_ids == ids


def test_special_tokens_are_single_ids(tok_dir, tok):
    ids = tok_dir[1]
    for t in GLM47_SPECIAL_TOKENS:
        assert tok.encode(t) == [ids[t]]
        middle = tok.encode("ab" + t + "cd")
        assert middle.count(ids[t]) == 1
        assert tok.decode(middle, skip_special=False) == "ab" + t + "cd"
        # Control tokens vanish from visible text; think/tool tags stay for the parser.
        assert tok.decode(middle) == ("abcd" if t in GLM47_CONTROL_TOKENS else "ab" + t + "cd")


def test_round_trip_mixed_text(tok):
    rng = random.Random(0)
    for _ in range(20):
        text = random_text(rng, 40)
        ids = tok.encode(text)
        assert tok.decode(ids, skip_special=False) == text
        visible = text
        for t in GLM47_CONTROL_TOKENS:
            visible = visible.replace(t, "")
        assert tok.decode(ids) == visible
    # The case the detokenizer exists for: one character over several byte tokens.
    crab = tok.encode("🦀")
    assert len(crab) >= 2 and "\ufffd" in tok.decode(crab[:-1])


def check_stream(tok, ids, cut):
    prompt_text = tok.decode(ids[:cut])
    full = tok.decode(ids)
    # A character the prompt leaves incomplete (shown as U+FFFD) belongs to the output.
    shown = prompt_text.rstrip("\ufffd")
    assert full.startswith(shown)
    pieces = stream(tok, ids[:cut], ids[cut:])
    assert "".join(pieces) == full[len(shown) :]
    for piece in pieces:
        assert "\ufffd" not in piece
        assert not any(t in piece for t in GLM47_CONTROL_TOKENS)
    return prompt_text != shown


def test_incremental_matches_full_decode_at_random_cuts(tok):
    rng = random.Random(1)
    num_mid_char = 0
    for _ in range(40):
        ids = tok.encode(random_text(rng, 30))
        num_mid_char += check_stream(tok, ids, rng.randint(0, len(ids)))
    ids = tok.encode(random_text(rng, 30))
    for cut in range(len(ids) + 1):  # every cut of one text, so mid-character cuts occur
        num_mid_char += check_stream(tok, ids, cut)
    assert num_mid_char > 0  # the prompt-ends-mid-character path was exercised


def test_prompt_ending_mid_character(tok):
    prompt, reply = tok.encode("Hi 🦀"), tok.encode(" crab<think>ok</think><|user|>")
    cut = len(prompt) - 1  # the prompt stops inside 🦀; its last byte token is the first output
    assert tok.decode(prompt[:cut]) == "Hi \ufffd"
    pieces = stream(tok, prompt[:cut], prompt[cut:] + reply)
    assert pieces[0] == "🦀"  # whole, and "Hi " is not re-emitted
    assert "".join(pieces) == "🦀 crab<think>ok</think>"
    assert pieces[-2:] == ["", ""]  # <|user|> then flush: nothing


def test_held_bytes_and_odd_ids(tok):
    crab = tok.encode("🦀")
    detok = IncrementalDetokenizer(tok, tok.encode("[gMASK]<sop><|user|>x<|assistant|>"))
    assert [detok.push(i) for i in crab[:-1]] == [""] * (len(crab) - 1)
    # Ids past the tokenizer (a padded LM head's extra rows) decode to nothing.
    assert detok.push(tok.vocab_size + 7) == ""
    assert detok.push(crab[-1]) == "🦀"
    assert detok.push(tok.token_id("<tool_call>")) == "<tool_call>"
    # A stream that ends inside a character flushes it as one U+FFFD, as a full decode shows it.
    assert detok.push(crab[0]) == ""
    assert detok.flush() == "\ufffd"


def test_chat_prompt_encodes_markers_as_single_ids(tok_dir, tok):
    ids = tok_dir[1]
    msgs = [{"role": "user", "content": "Zürich <weather>?"}]
    prompt = render_chat(tok.chat_template, msgs, enable_thinking=False)
    enc = tok.encode(prompt)
    assert enc[:3] == [ids["[gMASK]"], ids["<sop>"], ids["<|user|>"]]
    assert enc[-2:] == [ids["<|assistant|>"], ids["</think>"]]
    assert tok.decode(enc) == "Zürich <weather>?</think>"


def test_missing_and_bad_files(tok_dir, tmp_path):
    src = tok_dir[0]
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: file not found"):
        FlintTokenizer.from_dir(tmp_path)
    shutil.copy(src / "tokenizer_config.json", tmp_path)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: file not found"):
        FlintTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"model": 5}')
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: not a valid tokenizers file"):
        FlintTokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{oops")
    with pytest.raises(CheckpointError, match=r"tokenizer_config\.json: not valid JSON"):
        FlintTokenizer.from_dir(tmp_path)


def test_tokenizer_json_variants(tok_dir, tmp_path):
    src = tok_dir[0]
    data = json.loads((src / "tokenizer.json").read_text())
    config = json.loads((src / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    # Tags flagged special (as some GLM tokenizer.json files do) are still kept by decode.
    for entry in data["added_tokens"]:
        entry["special"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    tok = FlintTokenizer.from_dir(tmp_path)
    assert tok.decode(tok.encode("<|user|>a<think>b</think>")) == "a<think>b</think>"
    with pytest.raises(CheckpointError, match="no token '<nope>'"):
        tok.token_id("<nope>")
    with pytest.raises(CheckpointError, match="has no chat_template"):
        _ = tok.chat_template
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert FlintTokenizer.from_dir(tmp_path).chat_template == "{{ messages[0].content }}"
    data["added_tokens"] = [e for e in data["added_tokens"] if e["content"] != "<|observation|>"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"lacks the GLM-4.7 tokens \['<\|observation\|>'\]"):
        FlintTokenizer.from_dir(tmp_path)


def test_text_tags_not_special_in_files(tok_dir):
    flags = {e["content"]: e["special"]
             for e in json.loads((tok_dir[0] / "tokenizer.json").read_text())["added_tokens"]}
    assert all(flags[t] for t in GLM47_CONTROL_TOKENS)
    assert not any(flags[t] for t in GLM47_TEXT_TAGS)


# -- chat prompts: scaffolding ids, data as ordinary text (issue 6) ---------------------------


def test_encode_text_equals_encode_where_no_added_token_text_occurs(tok):
    rng = random.Random(5)
    plain = [p for p in PIECES if p not in GLM47_SPECIAL_TOKENS] + ["<", ">", "|", "[", "]"]
    for _ in range(300):
        text = "".join(rng.choice(plain) for _ in range(rng.randint(0, 12)))
        assert tok.encode_text(text) == tok.encode(text)


def test_encode_text_keeps_every_added_token_as_text(tok):
    assert set(tok.added_tokens) == set(GLM47_SPECIAL_TOKENS)
    added_ids = {tok.token_id(t) for t in tok.added_tokens}
    for marker in tok.added_tokens:
        text = f"a{marker}b {marker}"
        ids = tok.encode_text(text)
        assert not added_ids & set(ids), marker
        assert tok.decode(ids, skip_special=False) == tok.decode(ids) == text
        assert tok.encode(text).count(tok.token_id(marker)) == 2  # raw encode: real ids


def test_encode_segments_matches_added_tokens_only_in_scaffolding(tok):
    user, asst = tok.token_id("<|user|>"), tok.token_id("<|assistant|>")
    segs = [("<|user|>x ", False), ("<|user|>", True), (" y<|assistant|>", False)]
    # Text between scaffolding tokens is one run, data included (no split at the boundary).
    assert tok.encode_segments(segs) == [user] + tok.encode_text("x <|user|> y") + [asst]
    assert tok.encode_segments([]) == []
    assert tok.encode_segments([("<|user|>", True)]) == tok.encode_text("<|user|>")


@pytest.mark.parametrize("marker", GLM47_SPECIAL_TOKENS)
def test_each_control_token_in_chat_content_stays_text(tok, marker):
    from flint_graph.chat.chat_template import render_chat_segments

    content = f"before{marker}after {marker}"
    for role, msgs in (
        ("user", [{"role": "user", "content": content}]),
        ("tool", [{"role": "user", "content": "q"},
                  {"role": "assistant", "content": None, "tool_calls": [
                      {"type": "function", "function": {"name": "f", "arguments": {}}}]},
                  {"role": "tool", "content": content}]),
        ("system", [{"role": "system", "content": content}, {"role": "user", "content": "q"}]),
    ):
        segs = render_chat_segments(tok.chat_template, msgs, markers=tok.added_tokens)
        ids = tok.encode_segments(segs)
        benign = tok.encode(render_chat(tok.chat_template, [
            {**m, "content": m["content"] and m["content"].replace(marker, "")} for m in msgs]))
        added = {tok.token_id(t) for t in tok.added_tokens}
        # Each added id appears exactly as often as the template's structure puts it there.
        assert sorted(i for i in ids if i in added) == sorted(i for i in benign if i in added), role
        assert tok.decode(ids, skip_special=False) == "".join(s.text for s in segs)
        text_ids = tok.encode_text(content)
        start = next(i for i in range(len(ids)) if ids[i:i + len(text_ids)] == text_ids)
        assert tok.decode(ids[start:start + len(text_ids)], skip_special=False) == content


def test_chat_prompt_without_markers_in_data_encodes_as_before(tok):
    # The segment encoding changes nothing for ordinary conversations: same ids as encoding
    # the rendered text whole.
    from flint_graph.chat.chat_template import render_chat_segments

    msgs = [{"role": "system", "content": "Be brief. 你好"},
            {"role": "user", "content": "|> Zürich <weather>? [x] a|b <"},  # edges: data
            {"role": "assistant", "content": "ok", "tool_calls": [{"type": "function",
             "function": {"name": "f", "arguments": {"q": "a < b", "n": 3}}}]},
            {"role": "tool", "content": '{"t": 21}'}]  # fmt: skip
    tools = [{"type": "function", "function": {"name": "f", "description": "d <b>"}}]
    segs = render_chat_segments(tok.chat_template, msgs, tools, markers=tok.added_tokens)
    assert tok.encode_segments(segs) == tok.encode(render_chat(tok.chat_template, msgs, tools))


def test_a_tokenizer_json_with_a_byte_order_mark_loads(tok_dir, tok, tmp_path):
    """A bad-input trial (2026-12-06): a UTF-8 BOM in tokenizer.json was "not a valid tokenizers
    file (expected value at line 1 column 1)", while the other JSON files took it."""
    copy = tmp_path / "tok"
    shutil.copytree(tok_dir[0], copy)
    text = (copy / "tokenizer.json").read_text(encoding="utf-8")
    (copy / "tokenizer.json").write_text("\ufeff" + text, encoding="utf-8")
    bom = FlintTokenizer.from_dir(copy)
    assert bom.encode("hello world") == tok.encode("hello world")


@pytest.mark.parametrize("name, cap", [("tokenizer.json", "TOKENIZER_JSON_MAX_BYTES"),
                                       ("chat_template.jinja", "CHAT_TEMPLATE_MAX_BYTES")])
def test_tokenizer_files_past_their_size_bound_are_refused_before_reading(
        tok_dir, tmp_path, monkeypatch, name, cap):
    """A bad-input trial (2026-12-06): a 2 GiB tokenizer.json took 4.5 GB of memory before its
    error, and a 512 MB chat_template.jinja loaded and then spent 73 s and 2.9 GB in its first
    render. Each file is read only up to its bound (lowered here to keep the test small)."""
    from flint_graph.chat import tokenizer as tk

    copy = tmp_path / "tok"
    shutil.copytree(tok_dir[0], copy)
    monkeypatch.setattr(tk, cap, 4096)
    (copy / name).write_text("x" * 5000)
    with pytest.raises(CheckpointError, match=rf"{name}: larger than 0 MiB"):
        FlintTokenizer.from_dir(copy)


def test_the_template_file_is_the_one_the_template_came_from(tok_dir, tmp_path):
    """Template errors named DIR/tokenizer_config.json when the template was read from
    chat_template.jinja (a bad-input trial, 2026-12-06)."""
    assert FlintTokenizer.from_dir(tok_dir[0]).template_file.endswith("tokenizer_config.json")
    copy = tmp_path / "tok"
    shutil.copytree(tok_dir[0], copy)
    (copy / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert FlintTokenizer.from_dir(copy).template_file == str(copy / "chat_template.jinja")


def _with_pipeline(tok_dir, tmp_path, **parts):
    """A copy of the test tokenizer directory with tokenizer.json's `parts` replaced."""
    src = tok_dir[0]
    data = json.loads((src / "tokenizer.json").read_text())
    data.update(parts)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    shutil.copy(src / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    return tmp_path


@pytest.mark.parametrize("normalizer", [
    {"type": "Replace", "pattern": {"String": ""}, "content": "x"},
    {"type": "Prepend", "prepend": ""},
], ids=["empty-replace", "empty-prepend"])
def test_a_panicking_normalizer_is_a_checkpoint_error_naming_the_file(tok_dir, tmp_path,
                                                                      normalizer):
    """A Rust panic in `tokenizers` (a BaseException, past every `except Exception`) comes out
    of every encode and decode path as CheckpointError naming tokenizer.json (a bad-input
    trial, 2026-12-06: the CLI showed a traceback, the chat ended, the server answered a
    plain-text 500)."""
    tok = FlintTokenizer.from_dir(_with_pipeline(tok_dir, tmp_path, normalizer=normalizer))
    for encode in (tok.encode, lambda t: tok.encode(t, most=100), tok.encode_text):
        with pytest.raises(CheckpointError, match=r"tokenizer\.json's pipeline failed"):
            encode("hello")
    assert tok.decode([5, 6]) is not None  # decoding does not run the normalizer


def test_a_split_regex_past_onigs_limit_fails_that_text_only(tok_dir, tmp_path):
    pre = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated",
           "invert": False}
    tok = FlintTokenizer.from_dir(_with_pipeline(tok_dir, tmp_path, pre_tokenizer=pre))
    assert tok.decode(tok.encode("hello")) == "hello"
    with pytest.raises(CheckpointError, match=str(tmp_path)):
        tok.encode("a" * 40 + "!")
    assert tok.decode(tok.encode("world")) == "world"  # the tokenizer is still usable


def test_a_panic_while_loading_names_the_file(tok_dir, tmp_path):
    bad = {"type": "Precompiled", "precompiled_charsmap": "AAAA"}
    d = _with_pipeline(tok_dir, tmp_path, normalizer=bad)
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: not a valid tokenizers file"):
        FlintTokenizer.from_dir(d)


def _with(tok_dir, tmp_path, edit):
    """A copy of the tokenizer directory with tokenizer.json's JSON changed by `edit(data)`."""
    copy = tmp_path / "tok"
    shutil.copytree(tok_dir[0], copy)
    data = json.loads((copy / "tokenizer.json").read_text())
    edit(data)
    (copy / "tokenizer.json").write_text(json.dumps(data))
    return copy


def _long_added_token(data):
    entry = next(e for e in data["added_tokens"] if e["content"] == "[MASK]")
    entry["content"] = "Q" * 100_000


@pytest.mark.parametrize("edit, message", [
    # every render listed each prefix of each marker: ~10 GB for this one (a bad-input trial)
    (_long_added_token, r'added token \d+ is 100,000 characters \("QQQ.*at most 256'),
    # the normalizer grew a 170,000-character prompt to 11 GB: a Rust abort of the process
    (lambda d: d.update(normalizer={"type": "Replace", "pattern": {"String": "h"},
                                    "content": "hello" * 20000}),
     r'normalizer: can lengthen a text up to 100,000-fold \(Replace of "h" by 100,000'),
    (lambda d: d.update(normalizer={"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"Regex": "a"}, "content": "bbbbbbb"}] * 3}),
     r"normalizer: can lengthen a text up to 512-fold"),
    # a 400-token answer decoded to 109 MB
    (lambda d: d.update(decoder={"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": " "}, "content": "x" * 1_000_000},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
         "use_regex": True}]}),
     r"decoder: can lengthen a token's text up to 1,000,000-fold"),
])
def test_a_tokenizer_that_can_blow_a_text_up_is_refused_at_load(tok_dir, tmp_path, edit,
                                                                message):
    """Bad-input trials (2026-12-07): a tokenizer.json whose added token, normalizer or decoder
    can make a short text enormous loaded, and then exhausted the memory (or aborted the
    process in Rust) at the first prompt. Each is refused at load, naming the file and part."""
    with pytest.raises(CheckpointError, match="tokenizer.json " + message):
        FlintTokenizer.from_dir(_with(tok_dir, tmp_path, edit))


def test_a_normalizer_that_may_grow_a_text_bounds_the_prompt_it_encodes(tok_dir, tmp_path):
    """NFKC (at most 18-fold, by the bound taken for it) loads, and the characters a prompt may
    hold shrink by that much; without a normalizer the byte-level pre-tokenizer's 4 is all."""
    from flint_graph.chat.tokenizer import NORMALIZED_MAX_CHARS

    nfkc = FlintTokenizer.from_dir(_with(tok_dir, tmp_path,
                                         lambda d: d.update(normalizer={"type": "NFKC"})))
    assert nfkc.text_growth == 18 * 4  # NFKC, then the byte-level pre-tokenizer
    assert nfkc.max_text_chars == NORMALIZED_MAX_CHARS // 72
    assert nfkc.encode("hello") and FlintTokenizer.from_dir(tok_dir[0]).max_text_chars == \
        NORMALIZED_MAX_CHARS // 4


@pytest.mark.parametrize("template, found", [
    (None, "found null"), ({}, "found object"), (5, "found integer"),
    ([{"template": "x"}], 'none is named "default".*no entry has a name'),
    ([{"name": "tool_use", "template": "x"}], 'none is named "default".*names found: "tool_use"'),
])
def test_a_chat_template_of_the_wrong_shape_is_named_in_json_words(tok_dir, tmp_path, template,
                                                                   found):
    """A bad-input trial (2026-12-07): "expected a string, found dict / int" (Python's names),
    and a list without a "default" entry read as "has no chat_template"."""
    copy = tmp_path / "tok"
    shutil.copytree(tok_dir[0], copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    if template is None:  # null: no template, refused when one is asked for
        with pytest.raises(CheckpointError, match="has no chat_template"):
            _ = FlintTokenizer.from_dir(copy).chat_template
        return
    with pytest.raises(CheckpointError, match="tokenizer_config.json: chat_template.*" + found):
        FlintTokenizer.from_dir(copy)


def _byte_levels(n):
    def edit(data):
        extra = [{"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": False}] * n
        data["pre_tokenizer"] = {"type": "Sequence",
                                 "pretokenizers": [data["pre_tokenizer"], *extra]}
    return edit


def _many_long_added_tokens(data):
    start = max(e["id"] for e in data["added_tokens"]) + 1
    data["added_tokens"] += [{"id": start + i, "content": f"<|{i:04d}" + "x" * 240 + "|>",
                              "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for i in range(80)]


@pytest.mark.parametrize("edit, message", [
    # 24 more ByteLevel passes: a 101-character prompt became a 400 MB allocation, a Rust abort
    (_byte_levels(24), r"pre_tokenizer: can lengthen a text up to [\d,]+-fold"),
    (lambda d: d.update(normalizer={"type": "NFKC"}) or _byte_levels(1)(d),
     r"pre_tokenizer with the normalizer: can lengthen a text up to 288-fold"),
    # 80 tokens of 246 characters: each render listed ~2.4M characters of their prefixes
    (_many_long_added_tokens, r"81 added tokens|added tokens are too long together"),
])
def test_a_pipeline_or_added_tokens_that_grow_a_render_are_refused_at_load(tok_dir, tmp_path,
                                                                          edit, message):
    """A re-trial of the bounds above (2026-12-07): the pre-tokenizer's growth was not counted
    (a chain of ByteLevel passes doubles a text each), and the added tokens were bounded one by
    one but not together (1,000 of 256 characters: 51 s and 3.6 GB at the first chat)."""
    with pytest.raises(CheckpointError, match=message):
        FlintTokenizer.from_dir(_with(tok_dir, tmp_path, edit))


def test_one_more_byte_level_pass_still_loads(tok_dir, tmp_path):
    tok = FlintTokenizer.from_dir(_with(tok_dir, tmp_path, _byte_levels(1)))
    assert tok.text_growth == 16
