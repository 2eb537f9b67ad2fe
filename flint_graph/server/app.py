"""`flint-graph serve`'s ASGI app (FastAPI): the OpenAI HTTP API on one `LLM` (issue 23).

Routes: GET /health, GET /metrics, GET /v1/models, GET /v1/models/{id},
POST /v1/chat/completions and POST /v1/completions,
streamed as server-sent events when the request says `stream`. Every request runs on the one
engine: a handler drives its own request's stream in a worker thread, and the engine's steps
advance every running request at once (`Engine.step` serialises them), so concurrent clients
share batched decode steps. A streaming client that disconnects has its request aborted at the
next chunk. Bodies are checked by `protocol.py`; errors are OpenAI error bodies.
"""

import codecs
import contextlib
import dataclasses
import hmac
import json
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.to_thread
import asyncio
# FastAPI reads the handlers' annotations at run time: Request must be a module-level name
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from flint_graph.checkpoints import jsonfile
from flint_graph.errors import FlintError, found, shown
from flint_graph.server import protocol as p
from flint_graph.server.metrics import ServerMetrics

# how often a request waiting for its next event checks that its client is still there (s)
DISCONNECT_POLL_S = 0.25
_GONE = object()  # `_next_while_connected`: the client left before the next event
_STOPPED = object()  # ... or abort_all ended the request before it (a shutdown's grace passed)


BODY_TIMEOUT_S = 60.0  # to receive a whole request body
# bytes of request bodies being received at once, all connections together: each connection
# may take BODY_TIMEOUT_S to send up to MAX_BODY_BYTES, and 128 bodies held just short of
# complete took 2.7 GB of the server's memory (a bad-input trial, 2026-12-06); past this a body
# gets 503 and the client retries
MAX_BODIES_IN_FLIGHT_BYTES = 256 << 20
# '[' and '{' bytes a body may hold (counted before parsing): json.loads holds the interpreter
# lock while it builds each array and object, so 5.4 million of them in 16 MB held every other
# client for 2.7 s (a worker thread did not help, 2026-12-03); a prompt that fills the context
# with its tool schemas holds a few thousand
MAX_JSON_CONTAINERS = 200_000
# an error's extra response headers: after a 408, 413 or 415 the rest of the body is unread,
# so the connection closes rather than wait on it; a 415 for a content coding names the one
# taken (RFC 9110 §15.5.16)
_ERROR_HEADERS = {408: {"connection": "close"}, 413: {"connection": "close"},
                  415: {"connection": "close", "accept-encoding": "identity"}}
# ... and by error code, where the status alone does not say the body went unread; a busy
# server's 429 says when to retry, as the 503 does (RFC 9110 §10.2.3; a bad-input trial found
# it without one, 2026-12-07: clients such as openai's then back off by their own guess)
_ERROR_HEADERS_BY_CODE = {"bodies_in_flight": {"connection": "close", "retry-after": "1"},
                          "too_many_requests": {"retry-after": "1"}}


def _parsed(raw: bytearray) -> Any:
    """The JSON value of a request body. Raises APIError 400 for more than
    MAX_JSON_CONTAINERS '[' and '{' bytes, bytes that are not UTF-8 (RFC 8259 §8.1; a leading
    byte-order mark is ignored, as §8.1 allows), nesting too deep to parse, or text that is
    not JSON."""
    containers = raw.count(b"[") + raw.count(b"{")
    if containers > MAX_JSON_CONTAINERS:
        # counted as bytes, so brackets inside strings count too (a string-aware count of
        # a 16 MiB body held the event loop for up to 0.7 s here, 2026-12-05): say so
        raise p.APIError(400, f"request body: {containers:,} '[' and '{{' characters, "
                              "counted before parsing, inside strings too; at most "
                              f"{MAX_JSON_CONTAINERS:,} (the bound on parsing time)",
                         code="too_many_json_containers")
    bom = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:  # was "could not parse it as JSON" (2026-12-06)
        at = bom + e.start  # utf-8-sig counts from after the mark
        raise p.APIError(400, f"request body: not valid UTF-8 (byte 0x{raw[at]:02X} at "
                              f"offset {at}: {e.reason}); JSON bodies must be UTF-8") from None
    try:
        return jsonfile.loads(text)
    except json.JSONDecodeError:
        raise p.APIError(400, "request body: could not parse it as JSON") from None
    except ValueError as e:  # nested too deeply, an integer past Python's digit limit
        raise p.APIError(400, f"request body: could not parse it as JSON ({e})") from None


