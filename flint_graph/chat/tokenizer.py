"""Byte-level BPE tokenizer with the GLM-4.7 added tokens, plus streaming detokenization.

Follows glm47-format.md ("Tokens") and DESIGN §2: a checkpoint directory carries `tokenizer.json`
(the `tokenizers` format) and `tokenizer_config.json` (HF layout with the Jinja `chat_template`).
`train_tokenizer` / `write_tokenizer_files` build the synthetic checkpoints' tokenizer from a
built-in corpus; `FlintTokenizer` reads any GLM-style tokenizer directory and never hard-codes an
id; `IncrementalDetokenizer` turns sampled ids into text a piece at a time (DESIGN §3, "sampled id
→ incremental detokenizer → parser"), never emitting a character that later bytes could still
complete, nor one that the prompt left incomplete.
"""

from __future__ import annotations

import bisect
import json
import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

from flint_graph.errors import CheckpointError, ConfigError, kind as json_kind, shown
from flint_graph.checkpoints.jsonfile import MISSING, file_problem, read_json_object

# Control tokens: framing and role markers, skipped when decoding user-visible text.
GLM47_CONTROL_TOKENS = (
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
)  # fmt: skip
# Tags the reasoning / tool-call parser reads as text, so decoding keeps them.
GLM47_TEXT_TAGS = (
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>",
)  # fmt: skip
# Every GLM-4.7 added token, in the id order `train_tokenizer` gives them (after the BPE vocab).
GLM47_SPECIAL_TOKENS = GLM47_CONTROL_TOKENS + GLM47_TEXT_TAGS
# Tokens the chat format needs (glm47-format.md); a tokenizer lacking one cannot serve chat.
_CHAT_TOKENS = tuple(t for t in GLM47_SPECIAL_TOKENS if t not in ("[MASK]", "[sMASK]", "<eop>"))
EOS_TOKEN = "<|endoftext|>"
# glm47-format.md: <|user|> or <|endoftext|> end an answer, <|observation|> ends tool calls.
CHAT_STOP_TOKENS = ("<|endoftext|>", "<|user|>", "<|observation|>")
_BYTE_ALPHABET = 256  # a byte-level BPE always holds one token per byte value

# The built-in corpus: our own sentences, mixed by a seeded RNG. Several scripts and emoji make
# multi-byte characters; rare ones stay split over byte tokens. Seeded pseudo-words, as many as
# the vocab asks for, let the BPE fill large vocabs (151,552 in ~7 s) so few ids decode to nothing.
_ENGLISH = (
    "The scheduler picks the smallest bucket that holds every running request.",
    "A sliding window layer keeps the last few hundred keys in a ring buffer.",
    "Reasoning tokens count toward the limit, so hard questions need a large budget.",
    "She asked whether the weather in Paris would be sunny on Friday afternoon.",
    "Experts are chosen by score, then their weights are renormalised and scaled.",
    "If the file is missing, the loader stops and names the path it expected.",
    "We measured the copy bandwidth twice and kept the slower of the two runs.",
    "Please summarise the report in three short bullet points for the team.",
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Numbers like 3.14159, 2048, 1e-5 and 151552 show up in configuration files.",
)
_CODE = (
    "def rms_norm(x, weight, eps=1e-6):\n    return x * torch.rsqrt(x.pow(2).mean(-1) + eps)\n",
    "for (int i = 0; i < n; ++i) {\n    out[i] = a[i] * b[i] + c;\n}\n",
    "const reply = await fetch(url, { method: 'POST', body: JSON.stringify(payload) });\n",
    "class Scheduler:\n    def __init__(self, num_slots: int) -> None:\n        self.slots = []\n",
    "if err != nil {\n\treturn fmt.Errorf(\"open %s: %w\", path, err)\n}\n",
    "SELECT name, count(*) FROM requests WHERE status = 'done' GROUP BY name;\n",
)
_NON_ASCII = (
    "你好，世界！今天我们测试分词器和流式输出。",
    "東京の天気は晴れです。明日は雨が降るかもしれません。",
    "안녕하세요, 오늘 날씨가 좋네요.",
    "Привет, мир! Сегодня хорошая погода для прогулки.",
    "Καλημέρα κόσμε, τι κάνεις σήμερα;",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "नमस्ते दुनिया, आज मौसम अच्छा है।",
    "Café, naïve, façade, Ünïcödé, smørrebrød, ¿qué tal?",
    "Emoji: 😀 🚀 🎉 👍🏽 ❤️ 🇫🇷 🤖 ✅",
)
_WORDS = ("weather", "city", "days", "unit", "query", "limit", "path", "mode", "name", "value")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_SYLLABLES = tuple(c + v for c in "bcdfghjklmnprstvwz" for v in _VOWELS)


def _json_line(rng: random.Random) -> str:
    keys = rng.sample(_WORDS, k=rng.randint(1, 4))
    args = {k: rng.choice([rng.randint(-50, 5000), rng.random() < 0.5, rng.choice(_WORDS)])
            for k in keys}  # fmt: skip
    return json.dumps({"name": rng.choice(_WORDS), "arguments": args}, ensure_ascii=False)


