"""The OpenAI HTTP API's request bodies and responses, as `flint-graph serve` speaks them
(issue 23): which fields a request may carry, how they become `SamplingParams` and chat
arguments, and the JSON of responses, stream chunks and errors.

Follows the OpenAI API reference for `POST /v1/chat/completions`, `POST /v1/completions` and
`GET /v1/models` (object names, field names, `finish_reason` values, the `usage` block, the
error body `{"error": {"message", "type", "param", "code"}}`). A field the engine cannot honour
is refused with a 400 naming it, never silently dropped.
"""

from __future__ import annotations

import codecs
import json
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from flint_graph.errors import InvalidRequestError, kind, not_utf8
from flint_graph.runtime.sampling import TOP_LOGPROBS_MAX, SamplingParams

# fields accepted as they are; anything else is refused unless listed in the route's NEUTRAL
CHAT_FIELDS = {"model", "messages", "tools", "tool_choice", "temperature", "top_p", "top_k",
               "seed", "max_tokens", "max_completion_tokens", "stop", "logprobs", "top_logprobs",
               "stream", "stream_options", "chat_template_kwargs", "user"}
COMPLETION_FIELDS = {"model", "prompt", "temperature", "top_p", "top_k", "seed", "max_tokens",
                     "stop", "stream", "stream_options", "user", "logprobs"}
# fields honoured only at their neutral value (what clients send by default), per route
# (`_neutral` says what counts: 0.0 as 0 and logit_bias {} as null, but n: true is not n: 1)
_SHARED_NEUTRAL = {"frequency_penalty": 0, "presence_penalty": 0, "logit_bias": None, "n": 1}
# response_format: {"type": "text"} is the API's default, which some SDKs send explicitly
CHAT_NEUTRAL = {**_SHARED_NEUTRAL, "parallel_tool_calls": True,
                "response_format": {"type": "text"}}
COMPLETION_NEUTRAL = {**_SHARED_NEUTRAL, "echo": False, "suffix": None, "best_of": 1}
MAX_BODY_BYTES = 16 << 20  # far above any prompt that fits the 262K-token context


_FIELD_AT_START = re.compile(r"([a-z_]+)(?=[:\[. ])")


def field_of(message: str) -> str | None:
    """The request field an engine error message starts with ("tools[0] 'f': ...",
    "tool_choice: ...", "messages[2].content: ..."), for the error body's `param`; None when
    it names no field of the API."""
    m = _FIELD_AT_START.match(message)
    return m.group(1) if m and m.group(1) in CHAT_FIELDS | COMPLETION_FIELDS else None


MESSAGE_CHARS = 1000  # of an error message; PARAM_CHARS of its param
PARAM_CHARS = 100


# control characters and the bidirectional overrides and isolates (Unicode TR9): quoted raw in
# an error, a client's U+202E reversed the text of the log line or terminal that showed it
_ESCAPED = {c: f"\\u{c:04x}" for c in [*range(0x20), *range(0x7F, 0xA0), 0x061C, 0x200E,
                                        0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]}


def _printable(text: str, most: int) -> str:
    """`text` cut to `most` characters (marked "…") with lone surrogates (\\ud800), control
    characters and bidirectional controls (\\u202e) escaped: error bodies quote the client's
    keys and values, which a hostile client can make 15 MB long (a 29 MB error body),
    unencodable as UTF-8 (a 500, 2026-12-03) or able to reorder what a terminal shows
    (2026-12-06)."""
    text = text if len(text) <= most else text[:most] + "…"
    return text.encode("utf-8", "backslashreplace").decode("utf-8").translate(_ESCAPED)


class APIError(Exception):
    """An error the server answers with `status` and an OpenAI error body. The message and
    param are cut to MESSAGE_CHARS / PARAM_CHARS and made encodable (`_printable`)."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 kind: str = "invalid_request_error", code: str | None = None):
        message = _printable(str(message), MESSAGE_CHARS)
        param = None if param is None else _printable(str(param), PARAM_CHARS)
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = (status, message, param,
                                                                        kind, code)

    def body(self) -> dict[str, Any]:
        """The OpenAI error body."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


def _bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


def _neutral(value, neutral) -> bool:
    """Whether `value` asks for nothing beyond `neutral`: null; a number (not a boolean) equal
    to a numeric neutral (0.0 as 0); an empty object or string where the neutral is null
    (logit_bias {}, suffix ""); else the same type and value (n: true is not n: 1)."""
    if value is None:
        return True
    if isinstance(neutral, (int, float)) and not isinstance(neutral, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) \
            and value == neutral
    if neutral is None:
        return value == {} or value == ""
    return type(value) is type(neutral) and value == neutral


