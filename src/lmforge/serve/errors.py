"""One error shape for every answer that is not a success: OpenAI's error object.

    {"error": {"message": "temperature: Input should be less than or equal to 2", "type": "invalid_request_error",
               "param": "temperature", "code": null}}

400 a bad request (naming the field), 401 no or a wrong key, 404 an unknown route or model (``model_not_found``),
405 a wrong method, 413 a body over ``--max-body``, 429 a full queue (Retry-After), 500 the model failed on this
request (the server goes on), 503 the server is draining (Retry-After).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lmforge.errors import LmforgeError

KINDS = {401: "authentication_error", 404: "not_found_error", 429: "rate_limit_error", 500: "server_error",
         503: "server_error"}


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def union_member(part: str) -> bool:
    """Whether a part of pydantic's error location names a union's member type (``str``, ``list[TextPart]``,
    ``function-after[...]``, ``TextPart``) rather than a field or an index: a client knows the field only."""
    return "[" in part or part in ("str", "int", "float", "bool", "none", "dict", "list") or part[:1].isupper()


class HTTPError(Exception):
    """An answer other than 200, raised anywhere below a route."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str | None = None,
                 headers: dict[str, str] | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.headers, self.code = status, message, param, headers, code
        self.kind = kind or KINDS.get(status, "invalid_request_error")

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, self.kind, self.param, self.code), status_code=self.status,
                            headers=self.headers)


def install(app: FastAPI) -> None:
    """Every exception a route can raise becomes the error object (FastAPI's own ``{"detail": ...}`` never shows)."""

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        if first.get("type") == "json_invalid":  # not JSON, or not UTF-8
            return HTTPError(400, f"the body is not valid JSON in UTF-8 ({first.get('msg', 'invalid')})").response()
        param, message = ".".join(p for p in loc if not union_member(p)), first.get("msg", "invalid")
        rule = message.removeprefix("Value error, ")
        field, colon, _ = rule.partition(":")
        if not param and colon and field.isidentifier():  # a rule across fields names the one it refuses first
            return HTTPError(400, rule, field).response()
        return HTTPError(400, f"{param or 'body'}: {message}", param or None).response()

    @app.exception_handler(StarletteHTTPException)
    async def routing(_: Request, err: StarletteHTTPException) -> JSONResponse:
        messages = {404: "no such route (see GET /v1/models and the docs)", 405: "this route does not take that method"}
        message = messages.get(err.status_code) or str(err.detail)
        return HTTPError(err.status_code, message, headers=getattr(err, "headers", None)).response()

    @app.exception_handler(HTTPError)
    async def http_error(_: Request, err: HTTPError) -> JSONResponse:
        return err.response()

    @app.exception_handler(LmforgeError)
    async def refused(_: Request, err: LmforgeError) -> JSONResponse:
        message = str(err)
        field = message.split(":", 1)[0] if ":" in message else None  # "messages: the conversation is ..."
        return HTTPError(400, message, field if field and " " not in field else None).response()

    @app.exception_handler(Exception)
    async def failed(_: Request, err: Exception) -> JSONResponse:
        return HTTPError(500, f"{type(err).__name__}: {err}").response()
