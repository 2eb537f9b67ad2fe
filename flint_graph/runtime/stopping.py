"""When a request ends: stop strings over streamed text, and per-token finish checks (DESIGN §3).

`StopChecker` sits between the incremental detokenizer and the caller. It holds back any tail of
the text that could still grow into a stop string, so a partial stop string is never streamed
and the output is the same at every chunking. `check_token` decides, per sampled id, whether
the request ends by a stop token id / EOS ("stop") or by max_tokens ("length").
`RepeatDetector` ends a request whose output loops (SamplingParams.stop_on_repeat).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

from flint_graph.errors import InvalidRequestError, kind, shown
from flint_graph.runtime.sampling import SamplingParams

FinishReason = Literal["stop", "length"]


class StopChecker:
    """Streams text while watching for stop strings.

    Args:
        stop: stop strings, each non-empty (InvalidRequestError otherwise).

    `push(delta)` returns the text that is safe to stream now. When a stop string completes it
    returns the text before it, sets `stopped` and `matched`, and every later push returns "".
    The match that ends first wins; of those ending at the same place, the longest. `flush()`
    returns the text still held back (call it when generation ends for another reason).
    """

    def __init__(self, stop: Sequence[str]):
        if not isinstance(stop, (str, list, tuple)):  # bytes would iterate as integers
            raise InvalidRequestError(f"stop: expected a string or a list of strings, found "
                                      f"{kind(stop)}")
        stop = [stop] if isinstance(stop, str) else list(stop)
        for s in stop:
            if not (isinstance(s, str) and s):
                raise InvalidRequestError(f"stop: expected non-empty strings, found "
                                          f"{shown(s) if isinstance(s, str) else kind(s)}")
        self.stop = tuple(stop)
        self.stopped = False
        self.matched: str | None = None
        self._held = ""

    def push(self, delta: str) -> str:
        """Take new text; return what can be streamed now (possibly "")."""
        if self.stopped:
            return ""
        # Only held + delta can hold a new match: held alone had none, and held is all that
        # is left of the earlier text that could start one.
        text = self._held + delta
        hit = self._first_match(text)
        if hit is not None:
            start, matched = hit
            self.stopped, self.matched, self._held = True, matched, ""
            return text[:start]
        keep = self._partial_len(text)
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep]

    def flush(self) -> str:
        """Release the held-back text (nothing once stopped)."""
        out, self._held = self._held, ""
        return out

    def _first_match(self, text: str) -> tuple[int, str] | None:
        # The match that ends first is the one a per-character stream would meet first; ranking
        # by end (not start) is what makes the result independent of the chunking.
        best: tuple[int, int, str] | None = None  # (end, -length, string)
        for s in self.stop:
            i = text.find(s)
            if i >= 0 and (best is None or (i + len(s), -len(s)) < best[:2]):
                best = (i + len(s), -len(s), s)
        return None if best is None else (best[0] + best[1], best[2])

    def _partial_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:k]):
                    longest = k
                    break
        return longest


def check_token(token_id: int, num_generated: int, params: SamplingParams,
                eos_ids: Collection[int]) -> FinishReason | None:
    """Whether the request ends with the token just sampled.

    Args:
        token_id: the sampled id.
        num_generated: tokens generated so far, this one included (>= 1).
        params: the request's SamplingParams (after `with_defaults`).
        eos_ids: the checkpoint's EOS ids (generation_config.json eos_token_id).

    Returns "stop" when the id is in params.stop_token_ids, or in eos_ids and not
    params.ignore_eos, and at least min_tokens tokens came before it; otherwise "length" when
    num_generated reaches params.max_tokens; otherwise None. A stop id that is also the
    max_tokens-th token reports "stop". min_tokens counts as in vLLM: that many tokens come
    before any stop id.
    """
    if num_generated > params.min_tokens:
        if token_id in (params.stop_token_ids or ()):
            return "stop"
        if not params.ignore_eos and token_id in eos_ids:
            return "stop"
    if params.max_tokens is not None and num_generated >= params.max_tokens:
        return "length"
    return None


class RepeatDetector:
    """Whether the last `window` generated ids are one block of p ≤ min(window // 4, MAX_BLOCK)
    ids repeated (so at least four times): the loop a small or confused model falls into
    ("dddd…", "rererere…", a phrase over and over), which only max_tokens would otherwise end.

    Incremental, O(p) per token: for each period p it keeps how many ids in a row have
    equalled the id p before them; the last `window` ids have period p exactly when that run
    reaches window − p. `push(id)` returns True from the token that completes such a tail.
    Blocks are capped at MAX_BLOCK ids because the check runs on the host for every request at
    every decode step: a window of 4,096 with blocks up to 1,024 took 52 µs a token.
    """

    MIN_REPEATS = 4
    MAX_BLOCK = 32

    def __init__(self, window: int):
        if not (isinstance(window, int) and window >= 2 * self.MIN_REPEATS):
            raise InvalidRequestError(f"stop_on_repeat: expected a token count >= "
                                      f"{2 * self.MIN_REPEATS}, found {window!r}")
        self.window = window
        self.periods = min(window // self.MIN_REPEATS, self.MAX_BLOCK)
        self._recent: list[int] = []  # the last `periods` ids, oldest first
        self._runs = [0] * (self.periods + 1)  # index p: the run of ids equal to the id p back

    def push(self, token_id: int) -> bool:
        recent, hit = self._recent, False
        for p in range(1, self.periods + 1):
            if len(recent) >= p and recent[-p] == token_id:
                self._runs[p] += 1
                hit = hit or self._runs[p] >= self.window - p
            else:
                self._runs[p] = 0
        recent.append(token_id)
        if len(recent) > self.periods:
            del recent[0]
        return hit