def _quoted(value: Any, most: int = 60) -> str:
    """The start of `value` as JSON, at most about `most` characters, rendered only that far:
    serialising a huge value whole to quote its start held the event loop for 3 s on a 13 MB
    list (2026-12-03)."""
    parts: list[str] = []
    left = [most]

    def put(text: str) -> None:
        parts.append(text[:max(left[0], 0)])
        left[0] -= len(text)

    def walk(v: Any, depth: int) -> None:
        if left[0] <= 0:
            return
        if isinstance(v, (list, dict)) and depth < 8:
            items = v.items() if isinstance(v, dict) else v
            put("{" if isinstance(v, dict) else "[")
            for n, item in enumerate(items):
                if left[0] <= 0:
                    return
                put(", " if n else "")
                if isinstance(v, dict):
                    put(json.dumps(str(item[0])[:most]) + ": ")
                    item = item[1]
                walk(item, depth + 1)
            put("}" if isinstance(v, dict) else "]")
        elif isinstance(v, (list, dict)):
            put("…")
        else:
            put(json.dumps(v if not isinstance(v, str) else v[:most], default=str))

    walk(value, 0)
    text = "".join(parts)
    return text if left[0] >= 0 else text + "…"


def check_fields(body: Any, allowed: set[str], neutral: dict[str, Any]) -> Mapping[str, Any]:
    """`body` as a mapping whose every field is allowed, or in `neutral` at its neutral value;
    also the types of model, user, stream and stream_options. Raises APIError 400 naming the
    first field that is not."""
    if not isinstance(body, Mapping):
        raise _bad(f"request body: expected a JSON object, found {kind(body)}")
    for key, value in body.items():
        if key in neutral:
            if not _neutral(value, neutral[key]):
                raise _bad(f"{key} = {_quoted(value)}: this server "
                           f"supports only {json.dumps(neutral[key])} (or leaving it out)", key)
        elif key not in allowed:
            raise _bad(f"{key}: not a field this server supports", key)
    for key in ("model", "user"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise _bad(f"{key}: expected a string, found {kind(body[key])}", key)
        try:  # as every other text field: no lone surrogates
            (body.get(key) or "").encode("utf-8")
        except UnicodeEncodeError as e:
            raise _bad(f"{key}: {not_utf8(body[key], e)}", key) from None
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise _bad("stream: expected true or false", "stream")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise _bad("stream_options: only allowed when stream is true", "stream_options")
    return body


def sampling_params(body: Mapping[str, Any], completion: bool = False) -> SamplingParams:
    """SamplingParams from the request's temperature, top_p, top_k, seed, max_tokens (or
    max_completion_tokens), stop and logprobs (chat: true / false, with top_logprobs 0..20
    alternatives per token; completions: the number of alternatives per token, 0..20, 0 giving
    only the chosen tokens' log-probabilities). Raises APIError 400 naming the field."""
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, (str, list)):
        raise _bad("stop: expected a string or a list of strings", "stop")
    if stop == "":
        stop = None  # as OpenAI's API and vLLM read it: no stop string
    for key in ("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed"):
        try:  # each field that is present is checked, even where another one wins
            SamplingParams(**{"max_tokens" if key.startswith("max") else key: body.get(key)})
        except InvalidRequestError as e:
            raise _bad(f"{key}: {e.detail or e}", key) from None
    logprobs, top = body.get("logprobs"), 0
    if completion:
        if logprobs is not None and (isinstance(logprobs, bool) or not isinstance(logprobs, int)
                                     or not 0 <= logprobs <= TOP_LOGPROBS_MAX):
            raise _bad(f"logprobs: expected an integer from 0 to {TOP_LOGPROBS_MAX} "
                       "(alternatives per token)", "logprobs")
        top, logprobs = logprobs or 0, logprobs is not None
    else:
        if logprobs is not None and not isinstance(logprobs, bool):
            raise _bad("logprobs: expected true or false", "logprobs")
        top = body.get("top_logprobs")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int)
                                or not 0 <= top <= TOP_LOGPROBS_MAX):
            raise _bad(f"top_logprobs: expected an integer from 0 to {TOP_LOGPROBS_MAX}",
                       "top_logprobs")
        if top and not logprobs:
            raise _bad("top_logprobs: needs logprobs: true", "top_logprobs")
        top = top or 0
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    try:
        return SamplingParams(temperature=body.get("temperature"), top_p=body.get("top_p"),
                              top_k=body.get("top_k"), seed=body.get("seed"), max_tokens=limit,
                              stop=stop or (), logprobs=bool(logprobs), top_logprobs=top)
    except InvalidRequestError as e:  # in the words of the fields above ("stop: expected …")
        if e.field is None:
            raise
        raise _bad(f"{e.field}: {e.detail or e}", e.field) from None


