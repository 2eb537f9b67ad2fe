"""One request's life after sampling: detokenize, stop, parse, time (DESIGN §3 data flow).

`Request` owns the per-request pieces the scheduler hands tokens to: the incremental
detokenizer, the stop-string checker, the optional reasoning/tool-call parser and the timers.
It does no tensor math; `Engine` samples and calls `Request.append(token_id)`.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import deque
from dataclasses import dataclass, field, replace

from flint_graph.chat.output_parser import OutputParser, ParseDelta, ToolCall, ToolCallDelta
from flint_graph.runtime.sampling import SamplingParams
from flint_graph.runtime.stopping import RepeatDetector, StopChecker, check_token
from flint_graph.chat.tokenizer import FlintTokenizer, IncrementalDetokenizer

_ids = itertools.count()


@dataclass
class RequestDelta:
    """What one step added to one request's output (all strings may be empty).

    token_ids: new token ids; text: new visible text (after stop-string hold-back);
    reasoning/content/tool_calls: the same text split by the output parser (when parsing is on),
    tool_calls holding the calls completed by this step; tool_call_deltas: the streaming pieces
    of calls as they are read (OpenAI's `delta.tool_calls`: a call's name once complete, then its
    `arguments` JSON in fragments; `ToolCallDelta.error` withdraws a call that turned out
    malformed); errors: repairs and malformed calls (output_parser);
    finish_reason: None while running, else "stop" | "tool_calls" (the model stopped after
    calling at least one tool, OpenAI's convention) | "length" | "repeat" (the output looped
    and SamplingParams.stop_on_repeat cut it) | "abort" | "error" (the engine could not run the
    request's step; the reason is in errors).
    """

    request_id: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    tool_call_deltas: list[ToolCallDelta] = field(default_factory=list)


class Request:
    """A prompt (token ids) plus sampling params, and everything generated so far.

    Args:
        prompt_ids: the prompt's token ids (already through the chat template if any).
        params: sampling params with checkpoint defaults filled in (`SamplingParams.with_defaults`).
        tokenizer: the checkpoint tokenizer.
        eos_ids: stop token ids (generation_config's eos_token_id list).
        parser: an OutputParser when the output should be split into reasoning / content /
            tool calls (chat), else None (raw completion).
        max_new_tokens: hard cap from the context limit (tokens).
        end_ids: the model's own end-of-turn ids (generation_config's eos_token_id); None: all
            of eos_ids. A stop on another id of eos_ids (the caller's stop_token_ids) or on a
            stop string cuts the output from outside: reasoning it ends stays reasoning.
    """

    def __init__(self, prompt_ids: list[int], params: SamplingParams,
                 tokenizer: FlintTokenizer, eos_ids: list[int],
                 parser: OutputParser | None, max_new_tokens: int,
                 end_ids: list[int] | None = None):
        self.id = next(_ids)
        self.prompt_ids = list(prompt_ids)
        self.params = params
        # An unseeded request still draws from the counter-based sampler: give it a fresh seed.
        self.seed = params.seed if params.seed is not None else random.getrandbits(62)
        self.eos_ids = list(eos_ids)
        # the model's own end-of-turn ids among them (the rest are the caller's stop_token_ids)
        self._end_ids = frozenset(self.eos_ids if end_ids is None else end_ids)
        self.max_new_tokens = min(max_new_tokens, params.max_tokens or max_new_tokens)
        # The context limit may cap max_tokens below what was asked: finish checks use the cap.
        self._limits = replace(params, max_tokens=self.max_new_tokens,
                               min_tokens=min(params.min_tokens, self.max_new_tokens))
        self.output_ids: list[int] = []
        self.cached_tokens = 0  # prompt tokens served from a retained sequence's KV (issue 22)
        # a prompt position where the prefill also saves the rings for later requests (the end
        # of a chat's preamble: prefix_cache.preamble_end); None: only the prompt's end
        self.snapshot_at: int | None = None
        self.logprobs: list[float] = []  # per output token, when params.logprobs
        # per output token, its step's params.top_logprobs most likely (id, log-probability)
        self.top_logprobs: list[list[tuple[int, float]]] = []
        # Deltas not yet taken by whoever consumes this request (a stream, or generate()).
        self.pending: deque[RequestDelta] = deque()
        # the visible text so far, in pieces: `str +=` on an attribute copies the whole string
        # each token (5 µs a token on average over a 30K-token output, 2026-12-05)
        self._text_parts: list[str] = []
        self.finish_reason: str | None = None
        self.errors: list[str] = []  # the engine's, e.g. a failed decode step (finish "error")
        self._detok = IncrementalDetokenizer(tokenizer, self.prompt_ids)
        self._stop = StopChecker(list(params.stop or []))
        self._repeat = RepeatDetector(params.stop_on_repeat) if params.stop_on_repeat else None
        self.parser = parser
        self.t_submit = time.perf_counter()
        # perf_counter times of the engine's phases up to the first token ("admit": taken from
        # the queue, "prefill": its first prefill part starts, "prefilled": its last one ends,
        # GPU work included): where a TTFT went (`phases_ms`)
        self.marks: dict[str, float] = {}
        self.t_first: float | None = None
        self.t_last: float | None = None
        self._parser_failed = False  # `_parser_fault` ended parsing: finish with "error"
        self._caller_stop = False  # a stop string or stop_token_ids (not an EOS) ended it
        self._forced: list[int] = []  # tokens that replace the next draws (`force`)
        self._force_at: frozenset[int] = frozenset()  # ids that start them when drawn
        self._force_then: list[int] = []
        self._force_instead: dict[int, list[int]] = {}

    def force(self, tokens: list[int], *, after: tuple[int, ...] = (),
              instead: dict[int, list[int]] | None = None) -> None:
        """Make the output continue with `tokens` (API tool_choice: a forced tool call): at
        once, or, with `after`, right after the first draw of one of those ids (e.g. thinking's
        `</think>`); `instead` maps an id whose draw comes first to what replaces it and all
        of `tokens` (EOS -> `</think>` + tokens: the call still comes), or to a shorter
        remainder (`<tool_call>` drawn on its own -> only the name follows)."""
        if after:
            self._force_at, self._force_then = frozenset(after), list(tokens)
            self._force_instead = dict(instead or {})
        else:
            self._forced = list(tokens)

    def steer(self, token_id: int) -> int:
        """The token to append for a draw of `token_id`: the next forced one while `force`
        has some queued, else the draw (which may start the forced tokens: `force`)."""
        if self._forced:
            return self._forced.pop(0)
        if not self._force_at:
            return token_id
        instead = self._force_instead.get(token_id)
        if token_id in self._force_at or instead is not None:
            self._force_at, then = frozenset(), self._force_then
            if instead is None:
                self._forced = list(then)
                return token_id
            self._forced = list(instead[1:])
            return instead[0]
        return token_id

    def ends_with(self, token_id: int) -> bool:
        """Whether appending `token_id` ends this request by its id alone (EOS or a stop id
        past min_tokens, max_tokens: `check_token`); stop strings, repeats and the output
        parser are found only by `append`."""
        return check_token(token_id, self.num_generated + 1, self._limits,
                           self.eos_ids) is not None

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def parser_failed(self) -> bool:
        """Whether the output parser failed on this request (`_parser_fault`)."""
        return self._parser_failed

    @property
    def num_generated(self) -> int:
        return len(self.output_ids)

    def append(self, token_id: int) -> RequestDelta:
        """Take one sampled token; return what becomes visible and whether it finished."""
        now = time.perf_counter()
        self.t_first = self.t_first or now
        self.t_last = now
        self.output_ids.append(token_id)
        delta = RequestDelta(self.id, token_ids=[token_id])
        reason = check_token(token_id, self.num_generated, self._limits, self.eos_ids)
        is_stop_token = reason == "stop"
        # the caller's stop token, not the model's end of turn (an EOS id it may not ignore)
        self._caller_stop = is_stop_token and (self._limits.ignore_eos
                                               or token_id not in self._end_ids)
        if not is_stop_token:
            self._emit(delta, self._stop.push(self._detok.push(token_id)))
            if self._stop.stopped:
                reason = "stop"
                self._caller_stop = True
        if reason is None and self._repeat is not None and self._repeat.push(token_id):
            reason = "repeat"  # the output loops (SamplingParams.stop_on_repeat): a cut-off
        if self._parser_failed and reason is None:
            reason = "error"
        if reason is not None:
            self._finish_into(reason, delta)
        self.pending.append(delta)
        return delta

    def finish(self, reason: str) -> RequestDelta:
        """End the request now (e.g. "abort"), releasing held-back text into a new delta."""
        delta = RequestDelta(self.id)
        if self.finish_reason is None:
            self._finish_into(reason, delta)
            self.pending.append(delta)
        return delta

    def _finish_into(self, reason: str, delta: RequestDelta) -> None:
        if not self._stop.stopped:
            # The stop checker sees the detokenizer's held-back tail (the text from a character
            # the last token left incomplete) only now. A stop string in it ends the text there
            # and, as when `append` finds one in the max_tokens-th token's text, means "stop".
            tail = self._stop.push(self._detok.flush())
            if self._stop.stopped:
                reason = "stop" if reason == "length" else reason
                self._caller_stop = True
            else:
                tail += self._stop.flush()
            self._emit(delta, tail)
        if self.parser is not None:
            try:
                # a caller's stop cut the output from outside, as max_tokens does: reasoning
                # it ends stays reasoning (the model's own end of turn makes it the answer)
                cut = "stop_sequence" if reason == "stop" and self._caller_stop else reason
                _merge(delta, self.parser.finish(cut))
            except Exception as e:  # noqa: BLE001 - this request's own fault (`_emit`)
                self._parser_fault(delta, e)
                reason = "error"
        if self.parser is not None:
            if reason == "stop" and self.parser.has_tool_calls:
                # OpenAI's convention; "length" and "abort" stay, since they say the output was
                # cut short (a call may be missing), which the caller must still learn.
                reason = "tool_calls"
        self.finish_reason = reason
        delta.finish_reason = reason

    def phases_ms(self) -> dict[str, float]:
        """Where the time to the first token went, ms: "queued" (submission to admission: the
        steps before it, e.g. other requests' work, snapshots due), "admit" (the prefix match
        and the ring load), "schedule" (admitting the others of the step, ordering the
        prefills, the pacer's budget: to the prefill's start), "prefill" (every prefill part,
        the GPU's work included), "first_token" (sampling and appending it). {} before the
        first token; a phase the request never reached is left out. (issue 22's turn-2 stall
        was the pacer's first fit, then inside "admit": hence its own phase.)"""
        if self.t_first is None:
            return {}
        order = [("queued", self.t_submit, "admit"), ("admit", "admit", "admitted"),
                 ("schedule", "admitted", "prefill"), ("prefill", "prefill", "prefilled"),
                 ("first_token", "prefilled", None)]
        out = {}
        for name, a, b in order:
            t0 = a if isinstance(a, float) else self.marks.get(a)
            t1 = self.t_first if b is None else self.marks.get(b)
            if t0 is not None and t1 is not None:
                out[name] = round((t1 - t0) * 1e3, 3)
        return out

    def timing(self) -> tuple[float | None, float | None]:
        """(TTFT ms from submission, mean ms per output token after the first) — None if unknown."""
        if self.t_first is None:
            return None, None
        ttft = (self.t_first - self.t_submit) * 1e3
        n = self.num_generated
        tpot = (self.t_last - self.t_first) * 1e3 / (n - 1) if n > 1 else None
        return ttft, tpot

    @property
    def text(self) -> str:
        """The visible output text so far (stop strings and held-back bytes excluded)."""
        if len(self._text_parts) > 1:
            self._text_parts[:] = ["".join(self._text_parts)]
        return self._text_parts[0] if self._text_parts else ""

    def _emit(self, delta: RequestDelta, text: str) -> None:
        if not text:
            return
        self._text_parts.append(text)
        delta.text += text
        if self.parser is not None:
            try:
                _merge(delta, self.parser.feed(text))
            except Exception as e:  # noqa: BLE001 - contained: see _parser_fault
                self._parser_fault(delta, e)

    def _parser_fault(self, delta: RequestDelta, e: Exception) -> None:
        """The output parser failed on this request's output (a caller's tool schema it could
        not handle, say): this request ends with finish reason "error" naming it, parsing
        stops, and no other request of the engine step is touched."""
        why = f"output parser failed: {type(e).__name__}: {str(e)[:200]}"
        self.errors.append(why)
        delta.errors.append(why)
        self.parser, self._parser_failed = None, True


def _merge(delta: RequestDelta, parsed: ParseDelta) -> None:
    delta.reasoning += parsed.reasoning
    delta.content += parsed.content
    delta.tool_calls.extend(parsed.tool_calls)
    delta.errors.extend(parsed.errors)
    delta.tool_call_deltas.extend(parsed.tool_call_deltas)