def create_app(llm, model_name: str, api_key: str | None = None, on_error=None,
               max_waiting: int | None = 256, body_timeout_s: float = BODY_TIMEOUT_S,
               on_ready=None, request_log=None):
    """The FastAPI app serving `llm` as model `model_name`; with `api_key`, every /v1 route
    wants `Authorization: Bearer <api_key>`, the scheme in any case (401 otherwise). Requests
    beyond the engine's slots wait in arrival order; with `max_waiting`, one that finds that
    many already waiting gets 429 at once (code "too_many_requests"), before any work. A
    request body must arrive within `body_timeout_s` seconds (408 "request_timeout" otherwise:
    a body sent a byte at a time held its connection for as long as the client liked), and
    hold at most MAX_JSON_CONTAINERS '[' and '{' bytes (400 before parsing), in UTF-8 (400
    naming the first bad byte's offset otherwise); a compressed body (any Content-Encoding
    but identity) gets 415 before it is read. 408, 413 and 415 close the connection (the rest
    of the body is unread).

    `llm` is an LLM, or a function returning one, called in a background thread when the app
    starts: until it returns, /health answers 503 {"status": "loading"} and every other route
    503; if it raises, /health answers 503 {"status": "error", "error": ...} and
    `on_error(message)` is called (the CLI stops the server with it); once it is loaded,
    `on_ready(llm)` (the CLI logs that the server is ready). `request_log(line)`, when given,
    gets one line per finished generation (`metrics.request_line`: route, finish reason,
    tokens, TTFT, time) and one per refused request (method, path, status, reason).

    `app.state.abort_all()` (the CLI calls it when a shutdown's grace has passed) aborts every
    open request in the engine (from a thread: an abort waits for the engine step in
    progress) and each handler ends its own response at once, without waiting for that step:
    a streamed one with finish_reason "abort" and [DONE], another with a 503 error (code
    "server_shutting_down");
    from then on every route but /health answers 503 (on connections still open: uvicorn
    refuses new ones once it shuts down), a request whose body is still arriving too. Call
    it on the event loop's thread. Returns how many requests it aborted in the engine."""
    if max_waiting is not None and (not isinstance(max_waiting, int) or max_waiting < 1):
        raise ValueError(f"max_waiting = {max_waiting!r}: expected an int >= 1 (or None: no "
                         "bound)")
    state: dict[str, Any] = {"llm": None, "metrics": None, "error": None, "stopping": False,
                             "created": None}
    uploads: set[anyio.CancelScope] = set()  # request bodies being received
    in_flight = [0]  # their bytes so far (MAX_BODIES_IN_FLIGHT_BYTES); the event loop's only

    def _loaded(model) -> None:
        state["metrics"] = ServerMetrics(model.engine, request_log)
        # the model object's `created`: the same on every answer (it was each answer's time)
        state["created"] = int(time.time())
        state["llm"] = model
        if on_ready is not None:
            on_ready(model)

    def _load() -> None:
        try:
            _loaded(llm())
        except BaseException as e:  # noqa: BLE001 - reported on /health and to on_error
            state["error"] = f"{type(e).__name__}: {e}"
            if on_error is not None:
                on_error(state["error"])

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if callable(llm) and not hasattr(llm, "engine"):
            threading.Thread(target=_load, name="flint-graph-load", daemon=True).start()
        else:
            _loaded(llm)
        state["stop_event"] = asyncio.Event()  # made on the serving loop: abort_all sets it
        yield
        if state["llm"] is not None:  # shutting down: nothing keeps generating
            eng = state["llm"].engine
            for req in list(eng.waiting) + list(eng.prefilling) + list(eng.running):
                eng.abort(req)

    app = FastAPI(title="flint-graph", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)

    def abort_all() -> int:
        state["stopping"] = True
        if state.get("stop_event") is not None:  # handlers stop waiting on the engine
            state["stop_event"].set()
        for scope in list(uploads):  # a body still arriving: that request answers 503 now
            scope.cancel()
        if state["llm"] is None:
            return 0
        eng = state["llm"].engine
        reqs = list(eng.waiting) + list(eng.prefilling) + list(eng.running)
        # An abort waits for the engine step in progress (a long prompt's chunk: seconds on
        # a loaded CPU): from a thread, so this event loop answers meanwhile (it froze for
        # the chunk, and uvicorn's timeout then cut the responses; bad-input trial 2026-12-05)
        threading.Thread(target=lambda: [eng.abort(r) for r in reqs], daemon=True,
                         name="flint-graph-abort-all").start()
        return len(reqs)

    def open_requests() -> int:
        """Requests the engine holds now (waiting, prefilling or running)."""
        if state["llm"] is None:
            return 0
        eng = state["llm"].engine
        return len(eng.waiting) + len(eng.prefilling) + len(eng.running)

    app.state.abort_all = abort_all
    app.state.open_requests = open_requests
    app.router.redirect_slashes = False

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on "
                f"{request.url.path}"}.get(e.status_code, str(e.detail))
        return JSONResponse(p.APIError(e.status_code, what).body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _bug(_request: Request, e: Exception):  # ours: one line, never a traceback
        return JSONResponse(p.APIError(500, f"internal error: {type(e).__name__}: {e}",
                                       kind="server_error").body(), status_code=500)

    def _ready():
        """The LLM, or APIError 503 while it loads (or failed to) or shuts down."""
        if state["stopping"]:
            raise _stopping()
        if state["llm"] is None:
            why = (f"the model failed to load ({state['error']})" if state["error"] else
                   "the model is still loading; GET /health answers 200 once it is ready")
            raise p.APIError(503, why, kind="server_error", code="model_not_ready")
        return state["llm"]

    @app.exception_handler(ClientDisconnect)
    async def _gone(_request: Request, _e: ClientDisconnect):
        # the client left while its body was arriving: nothing to answer, nothing to log
        # (through the catch-all below, Starlette re-raised it: a 58-line traceback per client)
        return Response(status_code=400)

    def _log_refusal(request: Request, status: int, message: str) -> None:
        """The request log's line for a refused request (a re-trial, 2026-12-07: 400s, 404s
        and 429s left none, so a burst of refusals was invisible): method, path, status and
        the start of the reason. Not for /health, which load balancers poll."""
        if request_log is not None and request.url.path != "/health":
            reason = " ".join(message.split())
            reason = reason if len(reason) <= 120 else reason[:120] + "…"
            request_log(f"{request.method} {request.url.path} {status}: {reason}")

    @app.exception_handler(p.APIError)
    async def _api_error(request: Request, e: p.APIError):
        _log_refusal(request, e.status, e.message)
        return JSONResponse(e.body(), status_code=e.status,
                            headers=_ERROR_HEADERS_BY_CODE.get(e.code)
                            or _ERROR_HEADERS.get(e.status))

    @app.exception_handler(FlintError)
    async def _flint_error(request: Request, e: FlintError):
        msg = str(e)
        # the error's own field where it has one ("sampling argument 'stop': ..." starts with
        # none), else the field its message starts with
        field = getattr(e, "field", None)
        if field not in p.CHAT_FIELDS | p.COMPLETION_FIELDS:
            field = p.field_of(msg)
        if field == "prompt" and request.url.path.endswith("/chat/completions"):
            field = "messages"  # a chat's prompt is its messages (OpenAI's param there)
        _log_refusal(request, 400, msg)
        return JSONResponse(p.APIError(400, msg, field).body(), status_code=400)

    want = None if api_key is None else api_key.encode()

    def _auth(request: Request) -> None:
        """APIError 401 unless the request's Authorization is "Bearer <api_key>", the scheme
        in any case and followed by one space or more (RFC 7235 §2.1: `bearer KEY` was a
        401, bad-input trial 2026-12-06)."""
        if want is None:
            return
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        got = key.lstrip(" ").encode("latin-1", "replace")
        # the key compared in constant time: the time to refuse says nothing about it
        if not (hmac.compare_digest(got, want) and scheme.lower() == "bearer"):
            raise p.APIError(401, "missing or wrong API key (Authorization: Bearer ...)",
                             kind="authentication_error", code="invalid_api_key")

    def _uncompressed(request: Request) -> None:
        """APIError 415 for a body with a content coding (gzip, br, ...): it was parsed as
        JSON as it came and refused as not JSON (bad-input trial, 2026-12-06). Decoding it
        would need a bound on the decoded size; clients send these bodies uncompressed."""
        given = request.headers.getlist("content-encoding")
        codings = {c.strip().lower() for value in given for c in value.split(",")}
        if codings - {"", "identity"}:  # identity: no coding (RFC 9110 §8.4.1)
            shown = ", ".join(given)  # echoed at most 80 characters (a 25 KB header was whole)
            shown = shown if len(shown) <= 80 else shown[:80] + "…"
            raise p.APIError(415, f"request body: compressed (Content-Encoding: {shown}); "
                                  "this server takes uncompressed JSON bodies only",
                             code="unsupported_content_encoding")

    async def _body(request: Request) -> Any:
        _auth(request)
        _uncompressed(request)
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > p.MAX_BODY_BYTES:
            raise _too_large()
        raw = bytearray()
        late = False
        with anyio.CancelScope() as scope:  # abort_all cancels it
            uploads.add(scope)
            try:
                with anyio.move_on_after(body_timeout_s) as clock:
                    async for part in request.stream():
                        raw += part
                        in_flight[0] += len(part)
                        if len(raw) > p.MAX_BODY_BYTES:
                            raise _too_large()
                        if in_flight[0] > MAX_BODIES_IN_FLIGHT_BYTES:
                            raise p.APIError(
                                503, f"server busy: request bodies being received hold more "
                                     f"than {MAX_BODIES_IN_FLIGHT_BYTES >> 20} MiB; retry later",
                                kind="server_error", code="bodies_in_flight")
                late = clock.cancelled_caught
            finally:
                uploads.discard(scope)
                in_flight[0] -= len(raw)
        if scope.cancelled_caught:
            raise _stopping()
        if late:
            raise p.APIError(408, f"request body: not received within {body_timeout_s:g} s",
                             code="request_timeout")
        return _parsed(raw)

    def _too_large() -> p.APIError:
        return p.APIError(413, f"request body: larger than {p.MAX_BODY_BYTES >> 20} MiB",
                          code="request_too_large")

    def _model(body) -> None:
        name = body.get("model")
        if name is not None and name != model_name:
            raise _no_model(name)

    def _no_model(name) -> p.APIError:
        return p.APIError(404, f"model {shown(name, 80)} does not exist; this server serves "
                               f"{shown(model_name, 80)}", "model", code="model_not_found")

    def _card() -> dict[str, Any]:
        """The served model's object, as GET /v1/models lists it."""
        return {"id": model_name, "object": "model", "created": state["created"],
                "owned_by": "flint-graph"}

    @app.api_route("/health", methods=["GET", "HEAD"])  # load balancers probe with HEAD too
    async def health():
        if state["llm"] is None:
            status = {"status": "error", "error": state["error"]} if state["error"] else \
                {"status": "loading"}
            return JSONResponse(status, status_code=503)
        return {"status": "ok", "engine": state["llm"].engine.name}

    @app.get("/metrics")
    async def prometheus():
        _ready()
        data, media = state["metrics"].render()
        return Response(data, media_type=media)

    @app.get("/v1/models")
    async def models(request: Request):
        _auth(request)
        _ready()
        return {"object": "list", "data": [_card()]}

    # `path`: a served name may hold a slash ("org/model"), sent as is or as %2F
    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(request: Request, model_id: str):
        _auth(request)
        _ready()
        if model_id != model_name:
            raise _no_model(model_id)
        return _card()

    admitting = [0]  # requests accepted that have no first token yet (queued or prefilling)
    room_lock = threading.Lock()

    class _Admission:
        """One accepted request's place in the bound; `done` (idempotent) frees it once the
        request has its first token or has ended."""

        def __init__(self):
            self.open = True

        def done(self) -> None:
            with room_lock:
                if self.open:
                    self.open = False
                    admitting[0] -= 1

    def _room() -> _Admission:
        """429 when `max_waiting` accepted requests still wait for their first token (queued
        behind the engine's slots, or prefilling); counted here from acceptance, since many
        arriving at once all saw an empty engine queue before any reached it."""
        with room_lock:
            waiting = admitting[0]
            if max_waiting is not None and waiting >= max_waiting:
                raise p.APIError(429, f"server busy: {waiting} "
                                      f"request{'s' if waiting != 1 else ''} already wait"
                                      f"{'s' if waiting == 1 else ''} for "
                                      f"their first token (flint-graph serve --max-waiting "
                                      f"{max_waiting}); retry later", kind="rate_limit_error",
                                 code="too_many_requests")
            admitting[0] += 1
        return _Admission()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        llm, metrics = _ready(), state["metrics"]
        body = p.check_fields(await _body(request), p.CHAT_FIELDS, p.CHAT_NEUTRAL)
        _model(body)
        params = p.sampling_params(body)
        kwargs = {"enable_thinking": p.enable_thinking(body),
                  "tool_choice": body.get("tool_choice")}
        usage = p.include_usage(body)
        # building the prompt encodes it: off the event loop (a huge message takes seconds)
        admission = _room()
        try:
            stream = await run_in_threadpool(llm.stream_chat, body.get("messages"),
                                             body.get("tools"), params, **kwargs)
        except BaseException:
            admission.done()
            raise
        weakref.finalize(stream, admission.done)  # a response never iterated frees it too
        _started(stream)
        decode = _decoder(llm) if params.logprobs else None
        sse = await _respond(request, body, _chat_events(stream, usage, decode, admission,
                                                         body.get("tool_choice")),
                             stream, "chat", metrics, admission)
        if sse:
            return sse
        if state["stopping"] and stream.message.finish_reason == "abort":
            raise _stopping(stream)
        # the parsed message, as LLM.chat and `generate --json` report it: an output the model
        # ended inside its reasoning is the answer (content) only; a stream must send it twice
        # (first as reasoning, then, once known to be the answer, as content)
        msg = stream.message
        if not msg.reasoning_content:
            msg = dataclasses.replace(msg, reasoning_content=None)
        return p.chat_response(p.new_id("chatcmpl"), model_name, msg, _decoder(llm),
                               body.get("tool_choice"))

    def _stopping(stream=None) -> p.APIError:
        n = 0 if stream is None else len(stream.output.token_ids)
        done = f": the request was aborted after {n} token{'s' * (n != 1)}" if n else ""
        return p.APIError(503, f"the server is shutting down{done}", kind="server_error",
                          code="server_shutting_down")

    def _started(stream) -> None:
        """A request that reached the engine after abort_all is aborted too."""
        if state["stopping"]:
            stream.cancel()

    def _decoder(llm):
        return llm.tokenizer.token_bytes  # id -> the bytes it stands for (logprobs)

    def _new_logprobs(stream, sent: list[int], decode) -> list[dict] | None:
        """Chat logprobs entries of the tokens generated since the last call (`sent` holds
        how many went out), or None when the request does not record them."""
        if decode is None:
            return None
        ids, lps, tops = stream.token_ids, stream.logprobs, stream.top_logprobs
        n = min(len(ids), len(lps))
        new = p.token_logprobs(ids[sent[0]:n], lps[sent[0]:n], decode,
                               tops[sent[0]:n] if tops else None)
        sent[0] = n
        return new

    def _chat_events(stream, usage: bool, decode=None, admission=None,
                     tool_choice=None) -> Iterator[dict]:
        from flint_graph.api import forced_call

        rid, created = p.new_id("chatcmpl"), int(time.time())
        sent = [0]  # tokens whose logprobs went out (they ride on the chunks, in order)
        forced = forced_call(tool_choice) is not None
        held: list[dict] = []  # a forced call's withdrawal: said in the last chunk
        yield p.chat_chunk(rid, model_name, created, {"role": "assistant", "content": ""})
        for d in stream:
            if admission is not None:
                admission.done()  # it has a token: no longer waiting
            delta: dict[str, Any] = {}
            if d.reasoning:
                delta["reasoning_content"] = delta["reasoning"] = d.reasoning
            if d.content:
                delta["content"] = d.content
            calls = [c.to_openai() for c in d.tool_call_deltas if not c.error]
            if calls:
                delta["tool_calls"] = calls
            # A call streamed in part and then found cut off or malformed is no call: the
            # non-streamed answer has its text as content. OpenAI's stream cannot take back the
            # fragments sent, so it says so (a vendor field SDKs keep) beside that content.
            gone = [{"index": c.index, "reason": c.error} for c in d.tool_call_deltas if c.error]
            if forced:  # the forced call (the first, index 0) is withdrawn in the last chunk,
                # with the reason and the text the non-streamed answer gives (mid-stream it
                # said "kept as content" and sent none: a bad-input trial, 2026-12-07)
                held += [g for g in gone if g["index"] == 0]
                gone = [g for g in gone if g["index"] != 0]
            if gone:
                delta["withdrawn_tool_calls"] = gone
            if delta:
                chunk = p.chat_chunk(rid, model_name, created, delta)
                lps = _new_logprobs(stream, sent, decode)
                if lps is not None:
                    chunk["choices"][0]["logprobs"] = {"content": lps, "refusal": None}
                yield chunk
            else:
                yield None  # nothing to send; `_pump` still checks the client is there
        msg = stream.message
        # a forced call that did not come, whether its fragments went out or not: the last
        # chunk says so as the non-streamed answer does (a later call of the model's own
        # leaves the forced one's withdrawal as it was read)
        missed = p.missed_forced_call(tool_choice, msg) or held or None
        warnings = p.tool_call_warnings(msg)
        last = p.chat_chunk(rid, model_name, created,
                            ({"withdrawn_tool_calls": missed} if missed else {})
                            | ({"tool_call_warnings": warnings} if warnings else {}),
                            msg.finish_reason)
        lps = _new_logprobs(stream, sent, decode)
        if lps is not None:  # tokens whose text was held back (or produced none) until the end
            last["choices"][0]["logprobs"] = {"content": lps, "refusal": None}
        yield last
        if usage:
            yield p.usage_chunk(rid, model_name, created, msg.output)

    @app.post("/v1/completions")
    async def completions(request: Request):
        llm, metrics = _ready(), state["metrics"]
        body = p.check_fields(await _body(request), p.COMPLETION_FIELDS, p.COMPLETION_NEUTRAL)
        _model(body)
        params = p.sampling_params(body, completion=True)
        prompt = body.get("prompt")
        if not isinstance(prompt, (str, list)):
            raise p.APIError(400, "prompt: expected a string or a list of token ids", "prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(x, (str, list))
                                                        for x in prompt):
            # the API's batch form; a list of strings read as token ids said "must be ints"
            if len(prompt) > 1:
                raise p.APIError(400, f"prompt: a batch of {len(prompt)} prompts; this server "
                                 "takes one prompt per request (a string or a list of token "
                                 "ids, or a batch of one)", "prompt")
            prompt = prompt[0]  # a batch of one, as clients send it: its own checks apply
            at = next((i for i, t in enumerate(prompt) if type(t) is not int), None) \
                if isinstance(prompt, list) else None
            if at is not None:  # a token-id list with a string in it, not a batch
                raise p.APIError(400, f"prompt[0][{at}]: token ids must be integers, found "
                                 f"{found(prompt[at])}", "prompt")
        usage = p.include_usage(body)
        admission = _room()
        try:
            stream = await run_in_threadpool(llm.stream, prompt, params)
        except BaseException:
            admission.done()
            raise
        weakref.finalize(stream, admission.done)
        _started(stream)
        decode = _decoder(llm) if params.logprobs else None
        events = _completion_events(stream, usage, decode, admission, params.top_logprobs > 0)
        sse = await _respond(request, body, events,
                             stream, "completions", metrics, admission)
        if sse:
            return sse
        out = stream.output
        if state["stopping"] and out.finish_reason == "abort":
            raise _stopping(stream)
        lps = (p.completion_logprobs(out.token_ids, out.logprobs, decode,
                                     tops=out.top_logprobs if params.top_logprobs else None)[0]
               if decode is not None else None)
        return {"id": p.new_id("cmpl"), "object": "text_completion",
                "created": int(time.time()), "model": model_name,
                "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason,
                             "logprobs": lps}],
                "usage": p.usage(len(out.prompt_token_ids), len(out.token_ids),
                                 out.cached_tokens)}

    def _completion_events(stream, usage: bool, decode=None, admission=None,
                           alternatives: bool = False) -> Iterator[dict]:
        rid, created = p.new_id("cmpl"), int(time.time())
        sent, offset = [0], [0]  # tokens whose logprobs went out; their text's length
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # across chunks

        def chunk(text: str, finish: str | None) -> dict:
            lps = None
            if decode is not None:
                ids, lp, tops = stream.token_ids, stream.logprobs, stream.top_logprobs
                n = min(len(ids), len(lp))
                lps, offset[0] = p.completion_logprobs(ids[sent[0]:n], lp[sent[0]:n], decode,
                                                       offset[0], utf8,
                                                       tops[sent[0]:n] if alternatives else None)
                sent[0] = n
            return {"id": rid, "object": "text_completion", "created": created,
                    "model": model_name,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                 "logprobs": lps}]}

        for d in stream:
            if admission is not None:
                admission.done()
            yield chunk(d.text, None) if d.text else None  # None: only the disconnect check
        out = stream.output
        yield chunk("", out.finish_reason)
        if usage:
            yield {"id": rid, "object": "text_completion", "created": created,
                   "model": model_name, "choices": [],
                   "usage": p.usage(len(out.prompt_token_ids), len(out.token_ids),
                                    out.cached_tokens)}

    async def _next_while_connected(request: Request, events: Iterator[dict], done, stream):
        """next(events, done) from a worker thread, while the client is watched: one that
        leaves before the event comes (a long prompt's prefill takes many engine steps)
        aborts the request at once, and the worker's `next` then returns within one engine
        step (one prefill chunk); returns _GONE then. Why: the disconnect was checked only
        between events, so a client that gave up during an ~8K-token prefill on the CPU was
        noticed at the first token, 35 s later (bad-input trial, 2026-12-03).

        Likewise abort_all (a shutdown's grace passed): returns _STOPPED at once, the worker
        left to finish its engine step. Why: the abort takes effect between engine steps, and
        a long prompt's chunk on a loaded CPU outlasted uvicorn's last 5 s, which then cut the
        responses (a plain-text 500, a stream without [DONE]; bad-input trial, 2026-12-05)."""
        got: list = []

        async def watch() -> None:  # `_pump` checked just before: poll from the next period
            await anyio.sleep(DISCONNECT_POLL_S)
            while not await request.is_disconnected():
                await anyio.sleep(DISCONNECT_POLL_S)
            got.append(_GONE)
            with anyio.CancelScope(shield=True):
                await run_in_threadpool(stream.cancel)

        async def watch_stop() -> None:
            await state["stop_event"].wait()
            # even one the engine has ended: its reader may be queued behind the step in
            # progress for its last deltas (seen in a test), so it ends as aborted too
            got.append(_STOPPED)
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch)
            if state.get("stop_event") is not None:
                tg.start_soon(watch_stop)
            # abandon_on_cancel: when Starlette cancels a streamed response (it saw the
            # disconnect itself), `_pump`'s cleanup aborts the request now; the worker's
            # `next` then returns within a step, its event unused
            event = await anyio.to_thread.run_sync(next, events, done, abandon_on_cancel=True)
            tg.cancel_scope.cancel()  # the watcher, between its polls
        return got[0] if got else event

    async def _pump(request: Request, events: Iterator[dict], stream, route: str,
                    metrics, ended: list | None = None,
                    admission=None) -> AsyncIterator[dict]:
        """The events, pulled from a worker thread while the client is connected. When it goes
        away (or Starlette cancels the response, possibly while a worker is inside `next`),
        the request is aborted in the engine from a shielded worker and the worker's iteration
        ends on its own. The request is counted in the metrics once, however it ended."""
        done, finished = object(), False
        try:
            while True:
                if await request.is_disconnected():
                    return
                event = await _next_while_connected(request, events, done, stream)
                if event is _GONE:
                    return
                if event is _STOPPED:
                    if ended is not None:
                        ended.append(_STOPPED)
                    return
                if event is done:
                    finished = True
                    if ended is not None:
                        ended.append(True)
                    return
                if event is not None:  # None: a step with nothing to send (tokens held back,
                    yield event        # a call's arguments not streamed): checked, not sent
        finally:
            with anyio.CancelScope(shield=True):
                if not finished and not (ended and ended[-1] is _STOPPED):
                    await run_in_threadpool(stream.cancel)  # (abort_all's thread aborts those)
                if admission is not None:
                    admission.done()
                metrics.record(route, stream.output)  # ("abort" until the engine ends it)

    async def _sse(request, events, stream, route, metrics,
                   admission=None) -> AsyncIterator[str]:
        """The events as server-sent events, then [DONE] when the stream ended normally or
        abort_all ended it (first a last chunk with finish_reason "abort", as the engine's
        own abort would have sent)."""
        ended: list = []
        last = None
        async for event in _pump(request, events, stream, route, metrics, ended, admission):
            last = event
            yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
        if _STOPPED in ended:
            yield f"data: {json.dumps(_abort_chunk(route, last), ensure_ascii=False)}\n\n"
        if ended:
            yield "data: [DONE]\n\n"

    def _abort_chunk(route: str, last: dict | None) -> dict:
        """The last chunk of a stream abort_all ended: the stream's id, finish "abort"."""
        if route == "chat":
            rid = last["id"] if last else p.new_id("chatcmpl")
            created = last["created"] if last else int(time.time())
            return p.chat_chunk(rid, model_name, created, {}, "abort")
        return {"id": last["id"] if last else p.new_id("cmpl"), "object": "text_completion",
                "created": last["created"] if last else int(time.time()), "model": model_name,
                "choices": [{"index": 0, "text": "", "finish_reason": "abort",
                             "logprobs": None}]}

    async def _respond(request, body, events, stream, route, metrics, admission=None):
        """With `stream`, the SSE response of `events`; else None once the request has run
        to its end (a client that leaves aborts it), its result read from `stream`."""
        if body.get("stream"):
            return StreamingResponse(_sse(request, events, stream, route, metrics, admission),
                                     media_type="text/event-stream")
        ended: list = []
        async for _ in _pump(request, events, stream, route, metrics, ended, admission):
            pass
        if _STOPPED in ended:
            raise _stopping(stream)
        return None

    return app
