"""The HTTP side: FastAPI routes of the OpenAI API, auth, errors, streaming.

Every error is an OpenAI error body with a 4xx status for the client's mistakes
(malformed JSON, wrong types, unknown fields or model, unsupported parameters, prompts
the engine refuses, a full queue: 429 with Retry-After, no or a wrong bearer token: 401)
and 500 only for our own failures. A streaming client that disconnects aborts its
request (Starlette cancels the stream; the abort reaches the engine before its next
step); a non-streaming one is watched for the same.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from recallspec.engine import RequestOutput
from recallspec.server import protocol as P
from recallspec.server.engine_loop import Accepted, EngineLoop, Rejected, RequestStream

MAX_BODY = 8 << 20  # bytes; a prompt filling the context is far below this
_KINDS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        kind = _KINDS.get(self.status, "server_error" if self.status >= 500 else
                          "invalid_request_error")
        return JSONResponse(P.error_body(self.message, kind, self.param, self.code),
                            status_code=self.status, headers=self.headers)


def create_app(loop: EngineLoop, *, model_name: str, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="recallspec", docs_url=None, redoc_url=None, openapi_url=None)
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
            c.update(choices=[], usage=P.usage(acc.num_prompt_tokens, n_tokens))
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


async def parse(request: Request, model: type[P.CompletionRequest] | type[P.ChatRequest]
                ) -> Any:
    """The request body validated as ``model`` (400 naming the first problem)."""
    body = await request.body()
    if len(body) > MAX_BODY:
        raise ApiError(413, f"request body over {MAX_BODY} bytes")
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise ApiError(400, *_describe(e)) from None


def _describe(e: ValidationError) -> tuple[str, str | None]:
    """(message, param) of a validation error's first problem."""
    err = e.errors(include_url=False)[0]
    loc = ".".join(str(x) for x in err["loc"]) or None
    if err["type"] == "extra_forbidden":
        return f"unrecognized request argument: {loc}", loc
    if err["type"] == "json_invalid":
        return f"the body is not valid JSON: {err['msg']}", None
    if err["type"] == "model_type" and loc is None:
        return "the body must be a JSON object", None
    return (f"{loc}: {err['msg']}" if loc else err["msg"]), loc


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
