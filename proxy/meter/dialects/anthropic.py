"""Anthropic Messages (`POST /v1/messages`, its SSE events `message_start` … `message_stop`).

Output is a non-empty `content_block_delta` of type `text_delta`,
`thinking_delta` or `input_json_delta`; `signature_delta` and `citations_delta`
carry no tokens. Usage starts in `message_start` and is updated by each
`message_delta`, whose counts are cumulative: a field it carries replaces the
one from `message_start`. Input is reported as input + cache creation + cache
read, as the OpenTelemetry GenAI conventions define it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from orjson import loads

from proxy.meter.dialects.base import (NUMBER, Delta, Dialect, Quick, Usage, as_str, as_tokens, blocks, quick_pattern,
                                 results_after_last)

_DELTAS = {
    "text_delta": ("text", "text", True),
    "thinking_delta": ("thinking", "reasoning", False),
    "input_json_delta": ("partial_json", "tool_args", False),
}

# The quick pattern (proxy/meter/dialects/base.py): a content_block_delta as Anthropic sends it.
_QUICK_KINDS = {b'text_delta","text': ("text", True), b'thinking_delta","thinking': ("reasoning", False),
                b'input_json_delta","partial_json': ("tool_args", False)}
_QUICK = quick_pattern(
    rb'\{"type":"content_block_delta","index":' + NUMBER + rb',"delta":\{"type":"(?P<kind>'
    + b"|".join(_QUICK_KINDS) + rb')":"', rb'"\}\}',
    rb"content_block_delta", _QUICK_KINDS)

_FIELDS = {
    "input_tokens": "input",
    "cache_creation_input_tokens": "cache_creation",
    "cache_read_input_tokens": "cache_read",
    "output_tokens": "output",
}


@dataclass(slots=True)
class Anthropic(Dialect):
    name: ClassVar[str] = "anthropic"
    strict_json: ClassVar[bool] = True
    has_terminal_event: ClassVar[bool] = True
    quick: ClassVar[Quick | None] = _QUICK
    # The raw counts as last reported, before summing into `usage`.
    raw_usage: dict[str, int] = field(default_factory=dict, repr=False)
    # The tool_use blocks still open in a stream, by their index (content_block_stop ends one).
    open_calls: dict[Any, list[Any]] | None = None

    def on_event(self, data: bytes, event: str | None) -> Delta | None:
        try:
            obj = loads(data)
            kind = obj.get("type") or event
            if kind == "content_block_delta":
                return _delta(obj["delta"])
            self._message_event(kind, obj)
        except Exception as exc:
            self.note_exception("event", exc)
        return None

    def read_body(self, obj: Any) -> None:
        self._message(obj)
        for block in blocks(obj.get("content"), "tool_use"):
            self.add_tool_call(block.get("id"), block.get("name"))

    @staticmethod
    def tool_results(body: Any) -> list[tuple[str | None, str | None]] | None:
        """`tool_result` blocks (their `tool_use_id`) in the user messages after the last assistant
        message, named by that message's `tool_use` blocks."""
        return results_after_last(
            body.get("messages"), lambda m: m.get("role") == "assistant",
            lambda m: ((b.get("tool_use_id"), None) for b in blocks(m.get("content"), "tool_result")),
            lambda m: ((b.get("id"), b.get("name")) for b in blocks(m.get("content"), "tool_use")))

    def _message_event(self, kind: str | None, obj: dict[str, Any]) -> None:
        if kind == "content_block_start":
            block = obj.get("content_block")
            if type(block) is dict and block.get("type") == "tool_use":
                if self.open_calls is None:
                    self.open_calls = {}
                self.open_calls[obj.get("index")] = self.add_tool_call(block.get("id"), block.get("name"))
        elif kind == "content_block_stop":
            if self.open_calls and (entry := self.open_calls.pop(obj.get("index"), None)) is not None:
                self.end_tool_call(entry)
        elif kind == "message_start":
            self._message(obj["message"])
        elif kind == "message_delta":
            reason = (obj.get("delta") or {}).get("stop_reason")
            if reason:
                self.finish_reason = as_str(reason)
            if obj.get("usage"):
                self._usage(obj["usage"])
        elif kind == "message_stop":
            self.terminal = True
        elif kind == "error":
            # The stream ends here, as deliberately as with message_stop.
            self.note_error(obj.get("error") or "error event")
            self.terminal = True

    def _message(self, message: dict[str, Any]) -> None:
        model = message.get("model")
        if model:
            self.response_model = as_str(model)
        reason = message.get("stop_reason")
        if reason:
            self.finish_reason = as_str(reason)
        if message.get("usage"):
            self._usage(message["usage"])

    def _usage(self, usage: dict[str, Any]) -> None:
        raw = self.raw_usage
        for key, name in _FIELDS.items():
            value = as_tokens(usage.get(key))
            if value is not None:
                raw[name] = value
        parts = [raw[k] for k in ("input", "cache_creation", "cache_read") if k in raw]
        self.usage = Usage(
            input_tokens=sum(parts) if parts else None,
            output_tokens=raw.get("output"),
            cache_read_tokens=raw.get("cache_read"),
            cache_creation_tokens=raw.get("cache_creation"),
        )


def _delta(delta: dict[str, Any]) -> Delta | None:
    spec = _DELTAS.get(delta.get("type"))  # type: ignore[arg-type]  # None finds nothing
    if spec is None:
        return None
    key, kind, visible = spec
    value = as_str(delta.get(key))
    if not value:
        return None
    return kind, visible, len(value)  # type: ignore[return-value]  # a Delta's tuple
