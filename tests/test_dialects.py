import random

import orjson
import pytest

from proxy.meter.dialects.anthropic import Anthropic
from proxy.meter.dialects.base import Delta, Dialect, Usage
from proxy.meter.dialects.detect import detect_dialect
from proxy.meter.dialects.gemini import Gemini
from proxy.meter.dialects.openai_chat import OpenAIChat
from proxy.meter.dialects.openai_responses import OpenAIResponses
from proxy.meter.sse import SSEParser

def d(kind: str, chars: int) -> Delta:
    return Delta(kind, kind in ("text", "refusal"), chars)


def sse(*events, newline: bytes = b"\n") -> bytes:
    """An SSE stream of (event name or None, JSON object or raw str) pairs."""
    out = []
    for name, data in events:
        body = data.encode() if isinstance(data, str) else orjson.dumps(data)
        head = b"event: " + name.encode() + newline if name else b""
        out.append(head + b"data: " + body + newline + newline)
    return b"".join(out)


def run(cls, chunks):
    dialect, parser, deltas = cls(), SSEParser(), []
    for chunk in chunks:
        for name, data in parser.feed(chunk):
            delta = dialect.on_event(data, name)
            if delta is not None:
                deltas.append(delta)
    return deltas, dialect


def outcome(dialect: Dialect):
    return (
        dialect.usage,
        dialect.response_model,
        dialect.finish_reason,
        dialect.error_type,
        dialect.error_message,
        dialect.terminal,
        dialect.empty_choices_chunks,
        dialect.parse_errors,
    )


def check_every_split(cls, stream):
    """Feed the stream whole, then split at every byte: all must agree."""
    deltas, dialect = run(cls, [stream])
    for i in range(1, len(stream)):
        split_deltas, split_dialect = run(cls, [stream[:i], stream[i:]])
        assert split_deltas == deltas, i
        assert outcome(split_dialect) == outcome(dialect), i
    return deltas, dialect


# --- OpenAI Chat Completions (§A1) ---------------------------------------------------

CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}


def chat(delta=None, finish=None, usage=None, choices=True, **extra):
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return {**CHUNK, "choices": [choice] if choices else [], "usage": usage, **extra}


OPENAI_USAGE = {
    "prompt_tokens": 1200,
    "completion_tokens": 45,
    "total_tokens": 1245,
    "prompt_tokens_details": {"cached_tokens": 1024},
    "completion_tokens_details": {"reasoning_tokens": 20},
}


def test_chat_openai_stream_with_tool_call_and_usage_chunk():
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": ""}}
    stream = sse(
        (None, chat({"role": "assistant", "content": ""})),
        (None, chat({"content": "Hel"})),
        (None, chat({"content": "lo"})),
        (None, chat({"tool_calls": [call]})),
        (None, chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"path":'}}]})),
        (None, chat({"tool_calls": [{"index": 0, "function": {"arguments": '"a.py"}'}}]})),
        (None, chat({}, finish="tool_calls")),
        (None, chat(choices=False, usage=OPENAI_USAGE)),
        (None, "[DONE]"),
    )
    deltas, dialect = check_every_split(OpenAIChat, stream)
    assert deltas == [d("text", 3), d("text", 2), d("tool_args", 4), d("tool_args", 8), d("tool_args", 7)]
    assert outcome(dialect) == (
        Usage(input_tokens=1200, output_tokens=45, cache_read_tokens=1024, reasoning_tokens=20),
        "gpt-x", "tool_calls", None, None, True, 1, 0,
    )


def test_chat_openrouter_reasoning_and_usage_on_the_finishing_chunk():
    reasoning = {"content": "", "reasoning": "Let me think", "reasoning_details": [{"type": "reasoning.text", "text": "Let me think"}]}
    usage = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42, "cost": 0.0001,
             "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 16},
             "completion_tokens_details": {"reasoning_tokens": 5}}
    stream = b": OPENROUTER PROCESSING\n\n" + sse(
        (None, chat({"role": "assistant", "content": ""})),
        (None, chat(reasoning)),
        (None, chat({"content": "Hi there"})),
        (None, chat({"content": ""}, finish="stop", usage=usage)),
        (None, "[DONE]"),
        newline=b"\r\n",
    )
    deltas, dialect = check_every_split(OpenAIChat, stream)
    assert deltas == [d("reasoning", 12), d("text", 8)]
    assert outcome(dialect) == (
        Usage(input_tokens=30, output_tokens=12, cache_read_tokens=0, cache_creation_tokens=16, reasoning_tokens=5),
        "gpt-x", "stop", None, None, True, 0, 0,
    )


