"""Stop strings over streamed text (StopChecker) and per-token finish checks (check_token).

The oracle for StopChecker is a brute-force scan of the whole text: the first character index at
which some stop string ends (the longest one if several end there). Every chunking must give
exactly that output, and no push may emit text past the start of the match.
"""

import random
import re

import pytest

from flint_graph.errors import InvalidRequestError
from flint_graph.runtime.sampling import SamplingParams
from flint_graph.runtime.stopping import RepeatDetector, StopChecker, check_token

# Overlapping, self-overlapping and tag-like stops: the cases where a naive hold-back fails.
STOPS = ["<|user|>", "<|observation|>", "aab", "abab", "ba", "STOP", "é中"]


def reference(text: str, stop: list[str]) -> tuple[str, str | None]:
    for end in range(len(text) + 1):
        for s in sorted(stop, key=len, reverse=True):
            if text[:end].endswith(s):
                return text[:end - len(s)], s
    return text, None


def chunkings(text: str, rng: random.Random) -> list[list[str]]:
    per_char = list(text)
    groups, i = [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        groups.append(text[i:i + n])
        i += n
    with_empty = [c for ch in per_char for c in (ch, "")]
    return [[text], per_char, groups, with_empty]


def stream(chunks: list[str], stop: list[str]) -> tuple[str, str | None, list[str]]:
    checker = StopChecker(stop)
    pieces = [checker.push(c) for c in chunks]
    if not checker.stopped:
        pieces.append(checker.flush())
    return "".join(pieces), checker.matched, pieces


@pytest.mark.parametrize("stop", [STOPS, ["aab"], ["abab", "ba"], ["abcd", "bc", "c"],
                                  ["<|user|>"], ["x"]])
def test_every_chunking_matches_reference(stop):
    rng = random.Random(1234)
    # Draw from the stops' own characters so overlaps and near-misses are frequent.
    alphabet = sorted(set("".join(stop) + "x "))
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        want_text, want_match = reference(text, stop)
        for chunks in chunkings(text, rng):
            got_text, got_match, pieces = stream(chunks, stop)
            assert (got_text, got_match) == (want_text, want_match), (text, chunks)
            # Streaming is append-only, so every emitted prefix must be a prefix of the answer:
            # nothing past the start of a stop string that completes later was ever shown.
            emitted = ""
            for p in pieces:
                emitted += p
                assert want_text.startswith(emitted), (text, chunks, emitted)


def test_stop_string_spanning_many_deltas_is_never_partly_streamed():
    checker = StopChecker(["<|observation|>"])
    assert checker.push("Calling the tool") == "Calling the tool"
    out = [checker.push(c) for c in "<|observ"]
    assert "".join(out) == ""  # every piece could still grow into the stop string
    assert checker.push("ation|>trailing") == ""
    assert checker.stopped and checker.matched == "<|observation|>"
    assert checker.push("more") == "" and checker.flush() == ""


def test_hold_back_is_released_when_the_prefix_breaks_off():
    checker = StopChecker(["<|user|>"])
    assert checker.push("a <|us") == "a "
    assert checker.push("ed") == "<|used"
    assert checker.push("<|") == ""
    assert checker.flush() == "<|"
    assert not checker.stopped and checker.matched is None


def test_earliest_ending_match_wins_and_text_before_it_is_returned():
    checker = StopChecker(["abcd", "bc"])
    assert checker.push("xxabcd") == "xxa"
    assert checker.matched == "bc"
    checker = StopChecker(["c", "abc"])  # both end at the same character: the longer wins
    assert checker.push("zabc") == "z" and checker.matched == "abc"


def test_no_stop_strings_passes_text_through():
    checker = StopChecker([])
    assert [checker.push(c) for c in ("a", "<|", "b")] == ["a", "<|", "b"]
    assert checker.flush() == ""


@pytest.mark.parametrize("bad, match", [
    ([""], 'found ""'), (["ok", ""], 'found ""'), ([3], "found integer"),
    (b"x", "expected a string or a list of strings, found bytes"),  # not "found 120"
    ([b"x"], "found bytes")])
def test_stop_checker_rejects_bad_stop_strings(bad, match):
    with pytest.raises(InvalidRequestError, match=f"stop: .*{match}"):
        StopChecker(bad)


@pytest.mark.parametrize("bad, match", [(b"x", "expected a list of strings, found b'x'"),
                                        ([b"x"], "expected non-empty strings, found b'x'")])
def test_sampling_params_name_bytes_as_bytes(bad, match):
    with pytest.raises(InvalidRequestError, match=re.escape(match)):
        SamplingParams(stop=bad)


EOS = [7, 8]


@pytest.mark.parametrize(
    "token, n, kwargs, want",
    [
        (7, 1, {}, "stop"),  # EOS as the very first token
        (8, 4, {}, "stop"),
        (5, 4, {}, None),
        (7, 3, {"min_tokens": 3}, None),  # only 2 tokens before it: too early
        (7, 4, {"min_tokens": 3}, "stop"),  # 3 tokens before it
        (5, 5, {"max_tokens": 5}, "length"),
        (5, 4, {"max_tokens": 5}, None),
        (7, 5, {"max_tokens": 5}, "stop"),  # the last allowed token is EOS: a real stop
        (7, 5, {"max_tokens": 5, "min_tokens": 5}, "length"),  # EOS ignored under min_tokens
        (7, 2, {"ignore_eos": True}, None),
        (7, 9, {"ignore_eos": True, "max_tokens": 9}, "length"),
        (3, 2, {"ignore_eos": True, "stop_token_ids": [3]}, "stop"),  # explicit ids still stop
        (3, 2, {"stop_token_ids": [3]}, "stop"),
        (3, 2, {"stop_token_ids": [3], "min_tokens": 2}, None),
    ],
)
def test_check_token(token, n, kwargs, want):
    assert check_token(token, n, SamplingParams(**kwargs), EOS) == want


def test_check_token_with_checkpoint_defaults():
    gen = {"eos_token_id": [7, 8], "temperature": 1.0}
    params = SamplingParams(max_tokens=4).with_defaults(gen)
    # The API passes the resolved stop_token_ids as eos_ids; both routes must agree.
    for eos_ids in (EOS, list(params.stop_token_ids)):
        assert [check_token(t, i + 1, params, eos_ids) for i, t in enumerate([1, 2, 8])] == [
            None, None, "stop"]
        assert check_token(1, 4, params, eos_ids) == "length"
    quiet = SamplingParams(ignore_eos=True).with_defaults(gen)
    assert check_token(8, 3, quiet, list(quiet.stop_token_ids)) is None


# -- stop_on_repeat (issue 25: a run that repeats itself can be stopped) ---------------------


def _first_stop(window: int, ids: list[int]) -> int | None:
    det = RepeatDetector(window)
    return next((i for i, t in enumerate(ids) if det.push(t)), None)


def _periodic_tail(ids: list[int], window: int) -> bool:
    """Brute force: the last `window` ids are one block of p <= min(window // 4, 32) ids
    repeated."""
    tail = ids[-window:]
    return len(tail) == window and any(all(tail[i] == tail[i - p] for i in range(p, window))
                                       for p in range(1, min(window // 4, 32) + 1))


@pytest.mark.parametrize("ids, window, want", [
    ([7] * 20, 8, 7),  # "dddd…": the 8th identical id completes the window
    ([1, 2] * 10, 8, 7),  # "rerere…"
    ([5, 6, 7, 8, 9] * 8, 20, 19),  # a 5-id phrase, four times
    ([5, 6, 7, 8, 9] * 3 + [5, 6, 7, 8], 20, None),  # under four repeats: goes on
    (list(range(100)), 8, None),  # no loop
    ([3, 4, 3, 4, 3, 4, 3, 9] + [1] * 7, 8, None),  # a loop broken just in time
])
def test_a_loop_is_stopped_when_the_window_holds_four_repeats(ids, window, want):
    assert _first_stop(window, ids) == want


@pytest.mark.parametrize("seed", range(30))
def test_the_incremental_detector_agrees_with_brute_force(seed):
    rng = random.Random(seed)
    window = rng.choice([8, 12, 16, 33, 200])
    block = [rng.randrange(4) for _ in range(rng.randint(1, window // 4 + 2))]
    ids = [rng.randrange(4) for _ in range(rng.randint(0, 20))] + block * rng.randint(1, 12)
    ids += [rng.randrange(4) for _ in range(rng.randint(0, 5))]
    want = next((i for i in range(len(ids)) if _periodic_tail(ids[:i + 1], window)), None)
    assert _first_stop(window, ids) == want


@pytest.mark.parametrize("bad", [-1, 1, 7, 4097, 2.5, True, "64", "huge"])
def test_stop_on_repeat_takes_off_or_a_token_count(bad):
    bad = 10 ** 5000 if bad == "huge" else bad  # too long for Python to print: named by size
    with pytest.raises(InvalidRequestError, match="stop_on_repeat"):
        SamplingParams(stop_on_repeat=bad)
    assert SamplingParams(stop_on_repeat=None).stop_on_repeat == 0


def test_blocks_are_capped_so_a_wide_window_stays_cheap():
    """A 4,096-token window checks blocks of up to 32 ids, not 1,024 (52 µs a token on the host,
    at every decode step): 32 checks per token."""
    assert RepeatDetector(4096).periods == 32 and RepeatDetector(64).periods == 16


def test_a_looping_request_finishes_with_stop(tiny_llm):
    """The tiny model's greedy output at temperature 0 falls into a loop within its 300 tokens;
    with stop_on_repeat it ends there with "repeat", without running to max_tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True)
    free = tiny_llm.generate(["hello hello hello"], params)[0]
    stopped = tiny_llm.generate(["hello hello hello"],
                                SamplingParams(temperature=0.0, max_tokens=300, ignore_eos=True,
                                               stop_on_repeat=16))[0]
    cut = _first_stop(16, free.token_ids)
    assert cut is not None, "the tiny model did not loop: pick another prompt"
    assert stopped.finish_reason == "repeat" and stopped.token_ids == free.token_ids[:cut + 1]
