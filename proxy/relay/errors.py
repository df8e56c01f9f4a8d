"""Errors llmtap itself answers with, in the shape of the API the client called.

Clients parse error bodies with their own SDK; an error in the wrong shape
turns a clear message into a confusing one. Anthropic's Messages API has
`{"type": "error", "error": {"type", "message"}}`, Gemini has
`{"error": {"code", "message", "status"}}`, everything else gets OpenAI's
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from proxy.common.bounds import utf8

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
_GEMINI_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 413: "INVALID_ARGUMENT",
                  502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def api_shape(path: str) -> str:
    if "/messages" in path:
        return "anthropic"
    if ":generateContent" in path or ":streamGenerateContent" in path or "/v1beta/" in path:
        return "gemini"
    return "openai"


def error_body(path: str, status: int, message: str, code: str) -> bytes:
    message = utf8(message)  # it may quote a header whose bytes are not UTF-8 (guard.py's refusals)
    shape = api_shape(path)
    if shape == "anthropic":
        etype = _ANTHROPIC_TYPES.get(status, "api_error")
        return orjson.dumps({"type": "error", "error": {"type": etype, "message": message}})
    if shape == "gemini":
        return orjson.dumps({"error": {"code": status, "message": message,
                                       "status": _GEMINI_STATUS.get(status, "INTERNAL")}})
    etype = "invalid_request_error" if status < 500 else "upstream_error"
    return orjson.dumps({"error": {"message": message, "type": etype, "param": None, "code": code}})


def error_response(path: str, status: int, message: str, code: str) -> web.Response:
    return web.Response(
        status=status,
        body=error_body(path, status, message, code),
        content_type="application/json",
        headers={"x-llmtap-error": code},
    )
