"""What every route shares: ``ApiError`` (a client's mistake, 4xx, or our failure, 5xx,
as an OpenAI error body) and ``parse`` (a JSON body validated strictly, 400 naming the
first problem)."""

from __future__ import annotations

from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from recallspec.server.responses import error_body

MAX_BODY = 8 << 20  # bytes; a prompt filling the context is far below this
_KINDS = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}
M = TypeVar("M", bound=BaseModel)


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers

    def response(self) -> JSONResponse:
        kind = _KINDS.get(self.status, "server_error" if self.status >= 500 else
                          "invalid_request_error")
        return JSONResponse(error_body(self.message, kind, self.param, self.code),
                            status_code=self.status, headers=self.headers)


async def parse(request: Request, model: type[M]) -> M:
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
