"""proxy/meter/meter.py without a socket: the named events, in the order the relay fires them, make the row."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.meter.capture import make_meter
from proxy.meter.dialects.base import Delta
from proxy.meter.dialects.openai_responses import OpenAIResponses
from proxy.meter.meter import Meter
from proxy.common.schema import Outcome

MS = 1_000_000  # ns


def meter(path: str = "/v1/chat/completions") -> Meter:
    return Meter(received_ns=0, method="POST", path=path, query={}, headers=CIMultiDictProxy(CIMultiDict()),
                 route="/", upstream_host="up", tag=None)


def headers(**values: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({k.replace("_", "-"): v for k, v in values.items()}))


def test_a_stream_through_every_event() -> None:
    m = meter()
    m.on_request_read(b'{"model": "gpt-x", "stream": true, "messages": []}')
    m.on_upstream_sent(2 * MS)
    m.response_started(200, headers(content_type="text/event-stream"), 50 * MS)
    for i, t in enumerate((100, 120, 140)):
        m.on_chunk(b'data: {"choices":[{"index":0,"delta":{"content":"tok%d"}}]}\n\n' % i, t * MS)
    m.on_chunk(b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}\n\ndata: [DONE]\n\n',
               150 * MS)
    row, chunks = m.finish(None, 160 * MS)
    assert (row["request_model"], row["request_bytes"], row["status"], row["outcome"]) == ("gpt-x", 50, 200, "ok")
    assert (row["proxy_overhead_ms"], row["upstream_headers_ms"], row["ttft_ms"], row["e2e_ms"]) == (2, 50, 100, 160)
    assert (row["output_tokens"], row["tpot_ms"], row["output_events"]) == (3, 20, 3)
    assert [c[2] for c in chunks] == [100, 120, 140]


def test_refused_before_the_upstream() -> None:
    m = meter("/v1/messages")
    m.on_answered_locally(401)
    row, chunks = m.finish(Outcome.HTTP_ERROR, 1 * MS, ("invalid_client_key", "no"))
    assert (row["status"], row["outcome"], row["error_type"], row["ttft_ms"], list(chunks)) == (
        401, "http_error", "invalid_client_key", None, [])


def test_a_websocket_turn_streams_by_definition() -> None:
    m = meter("/v1/responses")
    m.on_websocket_turn(b'{"type": "response.create", "model": "gpt-x"}', 5 * MS)
    m.on_message(b'{"type": "response.output_text.delta", "delta": "hi"}', 30 * MS)
    m.on_message(b'{"type": "response.completed", "response": {"usage": {"input_tokens": 4, "output_tokens": 1}}}',
                 40 * MS)
    row, _ = m.finish(None, 41 * MS)
    assert (row["status"], row["stream"], row["ttft_ms"], row["output_tokens"], row["outcome"]) == (
        101, True, 30, 1, "ok")


def test_a_stream_cut_before_its_terminal_event_is_truncated() -> None:
    m = meter("/v1/messages")
    m.on_request_read(b'{"model": "claude-x", "stream": true, "max_tokens": 5, "messages": []}')
    m.response_started(200, headers(content_type="text/event-stream"), 10 * MS)
    m.on_chunk(b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
               b'"delta":{"type":"text_delta","text":"hi"}}\n\n', 20 * MS)
    row, _ = m.finish(None, 30 * MS)
    assert row["outcome"] == Outcome.STREAM_TRUNCATED


CREATE = b'{"type": "response.create", "model": "gpt-x"}'
DELTA = b'{"type": "response.output_text.delta", "delta": "hi"}'
COMPLETED = b'{"type": "response.completed", "response": {"usage": {"input_tokens": 4, "output_tokens": 1}}}'


def test_a_websocket_turn_is_done_at_its_terminal_frame_once() -> None:
    """The meter raises `done` (the relay ends the turn on it); the relay reads no frame itself."""
    m, done = meter("/v1/responses"), []
    m.on_websocket_turn(CREATE, 5 * MS, done=lambda: done.append(m.dialect.terminal))
    m.on_message(DELTA, 30 * MS)
    assert done == []
    m.on_message(COMPLETED, 40 * MS)
    assert done == [True]
    m.on_message(DELTA, 50 * MS)  # a frame after the end: no second `done`
    assert done == [True]


class BuggyResponses(OpenAIResponses):
    """The Responses dialect with a bug that raises on one frame (a fault injected: the meter's code runs as is)."""

    def on_event(self, data: bytes, event: str | None) -> Delta | None:
        if b"boom" in data:
            raise RuntimeError("a bug in a dialect")
        return super().on_event(data, event)


def test_a_meter_that_breaks_on_a_frame_ends_its_turn_there() -> None:
    """A broken meter cannot see the terminal frame any more: it says `done` at the frame it broke on
    (never raising into the relay), so the turn is not left open until the socket closes."""
    m, done = meter("/v1/responses"), []
    m.dialect = BuggyResponses()
    m.on_websocket_turn(CREATE, 5 * MS, done=lambda: done.append(True))
    m.on_message(DELTA, 30 * MS)
    m.on_message(b'{"type": "response.output_text.delta", "delta": "boom"}', 35 * MS)
    assert done == [True]
    row, _ = m.finish(None, 36 * MS)
    assert (row["ttft_ms"], row["output_events"], row["outcome"]) == (30, 1, "ok")
    assert row["parse_error"] == "meter: RuntimeError: a bug in a dialect"


def test_a_captured_websocket_turn_keeps_each_frame_on_its_line() -> None:
    m = make_meter(True, 1, received_ns=0, method="GET", path="/v1/responses", query={},
                   headers=CIMultiDictProxy(CIMultiDict()), route="/", upstream_host="up", tag=None)
    m.on_websocket_turn(CREATE, 5 * MS)
    m.on_message(DELTA, 30 * MS)
    m.on_message(COMPLETED, 40 * MS)
    m.finish(None, 41 * MS)
    assert m.captured is not None
    rid, request, response, request_cut, response_cut = m.captured
    assert (rid, request, request_cut, response_cut) == (m.id, CREATE.decode(), False, False)
    assert response == (DELTA + b"\n" + COMPLETED + b"\n").decode()


def test_a_snapshot_parses_nothing_and_a_read_waits_at_most_pending_ns() -> None:
    """What a live view sees of a request: as far as the meter parsed, never a parse of its own (a
    viewer connected changes nothing); reads are parsed in batches, the oldest waiting PENDING_NS at most."""
    from proxy.meter.meter import PENDING_NS

    m = meter()
    m.on_request_read(b'{"model": "gpt-x", "stream": true, "messages": []}')
    m.response_started(200, headers(content_type="text/event-stream"), 5 * MS)
    delta = b'data: {"choices":[{"index":0,"delta":{"content":"tok0"}}]}\n\n'
    m.on_chunk(delta, 10 * MS)
    m.on_chunk(delta, 20 * MS)
    snap = m.snapshot()
    assert (snap.status, snap.request_read, snap.first_output, snap.output_events, snap.tokens) == (
        200, True, None, 0, 0)
    assert m.snapshot() == snap
    assert m.request_labels() == ("gpt-x", None, None)
    m.on_chunk(delta, 10 * MS + PENDING_NS)
    snap = m.snapshot()
    assert (snap.first_output, snap.output_events, snap.tokens) == (10 * MS, 3, 3)
