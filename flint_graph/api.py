"""The Python API: `LLM(model).generate / stream / chat / stream_chat` (DESIGN §3 data flow).

    from flint_graph import LLM, SamplingParams
    llm = LLM()                                  # embedded default: flint-nano
    out = llm.generate(["Hello"], SamplingParams(max_tokens=16, seed=0))[0]
    msg = llm.chat([{"role": "user", "content": "Hi"}])

Errors: every bad input raises a `flint_graph.errors.FlintError` subclass (CheckpointError,
ConfigError, InvalidRequestError, ContextLengthError, TemplateError) naming what was wrong.
"""

from __future__ import annotations

import functools
import json
import numbers
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from flint_graph.chat.chat_template import Segment, check_template_kwargs, render_chat_segments
from flint_graph.chat.generated_ids import splice_generated
from flint_graph.checkpoints.checkpoint import LoadedCheckpoint, load_checkpoint
from flint_graph.runtime.engine import Engine
from flint_graph.runtime.engine_config import EngineConfig, pick_device
from flint_graph.runtime.prefix_cache import preamble_end
from flint_graph.errors import (CheckpointError, ConfigError, ContextLengthError,
                                InvalidRequestError, TemplateError, found, kind, not_utf8)
from flint_graph.chat.output_parser import OutputParser, ToolCall
from flint_graph.runtime.request import Request, RequestDelta
from flint_graph.runtime.sampling import SamplingParams
from flint_graph.chat.tokenizer import FlintTokenizer, TooManyTokens


CHAT_HISTORY = 16  # recent chat requests whose generated ids later prompts may reuse

@dataclass
class GenerationOutput:
    """One finished request.

    token_ids: generated ids (the stop token included when one ended it); text: visible text
    (special tokens and any matched stop string removed); finish_reason: "stop" | "length" |
    "repeat" (a loop that SamplingParams.stop_on_repeat cut) | "abort" | "error" (its prefill or
    a decode step failed; the reason is in errors), or for chat "tool_calls" when the model
    stopped after calling at least one tool (OpenAI's convention; a call cut off by max_tokens
    still says "length"); ttft_ms: submission to first token (ms); ms_per_token: mean time per
    output token after the first (TPOT, ms; None with fewer than two tokens); cached_tokens:
    prompt tokens served from the KV of an earlier sequence (EngineConfig.kv_reuse) rather than
    prefilled; ttft_phases_ms: where ttft_ms went (queued, admit, schedule, prefill,
    first_token; `Request.phases_ms`). For chat requests reasoning_content / content /
    tool_calls hold the parsed split, errors the malformed or rejected calls, the repairs made
    and the arguments that fit no reading of their schema ("tool call N: ..."), and for any
    request the engine's own failures ("decode step failed: ...").
    """

    # the id lists stay out of repr(): printing a message showed hundreds of numbers
    prompt_token_ids: list[int] = field(repr=False)
    token_ids: list[int] = field(repr=False)
    text: str
    finish_reason: str
    ttft_ms: float | None
    ms_per_token: float | None
    reasoning_content: str | None = None
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list, repr=False)  # SamplingParams(logprobs=True)
    # per output token, the step's most likely (id, log-probability), SamplingParams.top_logprobs
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list, repr=False)
    # prompt tokens whose KV came from an earlier sequence instead of a prefill (issue 22)
    cached_tokens: int = 0
    # where ttft_ms went, ms: queued, admit, schedule, prefill, first_token (`Request.phases_ms`)
    ttft_phases_ms: dict[str, float] = field(default_factory=dict, repr=False)
    # tool_choice forced a call and the model did not complete it: what it wrote after the
    # forced `<tool_call>` and name, in neither content nor tool_calls (errors say why)
    withdrawn_call_text: str | None = None

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens (`--json`'s and the API's `prompt_tokens`); with
        `cached_tokens`, the share served from the KV cache."""
        return len(self.prompt_token_ids)


@dataclass
class ChatMessage:
    """The assistant's reply: an OpenAI-style message plus the raw generation output."""

    content: str
    reasoning_content: str | None
    tool_calls: list[ToolCall]
    finish_reason: str
    output: GenerationOutput

    def to_dict(self) -> dict[str, Any]:
        """The message as chat history expects it (tool-call arguments as a mapping)."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning_content:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return msg


def _as_id(t):
    """A numpy integer as an int; anything else unchanged (refused by the caller)."""
    import numbers

    if isinstance(t, numbers.Integral) and not isinstance(t, bool):
        return int(t)
    return t


def check_prompt_text(prompt: str) -> None:
    """Refuse an empty prompt or one that is not valid UTF-8 text (a lone surrogate, as
    undecodable bytes arrive), naming the character's position. Raises InvalidRequestError."""
    if not prompt:
        raise InvalidRequestError("prompt: expected non-empty text, got an empty prompt")
    if not prompt.strip():
        raise InvalidRequestError(f"prompt: expected text, got only whitespace "
                                  f"({len(prompt)} characters)")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidRequestError(f"prompt: {not_utf8(prompt, e)}") from None


def _ctrl_c(method):
    """Public LLM calls: Ctrl-C anywhere inside (rendering the template, tokenizing, the engine
    loop) raises one KeyboardInterrupt(INTERRUPTED) from the call, not a traceback through
    jinja2, the tokenizer and the model; requests already added are aborted by `_run` /
    `_stream`'s cleanup. (A stream's own iteration is RequestStream.__next__'s.)"""

    @functools.wraps(method)
    def call(*args, **kwargs):
        try:
            return method(*args, **kwargs)
        except KeyboardInterrupt as e:  # its class kept: the CLI's SIGTERM is a subclass
            raise type(e)(INTERRUPTED) from None

    return call