def test_chat_deepseek_reasoning_content_and_cache_hits():
    usage = {"prompt_tokens": 100, "completion_tokens": 9, "total_tokens": 109,
             "prompt_cache_hit_tokens": 64, "prompt_cache_miss_tokens": 36,
             "completion_tokens_details": {"reasoning_tokens": 4}}
    stream = sse(
        (None, chat({"role": "assistant", "content": None, "reasoning_content": ""})),
        (None, chat({"content": None, "reasoning_content": "Hmm"})),
        (None, chat({"content": "Yes", "reasoning_content": None})),
        (None, chat({"content": ""}, finish="stop")),
        (None, chat(choices=False, usage=usage)),
        (None, "[DONE]"),
    )
    deltas, dialect = check_every_split(OpenAIChat, stream)
    assert deltas == [d("reasoning", 3), d("text", 3)]
    assert dialect.usage == Usage(input_tokens=100, output_tokens=9, cache_read_tokens=64, reasoning_tokens=4)


def test_chat_refusal_and_mixed_delta():
    _, dialect = run(OpenAIChat, [b""])
    assert dialect.on_event(orjson.dumps(chat({"refusal": "No."})), None) == d("refusal", 3)
    # several kinds in one event: the most visible names it, all count
    mixed = chat({"content": "ab", "reasoning_content": "cde"})
    assert dialect.on_event(orjson.dumps(mixed), None) == d("text", 5)
    legacy = chat({"function_call": {"name": "f", "arguments": "{}"}})
    assert dialect.on_event(orjson.dumps(legacy), None) == d("tool_args", 3)


def test_chat_midstream_error_and_no_done():
    stream = sse(
        (None, chat({"content": "Hel"})),
        (None, {"error": {"message": "Internal error", "type": "server_error", "code": None}}),
    )
    deltas, dialect = check_every_split(OpenAIChat, stream)
    assert deltas == [d("text", 3)]
    assert (dialect.error_type, dialect.error_message, dialect.terminal) == ("server_error", "Internal error", False)


def test_chat_body():
    dialect = OpenAIChat()
    dialect.on_body(orjson.dumps({
        "id": "c", "object": "chat.completion", "model": "gpt-x-2026",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
        "usage": OPENAI_USAGE,
    }))
    assert outcome(dialect) == (
        Usage(input_tokens=1200, output_tokens=45, cache_read_tokens=1024, reasoning_tokens=20),
        "gpt-x-2026", "length", None, None, True, 0, 0,
    )


# --- Anthropic Messages (§A3) ---------------------------------------------------------

def anthropic(kind, **fields):
    return (kind, {"type": kind, **fields})


def block_delta(index, delta):
    return anthropic("content_block_delta", index=index, delta=delta)


ANTHROPIC_STREAM = sse(
    anthropic("message_start", message={
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": [],
        "stop_reason": None, "usage": {"input_tokens": 12, "cache_creation_input_tokens": 500,
                                       "cache_read_input_tokens": 40000, "output_tokens": 1}}),
    anthropic("content_block_start", index=0, content_block={"type": "thinking", "thinking": ""}),
    anthropic("ping"),
    block_delta(0, {"type": "thinking_delta", "thinking": "Plan"}),
    block_delta(0, {"type": "signature_delta", "signature": "EqQBCkYIBxgCKkA"}),
    anthropic("content_block_stop", index=0),
    anthropic("content_block_start", index=1, content_block={"type": "text", "text": ""}),
    block_delta(1, {"type": "text_delta", "text": "Sure"}),
    block_delta(1, {"type": "text_delta", "text": ""}),
    block_delta(1, {"type": "citations_delta", "citation": {"type": "char_location"}}),
    anthropic("content_block_stop", index=1),
    anthropic("content_block_start", index=2, content_block={"type": "tool_use", "id": "t", "name": "Read", "input": {}}),
    block_delta(2, {"type": "input_json_delta", "partial_json": ""}),
    block_delta(2, {"type": "input_json_delta", "partial_json": '{"file": "a"}'}),
    anthropic("content_block_stop", index=2),
    anthropic("message_delta", delta={"stop_reason": None}, usage={"output_tokens": 100}),
    anthropic("message_delta", delta={"stop_reason": "tool_use", "stop_sequence": None}, usage={"output_tokens": 187}),
    anthropic("message_stop"),
)


