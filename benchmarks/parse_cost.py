"""Microseconds per event that measuring adds, per dialect, and per chunk for a whole Meter.

Builds a realistic stream for each API and times it in-process:
  sse      SSEParser.feed, one read per event as a streaming server sends them
  dialect  Dialect.on_event on the already split events
  both     the two together, as the meter runs them
  meter    Meter.on_chunk for every read, then Meter.finish (the row and its chunk rows), per read,
           on a stream of --chunks reads (one event each); `finish` alone is given apart (it parses
           the last reads kept, and builds the row: most of it is per request)

The streams are the shapes real servers send (docs: ../shared/reference/llm-wire-formats.md):
- openai_chat: a role chunk, text deltas with `obfuscation` padding of varying length, one with a
  line end in its text now and then, the finishing chunk, the usage chunk with `choices: []`, `[DONE]`;
- anthropic (Claude Code's shape): message_start with usage, a thinking block (thinking_delta,
  signature_delta), ping, a text block, a tool_use block whose input_json_delta pieces are full of
  escaped quotes, content_block_stop after each, message_delta with usage, message_stop;
- openai_responses: response.created, in_progress, output_item.added, reasoning summary deltas,
  output_text deltas with sequence numbers and obfuscation, the .done events, response.completed
  with usage;
- gemini: whole GenerateContentResponse chunks, each with its usageMetadata;
- chat (vLLM shape): the chat stream with a field of its own in each choice, which the meter's quick
  pattern does not know: every event parsed, as for any API of a shape it has no pattern for.

Every figure is this thread's CPU time (the least of --repeats runs), per event or per read.

Run: python benchmarks/parse_cost.py [--events N] [--chunks N] [--repeats N]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.meter.dialects.anthropic import Anthropic
from proxy.meter.dialects.base import Dialect
from proxy.meter.dialects.gemini import Gemini
from proxy.meter.dialects.openai_chat import OpenAIChat
from proxy.meter.dialects.openai_responses import OpenAIResponses
from proxy.meter.meter import Meter
from proxy.meter.sse import SSEParser

WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " lazy", " dog", ".\n\n", " naïve", " café", "\n-"]
JSON_ARGS = ['{"', 'file_path', '": "/src/', 'app.py", "', 'old_string": "', 'def main():\\n', '    return 0', '"}']
OBFUSCATION = "aB3xYz9QwErTy"


def event(data: object, name: str | None = None) -> bytes:
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def chat_stream(n: int) -> list[bytes]:
    rng = random.Random(1)
    base = {"id": "chatcmpl-AbC123", "object": "chat.completion.chunk", "created": 1764500000,
            "model": "gpt-4.1-2025-04-14", "service_tier": "default", "system_fingerprint": "fp_51e1070cf2"}
    out = [event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None},
                                       "logprobs": None, "finish_reason": None}], "usage": None, "obfuscation": "Xy"})]
    for i in range(n):
        out.append(event({**base, "choices": [{"index": 0, "delta": {"content": WORDS[i % len(WORDS)]},
                                               "logprobs": None, "finish_reason": None}], "usage": None,
                          "obfuscation": OBFUSCATION[:rng.randrange(1, 13)]}))
    out.append(event({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
                      "usage": None}))
    out.append(event({**base, "choices": [], "usage": {
        "prompt_tokens": 1200, "completion_tokens": n, "total_tokens": 1200 + n,
        "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                      "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}}}))
    out.append(b"data: [DONE]\n\n")
    return out


def vllm_stream(n: int) -> list[bytes]:
    """Chat chunks of another shape (vLLM's `stop_reason` in each choice): the quick pattern misses
    them, the meter parses every event (what the shortcut costs a stream it does not fit)."""
    return [r.replace(b'"finish_reason":null}', b'"finish_reason":null,"stop_reason":null}') for r in chat_stream(n)]


def anthropic_stream(n: int) -> list[bytes]:
    """Claude Code's shape: a fifth thinking, half text, the rest a tool call's arguments."""
    def block(index: int, kind: str, key: str, pieces: list[str], count: int, start: dict) -> list[bytes]:
        b = [event({"type": "content_block_start", "index": index, "content_block": start}, "content_block_start")]
        for i in range(count):
            b.append(event({"type": "content_block_delta", "index": index,
                            "delta": {"type": kind, key: pieces[i % len(pieces)]}}, "content_block_delta"))
        if kind == "thinking_delta":
            b.append(event({"type": "content_block_delta", "index": index,
                            "delta": {"type": "signature_delta", "signature": "EqQBCkYIBRgCKkC" * 8}},
                           "content_block_delta"))
        b.append(event({"type": "content_block_stop", "index": index}, "content_block_stop"))
        return b

    thinking, text = n // 5, n // 2
    tool = n - thinking - text
    out = [
        event({"type": "message_start", "message": {"id": "msg_01", "type": "message", "role": "assistant",
               "model": "claude-sonnet-4-5", "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 12, "cache_creation_input_tokens": 500,
                         "cache_read_input_tokens": 40000, "output_tokens": 1, "service_tier": "standard"}}},
              "message_start"),
        event({"type": "ping"}, "ping"),
    ]
    out += block(0, "thinking_delta", "thinking", WORDS, thinking, {"type": "thinking", "thinking": "", "signature": ""})
    out += block(1, "text_delta", "text", WORDS, text, {"type": "text", "text": ""})
    out += block(2, "input_json_delta", "partial_json", JSON_ARGS, tool,
                 {"type": "tool_use", "id": "toolu_01", "name": "Edit", "input": {}})
    out.append(event({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                      "usage": {"output_tokens": n}}, "message_delta"))
    out.append(event({"type": "message_stop"}, "message_stop"))
    return out


def responses_stream(n: int) -> list[bytes]:
    rng = random.Random(2)
    seq = iter(range(10 ** 6))

    def ev(kind: str, **fields: object) -> bytes:
        return event({"type": kind, "sequence_number": next(seq), **fields}, kind)

    response = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "gpt-5", "usage": None}
    out = [ev("response.created", response=response), ev("response.in_progress", response=response),
           ev("response.output_item.added", output_index=0, item={"id": "rs_1", "type": "reasoning", "summary": []})]
    reasoning = n // 5
    for i in range(reasoning):
        out.append(ev("response.reasoning_summary_text.delta", item_id="rs_1", output_index=0, summary_index=0,
                      delta=WORDS[i % len(WORDS)], obfuscation=OBFUSCATION[:rng.randrange(1, 13)]))
    out.append(ev("response.output_item.done", output_index=0, item={"id": "rs_1", "type": "reasoning"}))
    out.append(ev("response.output_item.added", output_index=1, item={"id": "msg_1", "type": "message"}))
    for i in range(n - reasoning):
        out.append(ev("response.output_text.delta", item_id="msg_1", output_index=1, content_index=0,
                      delta=WORDS[i % len(WORDS)], logprobs=[], obfuscation=OBFUSCATION[:rng.randrange(1, 13)]))
    out.append(ev("response.output_text.done", item_id="msg_1", output_index=1, content_index=0, text="…", logprobs=[]))
    done = {**response, "status": "completed", "usage": {
        "input_tokens": 9000, "input_tokens_details": {"cached_tokens": 8192}, "output_tokens": n,
        "output_tokens_details": {"reasoning_tokens": reasoning}, "total_tokens": 9000 + n}}
    out.append(ev("response.completed", response=done))
    return out


def gemini_stream(n: int) -> list[bytes]:
    out = []
    for i in range(n):
        chunk = {"candidates": [{"content": {"parts": [{"text": WORDS[i % len(WORDS)]}], "role": "model"}, "index": 0}],
                 "usageMetadata": {"promptTokenCount": 50, "totalTokenCount": 50},
                 "modelVersion": "gemini-2.5-flash", "responseId": "abc"}
        out.append(event(chunk))
    return out


STREAMS: list[tuple[type[Dialect], Callable[[int], list[bytes]], str]] = [
    (OpenAIChat, chat_stream, "/v1/chat/completions"),
    (OpenAIChat, vllm_stream, "/v1/chat/completions"),
    (Anthropic, anthropic_stream, "/v1/messages"),
    (OpenAIResponses, responses_stream, "/v1/responses"),
    (Gemini, gemini_stream, "/v1beta/models/gemini-2.5-flash:streamGenerateContent"),
]
HEADERS = CIMultiDictProxy(CIMultiDict({"content-type": "application/json", "authorization": "Bearer sk-test-123",
                                        "user-agent": "claude-cli/2.1.197 (external, cli)"}))
UPSTREAM = CIMultiDictProxy(CIMultiDict({"content-type": "text/event-stream; charset=utf-8"}))
REQUEST = orjson.dumps({"model": "m", "stream": True, "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}]})


# This thread's CPU time, the least of the repeats: on a shared machine, time spent waiting for the
# CPU is the others' and a run disturbed by them is not the least.
clock = time.thread_time_ns


def best_of(repeats: int, run: Callable[[], object]) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        run()
        times.append(clock() - start)
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


def measure_meter(path: str, reads: list[bytes], repeats: int) -> tuple[float, float]:
    """µs per read of Meter.on_chunk for every read then Meter.finish, and of finish alone (the
    meter made, its request read and its response started before the clock starts)."""
    best_total = best_finish = float("inf")
    for _ in range(repeats):
        m = Meter(received_ns=0, method="POST", path=path, query={}, headers=HEADERS, route="/",
                  upstream_host="api.example.com", tag=None)
        m.on_request_read(REQUEST)
        m.on_upstream_sent(1000)
        m.response_started(200, UPSTREAM, 2000)
        on_chunk, t = m.on_chunk, 3000
        start = clock()
        for r in reads:
            t += 1000
            on_chunk(r, t)
        mid = clock()
        m.finish(None, t + 1000)
        end = clock()
        best_total, best_finish = min(best_total, end - start), min(best_finish, end - mid)
    return best_total / len(reads) / 1000, best_finish / len(reads) / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=500, help="output events per stream for sse/dialect/both")
    parser.add_argument("--chunks", type=int, default=100, help="reads per stream for the meter column")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    print(f"{'dialect':<18}{'events':>7}{'bytes/ev':>10}{'sse µs':>9}{'dialect µs':>12}{'both µs':>9}"
          f"{'meter µs/chunk':>16}{'of it finish':>14}")
    for cls, build, path in STREAMS:
        reads = build(args.events)
        n, sse, dialect, both = measure(cls, reads, args.repeats)
        size = sum(map(len, reads)) / len(reads)
        k = args.chunks
        while len(build(k)) > args.chunks:  # the structural events count as reads too
            k -= 1
        chunks = build(k)
        meter, finish = measure_meter(path, chunks, args.repeats * 5)
        label = cls.name if build is not vllm_stream else "chat (vLLM shape)"
        print(f"{label:<18}{n:>7}{size:>10.0f}{sse:>9.2f}{dialect:>12.2f}{both:>9.2f}{meter:>16.2f}{finish:>14.2f}")


if __name__ == "__main__":
    main()
