"""Gemini `generateContent` / `streamGenerateContent`.

Each SSE event is a whole GenerateContentResponse. Output is a non-empty
`parts[].text` (a thought summary when the part has `"thought": true`) or a
`functionCall` part. `usageMetadata` is repeated and growing: keep the last.
There is no terminal event; the stream ends when the connection closes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orjson import dumps, loads

from proxy.meter.dialects.base import Delta, Dialect, Usage, as_str, as_tokens, results_after_last

_RANK = {"text": 0, "tool_args": 1, "reasoning": 2}


@dataclass(slots=True)
class Gemini(Dialect):
    name: ClassVar[str] = "gemini"
    strict_json: ClassVar[bool] = True
    has_terminal_event: ClassVar[bool] = False

    def on_event(self, data: bytes, event: str | None) -> Delta | None:
        try:
            return self._response(loads(data))
        except Exception as exc:
            self.note_exception("event", exc)
            return None

    def read_body(self, obj: Any) -> None:
        """One response, or the JSON array a stream is without `alt=sse`."""
        for response in obj if type(obj) is list else (obj,):
            self._response(response)

    @staticmethod
    def tool_results(body: Any) -> list[tuple[str | None, str | None]] | None:
        """`functionResponse` parts (their `id` and `name`) in the contents after the model's last."""
        return results_after_last(
            body.get("contents"), lambda c: c.get("role") == "model",
            lambda c: ((r.get("id"), r.get("name")) for r in _parts(c, "functionResponse")), lambda c: ())

    def _response(self, obj: dict[str, Any]) -> Delta | None:
        if obj.get("error"):
            self.note_error(obj["error"])
            return None
        model = obj.get("modelVersion")
        if model:
            self.response_model = as_str(model)
        if obj.get("usageMetadata"):
            self.usage = _usage(obj["usageMetadata"])
        candidates = obj.get("candidates")
        if not candidates:
            blocked = (obj.get("promptFeedback") or {}).get("blockReason")
            if blocked:
                self.finish_reason = as_str(blocked)
            return None
        kind: str | None = None
        chars = 0
        for candidate in candidates:
            reason = candidate.get("finishReason")
            if reason:
                self.finish_reason = as_str(reason)
            for part in (candidate.get("content") or {}).get("parts") or ():
                if part.get("functionCall"):  # a call comes whole, in one event
                    call = part["functionCall"]
                    self.end_tool_call(self.add_tool_call(call.get("id"), call.get("name")))
                k, n = _part(part)
                if n:
                    chars += n
                    if kind is None or _RANK[k] < _RANK[kind]:
                        kind = k
        if kind is None:
            return None
        return kind, kind == "text", chars  # type: ignore[return-value]  # a Delta's tuple


def _part(part: dict[str, Any]) -> tuple[str, int]:
    text = as_str(part.get("text"))
    if text:
        return ("reasoning" if part.get("thought") else "text"), len(text)
    call = part.get("functionCall")
    if call:
        name = as_str(call.get("name")) or ""
        args = call.get("args")
        return "tool_args", len(name) + (len(dumps(args)) if args else 0)
    return "text", 0


def _parts(content: dict[str, Any], key: str) -> list[dict[str, Any]]:
    parts = content.get("parts")
    return [p[key] for p in parts if type(p) is dict and type(p.get(key)) is dict] if type(parts) is list else []


def _usage(meta: dict[str, Any]) -> Usage:
    candidates = as_tokens(meta.get("candidatesTokenCount"))
    thoughts = as_tokens(meta.get("thoughtsTokenCount"))
    output = None if candidates is None and thoughts is None else (candidates or 0) + (thoughts or 0)
    return Usage(
        input_tokens=as_tokens(meta.get("promptTokenCount")),
        output_tokens=output,
        cache_read_tokens=as_tokens(meta.get("cachedContentTokenCount")),
        reasoning_tokens=thoughts,
    )
