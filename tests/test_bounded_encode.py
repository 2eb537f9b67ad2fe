"""Encoding against a token bound (the bad-input trial of 2026-12-04): eight concurrent chat
prompts just under the character bound were each refused correctly, but only after ~25 s of
tokenising them whole, and `/health` stalled up to 18.6 s meanwhile (`tokenizers`' `encode`
holds the GIL). Bounded encoding now stops once the ids pass the bound, slice by slice, and every
encode runs without the GIL. The sliced ids must be exactly the whole text's."""

import json
import random
import threading
import time
from pathlib import Path

import pytest
from tokenizers import Tokenizer

import flint_graph.chat.tokenizer as tk
from flint_graph.chat.chat_template import GLM47_CHAT_TEMPLATE
from flint_graph.chat.prompt_segments import Segment
from flint_graph.chat.tokenizer import FlintTokenizer, TooManyTokens, write_tokenizer_files
from flint_graph.errors import ContextLengthError
from flint_graph.runtime.sampling import SamplingParams

NANO = Path(__file__).resolve().parents[1] / "nano" / "flint-nano"
# Runs that put pre-token boundaries at every kind of place: long letter, digit and space runs
# (longer than a slice), newlines, multi-byte characters, contractions, punctuation.
PIECES = ("hello", " world", "Paris", "\n", "\n\n", "  ", "   \n ", "123", "4" * 700, "x" * 900,
          " " * 600, "é", "你好", "龘", "🦀", "'s", "'ll", "!!", "?!", ".", "Zürich", "\t",
          "print('hi')", '{"a": 1}')  # fmt: skip


@pytest.fixture(scope="module", params=["synthetic", "flint-nano"])
def tok(request, tmp_path_factory):
    if request.param == "flint-nano":
        return FlintTokenizer.from_dir(NANO)
    path = tmp_path_factory.mktemp("tok")
    write_tokenizer_files(path, 1024, GLM47_CHAT_TEMPLATE, seed=0)
    return FlintTokenizer.from_dir(path)


@pytest.fixture
def small_slices(monkeypatch):
    """Slices of 256 characters with a 32-character margin: many cuts in a short text."""
    monkeypatch.setattr(tk, "_SLICE_CHARS", 256)
    monkeypatch.setattr(tk, "_SLICE_MARGIN", 32)


def text_of(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(PIECES) for _ in range(n))


@pytest.mark.parametrize("seed", range(6))
def test_sliced_ids_are_the_whole_texts(tok, small_slices, seed):
    assert tok._sliceable
    text = text_of(seed, 600)
    whole = tok.encode_text(text)
    assert tok.encode_text(text, most=len(whole)) == whole
    assert tok.encode(text, most=len(whole)) == tok.encode(text) == whole


def test_the_bound_is_exact(tok, small_slices):
    text = text_of(7, 400)
    n = len(tok.encode_text(text))
    assert len(tok.encode_text(text, most=n)) == n
    with pytest.raises(TooManyTokens) as e:
        tok.encode_text(text, most=n - 1)
    assert e.value.counted >= n and e.value.total == len(text)


def test_a_text_far_over_the_bound_is_read_only_in_part(tok):
    text = text_of(8, 60_000)  # about 3 MB, default slices
    with pytest.raises(TooManyTokens) as e:
        tok.encode_text(text, most=4096)
    assert 4096 < e.value.counted and e.value.chars < len(text) // 20 == e.value.total // 20


