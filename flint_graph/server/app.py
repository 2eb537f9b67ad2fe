"""`flint-graph serve`'s ASGI app (FastAPI): the OpenAI HTTP API on one `LLM` (issue 23).

Routes: GET /health, GET /metrics, GET /v1/models, POST /v1/chat/completions and
POST /v1/completions,
streamed as server-sent events when the request says `stream`. Every request runs on the one
engine: a handler drives its own request's stream in a worker thread, and the engine's steps
advance every running request at once (`Engine.step` serialises them), so concurrent clients
share batched decode steps. A streaming client that disconnects has its request aborted at the
next chunk. Bodies are checked by `protocol.py`; errors are OpenAI error bodies.
"""

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
# FastAPI reads the handlers' annotations at run time: Request must be a module-level name
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from flint_graph.errors import FlintError
from flint_graph.server import protocol as p
from flint_graph.server.metrics import ServerMetrics


def create_app(llm, model_name: str, api_key: str | None = None, on_error=None):
    """The FastAPI app serving `llm` as model `model_name`; with `api_key`, every /v1 route
    wants `Authorization: Bearer <api_key>` (401 otherwise).

    `llm` is an LLM, or a function returning one, called in a background thread when the app
    starts: until it returns, /health answers 503 {"status": "loading"} and every other route
    503; if it raises, /health answers 503 {"status": "error", "error": ...} and
    `on_error(message)` is called (the CLI stops the server with it)."""
    state: dict[str, Any] = {"llm": None, "metrics": None, "error": None}

    def _loaded(model) -> None:
        state["metrics"] = ServerMetrics(model.engine)
        state["llm"] = model

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
        yield

    app = FastAPI(title="flint-graph", docs_url=None, redoc_url=None, lifespan=lifespan)

    def _ready():
        """The LLM, or APIError 503 while it loads (or failed to)."""
        if state["llm"] is None:
            why = (f"the model failed to load ({state['error']})" if state["error"] else
                   "the model is still loading; GET /health answers 200 once it is ready")
            raise p.APIError(503, why, kind="server_error", code="model_not_ready")
        return state["llm"]

    @app.exception_handler(p.APIError)
    async def _api_error(_request: Request, e: p.APIError):
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(FlintError)
    async def _flint_error(_request: Request, e: FlintError):
        return JSONResponse(p.APIError(400, str(e)).body(), status_code=400)

    async def _body(request: Request) -> Any:
        if api_key is not None:
            auth = request.headers.get("authorization", "")
            if auth != f"Bearer {api_key}":
                raise p.APIError(401, "missing or wrong API key (Authorization: Bearer ...)",
                                 kind="authentication_error", code="invalid_api_key")
        try:
            return await request.json()
        except (ValueError, UnicodeDecodeError):
            raise p.APIError(400, "request body: expected JSON") from None

    def _model(body) -> None:
        name = body.get("model")
        if name is not None and name != model_name:
            raise p.APIError(404, f"model {name!r} does not exist; this server serves "
                                  f"{model_name!r}", "model", code="model_not_found")

    @app.get("/health")
    async def health():
        if state["llm"] is None:
            status = {"status": "error", "error": state["error"]} if state["error"] else \
                {"status": "loading"}
            return JSONResponse(status, status_code=503)
        return {"status": "ok", "engine": state["llm"].engine.name}

    @app.get("/metrics")
    async def prometheus():
        _ready()
        data, kind = state["metrics"].render()
        return Response(data, media_type=kind)

    @app.get("/v1/models")
    async def models(request: Request):
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise p.APIError(401, "missing or wrong API key (Authorization: Bearer ...)",
                             kind="authentication_error", code="invalid_api_key")
        _ready()
        return {"object": "list", "data": [{"id": model_name, "object": "model",
                                            "created": int(time.time()),
                                            "owned_by": "flint-graph"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        llm, metrics = _ready(), state["metrics"]
        body = p.check_fields(await _body(request), p.CHAT_FIELDS)
        _model(body)
        params = p.sampling_params(body)
        thinking = p.enable_thinking(body)
        kwargs = {"enable_thinking": thinking, "tool_choice": body.get("tool_choice")}
        messages, tools = body.get("messages"), body.get("tools")
        if not body.get("stream"):
            msg = await run_in_threadpool(llm.chat, messages, tools, params, **kwargs)
            metrics.record("chat", msg.output)
            return p.chat_response(p.new_id("chatcmpl"), model_name, msg)
        stream = llm.stream_chat(messages, tools, params, **kwargs)  # validates before the 200
        usage = p.include_usage(body)
        return StreamingResponse(_sse(request, _chat_events(stream, usage), stream.cancel),
                                 media_type="text/event-stream")

    def _chat_events(stream, usage: bool) -> Iterator[dict]:
        rid, created = p.new_id("chatcmpl"), int(time.time())
        yield p.chat_chunk(rid, model_name, created, {"role": "assistant", "content": ""})
        try:
            for d in stream:
                delta: dict[str, Any] = {}
                if d.reasoning:
                    delta["reasoning_content"] = delta["reasoning"] = d.reasoning
                if d.content:
                    delta["content"] = d.content
                calls = [c.to_openai() for c in d.tool_call_deltas if not c.error]
                if calls:
                    delta["tool_calls"] = calls
                if delta:
                    yield p.chat_chunk(rid, model_name, created, delta)
        finally:
            stream.close()  # aborts the request when the client went away mid-stream
            state["metrics"].record("chat", stream.output)
        msg = stream.message
        yield p.chat_chunk(rid, model_name, created, {}, msg.finish_reason)
        if usage:
            yield p.usage_chunk(rid, model_name, created, msg.output)

    @app.post("/v1/completions")
    async def completions(request: Request):
        llm, metrics = _ready(), state["metrics"]
        body = p.check_fields(await _body(request), p.COMPLETION_FIELDS)
        _model(body)
        params = p.sampling_params(body)
        prompt = body.get("prompt")
        if not isinstance(prompt, (str, list)):
            raise p.APIError(400, "prompt: expected a string or a list of token ids", "prompt")
        if not body.get("stream"):
            out = (await run_in_threadpool(llm.generate, [prompt], params))[0]
            metrics.record("completions", out)
            return {"id": p.new_id("cmpl"), "object": "text_completion",
                    "created": int(time.time()), "model": model_name,
                    "choices": [{"index": 0, "text": out.text, "finish_reason": out.finish_reason,
                                 "logprobs": None}],
                    "usage": p.usage(len(out.prompt_token_ids), len(out.token_ids),
                                     out.cached_tokens)}
        stream = llm.stream(prompt, params)
        return StreamingResponse(
            _sse(request, _completion_events(stream, p.include_usage(body)), stream.cancel),
            media_type="text/event-stream")

    def _completion_events(stream, usage: bool) -> Iterator[dict]:
        rid, created = p.new_id("cmpl"), int(time.time())

        def chunk(text: str, finish: str | None) -> dict:
            return {"id": rid, "object": "text_completion", "created": created,
                    "model": model_name,
                    "choices": [{"index": 0, "text": text, "finish_reason": finish,
                                 "logprobs": None}]}

        try:
            for d in stream:
                if d.text:
                    yield chunk(d.text, None)
        finally:
            stream.close()
            state["metrics"].record("completions", stream.output)
        out = stream.output
        yield chunk("", out.finish_reason)
        if usage:
            yield {"id": rid, "object": "text_completion", "created": created,
                   "model": model_name, "choices": [],
                   "usage": p.usage(len(out.prompt_token_ids), len(out.token_ids),
                                    out.cached_tokens)}

    async def _sse(request: Request, events: Iterator[dict], cancel) -> AsyncIterator[str]:
        """The events as SSE lines, pulled from a worker thread. When the client goes away
        (Starlette then cancels this generator, possibly while a worker is inside `next`),
        `cancel` aborts the request in the engine from a shielded worker, and the worker's
        iteration ends on its own."""
        done, finished = object(), False
        try:
            while True:
                if await request.is_disconnected():
                    return
                event = await run_in_threadpool(next, events, done)
                if event is done:
                    finished = True
                    break
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            if not finished:
                with anyio.CancelScope(shield=True):
                    await run_in_threadpool(cancel)

    return app
