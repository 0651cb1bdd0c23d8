"""The HTTP side: FastAPI routes of the OpenAI API, auth, errors, streaming.

Every error is an OpenAI error body with a 4xx status for the client's mistakes
(malformed JSON, wrong types, unknown fields or model, unsupported parameters, prompts
the engine refuses, guides that do not compile, a full queue: 429 with Retry-After, no
or a wrong bearer token: 401) and 500 only for our own failures; a 400 names the field
at fault (``param``) where one is. A request with ``n`` choices runs as ``n`` engine
requests, added together and answered in one body or one stream of interleaved chunks.
A chat with tools is rendered and given its calls' guide by ``tool_support.py``, and
its choices' outputs are parsed for calls (``tool_calls.py``: whole, or incrementally
as stream deltas, each choice by its own parser); so is every harmony chat reply, whose
analysis channel becomes ``reasoning_content`` (the message's, or the deltas' as it
comes), never content. The corpus routes (``/v1/corpora``)
live in ``corpora.py``. A streaming client that disconnects aborts its request
(Starlette cancels the stream; the abort reaches the engine before its next step); a
non-streaming one is watched for the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from recallspec.decoding.logprobs import TokenLogprob
from recallspec.engine import RequestOutput
from recallspec.grammar import GrammarError
from recallspec.server import protocol as P
from recallspec.server import responses as R
from recallspec.server.corpora import add_corpus_routes
from recallspec.server.engine_loop import Accepted, EngineLoop, Rejected, RequestStream, merged
from recallspec.server.errors import ApiError, parse
from recallspec.server.tool_calls import (
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    ToolCallStream,
    ToolFamily,
    parse_tool_calls,
)
from recallspec.server.tool_support import ToolSupport


def create_app(loop: EngineLoop, *, model_name: str, api_key: str | None = None,
               corpus_dir: Path | None = None,
               on_shutdown: Callable[[], None] | None = None,
               tools: ToolSupport | None = None) -> FastAPI:
    """The routes over ``loop``'s engine; ``corpus_dir``: the only directory
    ``POST /v1/corpora`` may load files from (None: documents in the body only);
    ``on_shutdown`` runs (in a worker thread) when the server stops gracefully;
    ``tools``: how requests with tools are rendered and parsed (default: as the engine's
    tokenizer's chat template allows, ``ToolSupport.of``)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        if on_shutdown is not None:
            await asyncio.to_thread(on_shutdown)

    app = FastAPI(title="recallspec", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    engine = loop.engine
    tool_support = tools if tools is not None else ToolSupport.of(engine.tokenizer)

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
        # cost_curve: "measuring" while the server measures it in the background (its
        # drafts priced by a conservative prior meanwhile), "measured", "failed" (the
        # prior stays; the log says why) or "none".
        return JSONResponse({"status": "ok", "cost_curve": engine.curves.state})

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
        vocab_size = int(engine.model.config.vocab_size)
        try:
            sub = P.submission(req, engine.max_len, vocab_size)
        except ValueError as e:
            param = e.param if isinstance(e, P.ParamError) else None
            raise ApiError(400, str(e), param) from None
        if sub.tools is not None or P.uses_tools(sub.prompt):
            # Rendered with the tools (and their template) and encoded here, on a worker
            # thread; the calls' grammar becomes the guide.
            try:
                sub = await asyncio.to_thread(tool_support.prepare, sub, engine.tokenizer)
            except P.ParamError as e:
                raise ApiError(400, str(e), e.param) from None
        guide = sub.params.guide
        if guide is not None:
            # Compiled here, on a worker thread, so that a guide that does not compile is
            # a 400 before anything is submitted and the engine thread's own compile (the
            # same key: guide, tokenizer, vocabulary) is a cache hit, not a stall of
            # every running request. GrammarError carries llguidance's reason (a syntax
            # error, an unsupported schema, a grammar over the parser's limits).
            try:
                await asyncio.to_thread(engine.guides.compile, guide, engine.tokenizer,
                                        vocab_size=vocab_size)
            except GrammarError as e:
                raise ApiError(400, f"{sub.guide_param}: {e}", sub.guide_param) from None
        aloop = asyncio.get_running_loop()
        streams = [RequestStream(aloop, sub, i) for i in range(sub.n)]
        loop.submit(streams)
        firsts = [await s.get() for s in streams]
        for first in firsts:  # the engine thread takes or refuses the choices together
            if isinstance(first, Rejected):
                headers = {"Retry-After": "1"} if first.status == 429 else None
                raise ApiError(first.status, first.message, first.param, headers=headers)
        acc = firsts[0]
        assert isinstance(acc, Accepted)
        reply = _Reply(sub, streams, acc.num_prompt_tokens, isinstance(req, P.ChatRequest),
                       bool(req.recallspec and req.recallspec.return_token_ids),
                       engine.tokenizer.decode, loop,
                       tool_support.family if (sub.tools is not None and sub.tools.calls) or (
                           # (harmony's channels are markup in every chat reply: its final
                           # message is the content, with tools or without)
                           isinstance(req, P.ChatRequest) and tool_support.family == "harmony")
                       else None)
        if req.stream:
            usage = bool(req.stream_options and req.stream_options.include_usage)
            return _EventStream(sse(reply, usage), on_close=reply.abort)
        return await collect(request, reply)

    async def collect(request: Request, reply: _Reply) -> Response:
        async def watch() -> None:  # a client that hangs up aborts its request
            while (await request.receive())["type"] != "http.disconnect":
                pass
            reply.abort()

        watcher = asyncio.ensure_future(watch())
        n = len(reply.streams)
        text: list[list[str]] = [[] for _ in range(n)]
        tokens: list[list[int]] = [[] for _ in range(n)]
        lps: list[list[TokenLogprob]] = [[] for _ in range(n)]
        last: list[RequestOutput | None] = [None] * n
        try:
            async with contextlib.aclosing(merged(reply.streams)) as outs:
                async for i, out in outs:
                    if isinstance(out, Rejected):
                        raise ApiError(out.status, out.message)
                    assert isinstance(out, RequestOutput)
                    text[i].append(out.new_text)
                    tokens[i] += out.new_token_ids
                    lps[i] += out.new_logprobs
                    if out.finished:
                        last[i] = out
                        if out.finish_reason in ("abort", "error"):
                            break
        finally:
            watcher.cancel()
            # Choices still running (another one failed, the server stops): free them.
            reply.abort([s for s, o in zip(reply.streams, last, strict=True) if o is None])
        ends = [o for o in last if o is not None]
        if any(o.finish_reason == "abort" for o in ends):
            return Response(status_code=499)  # nobody is listening
        for o in ends:
            if o.finish_reason == "error":
                if isinstance(o.exception, GrammarError):  # its grammar, over a parser
                    raise ApiError(400, f"the request failed: {o.error}",  # limit midway
                                   reply.sub.guide_param or "tools")
                raise ApiError(500, f"the request failed: {o.error}")
        assert len(ends) == n
        body = R.envelope(reply.sub.request_id, model_name, reply.chat, chunk=False)
        choices = []
        for i, o in enumerate(ends):
            content: str | None = "".join(text[i])
            reason, calls, reasoning = o.finish_reason, None, None
            if reply.family is not None:  # the calls (and harmony's reasoning) out of the text
                parsed = parse_tool_calls(reply.family, content or "")
                content, reasoning = parsed.content, parsed.reasoning
                calls = [c.to_openai() for c in parsed.calls] or None
                reason = R.tool_finish_reason(reason, bool(calls))
            choices.append(R.choice(
                i, reply.chat, content, reason, tokens[i] if reply.ids else None, delta=False,
                logprobs=reply.logprobs(lps[i])[0] if reply.has_logprobs else None,
                tool_calls=calls, reasoning=reasoning))
        body["choices"] = choices
        body["usage"] = R.usage(reply.prompt_tokens, sum(map(len, tokens)), R.cached_tokens(ends))
        body["metrics"] = R.spec_metrics(R.total_spec([o.spec for o in ends]))
        return JSONResponse(body)

    async def sse(reply: _Reply, usage: bool) -> AsyncIterator[str]:
        n = len(reply.streams)
        n_tokens = 0
        offsets = [0] * n  # completions' text_offset, per choice
        last: list[RequestOutput | None] = [None] * n
        # A parser per choice where the output is parsed for calls (its deltas held back
        # until decided: content or a call's fragments).
        parsers = None if reply.family is None else [
            ToolCallStream(reply.family) for _ in range(n)]
        if reply.chat:  # OpenAI's first chunk of each choice: the role
            for i in range(n):
                yield _event(chunk(reply, i, "", None, [] if reply.ids else None, first=True))
        async with contextlib.aclosing(merged(reply.streams)) as outs:
            async for i, out in outs:
                if isinstance(out, Rejected):
                    yield _event(R.error_body(out.message, "server_error"))
                    break
                assert isinstance(out, RequestOutput)
                n_tokens += len(out.new_token_ids)
                if out.finish_reason == "error":
                    yield _event(R.error_body(f"the request failed: {out.error}",
                                              "server_error"))
                    break
                if out.finished:
                    last[i] = out
                new_ids = bool(out.new_token_ids) and (reply.ids or reply.has_logprobs)
                if parsers is not None:
                    for c in tool_chunks(reply, i, out, parsers[i], new_ids, offsets):
                        yield _event(c)
                elif out.new_text or out.finished or new_ids:
                    lp = None
                    if reply.has_logprobs and out.new_token_ids:
                        lp, offsets[i] = reply.logprobs(out.new_logprobs, offsets[i])
                    c = chunk(reply, i, out.new_text, out.finish_reason,
                              list(out.new_token_ids) if reply.ids else None, logprobs=lp)
                    if out.finished:
                        c["metrics"] = R.spec_metrics(out.spec)
                    yield _event(c)
        if usage:
            c = R.envelope(reply.sub.request_id, model_name, reply.chat, chunk=True)
            c.update(choices=[], usage=R.usage(reply.prompt_tokens, n_tokens,
                                               R.cached_tokens(last)))
            yield _event(c)
        yield "data: [DONE]\n\n"

    def chunk(reply: _Reply, index: int, text: str | None, reason: str | None,
              token_ids: list[int] | None, first: bool = False,
              logprobs: dict[str, Any] | None = None,
              tool_calls: list[dict[str, Any]] | None = None,
              reasoning: str | None = None) -> dict[str, Any]:
        c = R.envelope(reply.sub.request_id, model_name, reply.chat, chunk=True)
        c["choices"] = [R.choice(index, reply.chat, text, reason, token_ids, delta=True,
                                 first=first, logprobs=logprobs, tool_calls=tool_calls,
                                 reasoning=reasoning)]
        return c

    def tool_chunks(reply: _Reply, index: int, out: RequestOutput, parser: ToolCallStream,
                    new_ids: bool, offsets: list[int]) -> list[dict[str, Any]]:
        """The chunks of one output of a choice parsed for calls: a chunk per run of
        content, of reasoning or of call fragments that became decided, in the output's
        order; the output's token ids and logprobs on the first, its finish on the last
        (an empty delta where nothing else goes out)."""
        events = parser.feed(out.new_text) if out.new_text else []
        if out.finished:
            events += parser.finish()
        pieces = _runs(events)
        if not pieces and (out.finished or new_ids):
            pieces = [_Run()]
        lp = None
        if reply.has_logprobs and out.new_token_ids:
            lp, offsets[index] = reply.logprobs(out.new_logprobs, offsets[index])
        reason = (R.tool_finish_reason(out.finish_reason, bool(parser.calls))
                  if out.finished else None)
        chunks = []
        for k, run in enumerate(pieces):
            first, last = k == 0, k == len(pieces) - 1
            ids = list(out.new_token_ids) if first else []
            c = chunk(reply, index, run.content, reason if last else None,
                      ids if reply.ids else None, logprobs=lp if first else None,
                      tool_calls=run.calls, reasoning=run.reasoning)
            if out.finished and last:
                c["metrics"] = R.spec_metrics(out.spec)
            chunks.append(c)
        return chunks

    return app


@dataclass(frozen=True)
class _Reply:
    """One response's request: its submission, a stream per choice, and its shape."""

    sub: P.Submission
    streams: list[RequestStream]  # [i]: choice i's
    prompt_tokens: int
    chat: bool
    ids: bool  # choices carry token_ids
    decode: Callable[[Sequence[int]], str]  # token texts of logprobs
    loop: EngineLoop
    family: ToolFamily | None = None  # the call syntax the output is parsed for (None: none)

    @property
    def has_logprobs(self) -> bool:
        return self.sub.params.logprobs is not None

    def logprobs(self, entries: Sequence[TokenLogprob], offset: int = 0,
                 ) -> tuple[dict[str, Any], int]:
        return R.logprobs(self.chat, entries, self.decode, offset)

    def abort(self, streams: Sequence[RequestStream] | None = None) -> None:
        """Abort ``streams`` (default: every choice; one that has ended ignores it)."""
        for s in self.streams if streams is None else streams:
            self.loop.abort(s)


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


@dataclass(frozen=True)
class _Run:
    """One stream delta's payload: a run of content, of reasoning or of call fragments
    (at most one of the three set; none: an empty delta)."""

    content: str | None = None
    reasoning: str | None = None
    calls: list[dict[str, Any]] | None = None  # ``delta.tool_calls`` items


def _runs(events: Sequence[StreamEvent]) -> list[_Run]:
    """Stream events as deltas: each run of content or of reasoning as its text, each
    run of call fragments as a ``tool_calls`` list."""
    out: list[_Run] = []
    for e in events:
        last = out[-1] if out else None
        if isinstance(e, ContentDelta):
            if last is not None and last.content is not None:
                out[-1] = _Run(content=last.content + e.text)
            else:
                out.append(_Run(content=e.text))
        elif isinstance(e, ReasoningDelta):
            if last is not None and last.reasoning is not None:
                out[-1] = _Run(reasoning=last.reasoning + e.text)
            else:
                out.append(_Run(reasoning=e.text))
        else:
            item = e.to_openai()
            if last is not None and last.calls is not None:
                out[-1] = _Run(calls=[*last.calls, item])
            else:
                out.append(_Run(calls=[item]))
    return out