def _bool_option(body: Mapping[str, Any], field: str, option: str, default: bool) -> bool:
    """body[field][option], an object holding that one boolean option (or absent). Raises
    APIError 400 naming `field` for another shape, another option or a non-boolean value."""
    opts = body.get(field)
    opts = {} if opts is None else opts  # false, 0, [] or "" are not objects either
    if not isinstance(opts, Mapping):
        raise _bad(f"{field}: expected an object", field)
    unknown = set(opts) - {option}
    if unknown:
        raise _bad(f"{field}.{sorted(unknown)[0]}: not an option this server supports "
                   f"({option})", field)
    value = opts.get(option, default)
    if not isinstance(value, bool):
        raise _bad(f"{field}.{option}: expected true or false", field)
    return value


def include_usage(body: Mapping[str, Any]) -> bool:
    """stream_options.include_usage (only meaningful with stream)."""
    return _bool_option(body, "stream_options", "include_usage", False)


def enable_thinking(body: Mapping[str, Any]) -> bool:
    """chat_template_kwargs.enable_thinking (default true, GLM-4.7's default)."""
    return _bool_option(body, "chat_template_kwargs", "enable_thinking", True)


def new_id(prefix: str) -> str:
    """A response id, e.g. chatcmpl-<32 hex>."""
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """The usage block (cached prompt tokens under prompt_tokens_details, as OpenAI)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def chat_message(msg) -> dict[str, Any]:
    """An assistant ChatMessage as the response's `message` (arguments as JSON strings;
    reasoning under both names clients read: reasoning_content and reasoning)."""
    out: dict[str, Any] = {"role": "assistant", "content": msg.content or None}
    if msg.reasoning_content:
        out["reasoning_content"] = out["reasoning"] = msg.reasoning_content
    if msg.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments_json()}}
                             for c in msg.tool_calls]
    return out


def missed_forced_call(tool_choice: Any, msg) -> list[dict[str, Any]] | None:
    """`withdrawn_tool_calls` entries ([{"index": 0, "reason", "text"}]: text, where there is
    some, what the model wrote after the forced `<tool_call>`) for an answer with no tool
    call where `tool_choice` forced one ("required" or a named function), else None. The
    engine forces `<tool_call>` and the name but not what follows (`api.forced_call`), so the
    model can still write no valid call; without this a client saw `finish_reason: "stop"` and
    content starting with the forced `<tool_call>` (a bad-input trial, 2026-12-07)."""
    from flint_graph.api import forced_call

    if forced_call(tool_choice) is None or msg.tool_calls:
        return None
    why = next((e for e in msg.output.errors if e.startswith("tool call")),
               "the model wrote no tool call")
    entry = {"index": 0, "reason": f"tool_choice forced a call and none came: {why}"}
    if msg.output.withdrawn_call_text:  # what it wrote instead: not content (a re-trial)
        entry["text"] = msg.output.withdrawn_call_text
    return [entry]


def tool_call_warnings(msg) -> list[str] | None:
    """The output parser's findings on this answer's calls, for `tool_call_warnings` (a vendor
    field of the message, or of a stream's last delta): a returned call's missing required or
    undeclared arguments, repairs, values no reading of the schema fits, a rejected call whose
    text became content, call markup outside a call; None when there are none. A withdrawn
    forced call is said by `withdrawn_tool_calls` instead. Why: a forced calculator call with
    get_weather's arguments came back with nothing to flag it, though the parser had recorded
    it (a bad-input trial, 2026-12-07); the CLI's `--json` shows these as `errors`."""
    from flint_graph.chat.output_parser import WITHDRAWN

    said = [e for e in msg.output.errors if not e.endswith(WITHDRAWN)]
    return said or None


def chat_logprobs(out, token_bytes) -> dict[str, Any] | None:
    """OpenAI's `choices[].logprobs` for a GenerationOutput that recorded them (None when not
    asked): `token_logprobs` of its tokens."""
    if not out.logprobs:
        return None
    return {"content": token_logprobs(out.token_ids, out.logprobs, token_bytes,
                                      out.top_logprobs),
            "refusal": None}


def token_logprobs(ids, lps, token_bytes, tops=None) -> list[dict[str, Any]]:
    """Chat logprobs entries of tokens `ids` with natural-log probabilities `lps` (the model's
    own distribution): each token's `bytes` as it stands for them (`token_bytes`: id -> bytes;
    a token may hold part of a UTF-8 character, so only the joined bytes are text), its text
    (those bytes decoded, U+FFFD for a partial character) and its step's alternatives
    (`tops`: per token (id, log-probability) pairs, most likely first; none when not given)."""
    def entry(tid: int, lp: float) -> dict[str, Any]:
        raw = token_bytes(tid)
        return {"token": raw.decode("utf-8", "replace"), "logprob": lp, "bytes": list(raw)}

    return [{**entry(tid, lp), "top_logprobs": [entry(t, v) for t, v in top]}
            for tid, lp, top in zip(ids, lps, tops or [()] * len(ids))]


def _legacy_text(raw: bytes) -> str:
    """A token's text in the legacy completions logprobs: its bytes decoded when they are whole
    UTF-8, else OpenAI's form for part of a character, "bytes:" and each byte as \\xNN. Decoded
    with replacement, every such token read U+FFFD, so the alternatives of one step (keys of a
    dict) collapsed into one: 3 of the 5 asked for (a bad-input trial, 2026-12-06)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def completion_logprobs(ids, lps, token_bytes, offset: int = 0,
                        decoder=None, tops=None) -> tuple[dict[str, Any], int]:
    """The legacy completions `choices[].logprobs` of tokens `ids`: their texts
    (`_legacy_text`: "bytes:\\xNN…" for part of a character), log-probabilities, the
    alternatives (`tops`: per token (id, log-probability) pairs, as {text: log-probability}; None, null in the response, when
    logprobs 0 asked for none: a list, even an empty one, keeps a stream's type the same)
    and each token's character offset in the completion text, counted from
    `offset` with `decoder` (an incremental UTF-8 decoder carried across calls: a token that
    starts inside a character gets that character's offset); also the offset after them."""
    decoder = decoder or codecs.getincrementaldecoder("utf-8")("replace")
    tokens, offsets = [], []
    for tid in ids:
        raw = token_bytes(tid)
        offsets.append(offset)
        tokens.append(_legacy_text(raw))
        offset += len(decoder.decode(raw))
    alternatives = None
    if tops is not None:
        alternatives = []
        for top in tops:
            alt: dict[str, float] = {}
            for t, v in top:  # most likely first: a key two ids share keeps the larger value
                alt.setdefault(_legacy_text(token_bytes(t)), v)
            alternatives.append(alt)
    return {"tokens": tokens, "token_logprobs": list(lps), "top_logprobs": alternatives,
            "text_offset": offsets}, offset


def chat_response(rid: str, model: str, msg, decode=None,
                  tool_choice: Any = None) -> dict[str, Any]:
    """The non-streamed chat.completion object (`decode`: token id -> bytes, for logprobs);
    the message carries `withdrawn_tool_calls` where `tool_choice` forced a call that did not
    come (`missed_forced_call`), and `tool_call_warnings` where the parser found something in
    a call (`tool_call_warnings`)."""
    out = msg.output
    lps = chat_logprobs(out, decode) if decode is not None else None
    message = chat_message(msg)
    missed = missed_forced_call(tool_choice, msg)
    if missed:
        message["withdrawn_tool_calls"] = missed
    warnings = tool_call_warnings(msg)
    if warnings:
        message["tool_call_warnings"] = warnings
    return {"id": rid, "object": "chat.completion", "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message,
                         "finish_reason": msg.finish_reason, "logprobs": lps}],
            "usage": usage(len(out.prompt_token_ids), len(out.token_ids), out.cached_tokens)}


def chat_chunk(rid: str, model: str, created: int, delta: dict[str, Any],
               finish_reason: str | None = None) -> dict[str, Any]:
    """One chat.completion.chunk with one choice."""
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                         "logprobs": None}]}


def usage_chunk(rid: str, model: str, created: int, out) -> dict[str, Any]:
    """The last chunk when stream_options.include_usage: no choices, the usage block."""
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [],
            "usage": usage(len(out.prompt_token_ids), len(out.token_ids), out.cached_tokens)}
