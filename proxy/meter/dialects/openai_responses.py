"""OpenAI Responses API (`response.*` events), the API Codex speaks, over SSE or WebSocket.

Events are told apart by their JSON `type`. Output is the string `delta` of
the token-carrying `*.delta` events below; everything else is structure.
The stream ends with `response.completed`, `.incomplete`, `.failed` or a
top-level `error` event; usage is on the response object of the first three.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar

from orjson import loads

from proxy.meter.dialects.base import (ASCII, NUMBER, Delta, Dialect, Quick, Usage, as_str, as_tokens, quick_pattern,
                                 results_after_last)

# type -> (Delta.event_type, visible). "audio" counts base64 characters and
# "transcript" the text of generated speech; neither is read as text.
_OUTPUT: dict[str, tuple[str, bool]] = {
    "response.output_text.delta": ("text", True),
    "response.refusal.delta": ("refusal", True),
    "response.reasoning_summary_text.delta": ("reasoning", False),
    "response.reasoning_text.delta": ("reasoning", False),
    "response.function_call_arguments.delta": ("tool_args", False),
    "response.custom_tool_call_input.delta": ("tool_args", False),
    "response.mcp_call_arguments.delta": ("tool_args", False),
    "response.code_interpreter_call_code.delta": ("tool_args", False),
    "response.audio.delta": ("audio", False),
    "response.audio.transcript.delta": ("transcript", False),
}

# The quick pattern (proxy/meter/dialects/base.py): a `*.delta` event as OpenAI sends it (the index
# fields of text, reasoning summaries and tool arguments; logprobs and obfuscation when sent).
_QUICK_KINDS = {kind.encode(): output for kind, output in _OUTPUT.items()}
_QUICK = quick_pattern(
    rb'\{"type":"(?P<kind>' + b"|".join(re.escape(kind) for kind in _QUICK_KINDS)
    + rb')","sequence_number":' + NUMBER + rb',"item_id":' + ASCII + rb',"output_index":' + NUMBER
    + rb'(?:,"(?:content|summary)_index":' + NUMBER + rb')?,"delta":"',
    rb'"(?:,"logprobs":\[\])?(?:,"obfuscation":' + ASCII + rb')?\}',
    rb"response\.[a-z_.]+", _QUICK_KINDS, steady_head=False)  # its sequence number changes every event

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_STARTED = frozenset({"response.created", "response.in_progress", "response.queued"})


@dataclass(slots=True)
class OpenAIResponses(Dialect):
    name: ClassVar[str] = "openai_responses"
    strict_json: ClassVar[bool] = True
    has_terminal_event: ClassVar[bool] = True
    quick: ClassVar[Quick | None] = _QUICK
    # A stream's tool-call items still open (`output_item.added` to `.done`), by item id.
    open_calls: dict[Any, list[Any]] | None = None

    def on_event(self, data: bytes, event: str | None) -> Delta | None:
        try:
            obj = loads(data)
            kind = obj.get("type") or event
            output = _OUTPUT.get(kind)  # type: ignore[arg-type]  # None finds nothing
            if output is not None:
                delta = as_str(obj.get("delta"))
                return (output[0], output[1], len(delta)) if delta else None  # type: ignore[return-value]
            self._structural(kind, obj)
        except Exception as exc:
            self.note_exception("event", exc)
        return None

    def read_body(self, obj: Any) -> None:
        """A Response object or a compact response (`/responses/compact`)."""
        self._response(obj, final=True)
        for item in obj.get("output") or ():
            if _is_call(item):
                self.add_tool_call(item.get("call_id"), _call_name(item))

    @staticmethod
    def tool_results(body: Any) -> list[tuple[str | None, str | None]] | None:
        """`*_call_output` items (their `call_id`) after the last assistant message or reasoning item
        of `input`, named by the `*_call` items there (Codex sends the whole history)."""
        return results_after_last(
            body.get("input"), lambda i: i.get("type") == "reasoning" or i.get("role") == "assistant",
            lambda i: ((i.get("call_id"), None),) if type(i.get("type")) is str and i["type"].endswith("_call_output")
            else (),
            lambda i: ((i.get("call_id"), _call_name(i)),) if _is_call(i) else ())

    def _structural(self, kind: str | None, obj: dict[str, Any]) -> None:
        if kind == "response.output_item.added" or kind == "response.output_item.done":
            self._call_item(kind, obj.get("item"))
        elif kind in _TERMINAL:
            self.terminal = True
            self._response(obj["response"], final=True)
        elif kind in _STARTED:
            self._response(obj.get("response") or {}, final=False)
        elif kind == "error":
            self.terminal = True
            error = obj.get("error")  # Codex's WebSocket frames nest it
            if isinstance(error, dict):
                self.note_error(error)
            else:
                self.note_error({"code": obj.get("code"), "message": obj.get("message")})

    def _response(self, response: dict[str, Any], final: bool) -> None:
        model = response.get("model")
        if model:
            self.response_model = as_str(model)
        usage = response.get("usage")
        if usage:
            self.usage = _usage(usage)
        if not final:
            return
        if response.get("error"):
            self.note_error(response["error"])
        status = as_str(response.get("status"))
        reason = as_str((response.get("incomplete_details") or {}).get("reason"))
        if reason or status:
            self.finish_reason = reason or status
        if status == "failed" and self.error_type is None:
            self.note_error({"code": "response.failed"})


    def _call_item(self, kind: str, item: Any) -> None:
        """A tool-call output item opens with `output_item.added` and ends with `.done` (a `.done`
        alone is a call whole in one event)."""
        if not _is_call(item):
            return
        calls = self.open_calls
        if calls is None:
            calls = self.open_calls = {}
        entry = calls.pop(item.get("id"), None)
        if entry is None:
            entry = self.add_tool_call(item.get("call_id"), _call_name(item))
        if kind == "response.output_item.added":
            calls[item.get("id")] = entry
        else:
            self.end_tool_call(entry)


def _is_call(item: Any) -> bool:
    """A call of a tool the client runs (function_call, custom_tool_call, local_shell_call,
    computer_call, shell_call, apply_patch_call, …): a `*_call` item with a `call_id`. The server's
    own tools (web_search_call, file_search_call, …) have none."""
    return type(item) is dict and type(item.get("type")) is str and item["type"].endswith("_call") \
        and item.get("call_id") is not None


def _call_name(item: dict[str, Any]) -> str | None:
    """A function's or custom tool's name; for the built-in kinds, the kind (`local_shell`)."""
    name = item.get("name")
    return name if type(name) is str else item["type"][:-5]


def _usage(usage: dict[str, Any]) -> Usage:
    details_in = usage.get("input_tokens_details") or {}
    details_out = usage.get("output_tokens_details") or {}
    return Usage(
        input_tokens=as_tokens(usage.get("input_tokens")),
        output_tokens=as_tokens(usage.get("output_tokens")),
        cache_read_tokens=as_tokens(details_in.get("cached_tokens")),
        cache_creation_tokens=as_tokens(details_in.get("cache_write_tokens")),
        reasoning_tokens=as_tokens(details_out.get("reasoning_tokens")),
    )
