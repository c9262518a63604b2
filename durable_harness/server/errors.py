"""The API's one error shape, ``{"error": {"code", "message"}}``, and the handlers that
give every refusal that shape: the app's own (:class:`ApiError`), FastAPI's validation
errors (malformed JSON is 400, a well-formed body of the wrong shape 422), Starlette's
404/405 for unknown routes, the World's errors and the listener's own 413/408."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from durable_harness.core.errors import (
    ConfigError,
    DurableHarnessError,
    NotFound,
    SandboxUnavailable,
    WorldError,
)
from durable_harness.harness.listener import Scope

log = logging.getLogger(__name__)

_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "body_too_large",
    422: "invalid_request",
    429: "rate_limited",
    500: "internal_error",
    503: "unavailable",
}


class ApiError(Exception):
    """A refusal the API answers with ``status`` and ``{"error": {code, message}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or _CODES.get(status, "error")
        self.message = message
        self.headers = dict(headers or {})


def not_found(kind: str, item_id: str) -> ApiError:
    """The one answer for an unknown id and another tenant's: they must look the same."""
    return ApiError(404, f"no {kind} {item_id!r}", f"{kind}_not_found")


def body(code: str, message: str) -> dict[str, dict[str, str]]:
    return {"error": {"code": code, "message": message}}


def response(error: ApiError) -> JSONResponse:
    return JSONResponse(body(error.code, error.message), error.status, headers=error.headers)


def listener_refusal(scope: Scope, status: int, message: str) -> tuple[bytes, str]:
    """The listener's own refusals (body cap, body deadline) in the API's shape."""
    code = _CODES.get(status, "error")
    return json.dumps(body(code, message)).encode(), "application/json"


def install(app: FastAPI) -> None:
    """Give every error the app can answer the API's shape."""

    async def api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return response(exc)

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return response(
                ApiError(400, "the body is not JSON: send a JSON object", "malformed_json")
            )
        parts = []
        for e in errors:
            where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
            parts.append(f"{where}: {e.get('msg', 'invalid')}")
        return response(ApiError(422, "; ".join(parts) or "invalid request"))

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}: see /openapi.json"
        return response(ApiError(exc.status_code, message, headers=exc.headers))

    async def world_error(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, NotFound):
            return response(ApiError(404, str(exc)))
        log.error("%s %s: the World failed: %s", request.method, request.url.path, exc)
        return response(
            ApiError(503, "the World is not answering; retry shortly", headers={"Retry-After": "2"})
        )

    async def config_error(request: Request, exc: Exception) -> JSONResponse:
        return response(ApiError(422, str(exc)))

    async def harness_error(request: Request, exc: Exception) -> JSONResponse:
        # A session's check that needs a backend this serve cannot reach (Docker for a
        # docker session) is the operator's to fix, not the caller's: 503, as the World's.
        if isinstance(exc, SandboxUnavailable):
            return response(ApiError(503, str(exc), headers={"Retry-After": "30"}))
        log.error("%s %s: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return response(ApiError(500, f"{type(exc).__name__}: the request could not be served"))

    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        # Any other exception is our bug: logged with its traceback, answered in the API's
        # shape without it (a traceback may name paths and settings).
        log.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
        return response(ApiError(500, "internal error: the server logged it"))

    app.add_exception_handler(ApiError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(WorldError, world_error)
    app.add_exception_handler(ConfigError, config_error)
    app.add_exception_handler(DurableHarnessError, harness_error)
    app.add_exception_handler(Exception, crashed)


def unauthorized() -> ApiError:
    """The one 401 of the API (a missing, malformed, unknown, wrong or revoked credential)."""
    return ApiError(
        401,
        "a valid credential is required: Authorization: Bearer dh_... (an API token: "
        "`durable-harness token create --tenant NAME`), or the turn's signal secret",
        headers={"WWW-Authenticate": "Bearer"},
    )
