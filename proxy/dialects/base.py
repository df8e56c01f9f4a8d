"""What every dialect gives the meter.

A dialect is one object per request. The meter hands it each complete SSE
event (or WebSocket text frame) of a stream, or the whole JSON body of a
non-streaming response. For each event it answers whether that event carried
output (a `Delta`), and it keeps what the response said about itself: usage,
model, finish reason, errors, and whether the terminal event was seen.

Dialects never raise on bad input: a malformed event increments
`parse_errors` and keeps the first message in `parse_error`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson

from ..schema import ERROR_MESSAGE_MAX


@dataclass(slots=True)  # not frozen: a frozen dataclass is three times slower to make, once per event
class Delta:
    """One output-carrying event.

    event_type: a short stable name for the chunk table: "text",
        "reasoning" (thinking, reasoning summaries), "tool_args" (tool names,
        arguments and code), "refusal", and from the Responses API "audio"
        (base64 audio) and "transcript" (the text of generated speech).
    visible: True for text the user reads (not reasoning, not tool arguments).
    chars: characters of output in the event (for estimating tokens when the
        stream reports no usage).
    """

    event_type: str
    visible: bool
    chars: int


@dataclass(slots=True)
class Usage:
    """Token counts as the OpenTelemetry GenAI conventions define them.

    input_tokens includes cached reads and cache creation (Anthropic's three
    fields are summed); output_tokens includes reasoning tokens.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    reasoning_tokens: int | None = None

    def seen(self) -> bool:
        return self.input_tokens is not None or self.output_tokens is not None


@dataclass(slots=True)
class Dialect:
    """Base class; also the generic dialect for paths no API claims."""

    name: ClassVar[str] = "generic"
    usage: Usage = field(default_factory=Usage)
    response_model: str | None = None
    finish_reason: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    terminal: bool = False
    empty_choices_chunks: int = 0
    parse_errors: int = 0
    parse_error: str | None = None

    # Does this API end a stream with an explicit terminal event? If so, a
    # stream that ends without it is recorded as stream_truncated.
    has_terminal_event: ClassVar[bool] = False

    def on_event(self, data: bytes, event: str | None) -> Delta | None:
        """One complete SSE event (data lines joined) or WebSocket text frame."""
        return None

    # The generic dialect claims no format: a body that is not JSON is no parse error for it.
    strict_json: ClassVar[bool] = False

    def on_body(self, body: bytes) -> None:
        """The whole body of a non-streaming JSON response: an OpenAI-, Anthropic- or
        Gemini-shaped error body sets the error; anything else goes to `read_body`."""
        obj = self.load_body(body)
        if obj is None:
            return
        error = obj[0] if type(obj) is list and obj and type(obj[0]) is dict else obj  # Gemini wraps errors in an array
        try:
            if type(error) is dict and error.get("error"):
                self.note_error(error["error"])
            else:
                self.read_body(obj)
        except Exception as exc:
            self.note_exception("body", exc)

    def read_body(self, obj: Any) -> None:
        """A parsed non-streaming body that is not an error (each API reads its own)."""

    def note_parse_error(self, message: str) -> None:
        self.parse_errors += 1
        if self.parse_error is None:
            self.parse_error = message[:200]

    def note_exception(self, where: str, exc: Exception) -> None:
        self.note_parse_error(f"{self.name} {where}: {type(exc).__name__}: {exc}")

    def note_error(self, error: object) -> None:
        """An API error object: OpenAI/Anthropic `{type, message}`, Responses
        `{code, message}`, Gemini `{code, message, status}`, or a bare string."""
        if isinstance(error, dict):
            kind = error.get("type") or error.get("status") or error.get("code")
            message = error.get("message")
        else:
            kind, message = None, error
        self.error_type = str(kind) if kind else "error"
        if message is not None:
            self.error_message = str(message)[:ERROR_MESSAGE_MAX * 2]  # room for redaction; the row keeps the max

    def load_body(self, body: bytes) -> Any:
        """The parsed JSON of a whole body, or None after noting why it is not."""
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if self.strict_json:
                self.note_exception("body", exc)
            return None
        self.terminal = True
        return obj


def as_tokens(value: object) -> int | None:
    """A token count; None when absent. Any other type is a malformed event."""
    if value is None or type(value) is int:
        return value  # type: ignore[return-value]
    if type(value) is float and value.is_integer():
        return int(value)
    raise TypeError(f"token count is {type(value).__name__}")


def as_str(value: object) -> str | None:
    """A string field; None when absent. Any other type is a malformed event."""
    if value is None or type(value) is str:
        return value  # type: ignore[return-value]
    raise TypeError(f"expected a string, got {type(value).__name__}")