def test_anthropic_stream():
    deltas, dialect = check_every_split(Anthropic, ANTHROPIC_STREAM)
    assert deltas == [d("reasoning", 4), d("text", 4), d("tool_args", 13)]
    assert outcome(dialect) == (
        Usage(input_tokens=40512, output_tokens=187, cache_read_tokens=40000, cache_creation_tokens=500),
        "claude-x", "tool_use", None, None, True, 0, 0,
    )


def test_anthropic_dispatches_on_json_type_without_event_names():
    stream = ANTHROPIC_STREAM.replace(b"event: ", b": was event ")
    deltas, dialect = run(Anthropic, [stream])
    assert deltas == run(Anthropic, [ANTHROPIC_STREAM])[0]
    assert dialect.terminal and dialect.usage.output_tokens == 187


def test_anthropic_cumulative_message_delta_replaces_input_fields():
    stream = sse(
        anthropic("message_start", message={"model": "claude-x", "usage": {
            "input_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0, "output_tokens": 1}}),
        block_delta(0, {"type": "text_delta", "text": "ok"}),
        anthropic("message_delta", delta={"stop_reason": "end_turn"}, usage={
            "input_tokens": 11, "cache_read_input_tokens": 2000, "output_tokens": 3}),
        anthropic("message_stop"),
    )
    _, dialect = check_every_split(Anthropic, stream)
    assert dialect.usage == Usage(input_tokens=2011, output_tokens=3, cache_read_tokens=2000, cache_creation_tokens=0)
    assert dialect.finish_reason == "end_turn"


def test_anthropic_error_event():
    stream = sse(
        anthropic("message_start", message={"model": "claude-x", "usage": {"input_tokens": 5, "output_tokens": 1}}),
        block_delta(0, {"type": "text_delta", "text": "Hi"}),
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}, "request_id": "req_1"}),
    )
    deltas, dialect = check_every_split(Anthropic, stream)
    assert deltas == [d("text", 2)]
    assert outcome(dialect) == (
        Usage(input_tokens=5, output_tokens=1), "claude-x", None, "overloaded_error", "Overloaded", True, 0, 0,
    )


def test_anthropic_body_and_error_body():
    dialect = Anthropic()
    dialect.on_body(orjson.dumps({
        "id": "msg", "type": "message", "model": "claude-x", "stop_reason": "max_tokens",
        "content": [{"type": "text", "text": "hi"}],
        "usage": {"input_tokens": 3, "cache_creation_input_tokens": 4, "cache_read_input_tokens": 5, "output_tokens": 6},
    }))
    assert outcome(dialect) == (
        Usage(input_tokens=12, output_tokens=6, cache_read_tokens=5, cache_creation_tokens=4),
        "claude-x", "max_tokens", None, None, True, 0, 0,
    )
    error = Anthropic()
    error.on_body(b'{"type":"error","error":{"type":"rate_limit_error","message":"Slow down"},"request_id":"r"}')
    assert (error.error_type, error.error_message) == ("rate_limit_error", "Slow down")


# --- OpenAI Responses (§A2) -----------------------------------------------------------

def resp(kind, seq, **fields):
    return (kind, {"type": kind, "sequence_number": seq, **fields})


