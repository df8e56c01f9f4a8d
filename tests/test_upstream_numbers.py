"""A hostile upstream's numbers: out of range, they are not kept, the row says so, and no row is lost
(proxy/common/bounds.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import orjson

from proxy.common.bounds import RETRY_AFTER_MAX_S, checked

from .conftest import proxy_config, rows
from .upstreams import Script, ScriptedUpstream
from .serving import RunningProxy

HUGE = 2**70  # orjson reads it as a float that is an integer: a count past BIGINT
SSE = [("Content-Type", "text/event-stream")]
JSON = [("Content-Type", "application/json")]


def chat_stream(prompt_tokens: int) -> list[bytes]:
    head = {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-5"}
    text = {**head, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    stop = {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    usage = {**head, "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": 3,
                                             "prompt_tokens_details": {"cached_tokens": 2}}}
    raw_usage = orjson.dumps(usage).replace(b'"prompt_tokens":0', b'"prompt_tokens":%d' % prompt_tokens)
    return [b"data: " + orjson.dumps(text) + b"\n\n", b"data: " + orjson.dumps(stop) + b"\n\n",
            b"data: " + raw_usage + b"\n\n", b"data: [DONE]\n\n"]


MESSAGE = orjson.dumps({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                        "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                        "usage": {"input_tokens": 10, "output_tokens": -5}})
ANTHROPIC_LIMITS = [("anthropic-ratelimit-requests-limit", "1e30"), ("anthropic-ratelimit-requests-remaining", "-3"),
                    ("anthropic-ratelimit-tokens-limit", "80000"), ("retry-after", "-1e308")]
# a reset so far ahead there is no such time (it made the meter raise, and the row was lost)
OPENAI_LIMITS = [("x-ratelimit-limit-requests", "100"), ("x-ratelimit-remaining-requests", "nan"),
                 ("x-ratelimit-reset-requests", "1e300"), ("retry-after", "1e12")]
GEMINI = orjson.dumps({"candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
                       "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 1e300,
                                         "thoughtsTokenCount": 2}})


async def test_numbers_out_of_range_are_not_kept_and_every_row_stays(tmp_path: Path) -> None:
    async with (ScriptedUpstream(Script(headers=SSE, chunks=chat_stream(HUGE))) as huge,
                ScriptedUpstream(Script(headers=SSE, chunks=chat_stream(12))) as fine,
                ScriptedUpstream(Script(headers=JSON + ANTHROPIC_LIMITS, chunks=[MESSAGE])) as anthropic,
                ScriptedUpstream(Script(status=429, headers=JSON + OPENAI_LIMITS, chunks=[b"{}"])) as limited,
                ScriptedUpstream(Script(headers=JSON, chunks=[GEMINI])) as gemini):
        routes = {"/huge": huge.url, "/fine": fine.url, "/a": anthropic.url, "/l": limited.url, "/g": gemini.url}
        async with RunningProxy(proxy_config(None, tmp_path, routes=routes)) as p:  # type: ignore[arg-type]
            chat = {"model": "gpt-5", "stream": True, "max_tokens": 2**63, "messages": []}  # a client's, past BIGINT
            async with aiohttp.ClientSession() as s:
                async def send(path: str, body: dict) -> int:
                    async with s.post(p.url + path, json=body) as r:
                        await r.read()
                        return r.status

                statuses = await asyncio.gather(  # ending together: their rows are built and stored in one batch
                    send("/huge/v1/chat/completions", chat), send("/fine/v1/chat/completions", {**chat, "max_tokens": 100}),
                    send("/a/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": []}),
                    send("/l/v1/chat/completions", {"model": "gpt-5", "messages": []}),
                    send("/g/v1beta/models/gemini-2.5-flash:generateContent", {"contents": []}))
            assert statuses == [200, 200, 200, 429, 200]
            found = {r["route"]: r for r in rows(p)}
    assert sorted(found) == ["/a", "/fine", "/g", "/huge", "/l"]  # no row lost
    h = found["/huge"]
    assert (h["input_tokens"], h["output_tokens"], h["cache_read_tokens"], h["max_tokens"]) == (None, 3, 2, None)
    assert h["parse_error"] == f"out of range, not kept: max_tokens {2**63}, input_tokens {HUGE}"
    assert h["outcome"] == "ok" and h["finish_reason"] == "stop"
    f = found["/fine"]
    assert (f["input_tokens"], f["output_tokens"], f["max_tokens"], f["parse_error"]) == (12, 3, 100, None)
    a = found["/a"]
    assert (a["input_tokens"], a["output_tokens"], a["retry_after_s"]) == (10, None, None)
    assert (a["ratelimit_requests_limit"], a["ratelimit_requests_remaining"], a["ratelimit_tokens_limit"]) \
        == (None, None, 80000)
    assert a["parse_error"] == ("out of range, not kept: output_tokens -5, ratelimit_requests_limit "
                                "1000000000000000019884624838656, ratelimit_requests_remaining -3, retry_after_s -1e+308")
    limit = found["/l"]
    assert (limit["status"], limit["ratelimit_requests_limit"], limit["ratelimit_requests_remaining"],
            limit["ratelimit_requests_reset"], limit["retry_after_s"]) == (429, 100, None, None, None)
    assert limit["parse_error"] == "out of range, not kept: ratelimit_requests_remaining nan, retry_after_s 1000000000000.0"
    g = found["/g"]
    assert (g["input_tokens"], g["output_tokens"], g["reasoning_tokens"]) == (7, None, 2)
    assert g["parse_error"].startswith("out of range, not kept: output_tokens 1000000000000000052504760255204420248704")


def test_each_type_keeps_what_it_can_hold() -> None:
    values = {"output_tokens": 2**63 - 1, "input_tokens": 2**63, "message_count": 2**31, "max_tokens": 0,
              "cache_read_tokens": True, "retry_after_s": RETRY_AFTER_MAX_S, "ratelimit_5h_utilization": float("inf")}
    assert checked(values, {"tpot_ms": -1.0, "ratelimit_status": "anything"}) == (
        "out of range, not kept: input_tokens 9223372036854775808, message_count 2147483648, cache_read_tokens True, "
        "ratelimit_5h_utilization inf, tpot_ms -1.0")
    assert values == {"output_tokens": 2**63 - 1, "input_tokens": None, "message_count": None, "max_tokens": 0,
                      "cache_read_tokens": None, "retry_after_s": RETRY_AFTER_MAX_S, "ratelimit_5h_utilization": None}
    assert checked({"retry_after_s": RETRY_AFTER_MAX_S + 1}) is not None and checked({"input_tokens": None}) is None
