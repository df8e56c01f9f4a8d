"""Microseconds per event that measuring adds, per dialect.

Builds a realistic stream for each API (a few hundred short text deltas with
the fields real servers send, then usage and the terminal event), then times:
  sse      SSEParser.feed, one read per event as a streaming server sends them
  dialect  Dialect.on_event on the already split events
  both     the two together, as the meter runs them

Run: python benchmarks/parse_cost.py [--events N]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import orjson

from proxy.dialects.anthropic import Anthropic
from proxy.dialects.base import Dialect
from proxy.dialects.gemini import Gemini
from proxy.dialects.openai_chat import OpenAIChat
from proxy.dialects.openai_responses import OpenAIResponses
from proxy.sse import SSEParser

WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ".", "\n"]


def event(data: object, name: str | None = None) -> bytes:
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def chat_stream(n: int) -> list[bytes]:
    base = {"id": "chatcmpl-AbC123", "object": "chat.completion.chunk", "created": 1764500000,
            "model": "gpt-4.1-2025-04-14", "service_tier": "default", "system_fingerprint": "fp_51e1070cf2"}
    out = [event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None},
                                       "logprobs": None, "finish_reason": None}], "usage": None, "obfuscation": "Xy"})]
    for i in range(n):
        out.append(event({**base, "choices": [{"index": 0, "delta": {"content": WORDS[i % 10]}, "logprobs": None,
                                               "finish_reason": None}], "usage": None, "obfuscation": "k2J9"}))
    out.append(event({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                      "usage": None}))
    out.append(event({**base, "choices": [], "usage": {
        "prompt_tokens": 1200, "completion_tokens": n, "total_tokens": 1200 + n,
        "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}}))
    out.append(b"data: [DONE]\n\n")
    return out


def anthropic_stream(n: int) -> list[bytes]:
    out = [
        event({"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant",
               "model": "claude-sonnet-4-5", "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 12, "cache_creation_input_tokens": 500,
                         "cache_read_input_tokens": 40000, "output_tokens": 1, "service_tier": "standard"}}},
              "message_start"),
        event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
              "content_block_start"),
        event({"type": "ping"}, "ping"),
    ]
    for i in range(n):
        out.append(event({"type": "content_block_delta", "index": 0,
                          "delta": {"type": "text_delta", "text": WORDS[i % 10]}}, "content_block_delta"))
    out.append(event({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    out.append(event({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                      "usage": {"output_tokens": n}}, "message_delta"))
    out.append(event({"type": "message_stop"}, "message_stop"))
    return out


def responses_stream(n: int) -> list[bytes]:
    response = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "gpt-5", "usage": None}
    out = [event({"type": "response.created", "sequence_number": 0, "response": response}, "response.created")]
    for i in range(n):
        out.append(event({"type": "response.output_text.delta", "sequence_number": i + 1, "item_id": "msg_1",
                          "output_index": 1, "content_index": 0, "delta": WORDS[i % 10], "logprobs": [],
                          "obfuscation": "aBc"}, "response.output_text.delta"))
    done = {**response, "status": "completed", "usage": {
        "input_tokens": 9000, "input_tokens_details": {"cached_tokens": 8192}, "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 9000 + n}}
    out.append(event({"type": "response.completed", "sequence_number": n + 1, "response": done}, "response.completed"))
    return out


def gemini_stream(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        chunk = {"candidates": [{"content": {"parts": [{"text": WORDS[i % 10]}], "role": "model"}, "index": 0}],
                 "usageMetadata": {"promptTokenCount": 50, "totalTokenCount": 50},
                 "modelVersion": "gemini-2.5-flash", "responseId": "abc"}
        out.append(event(chunk))
    return out


def best_of(repeats: int, run: Callable[[], None]) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        run()
        times.append(time.perf_counter_ns() - start)
    return min(times)


def measure(cls: type[Dialect], reads: list[bytes], repeats: int) -> tuple[int, float, float, float]:
    events = [e for r in reads for e in SSEParser().feed(r)]

    def sse() -> None:
        parser = SSEParser()
        for r in reads:
            parser.feed(r)

    def dialect() -> None:
        d = cls()
        for name, data in events:
            d.on_event(data, name)

    def both() -> None:
        parser, d = SSEParser(), cls()
        for r in reads:
            for name, data in parser.feed(r):
                d.on_event(data, name)

    n = len(events)
    return n, *(best_of(repeats, f) / n / 1000 for f in (sse, dialect, both))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    streams = [(OpenAIChat, chat_stream), (Anthropic, anthropic_stream),
               (OpenAIResponses, responses_stream), (Gemini, gemini_stream)]
    print(f"{'dialect':<18}{'events':>7}{'bytes/ev':>10}{'sse µs':>9}{'dialect µs':>12}{'both µs':>9}")
    for cls, build in streams:
        reads = build(args.events)
        n, sse, dialect, both = measure(cls, reads, args.repeats)
        size = sum(map(len, reads)) / len(reads)
        print(f"{cls.name:<18}{n:>7}{size:>10.0f}{sse:>9.2f}{dialect:>12.2f}{both:>9.2f}")


if __name__ == "__main__":
    main()