class LLM:
    """A Flint model ready to generate.

    Args:
        model: a BF16 checkpoint directory or an NVFP4 GGUF file; None = the embedded default
            (flint-nano, the trained miniature Flint that ships in the package, unpacked into a
            cache directory with its BF16 twin on first use; nano/embedded.py).
        hf_config_path: directory with config.json / tokenizer / generation_config for a GGUF
            (defaults to the GGUF's own directory).
        device: "cuda", "cpu" or a torch.device; None picks CUDA when present.
        progress: show progress bars while loading.
        engine: runtime knobs (EngineConfig: max_slots, prefill_chunk_tokens, cpu_threads,
            engine ("auto" | "graph" | "reference"; a plain string is taken as this field),
            max_context: tokens per sequence, prompt and output, on either engine;
            on the CPU a small model gets one thread unless told otherwise, see
            engine_config.apply_cpu_threads).
    Raises CheckpointError / ConfigError for a missing, corrupt or inconsistent checkpoint,
    InvalidRequestError for a bad `device` or `model` argument.
    """

    def __init__(self, model: str | Path | None = None, hf_config_path: str | Path | None = None,
                 device: str | torch.device | None = None, progress: bool = True,
                 engine: EngineConfig | str | None = None):
        if isinstance(engine, str):
            engine = EngineConfig(engine=engine)  # the CLI's spelling: engine="graph"
        elif engine is None:
            engine = EngineConfig()
        elif not isinstance(engine, EngineConfig):
            raise InvalidRequestError(f"engine: expected an EngineConfig or one of 'auto', "
                                      f"'graph', 'reference', found {type(engine).__name__}")
        if model is not None and (not isinstance(model, (str, Path)) or not str(model)):
            raise InvalidRequestError(f"model {model!r}: expected a checkpoint directory or "
                                      ".gguf path (or None for the embedded default)")
        if hf_config_path is not None and (not isinstance(hf_config_path, (str, Path))
                                           or not str(hf_config_path)):
            raise InvalidRequestError(f"hf_config_path {hf_config_path!r}: expected the path "
                                      "of a directory holding config.json (or None)")
        self.device = pick_device(device)
        if engine.engine == "graph" and self.device.type != "cuda":
            # Refuse before reading a checkpoint that may be tens of GB.
            raise ConfigError(f"engine=graph (--engine graph): the graph engine needs CUDA and "
                              f"this run is on {self.device}; use engine auto or reference")
        if model is not None:
            t0 = time.perf_counter()
            checkpoint = load_checkpoint(model, hf_config_path, self.device, progress)
            self._start(checkpoint, engine, time.perf_counter() - t0)
            return
        # The generator is only needed for the embedded default: import it only then.
        from flint_graph.checkpoints.make_checkpoint import ensure_default_checkpoint

        model = ensure_default_checkpoint(progress=progress)
        for attempt in range(2):
            t0 = time.perf_counter()
            try:
                checkpoint = load_checkpoint(model, hf_config_path, self.device, progress)
                self._start(checkpoint, engine, time.perf_counter() - t0)
                return
            except (CheckpointError, ConfigError) as e:
                # The unpacked copy is checked by its files' sizes only; a file damaged in
                # place (bad-input trials flipped bytes in a shard, tokenizer.json, config.json
                # and generation_config.json) made every later run fail on a path the user
                # never named. The package still holds the original: unpack it again, once.
                if attempt or hf_config_path is not None:
                    raise
                print(f"flint-graph: the unpacked flint-nano did not load ({e}); unpacking "
                      "it again", file=sys.stderr)
                model = ensure_default_checkpoint(progress=progress, fresh=True)

    @classmethod
    def from_checkpoint(cls, checkpoint: LoadedCheckpoint, device: str | torch.device | None = None,
                        engine: EngineConfig | None = None) -> LLM:
        """An LLM over weights already in memory (e.g. synthetic ones made by `flint-graph
        bench`): `checkpoint.weights` on `device`, side files in `checkpoint.config_dir`. Raises
        as the constructor, minus the file errors."""
        self = cls.__new__(cls)
        self.device = pick_device(device)
        self._start(checkpoint, engine or EngineConfig(), 0.0)
        return self

    def _start(self, checkpoint: LoadedCheckpoint, engine: EngineConfig, load_s: float) -> None:
        """Tokenizer, generation defaults and the engine for a loaded checkpoint."""
        self.checkpoint = checkpoint
        loaded = time.perf_counter()
        self.cfg = self.checkpoint.cfg
        self.tokenizer = FlintTokenizer.from_dir(self.checkpoint.config_dir)
        self.generation_config = self.checkpoint.generation_config
        # the model's end-of-turn ids, read once (a stop on another of a request's stop ids is
        # the caller's: a cut-off, Request.end_ids)
        self._end_ids = list(SamplingParams().with_defaults(self.generation_config)
                             .stop_token_ids) or list(self.tokenizer.chat_stop_ids)
        bad = [t for t in self._end_ids if not 0 <= t < self.cfg.vocab_size]
        if bad:  # at start-up, named as the file's: every request would fail on it
            raise CheckpointError(
                f"{self.checkpoint.config_dir / 'generation_config.json'}: eos_token_id "
                f"{bad[0]} outside [0, vocab_size = {self.cfg.vocab_size}) of config.json")
        if self.tokenizer.vocab_size > self.cfg.vocab_size:
            raise CheckpointError(
                f"{self.checkpoint.config_dir / 'tokenizer.json'}: the tokenizer has "
                f"{self.tokenizer.vocab_size} tokens but config.json vocab_size is "
                f"{self.cfg.vocab_size}; the LM head has no row for the rest")
        self.engine = Engine(self.checkpoint, self.device, self.tokenizer.vocab_size, engine)
        # recent chat requests: their generated ids go back into later prompts (generated_ids)
        self._chat_history: deque[Request] = deque(maxlen=CHAT_HISTORY)
        self._chat_history_lock = threading.Lock()
        self.startup = startup_report(self, load_s, time.perf_counter() - loaded)

    # -- raw completion ---------------------------------------------------------------------

    @_ctrl_c
    def generate(self, prompts: str | list[str] | list[list[int]],
                 params: SamplingParams | None = None) -> list[GenerationOutput]:
        """Complete each prompt as raw text (no chat template), batched.

        The caller writes the whole prompt here, so added-token text in it (e.g. "<|user|>",
        "</think>") becomes the token's single id, as in GLM's own tokenizer; chat() instead
        keeps such text inside messages as ordinary text (prompt_segments).
        Args: prompts: a string, a list of strings, or a list of token-id lists.
        Returns one GenerationOutput per prompt, in order.
        Raises InvalidRequestError (no prompts, empty prompt, bad params), ContextLengthError.
        """
        if isinstance(prompts, (list, tuple)) and not prompts:
            raise InvalidRequestError("prompts: expected at least one prompt, got an empty list")
        if isinstance(prompts, str):
            prompts = [prompts]
        elif (isinstance(prompts, (list, tuple)) and prompts
              and isinstance(prompts[0], numbers.Integral)):
            # one prompt of ids (a tuple of ids too, not 3 prompts; numpy ids as well: a list
            # of np.int64 was "expected text or a list of token ids, found int64")
            prompts = [list(prompts)]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise InvalidRequestError(f"prompts: expected a string, a list of strings or a list "
                                      f"of token-id lists, found {type(prompts).__name__}")
        reqs = [self._request(self._encode(p), params, parser=None) for p in prompts]
        return self._run(reqs)

    @_ctrl_c
    def stream(self, prompt: str | list[int],
               params: SamplingParams | None = None) -> RequestStream:
        """Complete one raw prompt: an iterator of RequestDelta as tokens arrive (the last one
        carries finish_reason); `.output` is the GenerationOutput afterwards. Closing it early
        (or Ctrl-C while iterating) aborts the request. Raises as `generate`, and
        InvalidRequestError for a list of prompts (one stream is one prompt)."""
        if isinstance(prompt, (list, tuple)) and prompt and all(
                isinstance(p, (str, list, tuple)) for p in prompt):
            if len(prompt) == 1:
                raise InvalidRequestError("prompt: a list holding one prompt; stream() takes the "
                                          "prompt itself (a string or a list of token ids)")
            raise InvalidRequestError("prompt: stream() takes one prompt (a string or a list of "
                                      f"token ids), found a list of {len(prompt)} prompts; "
                                      "generate() takes several")
        return RequestStream(self, self._request(self._encode(prompt), params, parser=None))

    # -- chat -------------------------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], tools: list[dict] | None = None, *,
               enable_thinking: bool = True, tool_choice: str | None = None,
               **template_kwargs: Any) -> str:
        """The prompt text the checkpoint's chat template makes of `messages` (GLM-4.7 layout).
        Control-token text from messages or tools shows here as the same text as the template's
        markers; chat() encodes it as ordinary text, not as the control token (prompt_segments).

        Raises InvalidRequestError for malformed messages/tools, TemplateError if it raises."""
        return "".join(s.text for s in self._render_segments(
            messages, tools, enable_thinking=enable_thinking, tool_choice=tool_choice,
            **template_kwargs))

    def _check_template_kwargs(self, template_kwargs: dict[str, Any]) -> None:
        """Raise InvalidRequestError for a keyword argument of chat() and its kin that is a
        sampling setting, a name the API sets itself (`_API_SET`) or one the checkpoint's chat
        template would not take (`check_template_kwargs`)."""
        sampling = sorted(k for k in template_kwargs if k in _SAMPLING_FIELDS
                          or k in _SAMPLING_ALIASES)
        if sampling:  # `chat(msgs, max_tokens=3)` went to the template, silently unused (a
            # bad-input trial, 2026-12-07; max_new_tokens and vLLM's sampling_params too)
            fields = dict.fromkeys(_SAMPLING_ALIASES.get(k, k) for k in sampling)
            raise InvalidRequestError(
                f"{', '.join(sampling)}: "
                f"{'a sampling setting' if len(sampling) == 1 else 'sampling settings'}, not "
                "chat template variables; chat(), stream_chat() and chat_batch() take them as "
                "params=SamplingParams(" + ", ".join(f"{k}=..." if k else "..." for k in fields)
                + ")")
        _check_api_names(template_kwargs)
        check_template_kwargs(self.tokenizer.chat_template, template_kwargs)

    def _render_segments(self, messages: list[dict[str, Any]], tools: list[dict] | None, *,
                         enable_thinking: bool, tool_choice: str | None,
                         **template_kwargs: Any) -> list[Segment]:
        # The prompt as scaffolding / data segments: control-token text inside messages and
        # tools is data, encoded as ordinary text (prompt_segments).
        if isinstance(messages, list) and not messages:  # other types: validate_messages
            raise InvalidRequestError("messages: expected at least one message, got none")
        self._check_template_kwargs(template_kwargs)
        self._check_prompt_size(_message_text(messages))  # before templating a huge one
        source = (self.tokenizer.template_file
                  or self.checkpoint.config_dir / "tokenizer_config.json")
        try:
            segments = render_chat_segments(
                self.tokenizer.chat_template, messages, tools,
                markers=self.tokenizer.added_tokens, enable_thinking=enable_thinking,
                tool_choice=tool_choice, **template_kwargs)
        except TemplateError as e:
            raise TemplateError(f"{source}: {e}") from None
        except TypeError as e:  # e.g. a template kwarg that collides with a named argument
            raise InvalidRequestError(f"render: {e}") from None
        if not "".join(s.text for s in segments).strip():
            raise TemplateError(f"{source}: the chat template rendered an empty prompt")
        return segments

    @_ctrl_c
    def chat(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
             params: SamplingParams | None = None, *, enable_thinking: bool = True,
             tool_choice: str | None = None, **template_kwargs: Any) -> ChatMessage:
        """Generate the assistant's next message.

        Returns a ChatMessage with reasoning_content (None when thinking is off, unless the
        model opened `<think>` itself), content, tool_calls (parsed GLM-4.7 calls, typed by the
        tools' JSON schemas) and finish_reason ("tool_calls" when it called a tool). Without
        tools (or with tool_choice "none") no calls are parsed: call-like text stays content.
        tool_choice "required" or {"type": "function", "function": {"name": N}} makes the
        answer a call (to N) once the model has reasoned (`forced_call`).
        Raises InvalidRequestError (bad messages, tools, params), ContextLengthError,
        TemplateError (the checkpoint's template failed).
        """
        stream = self.stream_chat(messages, tools, params, enable_thinking=enable_thinking,
                                  tool_choice=tool_choice, **template_kwargs)
        for _ in stream:
            pass
        return stream.message

    @_ctrl_c
    def stream_chat(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                    params: SamplingParams | None = None, *, enable_thinking: bool = True,
                    tool_choice: str | None = None, **template_kwargs: Any) -> RequestStream:
        """Like `chat`, but an iterator of RequestDelta (reasoning / content / tool_calls split
        as they arrive); after iteration, `.message` holds the final ChatMessage.

        Tool calls stream in `delta.tool_call_deltas` (ToolCallDelta, after OpenAI's
        ChoiceDeltaToolCall): `index`, `id` ("call_<index>") and `name` once the name is
        complete, then `arguments` fragments whose concatenation is the call's final
        `arguments` JSON. A string-only parameter streams as the model writes it; other values
        arrive whole at their `</arg_value>` (their type is known only then). A streamed call
        that turns out malformed ends with a delta whose `error` is set: drop it (its text went
        to content; its index is not reused). The whole ToolCall also arrives in
        `delta.tool_calls` when its `</tool_call>` does. `ToolCallDelta.to_openai()` gives the
        OpenAI `delta.tool_calls[]` entry."""
        req = self._chat_request(messages, tools, params, enable_thinking=enable_thinking,
                                 tool_choice=tool_choice, **template_kwargs)
        return RequestStream(self, req, enable_thinking)

    @_ctrl_c
    def chat_batch(self, conversations: list[tuple[list[dict[str, Any]], list[dict] | None]],
                   params: SamplingParams | None = None, *, enable_thinking: bool = True,
                   tool_choice: str | dict | None = None,
                   **template_kwargs: Any) -> list[ChatMessage]:
        """`chat` for many conversations at once, run as one batch by the scheduler (as many
        at a time as the engine has slots): conversations is a list of (messages, tools)
        pairs, or of plain message lists (no tools); `tool_choice` (as `chat`'s) applies to
        every one. Returns one ChatMessage per conversation, in order. Raises as `chat`, the
        message starting with `conversations[i]` for an error in entry i (InvalidRequestError
        also for an entry that is neither form), or naming `conversations` for an empty
        list."""
        if not isinstance(conversations, (list, tuple)):
            raise InvalidRequestError(f"conversations: expected a list of (messages, tools) "
                                      f"pairs or of message lists, found {kind(conversations)}")
        if not conversations:  # as generate([]): an empty batch is a caller's slip
            raise InvalidRequestError("conversations: expected at least one conversation, got "
                                      "an empty list")
        # what every conversation shares is checked once, so its error names no entry (a
        # re-trial, 2026-12-07: `chat_batch([c], n=2)` was blamed on conversations[0])
        self._sampling(params)
        if not isinstance(enable_thinking, bool):
            raise InvalidRequestError(f"enable_thinking: expected a bool, found "
                                      f"{kind(enable_thinking)}", field="enable_thinking")
        self._check_template_kwargs(template_kwargs)
        reqs = []
        for i, c in enumerate(conversations):
            try:
                reqs.append(self._chat_request(*_conversation(c, i), params,
                                               enable_thinking=enable_thinking,
                                               tool_choice=tool_choice, **template_kwargs))
            except (InvalidRequestError, TemplateError) as e:
                if not str(e).startswith(f"conversations[{i}]"):  # which entry, in a batch
                    e.args = (f"conversations[{i}]: {e}",)
                raise
        self._run(reqs)
        return [_message(r, enable_thinking) for r in reqs]

    # -- internals --------------------------------------------------------------------------

    def _chat_request(self, messages, tools, params, *, enable_thinking: bool,
                      tool_choice: str | None, **template_kwargs: Any) -> Request:
        if isinstance(tools, tuple):  # as messages may be (a re-trial, 2026-12-07)
            tools = list(tools)
        segments = self._render_segments(messages, tools, enable_thinking=enable_thinking,
                                         tool_choice=tool_choice, **template_kwargs)
        # With tools, a call to an undeclared one is reported and left visible as content.
        # Without tools (or with tool_choice "none", which leaves them out of the prompt) no
        # calls are parsed at all, as vLLM runs no tool parser then: text that merely looks like
        # a call stays content, without warnings.
        declared = (tools or []) if tool_choice != "none" else []
        name = forced_call(tool_choice)
        if name:  # a named choice: a call to any other tool (the model may extend the forced
            # name, "get" -> "get_weather") is reported and kept as content, never returned
            declared = [t for t in declared if t["function"]["name"] == name]
        # a call's id counts the calls already in the conversation: every turn's calls keep
        # distinct ids, so tool results pair with theirs across a transcript
        earlier = sum(len(m.get("tool_calls") or ()) for m in messages
                      if isinstance(m, dict) and m.get("role") == "assistant")
        parser = OutputParser(tools=declared, thinking=enable_thinking, first_id=earlier,
                              forced=None if name is None else "<tool_call>" + name)
        text = "".join(s.text for s in segments)
        check_prompt_text(text)

        def shares() -> tuple[int, int]:  # (message characters, tool definition characters)
            said = _message_text(messages)
            # the definitions as JSON: the template writes them about so (4,001 one-character
            # messages were said to be "mostly the tool definitions" for one tool `f`, where
            # the template's markup around each message was the rest: a bad-input trial,
            # 2026-12-06), compactly and never more than the text leaves (2,000 one-line tools
            # were "about 104,890" of a 103,364-character prompt: a bad-input trial, 2026-12-07)
            defs = len(json.dumps(tools, ensure_ascii=False, separators=(",", ":")))
            return said, max(0, min(defs, len(text) - said))

        def what() -> str:  # where its characters are: the history or the tools to trim
            if not tools:
                return "prompt"
            said, defs = shares()
            return (f"prompt ({len(text):,} characters: its messages {said:,}, the tool "
                    f"definitions about {defs:,}, the rest the chat template's markup around "
                    "them)")

        try:
            self._check_prompt_size(text, what)
            try:  # twice the limit: splicing the generated ids back in below may shorten it
                ids = self.tokenizer.encode_segments(segments, most=2 * self.engine.context_limit)
            except TooManyTokens as e:
                raise self._too_many_tokens(e, what()) from None
        except ContextLengthError as e:
            if tools and 2 * shares()[1] > len(text):
                e.field = "tools"  # the server's `param`: what to trim is the definitions
            raise
        # earlier turns the template wrote back verbatim get the ids that were generated
        # a copy first: server threads append to the deque while another iterates it
        # ("deque mutated during iteration", a bad-input trial, 2026-12-06)
        with self._chat_history_lock:
            history = list(self._chat_history)
        done = [(r.prompt_ids, r.output_ids) for r in history if r.is_finished
                and r.finish_reason in ("stop", "tool_calls") and not r.errors]
        ids = splice_generated(ids, done, lambda t: self.tokenizer.decode(t, False))
        req = self._request(ids, params, parser=parser, what=what)
        # the rings are also saved where the system prompt and tools end (issue 22): a new
        # conversation with the same ones resumes there
        req.snapshot_at = preamble_end(ids, self.tokenizer.special_ids.get("<|user|>"))
        if name is not None:
            self._force_call(req, name, enable_thinking)
        with self._chat_history_lock:
            self._chat_history.append(req)
        return req

    def _force_call(self, req: Request, name: str, thinking: bool) -> None:
        """Make `req`'s answer a tool call (`forced_call`): `<tool_call>` and the name's ids
        replace the draws right after the model's `</think>` (thinking on: it reasons first),
        or at once (thinking off); an end-of-turn drawn before `</think>` becomes `</think>`
        and the call; a `<tool_call>` the model opens itself gets only the name after it."""
        tok = self.tokenizer
        call_open, think_close = tok.token_id("<tool_call>"), tok.token_id("</think>")
        tokens = [call_open, *(tok.encode_text(name) if name else [])]
        if not thinking:
            req.force(tokens)
            return
        instead = {eos: [think_close, *tokens] for eos in req.eos_ids}
        instead[call_open] = tokens
        req.force(tokens, after=(think_close,), instead=instead)

    def _check_prompt_size(self, text: str | int, what=lambda: "prompt") -> None:
        """Refuse text that cannot fit the context by its length alone, before tokenising it
        (a 16 MB message was tokenised whole, 9.6 s and 2.4 GB, before its token count was
        refused): no token covers more than `tokenizer.max_token_chars` characters, so more
        than context limit × that many characters are more tokens than the context holds.
        Raises ContextLengthError naming both numbers; `what()` names the text (called only
        then, so the common case builds no message)."""
        limit = self.engine.context_limit * self.tokenizer.max_token_chars
        n = text if isinstance(text, int) else len(text)
        if n > self.tokenizer.max_text_chars and self.tokenizer.max_text_chars < limit:
            # the tokenizer's pipeline may lengthen it past what is encoded at all (an
            # expanding Replace aborted the process in Rust: a bad-input trial, 2026-12-07)
            raise ContextLengthError(
                f"{what()}: {n:,} characters; this tokenizer's normalizer and pre-tokenizer can "
                f"lengthen a text up to {self.tokenizer.text_growth:,.0f}-fold, so at most "
                f"{self.tokenizer.max_text_chars:,} characters are encoded")
        if n > limit:
            raise ContextLengthError(
                f"{what()}: {n:,} characters cannot fit the context limit of "
                f"{self.engine.context_limit:,} tokens (at most {limit:,} characters: no token "
                f"covers more than {self.tokenizer.max_token_chars})")

    def _too_many_tokens(self, e: TooManyTokens, what: str = "prompt") -> ContextLengthError:
        """The refusal of a prompt whose encoding stopped at a bound: a long one is refused
        after about that many tokens' work, not all of it, so the count is often a lower bound
        (`TooManyTokens`). `what` names the text (the tool definitions' share, for chat)."""
        read = f" in its first {e.chars:,} of {e.total:,} characters" if e.chars and \
            e.chars < (e.total or 0) else ""
        if e.exact:
            size = f"{what} is {e.counted:,} tokens"
        elif e.estimated:
            size = f"{what}: about {e.counted:,} tokens or more (estimated{read})"
        else:
            size = f"{what}: at least {e.counted:,} tokens" + (f" (counted{read})" if read else "")
        limit = self.engine.context_limit
        source = ("max_position_embeddings" if limit == self.cfg.max_position_embeddings else
                  "max_context: EngineConfig(max_context=...), --max-context"
                  if limit == self.engine.max_context else
                  "the KV cache per sequence; EngineConfig(max_context=...) sets it")
        return ContextLengthError(f"{size}; the context limit is {limit:,} tokens ({source}), "
                                  "leaving no room to generate")

    def _encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            check_prompt_text(prompt)
            self._check_prompt_size(prompt)
            try:  # most: the longest prompt _request admits
                return self.tokenizer.encode(prompt, most=self.engine.context_limit - 1)
            except TooManyTokens as e:
                raise self._too_many_tokens(e) from None
        if isinstance(prompt, tuple):
            prompt = list(prompt)
        if not isinstance(prompt, list):
            raise InvalidRequestError(f"prompt: expected text or a list of token ids, found "
                                      f"{type(prompt).__name__}")
        if not prompt:
            raise InvalidRequestError("prompt: expected at least one token id, got none")
        # numpy integers (a tokenizer's array turned into a list) are ids too, as
        # SamplingParams takes them; bool is not
        prompt = [t if type(t) is int else _as_id(t) for t in prompt]
        at = next((i for i, t in enumerate(prompt) if type(t) is not int), None)
        if at is not None:
            raise InvalidRequestError(f"prompt[{at}]: token ids must be integers, found "
                                      f"{found(prompt[at])}")
        bad = [t for t in prompt if not 0 <= t < self.cfg.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt: token id {bad[0]} outside [0, vocab_size = {self.cfg.vocab_size})")
        return list(prompt)

    def _sampling(self, params: SamplingParams | None) -> SamplingParams:
        """`params` with the checkpoint's defaults filled in (SamplingParams.with_defaults).
        Raises InvalidRequestError for params that are not SamplingParams, or whose
        min_tokens passes the default max_tokens."""
        if params is not None and not isinstance(params, SamplingParams):
            raise InvalidRequestError(f"params: expected SamplingParams, found "
                                      f"{type(params).__name__}")
        return (params or SamplingParams()).with_defaults(self.generation_config)

    def _request(self, prompt_ids: list[int], params: SamplingParams | None,
                 parser: OutputParser | None, what=lambda: "prompt") -> Request:
        params = self._sampling(params)
        limit = self.engine.context_limit
        if len(prompt_ids) >= limit:  # `what` names the prompt (its tool definitions' share)
            raise self._too_many_tokens(TooManyTokens(len(prompt_ids), None, None, exact=True),
                                        what())
        eos = list(params.stop_token_ids or [])
        if not eos and not params.ignore_eos:
            eos = list(self.tokenizer.chat_stop_ids)  # no eos_token_id in generation_config
        bad = [t for t in eos if not 0 <= t < self.cfg.vocab_size]
        if bad:  # the caller's list, or the checkpoint's own end ids when it gave none
            whose = "stop_token_ids" if params.stop_token_ids else \
                "the checkpoint's end-of-turn ids (generation_config.json eos_token_id)"
            raise InvalidRequestError(f"{whose}: id {bad[0]} outside [0, vocab_size = "
                                      f"{self.cfg.vocab_size})")
        return Request(prompt_ids, params, self.tokenizer, eos, parser,
                       max_new_tokens=limit - len(prompt_ids), end_ids=self._end_ids)

    def _run(self, reqs: list[Request]) -> list[GenerationOutput]:
        for r in reqs:
            self.engine.add(r)
        try:
            while any(not r.is_finished for r in reqs):
                self.engine.step()
        finally:
            for r in reqs:
                if not r.is_finished:
                    self.engine.abort(r)
                r.pending.clear()  # nobody streams these: drop their deltas
        return [_output(r) for r in reqs]

    def _stream(self, req: Request) -> Iterator[RequestDelta]:
        self.engine.add(req)
        try:
            while True:
                # Steps driven by other consumers may already have queued our deltas.
                while req.pending:
                    yield req.pending.popleft()
                if req.is_finished:
                    return
                self.engine.step()
        finally:
            if not req.is_finished:
                self.engine.abort(req)
            req.pending.clear()


# What Ctrl-C raises in a script waiting in generate / chat or iterating a stream (README, "The
# Python API"): KeyboardInterrupt with this message, its request aborted.
INTERRUPTED = "interrupted (Ctrl-C): flint_graph aborted the request"


class RequestStream:
    """Iterator of one request's RequestDelta objects; afterwards `.output` is its
    GenerationOutput and, for chat requests, `.message` its ChatMessage."""

    def __init__(self, llm: LLM, req: Request, thinking: bool = False):
        self._llm, self._req, self._thinking = llm, req, thinking
        self._deltas = llm._stream(req)
        self._reader: int | None = None  # the thread iterating this stream, once one has
        self._reading = threading.Lock()  # held inside __next__

    def __iter__(self) -> Iterator[RequestDelta]:
        return self

    def __next__(self) -> RequestDelta:
        # two threads iterating one stream: the second got Python's bare "ValueError:
        # generator already executing" (a bad-input trial, 2026-12-06)
        if not self._reading.acquire(blocking=False):
            raise InvalidRequestError("this RequestStream is being read by another thread; "
                                      "read a stream from one thread (other threads may "
                                      "cancel() it)")
        try:
            return self._next()
        finally:
            self._reading.release()

    def _next(self) -> RequestDelta:
        self._reader = threading.get_ident()
        try:
            return next(self._deltas)
        except KeyboardInterrupt as e:
            # Ctrl-C in a script's loop: the request is aborted (the generator's cleanup, or
            # here when the signal landed outside it) and the script sees one short
            # KeyboardInterrupt instead of a traceback through the engine and the model
            self.cancel()
            raise type(e)(INTERRUPTED) from None

    def close(self) -> None:
        """Abort the request if it is still running (e.g. on Ctrl-C). From any thread: the
        request is aborted in the engine (as `cancel`), and the stream's generator is closed
        only by the thread that reads it (or when none has yet). Closing it from another thread
        ran its cleanup there, under the engine's lock, while the reader's next read then
        raised "generator already executing"; now that reader gets the "abort" delta."""
        self.cancel()
        if self._reader in (None, threading.get_ident()):
            try:
                self._deltas.close()
            except ValueError:  # the reader started meanwhile and is inside it: it ends
                pass

    def cancel(self) -> None:
        """Abort the request from any thread, even while another one is iterating this
        stream (which then ends with finish reason "abort"): a server whose client left."""
        self._llm.engine.abort(self._req)

    @property
    def output(self) -> GenerationOutput:
        """The request's GenerationOutput so far (final once iteration ended; its
        finish_reason reads "abort" until then)."""
        return _output(self._req)

    @property
    def token_ids(self) -> list[int]:
        """The ids generated so far (the request's own list: read it, do not keep it)."""
        return self._req.output_ids

    @property
    def logprobs(self) -> list[float]:
        """Their log-probabilities so far, with SamplingParams(logprobs=True) (else empty)."""
        return self._req.logprobs

    @property
    def top_logprobs(self) -> list[list[tuple[int, float]]]:
        """Per token so far, its step's most likely (id, log-probability) pairs, with
        SamplingParams(top_logprobs=k) (else empty)."""
        return self._req.top_logprobs

    @property
    def message(self) -> ChatMessage:
        """The assistant ChatMessage parsed from the output (chat requests)."""
        return _message(self._req, self._thinking)


def _message_text(messages: Any) -> int:
    """Characters of the text in OpenAI messages (string contents and text parts, an assistant
    turn's reasoning and its calls' arguments; anything malformed counts 0: validation names it
    later): a lower bound of the prompt's length. (Counting content alone blamed a 1.2 MB
    reasoning_content on the tool definitions, a bad-input trial of 2026-12-06.)"""
    n = 0
    for m in messages if isinstance(messages, list) else ():
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        parts = content if isinstance(content, list) else [content]
        texts = [part.get("text") if isinstance(part, dict) else part for part in parts]
        texts.append(m.get("reasoning_content") or m.get("reasoning"))
        for call in m.get("tool_calls") or () if isinstance(m.get("tool_calls"), list) else ():
            fn = call.get("function") if isinstance(call, dict) else None
            args = fn.get("arguments") if isinstance(fn, dict) else None
            texts.append(args if isinstance(args, str) else
                         _dumped(args) if isinstance(args, dict) else None)
        n += sum(len(t) for t in texts if isinstance(t, str))
    return n


def _dumped(value: dict) -> str | None:
    """`value` as JSON text, or None where it holds what JSON cannot (a set, a circular
    reference, an int past Python's 4,300-digit conversion limit): validation names it later
    (a bad-input trial, 2026-12-07: these raised TypeError / ValueError from this count)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return None


# keyword arguments chat() and chat_batch() pass on to the template that the API sets itself
_API_SET = {
    "tools": "chat_batch() takes each conversation's tools in its (messages, tools) pair",
    "messages": "the conversation is the first argument, not a template variable",
    "add_generation_prompt": "chat() always ends the prompt with the assistant's turn; "
                             "flint_graph.chat.chat_template.render_chat renders other prompts",
    "markers": "set by the API from the tokenizer's added tokens, not a template variable",
    "template": "the checkpoint's chat template is the one its tokenizer_config.json holds"}


def _check_api_names(template_kwargs: Mapping[str, Any]) -> None:
    """Raise InvalidRequestError naming a template keyword argument the API sets itself
    (`_API_SET`): `chat_batch(c, tools=[])` crashed with a TypeError, `chat(m,
    add_generation_prompt=False)` answered from a prompt without the assistant's turn (a
    bad-input trial, 2026-12-07)."""
    taken = sorted(_API_SET.keys() & template_kwargs.keys())
    if taken:
        raise InvalidRequestError(f"{taken[0]}: {_API_SET[taken[0]]}", field=taken[0])


# SamplingParams' fields: keyword arguments of chat() that are these go nowhere near the template
_SAMPLING_FIELDS = frozenset(f.name for f in fields(SamplingParams))
# ... and other runtimes' names for them (transformers, OpenAI, vLLM): SamplingParams' field
_SAMPLING_ALIASES = {"max_new_tokens": "max_tokens", "max_completion_tokens": "max_tokens",
                     "sampling_params": "", "do_sample": "temperature"}


def forced_call(tool_choice: Any) -> str | None:
    """The tool a tool_choice forces a call to: the name of a function object, "" for
    "required" (the model picks the tool), None when it forces nothing. `LLM._force_call`
    makes the answer start with `<tool_call>` and that name, after the model's reasoning; the
    model has no grammar to follow after it, so what it writes is parsed as any call (an
    undeclared name or a malformed call is reported and its text kept as content). vLLM and
    llama.cpp force these with constrained decoding instead."""
    if tool_choice == "required":
        return ""
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") == "function":
        return tool_choice["function"]["name"]
    return None


def _conversation(entry: Any, i: int) -> tuple[Any, Any]:
    """(messages, tools) of `chat_batch`'s entry i: a (messages, tools) pair, or a message list
    alone (a list of dicts: its first two messages once read as the pair). Raises
    InvalidRequestError naming conversations[i]."""
    if isinstance(entry, (list, tuple)) and entry and all(isinstance(m, dict) for m in entry):
        return entry, None
    if isinstance(entry, (list, tuple)) and len(entry) == 2:
        return entry[0], entry[1]
    raise InvalidRequestError(f"conversations[{i}]: expected a (messages, tools) pair or a list "
                              f"of messages, found {found(entry, 60)}")


def _message(req: Request, thinking: bool) -> ChatMessage:
    out = _output(req)
    # Thinking off still reports reasoning the model opened itself with <think>.
    thinking = thinking or bool(out.reasoning_content)
    return ChatMessage(content=out.content or "",
                       reasoning_content=out.reasoning_content if thinking else None,
                       tool_calls=out.tool_calls, finish_reason=out.finish_reason, output=out)


def _output(req: Request) -> GenerationOutput:
    ttft, tpot = req.timing()
    out = GenerationOutput(req.prompt_ids, list(req.output_ids), req.text,
                           req.finish_reason or "abort", ttft, tpot,
                           logprobs=list(req.logprobs), cached_tokens=req.cached_tokens,
                           top_logprobs=[list(t) for t in req.top_logprobs],
                           ttft_phases_ms=req.phases_ms())
    if req.parser is not None:
        parsed = req.parser.result()
        out.reasoning_content = parsed.reasoning
        out.content = parsed.content
        out.tool_calls = list(parsed.tool_calls)
        out.errors = list(parsed.errors)
        out.withdrawn_call_text = parsed.withdrawn or None
    elif req.parser_failed:  # its output is shown as written; the error says why
        out.content = req.text
    out.errors += req.errors
    return out


def startup_report(llm: LLM, load_s: float, engine_s: float) -> dict[str, Any]:
    """What start-up cost and holds, in seconds and bytes: checkpoint_s (the whole load), split
    into checkpoint_read_s (file read and copy to the device) and repack_s (NVFP4 block
    permutation, GGUF only); engine_s (graph engine: kv_alloc_s, then per bucket
    kernel_load_B{b}_s (kernel-cache entries loaded and the layers set up) and capture_B{b}_s;
    kernel_cache_s their load total; capture_prefill_s, the prefill buckets' graphs;
    warm_up_eager_s, one eager chunk run so that the first long prompt pays no first-use
    costs: capture/runner.py); kernels_per_step per bucket (our launches), bytes of weights
    and KV cache, prefill_dense_bf16_bytes (the prefill's kept BF16 dense weights) and
    prefill_buckets (the chunk sizes in tokens replayed as graphs); kv_reuse: how many
    finished sequences the engine may retain
    (retained_max, 0 = reuse off; on the graph engine they hold KV slots counted in
    kv_cache_bytes) and the bytes of one ring snapshot (snapshot_bytes; up to
    snapshots_per_sequence per retained or running sequence, on the engine's device;
    snapshot_bytes_max their most, which the graph engine keeps free when it sizes the KV
    cache: capture/runner.py snapshot_reserve; on the reference engine, whose retained
    sequences keep KV tensors of their own, retained_ring_bytes per sequence (its sliding
    rings), retained_kv_bytes_per_token (its full layers) and retained_kv_bytes_max, what
    retained_max sequences at the context limit would hold)."""
    eng = llm.engine
    repack = llm.checkpoint.timings.get("repack_s", 0.0)
    out: dict[str, Any] = {"engine": eng.name, "checkpoint_s": round(load_s, 3),
                           "checkpoint_read_s": round(load_s - repack, 3),
                           "repack_s": round(repack, 3), "engine_s": round(engine_s, 3),
                           "weights_bytes": llm.checkpoint.weights.nbytes()}
    if eng.runner is not None:
        out.update({k: round(v, 3) for k, v in eng.runner.timings.items()})
        out["kernels_per_step"] = eng.runner.kernels_per_step
        out["kv_cache_bytes"] = eng.runner.kv.nbytes
        out["prefill_dense_bf16_bytes"] = eng.runner.memory["prefill_dense_bf16"]
        # the chunk sizes replayed as graphs (fewer when their pool did not fit beside the KV
        # cache: capture/runner.py capture_prefill_graphs)
        out["prefill_buckets"] = eng.runner.prefill_buckets
        out["context_limit"] = eng.context_limit
    else:
        out["fallback_reason"] = eng.fallback_reason
    from flint_graph.runtime.prefix_cache import MAX_SNAPSHOTS

    out["kv_reuse"] = {"retained_max": eng.prefix_cache.capacity,
                       "snapshot_bytes": llm.cfg.sliding_kv_bytes_per_slot,
                       "snapshots_per_sequence": MAX_SNAPSHOTS,
                       # the most the snapshots can hold: running and retained sequences
                       "snapshot_bytes_max": (eng.max_slots + eng.prefix_cache.capacity)
                       * MAX_SNAPSHOTS * llm.cfg.sliding_kv_bytes_per_slot}
    if eng.runner is None:  # the graph engine's retained sequences hold slots of its cache
        cfg, reuse = llm.cfg, out["kv_reuse"]
        reuse["retained_ring_bytes"] = cfg.sliding_kv_bytes_per_slot
        reuse["retained_kv_bytes_per_token"] = cfg.kv_bytes_per_token
        reuse["retained_kv_bytes_max"] = reuse["retained_max"] * (
            cfg.sliding_kv_bytes_per_slot + cfg.kv_bytes_per_token * eng.context_limit)
    return out


def output_to_json(out: GenerationOutput, engine: str | None = None,
                   context_limit: int | None = None) -> str:
    """`out` as one JSON object (the CLI's `generate --json`); `engine`, when given, names the
    engine that decoded it ("graph" or "reference"); `context_limit` (tokens), when given, is
    reported with "length_cause": "context_limit" when a "length" finish came from the context
    filling up, "max_tokens" when from the output limit (both are "length" in OpenAI's API)."""
    extra = {"engine": engine} if engine is not None else {}
    if context_limit is not None:
        extra["context_limit"] = context_limit
        if out.finish_reason == "length":
            full = len(out.prompt_token_ids) + len(out.token_ids) >= context_limit
            extra["length_cause"] = "context_limit" if full else "max_tokens"
    return json.dumps({
        "token_ids": out.token_ids,
        "text": out.text,
        "reasoning_content": out.reasoning_content,
        "content": out.content,
        "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments}
                       for c in out.tool_calls],
        "finish_reason": out.finish_reason,
        "ttft_ms": out.ttft_ms,
        "ms_per_token": out.ms_per_token,
        "prompt_tokens": len(out.prompt_token_ids),
        "cached_tokens": out.cached_tokens,
        "errors": out.errors,
        **extra,
    }, ensure_ascii=False)