def build_corpus(vocab_size: int, seed: int = 0) -> list[str]:
    """The deterministic training corpus for a tokenizer of `vocab_size` tokens: 6,000 strings
    mixed from English, code, JSON and non-ASCII text, then vocab_size*2/5 lines of 12
    pseudo-words drawn from a lexicon of vocab_size*4/3, all by `random.Random(seed)`."""
    rng = random.Random(seed)
    pools = (_ENGLISH, _CODE, _NON_ASCII)
    lines = []
    for _ in range(6000):
        kind = rng.randrange(4)
        lines.append(_json_line(rng) if kind == 3 else rng.choice(pools[kind]))
    lexicon = ["".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4)))
               for _ in range(vocab_size * 4 // 3)]  # fmt: skip
    lines += [" ".join(rng.choices(lexicon, k=12)) for _ in range(vocab_size * 2 // 5)]
    return lines


def min_trained_vocab_size() -> int:
    """The smallest vocab_size `train_tokenizer` takes: 256 byte tokens plus the GLM-4.7 added
    tokens."""
    return _BYTE_ALPHABET + len(GLM47_SPECIAL_TOKENS)


def train_tokenizer(vocab_size: int, seed: int = 0, corpus: Iterable[str] | None = None,
                    split_digits: bool = False) -> Tokenizer:
    """Train a byte-level BPE on `corpus` (default: the built-in one, `build_corpus`) and append
    the GLM-4.7 added tokens. `split_digits` makes every digit its own pre-token (so numbers
    are spelled digit by digit, as flint-nano's arithmetic reasons them).

    Ids: 0..255 bytes and the BPE merges first, then `GLM47_SPECIAL_TOKENS` in order (as GLM puts
    its added tokens after the BPE vocab). Total size <= `vocab_size` (equal in practice; a model's
    vocab may still exceed its tokenizer's, as real models pad). Control tokens are
    added with special=True, text tags with special=False. Deterministic for (vocab_size, seed).
    Raises ConfigError if `vocab_size` cannot hold 256 byte tokens plus the added tokens.
    """
    min_size = min_trained_vocab_size()
    if vocab_size < min_size:
        raise ConfigError(f"vocab_size: expected >= {min_size} (256 bytes + "
                          f"{len(GLM47_SPECIAL_TOKENS)} added tokens), found {vocab_size}")
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                  byte_level]) if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(GLM47_SPECIAL_TOKENS),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = build_corpus(vocab_size, seed) if corpus is None else corpus
    tok.train_from_iterator(lines, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in GLM47_CONTROL_TOKENS])  # fmt: skip
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GLM47_TEXT_TAGS])
    return tok


