"""Error bodies in each API's own shape."""

from __future__ import annotations

from typing import Any, Literal

Api = Literal["openai", "anthropic", "gemini"]

_MESSAGES = {
    400: "Invalid request (simulated)",
    401: "Incorrect API key provided (simulated)",
    403: "Permission denied (simulated)",
    404: "Not found (simulated)",
    429: "Rate limit reached (simulated)",
    500: "The server had an error while processing your request (simulated)",
    503: "The service is unavailable (simulated)",
    529: "Overloaded",
}

_OPENAI = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "not_found"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}

_ANTHROPIC = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}

_GEMINI = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

# What a mid-stream failure looks like as an HTTP error, per API.
STREAM_ERROR_STATUS: dict[Api, int] = {"openai": 500, "anthropic": 529, "gemini": 503}


def default_message(status: int) -> str:
    return _MESSAGES.get(status, f"Simulated error (HTTP {status})")


def openai_error(status: int, message: str) -> dict[str, Any]:
    kind, code = _OPENAI.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def gemini_error(status: int, message: str) -> dict[str, Any]:
    kind = _GEMINI.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
    return {"error": {"code": status, "message": message, "status": kind}}


def error_body(api: Api, status: int, message: str | None = None) -> dict[str, Any]:
    message = message or default_message(status)
    if api == "anthropic":
        return anthropic_error(status, message)
    if api == "gemini":
        return gemini_error(status, message)
    return openai_error(status, message)