@pytest.mark.parametrize("run", ["x", "你", " ", "!", "ab", "7"])
def test_a_text_of_one_long_pre_token_is_refused_after_part_of_it(tok, run):
    """The bad-input trial (2026-12-04, after the first fix): a run without word breaks
    ("你" * 1,376,000) has no pre-token boundary to slice at, so it was encoded whole (70 s for
    eight at once). Such slices are now cut anyway and counted, less a slack per cut."""
    text = run * (400_000 // len(run))
    with pytest.raises(TooManyTokens) as e:
        tok.encode_text(text, most=8192)
    assert e.value.counted > 8192 and e.value.chars < len(text) // 4, vars(e.value)
    assert e.value.estimated or run == "7"  # digits split one by one: every slice has cuts


@pytest.mark.parametrize("run", ["x", "你", " "])
def test_a_long_pre_token_under_the_bound_is_encoded_exactly(tok, small_slices, run):
    text = "hello " * 50 + run * 2000 + " world" * 50
    whole = tok.encode_text(text)
    assert tok.encode_text(text, most=len(whole)) == whole
    with pytest.raises(TooManyTokens):
        tok.encode_text(text, most=len(whole) - 1)


def test_a_text_with_added_token_strings_is_bounded_too(tok):
    text = "<|user|>" + text_of(9, 2_000) + "<|assistant|><think>" + text_of(10, 500)
    n = len(tok.encode(text))
    assert tok.encode(text, most=n) == tok.encode(text)
    with pytest.raises(TooManyTokens):
        tok.encode(text, most=n - 1)
    far = "<|user|>" + "x y " * 400_000  # refused after part of it, as without the marker
    with pytest.raises(TooManyTokens) as e:
        tok.encode(far, most=4096)
    assert e.value.counted > 4096 and e.value.chars is None


def test_chat_segments_are_bounded_across_runs(tok, small_slices):
    segments = [Segment("[gMASK]<sop><|user|>", False), Segment(text_of(10, 300), True),
                Segment("<|assistant|>", False), Segment(text_of(11, 300), True)]
    ids = tok.encode_segments(segments)
    assert tok.encode_segments(segments, most=len(ids)) == ids
    with pytest.raises(TooManyTokens) as e:
        tok.encode_segments(segments, most=len(ids) - 1)
    assert e.value.counted >= len(ids)


@pytest.mark.parametrize("change", ["normalizer", "metaspace", "prefix_space"])
def test_a_tokenizer_that_cannot_be_sliced_encodes_whole(tok, small_slices, change, tmp_path):
    """A normalizer, a Metaspace pre-tokenizer or ByteLevel's add_prefix_space make a slice's
    start encode unlike the same text inside the whole: such tokenizers are encoded whole."""
    spec = json.loads(tok._tok.to_str())
    if change == "normalizer":
        spec["normalizer"] = {"type": "NFC"}
    elif change == "metaspace":
        spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁",
                                 "prepend_scheme": "always", "split": True}
    else:
        spec["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": True,
                                 "trim_offsets": True, "use_regex": True}
    plain, sliceable = tk._plain_pipeline(Tokenizer.from_str(json.dumps(spec)))
    assert not sliceable


def test_encoding_lets_other_threads_run(tok):
    """`encode_batch` releases the GIL (`encode` held it: an event loop thread stalled for the
    whole encode). A thread ticking every ms meanwhile never waits half the encode's time."""
    text = "The weather in Zürich is 21 degrees, 你好! " * 20_000  # ~1 s to encode here
    gaps, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            t = time.perf_counter()
            time.sleep(0.001)
            gaps.append(time.perf_counter() - t)

    ticker = threading.Thread(target=tick)
    ticker.start()
    t0 = time.perf_counter()
    tok.encode(text)
    tok.encode_text(text)
    took = time.perf_counter() - t0
    stop.set()
    ticker.join()
    assert max(gaps) < took / 2, (max(gaps), took)


def test_an_llm_refuses_a_prompt_over_the_limit_after_reading_part_of_it(tiny_llm):
    """Under the character bound (so it reaches the tokenizer), far over the token limit."""
    limit = tiny_llm.engine.context_limit
    text = "ab 12 " * (limit * 3)
    assert len(text) < limit * tiny_llm.tokenizer.max_token_chars
    with pytest.raises(ContextLengthError, match=r"at least [\d,]+ tokens \(counted in its "
                                                 r"first [\d,]+ of [\d,]+ characters\); the "
                                                 r"context limit is 4,096 tokens"):
        tiny_llm.generate([text], SamplingParams(max_tokens=1))
    with pytest.raises(ContextLengthError, match=r"at least [\d,]+ tokens.*4,096 tokens"):
        tiny_llm.chat([{"role": "user", "content": text}])


def test_an_llm_still_runs_a_prompt_just_under_the_limit(tiny_llm):
    limit = tiny_llm.engine.context_limit
    ids = tiny_llm.tokenizer.encode("hello " * limit)[: limit - 1]
    text = tiny_llm.tokenizer.decode(ids, False)
    assert len(tiny_llm.tokenizer.encode(text)) == limit - 1
    out = tiny_llm.generate([text], SamplingParams(max_tokens=1))[0]
    assert len(out.token_ids) == 1