def write_tokenizer_files(
    out_dir: Path, vocab_size: int, chat_template: str, seed: int = 0,
    corpus: Iterable[str] | None = None, split_digits: bool = False,
) -> dict[str, int]:
    """Train (`train_tokenizer(vocab_size, seed, corpus, split_digits)`) and write `tokenizer.json` and `tokenizer_config.json` (HF
    layout: added_tokens_decoder, eos/pad = <|endoftext|>, no BOS, `chat_template`) into `out_dir`.

    Returns {token string: id} for every entry of `GLM47_SPECIAL_TOKENS`, e.g. the generator's
    generation_config eos_token_id = ids of "<|endoftext|>", "<|user|>", "<|observation|>".
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(vocab_size, seed, corpus, split_digits)
    tok.save(str(out_dir / "tokenizer.json"))
    decoder = {
        str(i): {"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                 "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}
        for i, t in sorted(tok.get_added_tokens_decoder().items())
    }  # fmt: skip
    config = {
        "added_tokens_decoder": decoder,
        "additional_special_tokens": list(GLM47_CONTROL_TOKENS[1:]),
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "padding_side": "left",
        "remove_space": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
    (out_dir / "tokenizer_config.json").write_text(text, encoding="utf-8")
    return {t: tok.token_to_id(t) for t in GLM47_SPECIAL_TOKENS}


# Long texts encoded against a bound go a slice at a time (`FlintTokenizer._encode_slices`);
# the margin is far beyond what any allowed pre-tokenizer regex looks ahead (one character).
_SLICE_CHARS, _SLICE_MARGIN = 1 << 15, 1 << 10
# Pre-tokenizers whose splits of a text's start do not depend on its distant rest; ByteLevel
# only without add_prefix_space (a slice would gain a space), Metaspace never (it prepends).
_LOCAL_PRE_TOKENIZERS = {"Digits", "Split", "Punctuation", "Whitespace", "WhitespaceSplit",
                         "ByteLevel"}


_CUT_SLACK = 4  # tokens a cut inside a pre-token is allowed to add to a slice count


class TooManyTokens(ValueError):
    """Encoding with a bound (`most`) found more ids than it allows: `counted` ids from the
    first `chars` of `total` characters (None where not known). `exact`: the text was encoded
    whole and has exactly `counted`; else `counted` is a lower bound (`estimated`: one from
    slices cut inside a pre-token, less a slack per cut). The caller names its limit."""

    def __init__(self, counted: int, chars: int | None, total: int | None, *,
                 exact: bool = False, estimated: bool = False) -> None:
        super().__init__(f"{counted:,} tokens" if exact else f"at least {counted:,} tokens")
        self.counted, self.chars, self.total = counted, chars, total
        self.exact, self.estimated = exact, estimated


def _bounded(ids: list[int], most: int | None, total: int | None) -> list[int]:
    if most is not None and len(ids) > most:
        raise TooManyTokens(len(ids), total, total, exact=True)
    return ids


def _whole_pre_tokens(enc, size: int) -> int:
    """How many of a slice's ids (an `Encoding` of `size` characters) belong to pre-tokens
    that end at least _SLICE_MARGIN characters before the slice's end; 0 when the first
    pre-token does not. Offsets and word ids never decrease, so both are bisected."""
    past = bisect.bisect_right(enc.offsets, size - _SLICE_MARGIN, key=lambda o: o[1])
    words = enc.word_ids
    return past if past == len(words) else bisect.bisect_left(words, words[past])


def is_rust_panic(e: BaseException) -> bool:
    """Whether `e` is a Rust panic surfacing from `tokenizers` (pyo3's PanicException): a
    BaseException, not an Exception, so no `except Exception` sees it. A malformed
    tokenizer.json raises one on load or on every encode (an empty Replace pattern, a
    Precompiled charsmap that is not one), or on one text (a Split regex past Onig's retry
    limit): a bad-input trial, 2026-12-06, had them crash the CLI, end a chat and answer a
    plain-text 500."""
    return type(e).__name__ == "PanicException" and not isinstance(e, Exception)


class _PanicGuard:
    """A `tokenizers.Tokenizer` (attributes passed through) whose methods raise
    CheckpointError naming the checkpoint's tokenizer.json instead of a Rust panic. Each
    method is wrapped once, on first use, and kept (decode runs once a generated token)."""

    def __init__(self, tokenizer: Tokenizer, source: str) -> None:
        self._raw, self._source = tokenizer, source

    def __getattr__(self, name: str):
        attr = getattr(self._raw, name)
        if not callable(attr):
            return attr

        def guarded(*args, **kwargs):
            try:
                return attr(*args, **kwargs)
            except BaseException as e:
                if not is_rust_panic(e):
                    raise
                raise CheckpointError(
                    f"{self._source}: tokenizer.json's pipeline failed in {name} (a panic in "
                    f"the tokenizers library: {str(e).strip()[:300]}); the file's normalizer, "
                    "pre-tokenizer or model is malformed") from None
        setattr(self, name, guarded)  # found before __getattr__ from now on
        return guarded


def _plain_pipeline(tokenizer: Tokenizer) -> tuple[Tokenizer, bool]:
    """`tokenizer` without added tokens and post-processor (normalizer, pre-tokenizer, BPE
    only; sharing its model, so nothing is copied: a JSON round trip took 1 s at Flint's
    151,552-entry vocab), and whether a text may be encoded by slices with it: no normalizer,
    and only pre-tokenizers in _LOCAL_PRE_TOKENIZERS."""
    plain = Tokenizer(tokenizer.model)
    if tokenizer.normalizer is not None:
        plain.normalizer = tokenizer.normalizer
    pre = tokenizer.pre_tokenizer
    if pre is not None:
        plain.pre_tokenizer = pre

    def local(p: dict | None) -> bool:
        if p is None:
            return True
        if p.get("type") == "Sequence":
            return all(local(q) for q in p.get("pretokenizers", ()))
        return p.get("type") in _LOCAL_PRE_TOKENIZERS and not p.get("add_prefix_space", False)

    spec = None if pre is None else json.loads(pre.__getstate__())
    return plain, tokenizer.normalizer is None and local(spec)


# Size bounds on what a checkpoint's tokenizer files may hold, checked before reading them:
# a 2 GiB tokenizer.json took 4.5 GB of memory before its error, and a 512 MB
# chat_template.jinja loaded and then spent 73 s and 2.9 GB in its first render (a bad-input
# trial, 2026-12-06). Real ones: tokenizer.json 7-35 MB (Flint's ~20 MB), templates a few KB.
TOKENIZER_JSON_MAX_BYTES = 256 << 20
CHAT_TEMPLATE_MAX_BYTES = 4 << 20


# Added tokens become the chat prompt's markers (`prompt_segments`), whose prefixes are listed
# per render: one of 100,000 characters made every render build ~10 GB of them (a bad-input
# trial, 2026-12-07). Real ones are short tags (flint-nano's longest: 16 characters).
ADDED_TOKEN_MAX_CHARS = 256
# How many times a tokenizer.json's normalizer may lengthen a text, and its decoder a token's
# text: a Replace of "h" by 100,000 characters made a 170,000-character prompt an 11 GB
# allocation that aborted the process in Rust, and a Replace decoder of " " by 1 MB made a
# 400-token answer 109 MB (a bad-input trial, 2026-12-07). Unicode normalization grows a text
# at most 18-fold (NFKC/NFKD, e.g. U+FDFA); Flint's tokenizer has no normalizer and a
# byte-level pre-tokenizer (4-fold at most).
PIPELINE_GROWTH_MAX = 128  # NFKC (18) and a byte-level pre-tokenizer (4) together: 72
# the most characters a prompt may hold after normalization and pre-tokenization
# (`FlintTokenizer.max_text_chars`): encoding costs ~150 bytes of peak memory a character there
# (a re-trial of 2026-12-07: 2^27 would have been ~20 GB), so ~5 GB at most, reached only by
# a pipeline near PIPELINE_GROWTH_MAX and a prompt that fills it; a 262K-token prompt is ~1M
# characters, and a byte-level pre-tokenizer is taken to grow one 4-fold (8.4M allowed)
NORMALIZED_MAX_CHARS = 1 << 25
# bounds on the growth of each normalizer type without a Replace-like content (per character)
_NORMALIZER_GROWTH = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18, "Lowercase": 3,
                      "BertNormalizer": 3, "Precompiled": 18, "ByteLevel": 4, "Strip": 1,
                      "StripAccents": 1, "Nmt": 1}
# ... and of each pre-tokenizer type: ByteLevel writes a character per UTF-8 byte (4 for one
# character, and its output characters are 2 bytes each, so a chain of them grows 2-4-fold a
# pass: 24 in a Sequence made a 101-character prompt a 400 MB allocation that aborted the
# process, a re-trial of 2026-12-07); Metaspace may prepend one; the splitters add nothing
_PRE_TOKENIZER_GROWTH = {"ByteLevel": 4, "Metaspace": 2, "Split": 1, "Whitespace": 1,
                         "WhitespaceSplit": 1, "Punctuation": 1, "Digits": 1,
                         "UnicodeScripts": 1, "BertPreTokenizer": 1, "CharDelimiterSplit": 1}
# Σ len² over the added tokens: a chat render lists every prefix and suffix of each (for the
# markers cut at a string's ends), ~Σ len² / 2 characters; 1,000 tokens of 256 characters
# took 51 s and 3.6 GB at the first chat (a re-trial, 2026-12-07). flint-nano's 20 tags: 2,216
ADDED_TOKENS_SQUARED_MAX = 1 << 22


def pipeline_growth(spec: dict | None, items: str) -> tuple[float, str]:
    """(the most times the normalizer or decoder `spec` (its tokenizer.json object; `items`
    names a Sequence's list: "normalizers", "pretokenizers" or "decoders") can lengthen a text,
    the part that
    grows it most, in words). A Replace grows it by its content over its pattern's length (a
    regex pattern: content + 1, as a match may be one character or empty); Prepend by its
    string; a Sequence by the product of its parts; a decoder other than Replace not at all;
    a normalizer type not known here by 18 (`_NORMALIZER_GROWTH`), a pre-tokenizer by
    `_PRE_TOKENIZER_GROWTH` (one not known there by 4)."""
    if not isinstance(spec, dict):
        return 1.0, ""
    kind = spec.get("type")
    if kind == "Sequence":
        total, worst, top = 1.0, "", 0.0
        for part in spec.get(items) or ():
            g, why = pipeline_growth(part, items)
            total *= g
            if g > top:
                top, worst = g, why
        return total, worst
    if kind == "Replace":
        content = spec.get("content")
        content = content if isinstance(content, str) else ""
        pattern = spec.get("pattern") if isinstance(spec.get("pattern"), dict) else {}
        text = pattern.get("String")
        if isinstance(text, str) and text:
            g = max(1.0, len(content) / len(text))
            return g, f"Replace of {shown(text, 20)} by {len(content):,} characters"
        return float(len(content) + 1), f"Replace by {len(content):,} characters"
    if kind == "Prepend":
        prepend = spec.get("prepend")
        n = len(prepend) if isinstance(prepend, str) else 0
        return float(1 + n), f"Prepend of {n:,} characters"
    if items == "decoders":
        return 1.0, ""
    if items == "pretokenizers":
        return float(_PRE_TOKENIZER_GROWTH.get(kind, 4)), f"{shown(kind, 30)}"
    return float(_NORMALIZER_GROWTH.get(kind, 18)), f"{shown(kind, 30)}"


def _check_pipeline(tokenizer, source: str) -> float:
    """How many times the normalizer and pre-tokenizer together can lengthen a text
    (`pipeline_growth`); raises CheckpointError naming tokenizer.json when the normalizer, the
    pre-tokenizer, both together, or the decoder grow a text more than
    PIPELINE_GROWTH_MAX-fold."""
    grown = 1.0
    for part, items in (("normalizer", "normalizers"), ("pre_tokenizer", "pretokenizers"),
                        ("decoder", "decoders")):
        obj = getattr(tokenizer, part)
        if obj is None:
            continue
        try:
            spec = json.loads(obj.__getstate__())
        except (TypeError, ValueError, AttributeError):
            spec = None
        g, why = pipeline_growth(spec, items)
        if part != "decoder":
            g, why = grown * g, (why if g > 1 else "")
        if g > PIPELINE_GROWTH_MAX:
            what = "a token's text" if part == "decoder" else "a text"
            with_normalizer = " with the normalizer" if part == "pre_tokenizer" and grown > 1 \
                else ""
            raise CheckpointError(f"{source}: tokenizer.json {part}{with_normalizer}: can "
                                  f"lengthen {what} up to {g:,.0f}-fold ({why}); at most "
                                  f"{PIPELINE_GROWTH_MAX}-fold is accepted (Unicode "
                                  "normalization: 18-fold at most, a byte-level pre-tokenizer 4)")
        if part != "decoder":
            grown = g
    return grown


def _read_capped_text(path: Path, max_bytes: int, encoding: str) -> str:
    """The text of the regular file `path` (checked by the caller), read only up to
    `max_bytes` + 1 bytes. Raises CheckpointError naming the file when it is larger, cannot be
    read or is not UTF-8."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e.strerror})") from None
    if len(data) > max_bytes:
        raise CheckpointError(f"{path}: larger than {max_bytes >> 20} MiB, the most a "
                              f"checkpoint's {path.name} may hold")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {e.start})") from None


