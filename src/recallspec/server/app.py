"""The HTTP side: FastAPI routes of the OpenAI API, auth, errors, streaming.

Every error is an OpenAI error body with a 4xx status for the client's mistakes
(malformed JSON, wrong types, unknown fields or model, unsupported parameters, prompts
the engine refuses, a full queue: 429 with Retry-After, no or a wrong bearer token: 401)
and 500 only for our own failures. The corpus routes (``/v1/corpora``) live in
``corpora.py``. A streaming client that disconnects aborts its
request (Starlette cancels the stream; the abort reaches the engine before its next
step); a non-streaming one is watched for the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from recallspec.engine import RequestOutput
from recallspec.server import protocol as P
from recallspec.server.corpora import add_corpus_routes
from recallspec.server.engine_loop import Accepted, EngineLoop, Rejected, RequestStream
from recallspec.server.errors import ApiError, parse


def create_app(loop: EngineLoop, *, model_name: str, api_key: str | None = None,
               corpus_dir: Path | None = None,
               on_shutdown: Callable[[], None] | None = None) -> FastAPI:
    """The routes over ``loop``'s engine; ``corpus_dir``: the only directory
    ``POST /v1/corpora`` may load files from (None: documents in the body only);
    ``on_shutdown`` runs (in a worker thread) when the server stops gracefully."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)

    app = FastAPI(title="recallspec", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    engine = loop.engine

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError) -> JSONResponse:
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, e: StarletteHTTPException) -> JSONResponse:
        return ApiError(e.status_code, str(e.detail)).response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, e: RequestValidationError) -> JSONResponse:
        return ApiError(400, str(e)).response()

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:
        return ApiError(500, f"internal error: {type(e).__name__}").response()

    def authorize(request: Request) -> None:
        if api_key is None:
            return
        got = request.headers.get("authorization", "")
        if not hmac.compare_digest(got.encode(), f"Bearer {api_key}".encode()):
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer ...)",
                           code="invalid_api_key")

    @app.get("/health")
    async def health() -> Response:
        if not loop.is_alive():
            raise ApiError(503, "the engine thread is not running")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(loop.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    add_corpus_routes(app, engine, authorize, corpus_dir)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        authorize(request)
        return JSONResponse({"object": "list", "data": [{
            "id": model_name, "object": "model", "created": int(time.time()),
            "owned_by": "recallspec", "max_model_len": engine.max_len,
        }]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        authorize(request)
        return await serve(request, await parse(request, P.CompletionRequest))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        authorize(request)
        return await serve(request, await parse(request, P.ChatRequest))

    async def serve(request: Request, req: P.CompletionRequest | P.ChatRequest) -> Response:
        if req.model != model_name:
            raise ApiError(404, f"model {req.model!r} does not exist; this server serves "
                                f"{model_name!r}", "model", "model_not_found")
        bad = req.unsupported()
        if bad:
            raise ApiError(400, f"{bad}: not supported by this server", bad)
        try:
            sub = P.submission(req, engine.max_len, int(engine.model.config.vocab_size))
        except ValueError as e:
            raise ApiError(400, str(e)) from None
        stream = RequestStream(asyncio.get_running_loop(), sub)
        loop.submit(stream)
        first = await stream.get()
        if isinstance(first, Rejected):
            headers = {"Retry-After": "1"} if first.status == 429 else None
            raise ApiError(first.status, first.message, first.param, headers=headers)
        assert isinstance(first, Accepted)
        chat = isinstance(req, P.ChatRequest)
        ids = bool(req.recallspec and req.recallspec.return_token_ids)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return _EventStream(sse(stream, first, chat, ids, usage),
                                on_close=lambda: loop.abort(stream))
        return await collect(request, stream, first, chat, ids)

    async def collect(request: Request, stream: RequestStream, acc: Accepted, chat: bool,
                      ids: bool) -> Response:
        async def watch() -> None:  # a client that hangs up aborts its request
            while (await request.receive())["type"] != "http.disconnect":
                pass
            loop.abort(stream)

        watcher = asyncio.ensure_future(watch())
        text: list[str] = []
        tokens: list[int] = []
        done = False
        try:
            while True:
                out = await stream.get()
                if isinstance(out, Rejected):
                    done = True
                    raise ApiError(out.status, out.message)
                assert isinstance(out, RequestOutput)
                text.append(out.new_text)
                tokens += out.new_token_ids
                if out.finished:
                    done = True
                    break
        finally:
            watcher.cancel()
            if not done:  # cancelled (the server stops): free the slot
                loop.abort(stream)
        if out.finish_reason == "abort":
            return Response(status_code=499)  # nobody is listening
        if out.finish_reason == "error":
            raise ApiError(500, f"the request failed: {out.error}")
        body = P.envelope(stream.sub, model_name, chat, chunk=False)
        body["choices"] = [P.choice(chat, "".join(text), out.finish_reason,
                                    tokens if ids else None, delta=False)]
        body.update(P.final_fields(out, acc.num_prompt_tokens, len(tokens)))
        return JSONResponse(body)

    async def sse(stream: RequestStream, acc: Accepted, chat: bool, ids: bool,
                  usage: bool) -> AsyncIterator[str]:
        n_tokens = 0
        if chat:  # OpenAI's first chunk: the role
            yield _event(chunk(stream, chat, "", None, [] if ids else None, first=True))
        while True:
            out = await stream.get()
            if isinstance(out, Rejected):
                yield _event(P.error_body(out.message, "server_error"))
                break
            assert isinstance(out, RequestOutput)
            n_tokens += len(out.new_token_ids)
            if out.finish_reason == "error":
                yield _event(P.error_body(f"the request failed: {out.error}", "server_error"))
                break
            if out.new_text or out.finished or (ids and out.new_token_ids):
                c = chunk(stream, chat, out.new_text, out.finish_reason,
                          list(out.new_token_ids) if ids else None)
                if out.finished:
                    c["metrics"] = P.spec_metrics(out.spec)
                yield _event(c)
            if out.finished:
                break
        if usage:
            c = P.envelope(stream.sub, model_name, chat, chunk=True)
            cached = P.cached_tokens(out) if isinstance(out, RequestOutput) else 0
            c.update(choices=[], usage=P.usage(acc.num_prompt_tokens, n_tokens, cached))
            yield _event(c)
        yield "data: [DONE]\n\n"

    def chunk(stream: RequestStream, chat: bool, text: str, reason: str | None,
              token_ids: list[int] | None, first: bool = False) -> dict[str, Any]:
        c = P.envelope(stream.sub, model_name, chat, chunk=True)
        c["choices"] = [P.choice(chat, text, reason, token_ids, delta=True, first=first)]
        return c

    return app


class _EventStream(StreamingResponse):
    """Server-Sent Events that abort their request however the response ends: a client
    hanging up cancels the stream (Starlette), even before its first event, and the
    abort reaches the engine before its next step (a finished request ignores it)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
