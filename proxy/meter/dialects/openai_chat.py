"""OpenAI Chat Completions and the many APIs that copy it (`chat.completion.chunk` events).

Output is any non-empty `delta.content`, `refusal`, reasoning text
(`reasoning_content` from DeepSeek and vLLM, `reasoning` from OpenRouter) or
tool-call fragment (`tool_calls[].function.name/arguments`, the deprecated
`function_call`). Usage is the last non-null `usage`, whatever `choices` holds
(OpenAI sends it with `choices: []`, OpenRouter on the finishing chunk).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from orjson import loads

from proxy.meter.dialects.base import (ASCII, NUMBER, Delta, Dialect, Quick, Usage, as_str, as_tokens, quick_pattern,
                                 results_after_last)

# When one event carries several kinds of output, it is reported as the most
# visible one, with the characters of all of them.
_RANK = {"text": 0, "refusal": 1, "tool_args": 2, "reasoning": 3}


# The quick pattern (proxy/meter/dialects/base.py): a chunk of one output delta as OpenAI sends it
# (service_tier, system_fingerprint, logprobs, usage and obfuscation when sent; DeepSeek's and
# OpenRouter's reasoning keys), no usage and no finish reason: it sets the model, nothing else.
_QUICK_KINDS = {b"content": ("text", True), b"refusal": ("refusal", True),
                b"reasoning_content": ("reasoning", False), b"reasoning": ("reasoning", False)}
_QUICK = quick_pattern(
    rb'\{"id":' + ASCII + rb',"object":"chat\.completion\.chunk","created":' + NUMBER
    + rb',"model":"(?P<model>[ !#-\[\]-~]*)"(?:,"service_tier":' + ASCII + rb')?(?:,"system_fingerprint":' + ASCII
    + rb')?,"choices":\[\{"index":' + NUMBER + rb',"delta":\{"(?P<kind>' + b"|".join(_QUICK_KINDS) + rb')":"',
    rb'"\}(?:,"logprobs":null)?,"finish_reason":null\}\](?:,"usage":null)?(?:,"obfuscation":' + ASCII + rb')?\}',
    rb"[a-z_.]+", _QUICK_KINDS)


@dataclass(slots=True)
class OpenAIChat(Dialect):
    name: ClassVar[str] = "openai_chat"
    strict_json: ClassVar[bool] = True
    has_terminal_event: ClassVar[bool] = True
    quick: ClassVar[Quick | None] = _QUICK
    # A stream's tool calls by (choice index, call index): their fragments come apart, the first
    # with the id and name; the call's block ends with its last fragment.
    open_calls: dict[Any, list[Any]] | None = None

    def on_event(self, data: bytes, event: str | None) -> Delta | None:
        if data[:1] != b"{" and data.strip() == b"[DONE]":
            self.terminal = True
            return None
        try:
            return self._chunk(loads(data))
        except Exception as exc:
            self.note_exception("event", exc)
            return None

    def read_body(self, obj: Any) -> None:
        for choice in self._common(obj) or ():
            message = choice.get("message") or {}
            for call in message.get("tool_calls") or ():
                self.add_tool_call(call.get("id"), (call.get("function") or {}).get("name"))
            if message.get("function_call"):
                self.add_tool_call(None, message["function_call"].get("name"))

    @staticmethod
    def tool_results(body: Any) -> list[tuple[str | None, str | None]] | None:
        """`role: tool` messages (their `tool_call_id`; the deprecated `role: function` by name) after
        the last assistant message, named by its `tool_calls`."""
        return results_after_last(body.get("messages"), lambda m: m.get("role") == "assistant", _result,
                                  lambda m: ((c.get("id"), (c.get("function") or {}).get("name"))
                                             for c in m.get("tool_calls") or () if type(c) is dict))

    def _tool_fragments(self, choice: dict[str, Any], delta: dict[str, Any]) -> None:
        """A stream's tool-call fragments in one choice's delta: a fragment with an id opens a call."""
        calls = self.open_calls
        if calls is None:
            calls = self.open_calls = {}
        at = choice.get("index", 0)
        for position, call in enumerate(delta.get("tool_calls") or ()):
            key = (at, call.get("index", position))
            function = call.get("function") or {}
            entry = calls.get(key)
            call_id = call.get("id")
            if entry is None or (call_id and call_id != entry[0]):  # some APIs repeat the id in every fragment
                entry = calls[key] = self.add_tool_call(call_id, function.get("name"))
            elif entry[1] is None and function.get("name"):
                entry[1] = as_str(function["name"])
            self.end_tool_call(entry)
        if delta.get("function_call"):
            entry = calls.get((at, "function_call"))
            if entry is None:
                entry = calls[(at, "function_call")] = self.add_tool_call(None, delta["function_call"].get("name"))
            self.end_tool_call(entry)

    def _chunk(self, obj: dict[str, Any]) -> Delta | None:
        if obj.get("error"):
            self.note_error(obj["error"])
            return None
        choices = self._common(obj)
        if not choices:
            if type(choices) is list:
                self.empty_choices_chunks += 1
            return None
        kind: str | None = None
        chars = 0
        for choice in choices:
            delta = choice.get("delta")
            if delta:
                if "tool_calls" in delta or "function_call" in delta:
                    self._tool_fragments(choice, delta)
                k, n = _output(delta)
                if n:
                    chars += n
                    if kind is None or _RANK[k] < _RANK[kind]:
                        kind = k
        if kind is None:
            return None
        return kind, kind == "text" or kind == "refusal", chars  # type: ignore[return-value]  # a Delta's tuple

    def _common(self, obj: dict[str, Any]) -> Any:
        """Model, usage and finish reason, shared by chunks and whole bodies."""
        model = obj.get("model")
        if model:
            self.response_model = as_str(model)
        usage = obj.get("usage")
        if usage:
            self.usage = _usage(usage)
        choices = obj.get("choices")
        for choice in choices or ():
            reason = choice.get("finish_reason")
            if reason:
                self.finish_reason = as_str(reason)
        return choices


def _output(delta: dict[str, Any]) -> tuple[str, int]:
    """(kind, characters) of the output in one choice's delta."""
    kind = "text"
    chars = 0
    content = as_str(delta.get("content"))
    if content:
        chars = len(content)
    refusal = as_str(delta.get("refusal"))
    if refusal:
        if not chars:
            kind = "refusal"
        chars += len(refusal)
    calls = delta.get("tool_calls")
    call = delta.get("function_call")
    if calls or call:
        n = sum(_call_chars(c.get("function")) for c in calls or ()) + _call_chars(call)
        if n and not chars:
            kind = "tool_args"
        chars += n
    reasoning = as_str(delta.get("reasoning_content") or delta.get("reasoning"))
    if reasoning:
        if not chars:
            kind = "reasoning"
        chars += len(reasoning)
    return kind, chars


def _result(message: dict[str, Any]) -> tuple[tuple[Any, Any], ...]:
    role = message.get("role")
    if role == "tool":
        return ((message.get("tool_call_id"), None),)
    if role == "function":
        return ((None, message.get("name")),)
    return ()


def _call_chars(function: dict[str, Any] | None) -> int:
    if not function:
        return 0
    name = as_str(function.get("name")) or ""
    arguments = as_str(function.get("arguments")) or ""
    return len(name) + len(arguments)


def _usage(usage: dict[str, Any]) -> Usage:
    prompt = usage.get("prompt_tokens_details") or {}
    completion = usage.get("completion_tokens_details") or {}
    cache_read = as_tokens(prompt.get("cached_tokens"))
    if cache_read is None:  # DeepSeek
        cache_read = as_tokens(usage.get("prompt_cache_hit_tokens"))
    return Usage(
        input_tokens=as_tokens(usage.get("prompt_tokens")),
        output_tokens=as_tokens(usage.get("completion_tokens")),
        cache_read_tokens=cache_read,
        cache_creation_tokens=as_tokens(prompt.get("cache_write_tokens")),
        reasoning_tokens=as_tokens(completion.get("reasoning_tokens")),
    )