class FlintTokenizer:
    """A GLM-style tokenizer: `tokenizers.Tokenizer` plus its HF tokenizer_config.

    Ids are int in [0, vocab_size). Decoding skips the added tokens flagged special and every
    control token (roles, [gMASK], <sop>, <|endoftext|>) but always keeps the think/tool tags,
    whatever their flag in tokenizer.json: the output parser must see them (glm47-format.md).
    Ids at or above `vocab_size` (a padded LM head's extra rows) decode to nothing.
    """

    def __init__(self, tokenizer: Tokenizer, config: dict, chat_template: str | None = None,
                 source: str = "<memory>", template_file: str | None = None) -> None:  # fmt: skip
        tokenizer = _PanicGuard(tokenizer, source)
        self._tok = tokenizer
        self._source = source
        self._chat_template = chat_template
        # the file the chat template was read from (chat_template.jinja or
        # tokenizer_config.json), which its errors name; None when given in memory
        self.template_file = template_file
        vocab = tokenizer.get_vocab(with_added_tokens=True)
        missing = [t for t in _CHAT_TOKENS if t not in vocab]
        if missing:
            raise CheckpointError(f"{source}: tokenizer.json lacks the GLM-4.7 tokens {missing} "
                                  "(each must be one added token)")  # fmt: skip
        self._vocab_size = max(vocab.values()) + 1
        for i, t in sorted(tokenizer.get_added_tokens_decoder().items()):
            if len(t.content) > ADDED_TOKEN_MAX_CHARS:
                raise CheckpointError(
                    f"{source}: tokenizer.json added token {i} is {len(t.content):,} "
                    f"characters ({shown(t.content, 40)}); an added token (a control token or "
                    f"tag) may have at most {ADDED_TOKEN_MAX_CHARS}")
        squares = sum(len(t.content) ** 2 for t in tokenizer.get_added_tokens_decoder().values())
        if squares > ADDED_TOKENS_SQUARED_MAX:
            n = len(tokenizer.get_added_tokens_decoder())
            raise CheckpointError(
                f"{source}: tokenizer.json's {n:,} added tokens are too long together (the "
                f"sum of their squared lengths is {squares:,}; at most "
                f"{ADDED_TOKENS_SQUARED_MAX:,}): each becomes a marker a chat prompt is "
                "searched for")
        # a prompt of n characters is at most n * growth after normalization and pre-tokenizing
        self.text_growth = _check_pipeline(tokenizer, source)
        # no token stands for more characters than this (byte-level BPE: one character per
        # byte), so a text of n characters has at least n / max_token_chars tokens
        self.max_token_chars = max(1, max(len(t) for t in vocab))
        _check_added_ids(tokenizer, config, source)
        eos = config.get("eos_token", EOS_TOKEN)
        eos = eos.get("content") if isinstance(eos, dict) else eos  # HF allows {"content": ...}
        if not isinstance(eos, str):
            raise CheckpointError(f"{source}: tokenizer_config.json eos_token: expected a token "
                                  f"string, found {shown(eos)}")  # fmt: skip
        self._eos_id = self.token_id(eos)
        flagged = {i for i, t in tokenizer.get_added_tokens_decoder().items()
                   if t.special and t.content not in GLM47_TEXT_TAGS}  # fmt: skip
        self._skip_ids = frozenset(flagged | {vocab[t] for t in GLM47_CONTROL_TOKENS if t in vocab})
        self.special_ids = {t: vocab[t] for t in GLM47_SPECIAL_TOKENS if t in vocab}
        # Every added token (control, tag or other) by its text, for chat prompts' scaffolding;
        # longest first, so the pattern finds them leftmost-longest as `tokenizers` does.
        self._added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()
                       if t.content}  # fmt: skip
        self._added_re = re.compile("|".join(re.escape(t) for t in sorted(self._added, key=len,
                                                                          reverse=True)) or "(?!)")
        plain, self._sliceable = _plain_pipeline(tokenizer)
        self._plain = _PanicGuard(plain, source)
        # `tokenizers` matches an added token by its exact text unless a flag widens the match
        # (lstrip / rstrip / single_word) or the normalizer runs first: then encode_segments
        # of a raw text gives `encode`'s ids, bounded
        self._plain_added = self._sliceable and not any(
            t.lstrip or t.rstrip or t.single_word
            for t in tokenizer.get_added_tokens_decoder().values())

    @classmethod
    def from_dir(cls, path: str | Path) -> FlintTokenizer:
        """Load `tokenizer.json` + `tokenizer_config.json` from a checkpoint directory.

        The chat template comes from `chat_template.jinja` when present (newer HF layout), else
        tokenizer_config's "chat_template" (a string, or a list of {name, template} using
        "default"). Raises CheckpointError naming the file if one is missing or malformed, or if
        a GLM-4.7 chat token is absent.
        """
        path = Path(path)
        config = read_json_object(path / "tokenizer_config.json", CheckpointError,
                                  "file not found (a tokenizer directory needs it)")
        tok_path = path / "tokenizer.json"
        problem = file_problem(tok_path)
        if problem is not None:
            raise CheckpointError(f"{tok_path}: {problem} (a tokenizer directory needs this "
                                  "file)")
        text = _read_capped_text(tok_path, TOKENIZER_JSON_MAX_BYTES, "utf-8-sig")
        try:
            # "utf-8-sig": a byte-order mark (some Windows editors write one) is no part of the
            # JSON, as for the checkpoint's other JSON files (it was "expected value at line 1")
            tok = Tokenizer.from_str(text)
        except BaseException as e:  # a bare Exception for bad JSON or schema, or a panic
            if not (isinstance(e, Exception) or is_rust_panic(e)):
                raise
            raise CheckpointError(f"{tok_path}: not a valid tokenizers file "
                                  f"({str(e).strip()[:300]})") from None
        del text
        template = config.get("chat_template")
        if isinstance(template, list):
            named = {d.get("name"): d.get("template") for d in template if isinstance(d, dict)}
            if "default" not in named:  # it said "has no chat_template", though one was there
                names = [shown(n, 30) for n in named if n is not None]
                raise CheckpointError(
                    f"{path / 'tokenizer_config.json'}: chat_template is a list of "
                    f"{len(template)} entries and none is named \"default\" (the one used; "
                    f"{'names found: ' + ', '.join(names[:8]) if names else 'no entry has a name'}"
                    "); expected [{\"name\": \"default\", \"template\": \"...\"}, ...]")
            template = named.get("default")
        jinja_path = path / "chat_template.jinja"
        problem = file_problem(jinja_path)
        if problem not in (None, MISSING):  # else tokenizer_config's was used in silence
            raise CheckpointError(f"{jinja_path}: {problem}; expected the chat template as a "
                                  "text file, or no such file (tokenizer_config.json's "
                                  "chat_template is used then)")
        template_file = path / "tokenizer_config.json"
        if problem is None:
            template = _read_capped_text(jinja_path, CHAT_TEMPLATE_MAX_BYTES, "utf-8")
            template_file = jinja_path
        if template is not None and not isinstance(template, str):
            raise CheckpointError(f"{path / 'tokenizer_config.json'}: chat_template: expected a "
                                  f"string, found {json_kind(template)}")  # fmt: skip
        if template is not None and len(template) > CHAT_TEMPLATE_MAX_BYTES:
            raise CheckpointError(f"{template_file}: chat_template holds {len(template):,} "
                                  f"characters; at most {CHAT_TEMPLATE_MAX_BYTES >> 20} MiB")
        return cls(tok, config, template, source=str(path),
                   template_file=None if template is None else str(template_file))

    @property
    def max_text_chars(self) -> int:
        """The most characters a text to encode may hold: NORMALIZED_MAX_CHARS over the
        normalizer's and pre-tokenizer's growth (`pipeline_growth`: 8,388,608 for a byte-level
        pre-tokenizer alone, as Flint's)."""
        return int(NORMALIZED_MAX_CHARS // self.text_growth)

    @property
    def vocab_size(self) -> int:
        """One past the largest id the tokenizer knows (BPE vocab plus added tokens)."""
        return self._vocab_size

    @property
    def chat_template(self) -> str:
        """The Jinja chat template; CheckpointError if the checkpoint ships none."""
        if self._chat_template is None:
            raise CheckpointError(f"{self._source}: tokenizer_config.json has no chat_template "
                                  "(and there is no chat_template.jinja)")  # fmt: skip
        return self._chat_template

    def token_id(self, name: str) -> int:
        """Id of the single token `name` (e.g. "<|user|>"); CheckpointError if absent."""
        tid = self._tok.token_to_id(name)
        if tid is None:
            raise CheckpointError(f"{self._source}: tokenizer has no token {name!r}")
        return tid

    @property
    def eos_id(self) -> int:
        """Id of tokenizer_config's eos_token (GLM: <|endoftext|>)."""
        return self._eos_id

    @property
    def chat_stop_ids(self) -> tuple[int, ...]:
        """Ids that end an assistant turn: <|endoftext|>, <|user|>, <|observation|>."""
        return tuple(self.special_ids[t] for t in CHAT_STOP_TOKENS)

    def word_pieces(self, leading_space: bool = False) -> tuple[str, ...]:
        """The vocabulary's lower-case ASCII word pieces of 2+ letters, without the leading
        space a piece may carry (" ano" and "ano" are both "ano"), sorted. With
        `leading_space`, only the pieces that are a token with a leading space (" ano"): the
        ones a word after a space starts with. flint-nano's curriculum coins words from them so
        that copying is trained on every such token."""
        out = set()
        for i in range(self._tok.get_vocab_size()):
            t = self._tok.decode([i], skip_special_tokens=False)
            s = t.strip()
            if leading_space and t != " " + s:
                continue
            if len(s) >= 2 and s.isascii() and s.isalpha() and s.islower():
                out.add(s)
        return tuple(sorted(out))

    def encode(self, text: str, most: int | None = None) -> list[int]:
        """Ids of `text`; adds no BOS (the chat template writes [gMASK]<sop>). Added-token strings
        in the text (e.g. "<|user|>") become their single ids. With `most`, raises TooManyTokens
        once the ids pass it, having read only about as much of the text as that takes
        (`encode_text`, between the added tokens). Runs without the GIL."""
        if most is not None and self._added_re.search(text) is None:
            return self.encode_text(text, most)
        if most is not None and self._plain_added:  # the added tokens are matched as exact
            return self.encode_segments([(text, False)], most)  # text: the same ids
        return _bounded(self._tok.encode_batch([text], add_special_tokens=False)[0].ids, most,
                        len(text))

    @property
    def added_tokens(self) -> tuple[str, ...]:
        """The text of every added token (GLM-4.7's control tokens and tags among them)."""
        return tuple(self._added)

    def encode_text(self, text: str, most: int | None = None) -> list[int]:
        """Ids of `text` as ordinary text: no added token is matched, so "<|user|>" becomes the
        ids of its characters. The tokenizer's own pipeline minus its added-token pass and
        post-processor (normalizer, pre-tokenizer, model), so text without added-token strings
        gets exactly the ids `encode` gives it. Runs without the GIL (`encode_batch`), so a long
        prompt does not stall the server's event loop or the engine thread.

        With `most`, raises TooManyTokens as soon as the ids pass it: a long text is then
        encoded a slice at a time (`_encode_slices`), so a prompt far over the context limit is
        refused after about `most` tokens' worth of work, not all of it."""
        if most is None or len(text) <= _SLICE_CHARS or not self._sliceable:
            return _bounded(self._plain.encode_batch([text], add_special_tokens=False)[0].ids,
                            most, len(text))
        return self._encode_slices(text, most)

    def _encode_slices(self, text: str, most: int) -> list[int]:
        # Each slice starts on a pre-token boundary of the whole text and keeps the ids of the
        # pre-tokens that end at least _SLICE_MARGIN characters before its end: the
        # pre-tokenizers allowed here (`_plain_pipeline`) split by regexes that look at most a
        # character past a match, so those pre-tokens (and their BPE ids) are the whole text's.
        # A slice inside one pre-token (a run of letters, CJK or spaces longer than the margin
        # allows) has no such cut: from there on the slices are cut anyway and only counted,
        # less _CUT_SLACK per cut (a cut changes a BPE count by a token or two), to refuse a
        # text far over the bound; one under it is then encoded exactly from that point.
        ids: list[int] = []
        pos, n = 0, len(text)
        rough_from, rough, cuts = None, 0, 0
        while pos < n:
            end = min(n, pos + _SLICE_CHARS)
            enc = self._plain.encode_batch([text[pos:end]], add_special_tokens=False)[0]
            if end == n and rough_from is None:
                return _bounded(ids + enc.ids, most, n)
            keep = 0 if rough_from is not None or end == n else _whole_pre_tokens(enc, end - pos)
            if keep and enc.offsets[keep - 1][1] > 0:
                ids += enc.ids[:keep]
                pos += enc.offsets[keep - 1][1]
            else:
                rough_from = pos if rough_from is None else rough_from
                rough, cuts, pos = rough + len(enc.ids), cuts + 1, end
            counted = len(ids) + rough - _CUT_SLACK * cuts
            if counted > most:
                raise TooManyTokens(counted, pos, n, estimated=cuts > 0)
        if rough_from is None:
            return _bounded(ids, most, n)
        rest = self._plain.encode_batch([text[rough_from:]], add_special_tokens=False)[0]
        return _bounded(ids + rest.ids, most, n)

    def encode_segments(self, segments: Iterable[tuple[str, bool]],
                        most: int | None = None) -> list[int]:
        """Ids of a chat prompt given as (text, is_data) segments (`prompt_segments.Segment`):
        added-token text in scaffolding (is_data False) becomes the token's id; data is ordinary
        text (`encode_text`). Text between two scaffolding tokens is encoded as one run, data
        included, so a prompt whose data holds no added-token text gets exactly the ids
        `encode` gives the joined text. Added tokens are matched as exact text (the lstrip /
        rstrip / single_word flags of tokenizer.json are not applied; GLM tokenizers set none).
        With `most`, raises TooManyTokens once the ids pass it (`encode_text`)."""
        ids: list[int] = []
        run: list[str] = []  # ordinary text since the last scaffolding token
        for text, data in segments:
            pos = 0
            for m in () if data else self._added_re.finditer(text):
                run.append(text[pos : m.start()])
                ids += self._run_ids("".join(run), most, len(ids))
                ids.append(self._added[m.group()])
                run, pos = [], m.end()
            run.append(text[pos:])
        ids += self._run_ids("".join(run), most, len(ids))
        return _bounded(ids, most, None)

    def _run_ids(self, text: str, most: int | None, before: int) -> list[int]:
        if most is None:
            return self.encode_text(text)
        try:
            return self.encode_text(text, max(0, most - before))
        except TooManyTokens as e:  # a lower bound: later segments were not counted
            raise TooManyTokens(before + e.counted, None, None, estimated=e.estimated) from None

    def token_bytes(self, tid: int) -> bytes:
        """The bytes token `tid` stands for, which for a byte-level BPE token may be part of a
        UTF-8 character (logprobs report them: joined they rebuild the text): an added token's
        text; a vocabulary piece through the byte-level alphabet; anything else (a tokenizer
        that is not byte-level) its decoded text. b"" for an id the tokenizer lacks."""
        piece = self._tok.id_to_token(int(tid))
        if piece is None:
            return b""
        if piece in self._added:
            return piece.encode("utf-8")
        try:
            return bytes(_BYTE_OF_CHAR[c] for c in piece)
        except KeyError:
            return self._tok.decode([int(tid)], skip_special_tokens=False).encode("utf-8")

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of `ids`. With skip_special, control tokens are dropped and tags kept. Bytes that
        do not form valid UTF-8 (e.g. a character cut at the end) come out as U+FFFD."""
        size = self._vocab_size
        skip = self._skip_ids if skip_special else frozenset()
        kept = [i for i in ids if 0 <= i < size and i not in skip]
        return self._tok.decode(kept, skip_special_tokens=False)


class IncrementalDetokenizer:
    """Streams the text of generated ids: one `push` per sampled id, then `flush()` at the end.

    The rule: the concatenated pushes plus `flush()` equal decode(prompt + output) with its
    longest common prefix with decode(prompt) removed. Decoding shows an incomplete UTF-8
    character as U+FFFD, and text before such a character decodes the same whatever follows, so
    the two decodes differ only from the prompt's trailing U+FFFD run on. That gives:

    - A character the prompt leaves incomplete belongs to the output once the output completes
      it (prompt "Hi " + F0 9F, output 8C B6 "!" gives "🌶!").
    - If the output does not complete it (EOS first, other text, bytes that break it), it never
      appears: that U+FFFD is the prompt's (prompt + EOS gives "", prompt + "abc" gives "abc").
    - A character the output itself leaves incomplete at the end (max_tokens or an abort cut it
      short) is flushed as U+FFFD, as decode(output) shows it: the text shows that something was
      cut, and no byte the model generated vanishes without trace.

    `push` never emits a U+FFFD that later bytes could still complete: while the window's text
    ends in one it holds all new text back. Control tokens never appear; think and tool-call
    tags do. Known limit: output bytes that complete the prompt's partial character into a
    literal U+FFFD (EF BF + BD) look like the prompt's own U+FFFD and are dropped.
    """

    _CONTEXT_TOKENS = 5  # prompt tokens decoded ahead of the output, for decoders that join

    def __init__(self, tokenizer: FlintTokenizer, prompt_ids: Sequence[int]) -> None:
        self._tok = tokenizer
        self._ids = list(prompt_ids)
        self._read = len(self._ids)  # ids before this are accounted for (prompt or emitted)
        self._prefix = max(self._read - self._CONTEXT_TOKENS, 0)  # decoding window start
        # The text of ids[prefix:read]. A prompt's trailing U+FFFD stays in it, so the common
        # prefix rule drops that U+FFFD from the output unless the output completes the character.
        self._prefix_text = tokenizer.decode(self._ids[self._prefix :])

    def push(self, token_id: int) -> str:
        """Add one generated id; return the newly completed text ("" while a character may still
        be incomplete, or when the id adds no text, e.g. a skipped control token)."""
        self._ids.append(int(token_id))
        text = self._tok.decode(self._ids[self._prefix :])
        if text.endswith("\ufffd"):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """End of stream: return the text held back. An incomplete character of the output's
        own comes out as U+FFFD; one the prompt left incomplete and the output never completed
        does not appear. Calling it again returns ""."""
        return self._advance(self._tok.decode(self._ids[self._prefix :]))

    def _advance(self, text: str) -> str:
        # Both texts decode the same ids from the same start, so the accounted text's common
        # prefix with `text` is what was shown (or is the prompt's); the rest is new.
        n = 0
        for a, b in zip(text, self._prefix_text):
            if a != b:
                break
            n += 1
        new = text[n:]
        if new:
            self._prefix, self._read = self._read, len(self._ids)
            self._prefix_text = self._tok.decode(self._ids[self._prefix : self._read])
        return new


def _check_added_ids(tokenizer: Tokenizer, config: dict, source: str) -> None:
    """Refuse a tokenizer.json whose added tokens sit at other ids than tokenizer_config.json's
    `added_tokens_decoder` says (issue 26: a tokenizer.json missing one added token shifted
    every later one, `<|user|>` 1011 -> 1010, so the template's and generation_config's ids
    named other tokens). CheckpointError naming both files, the token and both ids."""
    decoder = config.get("added_tokens_decoder")
    if decoder is None:
        return
    if not isinstance(decoder, dict):
        raise CheckpointError(f"{source}: tokenizer_config.json added_tokens_decoder: expected "
                              f"an object of id -> token, found {json_kind(decoder)}")
    for key, entry in decoder.items():
        content = entry.get("content") if isinstance(entry, dict) else None
        if not (isinstance(key, str) and key.isdigit() and isinstance(content, str)):
            raise CheckpointError(f"{source}: tokenizer_config.json added_tokens_decoder entry "
                                  f"{str(key)[:40]!r}: expected a decimal id -> {{'content': "
                                  "str}")
        at = tokenizer.token_to_id(content)
        if at != int(key):
            shown = content if len(content) <= 40 else content[:40] + "…"
            where = f"id {at}" if at is not None else "no id at all"
            raise CheckpointError(f"{source}: tokenizer.json has the added token {shown!r} at "
                                  f"{where}, tokenizer_config.json's added_tokens_decoder at "
                                  f"{key}: the two files disagree (a token missing from one "
                                  "shifts every later id)")


def _byte_level_alphabet() -> dict[str, int]:
    """Character -> byte of the byte-level BPE alphabet (GPT-2's, which GLM tokenizers and
    `pre_tokenizers.ByteLevel` use): the printable Latin-1 bytes stand for themselves, the
    other 68 bytes for the code points from 256 up, in byte order."""
    visible = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {chr(b): b for b in visible}
    extra = 0
    for b in range(256):
        if b not in out.values():
            out[chr(256 + extra)] = b
            extra += 1
    return out


_BYTE_OF_CHAR = _byte_level_alphabet()