RESPONSES_USAGE = {"input_tokens": 9000, "input_tokens_details": {"cached_tokens": 8192},
                   "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 128}, "total_tokens": 9300}


def responses_stream(*middle, end):
    return sse(
        resp("response.created", 0, response={"id": "resp_1", "status": "in_progress", "model": "gpt-x", "usage": None}),
        resp("response.in_progress", 1, response={"id": "resp_1", "status": "in_progress", "model": "gpt-x", "usage": None}),
        resp("response.output_item.added", 2, output_index=0, item={"type": "reasoning"}),
        *middle,
        end,
    )


def test_responses_completed_stream():
    stream = responses_stream(
        resp("response.reasoning_summary_text.delta", 3, item_id="rs", summary_index=0, delta="**Plan**"),
        resp("response.reasoning_summary_text.done", 4, text="**Plan**"),
        resp("response.content_part.added", 5, part={"type": "output_text", "text": ""}),
        resp("response.output_text.delta", 6, item_id="msg_1", output_index=1, content_index=0, delta="Hel", logprobs=[]),
        resp("response.output_text.delta", 7, item_id="msg_1", output_index=1, content_index=0, delta="", logprobs=[]),
        resp("response.output_text.delta", 8, item_id="msg_1", output_index=1, content_index=0, delta="lo", logprobs=[]),
        resp("response.function_call_arguments.delta", 9, delta='{"cmd":'),
        resp("response.custom_tool_call_input.delta", 10, delta="*** Begin Patch"),
        resp("response.output_text.done", 11, text="Hello"),
        end=resp("response.completed", 12, response={
            "id": "resp_1", "status": "completed", "model": "gpt-x-2026", "usage": RESPONSES_USAGE}),
    )
    deltas, dialect = check_every_split(OpenAIResponses, stream)
    assert deltas == [d("reasoning", 8), d("text", 3), d("text", 2), d("tool_args", 7), d("tool_args", 15)]
    assert outcome(dialect) == (
        Usage(input_tokens=9000, output_tokens=300, cache_read_tokens=8192, reasoning_tokens=128),
        "gpt-x-2026", "completed", None, None, True, 0, 0,
    )


def test_responses_incomplete():
    stream = responses_stream(
        resp("response.output_text.delta", 3, delta="Hi"),
        end=resp("response.incomplete", 4, response={
            "status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "usage": {"input_tokens": 10, "output_tokens": 2}}),
    )
    deltas, dialect = check_every_split(OpenAIResponses, stream)
    assert deltas == [d("text", 2)]
    assert outcome(dialect) == (Usage(input_tokens=10, output_tokens=2), "gpt-x", "max_output_tokens", None, None, True, 0, 0)


def test_responses_failed():
    stream = responses_stream(end=resp("response.failed", 3, response={
        "status": "failed", "error": {"code": "server_error", "message": "The model failed"}, "usage": None}))
    deltas, dialect = check_every_split(OpenAIResponses, stream)
    assert deltas == []
    assert outcome(dialect) == (Usage(), "gpt-x", "failed", "server_error", "The model failed", True, 0, 0)


def test_responses_error_event():
    stream = responses_stream(end=resp("error", 3, code="rate_limit_exceeded", message="Rate limit reached", param=None))
    _, dialect = check_every_split(OpenAIResponses, stream)
    assert (dialect.error_type, dialect.error_message, dialect.terminal) == ("rate_limit_exceeded", "Rate limit reached", True)


def test_responses_truncated_stream_is_not_terminal():
    stream = responses_stream(resp("response.output_text.delta", 3, delta="Hi"), end=(None, "{}"))
    _, dialect = run(OpenAIResponses, [stream])
    assert not dialect.terminal and dialect.usage == Usage()


def test_responses_websocket_error_frame():
    dialect = OpenAIResponses()
    frame = {"type": "error", "status": 429, "error": {"type": "usage_limit_reached", "message": "Limit"}}
    assert dialect.on_event(orjson.dumps(frame), None) is None
    assert (dialect.error_type, dialect.error_message, dialect.terminal) == ("usage_limit_reached", "Limit", True)


def test_responses_body_and_compact_body():
    dialect = OpenAIResponses()
    dialect.on_body(orjson.dumps({"id": "r", "object": "response", "status": "completed", "model": "gpt-x",
                                  "error": None, "incomplete_details": None, "usage": RESPONSES_USAGE}))
    assert outcome(dialect) == (
        Usage(input_tokens=9000, output_tokens=300, cache_read_tokens=8192, reasoning_tokens=128),
        "gpt-x", "completed", None, None, True, 0, 0,
    )
    compact = OpenAIResponses()
    compact.on_body(b'{"output": [{"type": "compaction", "encrypted_content": "x"}]}')
    assert outcome(compact) == (Usage(), None, None, None, None, True, 0, 0)


# --- Gemini (§A4) ---------------------------------------------------------------------

def gemini(parts=None, finish=None, usage=None):
    candidate = {"content": {"role": "model", "parts": parts or []}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    out = {"candidates": [candidate], "modelVersion": "gemini-x"}
    if usage:
        out["usageMetadata"] = usage
    return (None, out)


def test_gemini_stream():
    stream = sse(
        gemini([{"text": "Considering", "thought": True}], usage={"promptTokenCount": 50, "totalTokenCount": 50}),
        gemini([{"text": "Hello"}]),
        gemini([{"text": " world"}, {"functionCall": {"name": "ls", "args": {"d": "."}}}]),
        gemini([{"functionCall": {"name": "ls", "args": {}}}]),
        gemini([{"text": ""}], finish="STOP", usage={
            "promptTokenCount": 50, "candidatesTokenCount": 7, "thoughtsTokenCount": 20,
            "cachedContentTokenCount": 32, "totalTokenCount": 77}),
    )
    deltas, dialect = check_every_split(Gemini, stream)
    assert deltas == [d("reasoning", 11), d("text", 5), d("text", 6 + 2 + 9), d("tool_args", 2)]
    assert outcome(dialect) == (
        Usage(input_tokens=50, output_tokens=27, cache_read_tokens=32, reasoning_tokens=20),
        "gemini-x", "STOP", None, None, False, 0, 0,
    )
    assert Gemini.has_terminal_event is False


def test_gemini_body_array_and_error():
    dialect = Gemini()
    body = [gemini([{"text": "Hi"}])[1], gemini(finish="MAX_TOKENS", usage={"promptTokenCount": 4, "candidatesTokenCount": 2})[1]]
    dialect.on_body(orjson.dumps(body))
    assert outcome(dialect) == (Usage(input_tokens=4, output_tokens=2), "gemini-x", "MAX_TOKENS", None, None, True, 0, 0)
    error = Gemini()
    error.on_body(b'{"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED"}}')
    assert (error.error_type, error.error_message) == ("RESOURCE_EXHAUSTED", "Quota exceeded")


def test_gemini_blocked_prompt():
    dialect = Gemini()
    dialect.on_event(b'{"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 8}}', None)
    assert (dialect.finish_reason, dialect.usage.input_tokens) == ("SAFETY", 8)


# --- generic dialect and detection ----------------------------------------------------

@pytest.mark.parametrize(("body", "expected"), [
    (b'{"error": {"message": "Incorrect API key", "type": "invalid_request_error", "code": "invalid_api_key"}}',
     ("invalid_request_error", "Incorrect API key")),
    (b'{"error": {"message": "No such model", "type": null, "code": "model_not_found"}}', ("model_not_found", "No such model")),
    (b'{"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}',
     ("authentication_error", "invalid x-api-key")),
    (b'[{"error": {"code": 400, "message": "API key not valid", "status": "INVALID_ARGUMENT"}}]',
     ("INVALID_ARGUMENT", "API key not valid")),
    (b'{"error": "upstream unavailable"}', ("error", "upstream unavailable")),
    (b'{"input_tokens": 1234}', (None, None)),
    (b"<html>502 Bad Gateway</html>", (None, None)),
    (b"", (None, None)),
])
def test_generic_body_errors(body, expected):
    dialect = Dialect()
    dialect.on_body(body)
    assert (dialect.error_type, dialect.error_message) == expected
    assert dialect.parse_errors == 0


@pytest.mark.parametrize("cls", [OpenAIChat, OpenAIResponses, Anthropic])
def test_error_bodies_of_each_api(cls):
    dialect = cls()
    dialect.on_body(b'{"error": {"message": "Bad request", "type": "invalid_request_error"}}')
    assert (dialect.error_type, dialect.error_message, dialect.parse_errors) == ("invalid_request_error", "Bad request", 0)


@pytest.mark.parametrize(("path", "cls"), [
    ("/v1/chat/completions", OpenAIChat),
    ("/openrouter/api/v1/chat/completions?x=1", OpenAIChat),
    ("/v1/responses", OpenAIResponses),
    ("/codex/v1/responses/compact", OpenAIResponses),
    ("/v1/messages?beta=true", Anthropic),
    ("/anthropic/v1/messages", Anthropic),
    ("/v1/messages/count_tokens?beta=true", Dialect),
    ("/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse", Gemini),
    ("/gemini/v1beta/models/gemini-2.5-flash:generateContent", Gemini),
    ("/v1/models", Dialect),
    ("/", Dialect),
    ("", Dialect),
])
def test_detect_dialect(path, cls):
    assert detect_dialect(path) is cls


def test_dialect_names():
    assert [c.name for c in (OpenAIChat, OpenAIResponses, Anthropic, Gemini, Dialect)] == [
        "openai_chat", "openai_responses", "anthropic", "gemini", "generic"]
    assert [c.has_terminal_event for c in (OpenAIChat, OpenAIResponses, Anthropic, Gemini)] == [True, True, True, False]


# --- garbage never raises -------------------------------------------------------------

ALL = [OpenAIChat, OpenAIResponses, Anthropic, Gemini, Dialect]
GARBAGE = [b"", b"not json", b"\xff\xfe\x00", b"[1, 2]", b"null", b"42", b'"str"', b"{", b"{}}"]
WRONG_TYPES = {
    OpenAIChat: [b'{"choices": 5}', b'{"choices": [{"delta": {"content": 5}}]}', b'{"usage": {"prompt_tokens": "9"}}',
                 b'{"choices": [{"delta": {"tool_calls": [{"function": {"arguments": []}}]}}]}', b'{"model": 3}'],
    OpenAIResponses: [b'{"type": "response.output_text.delta", "delta": 5}', b'{"type": "response.completed", "response": 5}',
                      b'{"type": "response.completed", "response": {"usage": {"input_tokens": true}}}', b'{"type": ["a"]}'],
    Anthropic: [b'{"type": "content_block_delta", "delta": {"type": "text_delta", "text": 5}}', b'{"type": "message_start"}',
                b'{"type": "message_delta", "usage": {"output_tokens": "7"}}', b'{"type": "content_block_delta", "delta": []}'],
    Gemini: [b'{"candidates": [{"content": {"parts": [{"text": 1}]}}]}', b'{"candidates": 3}',
             b'{"usageMetadata": {"promptTokenCount": "5"}}', b'{"candidates": [{"content": {"parts": "x"}}]}'],
}


@pytest.mark.parametrize("cls", ALL[:4])
def test_garbage_and_wrong_types_are_parse_errors(cls):
    dialect = cls()
    events = [g for g in GARBAGE if g.strip() != b"[DONE]"] + WRONG_TYPES[cls]
    for data in events:
        assert dialect.on_event(data, "x") is None
    assert dialect.parse_errors == len(events)
    assert dialect.parse_error.startswith(cls.name)
    body = cls()
    body.on_body(b"<html>")
    assert (body.parse_errors, body.terminal) == (1, False)


def mutate(value, rng):
    """The same JSON with one value somewhere replaced by one of another type."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(list(value))
        return {**value, key: mutate(value[key], rng)}
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        return [*value[:i], mutate(value[i], rng), *value[i + 1:]]
    return rng.choice([None, True, 0, -1, 1.5, "", "x", [], {}, [1], {"a": 1}])


@pytest.mark.parametrize("cls", ALL)
def test_mutated_events_never_raise(cls):
    rng = random.Random(cls.name)
    streams = [ANTHROPIC_STREAM, responses_stream(end=resp("response.completed", 9, response={"usage": RESPONSES_USAGE}))]
    events = [orjson.loads(data) for s in streams for _, data in SSEParser().feed(s)]
    events += [chat({"content": "x", "tool_calls": [{"function": {"name": "f"}}]}, usage=OPENAI_USAGE),
               gemini([{"text": "a"}, {"functionCall": {"name": "f", "args": {}}}], usage={"promptTokenCount": 1})[1]]
    dialect = cls()
    for _ in range(2000):
        event = mutate(rng.choice(events), rng)
        data = orjson.dumps(event)
        result = dialect.on_event(data, None)
        assert result is None or (type(result) is tuple and Delta(*result) == result)
        dialect.on_body(data)
    big = b'{"usage": {"prompt_tokens": 123456789012345678901234567890}, "choices": []}'
    assert dialect.on_event(big, None) is None


