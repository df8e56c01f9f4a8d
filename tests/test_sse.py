import random
import tracemalloc

import pytest

from proxy.meter.sse import SSEParser

BOM = b"\xef\xbb\xbf"

STREAM = (
    b": OPENROUTER PROCESSING\n\n"
    b"event: message_start\ndata: {\"type\":\"message_start\"}\n\n"
    b"data: first line\ndata:second line\ndata:  two spaces\n\n"
    b"id: 7\nretry: 1000\nevent: ping\ndata: {}\n\n"
    b"event: lonely\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    ("message_start", b'{"type":"message_start"}'),
    (None, b"first line\nsecond line\n two spaces"),
    ("ping", b"{}"),
    (None, b"[DONE]"),
]


def reference(stream: bytes, max_event_bytes: int | None = None) -> list[tuple[str | None, bytes]]:
    """The WHATWG algorithm applied to a whole stream at once, line by line; with
    `max_event_bytes`, an event whose data lines (each counted with its line end) are
    longer is dropped."""
    if stream.startswith(BOM):
        stream = stream[3:]
    lines = stream.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    lines.pop()  # the unterminated last line, never processed
    events, data, name = [], [], None
    for line in lines:
        if not line:
            too_big = max_event_bytes is not None and sum(len(d) + 1 for d in data) > max_event_bytes
            if data and not too_big:
                events.append((name, b"\n".join(data)))
            data, name = [], None
        elif not line.startswith(b":"):
            field, colon, value = line.partition(b":")
            if colon and value.startswith(b" "):
                value = value[1:]
            if field == b"data":
                data.append(value)
            elif field == b"event":
                name = value.decode("utf-8", "replace") or None
    return events


def feed_all(chunks, parser=None):
    parser = parser or SSEParser()
    return [event for chunk in chunks for event in parser.feed(chunk)]


def test_one_feed():
    assert feed_all([STREAM]) == EXPECTED
    assert reference(STREAM) == EXPECTED


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_line_endings(newline):
    stream = STREAM.replace(b"\n", newline)
    assert feed_all([stream]) == EXPECTED
    assert feed_all([stream[i : i + 1] for i in range(len(stream))]) == EXPECTED


def test_mixed_line_endings():
    assert feed_all([b"data: a\r\ndata: b\rdata: c\n\r\n"]) == [(None, b"a\nb\nc")]


def test_cr_then_lf_in_next_read_is_one_line_end():
    # Were CR and LF two line ends, the LF would be a blank line dispatching "a".
    assert feed_all([b"data: a\r", b"\ndata: b\r\n\r\n"]) == [(None, b"a\nb")]
    assert feed_all([b"data: a\r", b"\n", b"\r", b"\n"]) == [(None, b"a")]


def test_cr_then_cr_is_two_line_ends():
    assert feed_all([b"data: a\r", b"\r"]) == [(None, b"a")]


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_every_two_way_split(newline):
    stream = STREAM.replace(b"\n", newline)
    for i in range(len(stream) + 1):
        assert feed_all([stream[:i], stream[i:]]) == EXPECTED, i


def test_every_three_way_split():
    stream = b"data: a\r\n\r\nevent: e\rdata:b\rdata: c\r\r: x\ndata: d\n\n"
    expected = [(None, b"a"), ("e", b"b\nc"), (None, b"d")]
    for i in range(len(stream) + 1):
        for j in range(i, len(stream) + 1):
            assert feed_all([stream[:i], stream[i:j], stream[j:]]) == expected, (i, j)


def test_events_are_returned_by_the_read_that_completes_them():
    parser = SSEParser()
    assert parser.feed(b"data: a\n") == []
    assert parser.feed(b"\ndata: b\n\ndata: c") == [(None, b"a"), (None, b"b")]
    assert parser.feed(b"\n\n") == [(None, b"c")]


def test_fields_and_values():
    stream = (
        b"data\n\n"  # a field without a colon: empty data
        b"data:\n\n"
        b"data:nospace\n\n"
        b"event: x\nevent\ndata: 1\n\n"  # a bare `event` clears the name
        b"event: x\n\ndata: 2\n\n"  # the name does not outlive its event
        b"unknown: 1\nDATA: 2\ndata: 3\n\n"
    )
    assert feed_all([stream]) == [
        (None, b""),
        (None, b""),
        (None, b"nospace"),
        (None, b"1"),
        (None, b"2"),
        (None, b"3"),
    ]


def test_unterminated_event_is_not_returned():
    assert feed_all([b"data: a\n"]) == []
    assert feed_all([b"data: a"]) == []


def test_bom_is_ignored_only_at_the_start():
    assert feed_all([BOM + b"data: a\n\n"]) == [(None, b"a")]
    assert feed_all([BOM[:1], BOM[1:2], BOM[2:] + b"data: a\n\n"]) == [(None, b"a")]
    assert feed_all([b"data: a\n\n" + BOM + b"data: b\n\n"]) == [(None, b"a")]
    assert feed_all([BOM[:2], b"data: a\n\n"]) == []  # a broken BOM spoils the field name


def test_invalid_utf8_is_kept_as_bytes():
    assert feed_all([b"event: \xff\ndata: \xfe\xff\x00\n\n"]) == [("\ufffd", b"\xfe\xff\x00")]


def test_oversized_event_is_dropped_and_parsing_resumes():
    parser = SSEParser(max_event_bytes=100)
    stream = b"data: ok\n\n" + b"data: " + b"x" * 60 + b"\n" + b"data: " + b"y" * 60 + b"\n\n" + b"data: next\n\n"
    assert feed_all([stream], parser) == [(None, b"ok"), (None, b"next")]
    assert parser.oversized == 1


def test_oversized_line_split_across_reads():
    parser = SSEParser(max_event_bytes=100)
    chunks = [b"data: ok\n\ndata: "] + [b"z" * 7] * 50 + [b"\ndata: more\n\ndata: next\n\n"]
    assert feed_all(chunks, parser) == [(None, b"ok"), (None, b"next")]
    assert parser.oversized == 1


def test_oversized_line_ending_at_the_start_of_the_next_read():
    parser = SSEParser(max_event_bytes=10)
    chunks = [b"data: " + b"x" * 20, b"\ndata: more\n\ndata: next\n\n"]
    assert feed_all(chunks, parser) == [(None, b"next")]
    assert parser.oversized == 1


def test_oversized_event_within_the_bound_is_kept():
    parser = SSEParser(max_event_bytes=100)
    assert feed_all([b"data: " + b"x" * 90 + b"\n\n"], parser) == [(None, b"x" * 90)]
    assert parser.oversized == 0


def test_memory_stays_bounded_on_an_endless_line():
    parser = SSEParser(max_event_bytes=64 * 1024)
    chunk = b"a" * 4096
    tracemalloc.start()
    try:
        parser.feed(b"data: ")
        for _ in range(2500):  # 10 MB without a line end
            parser.feed(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024
    assert parser.oversized == 1
    assert parser.feed(b"\n\ndata: after\n\n") == [(None, b"after")]


ALPHABET = [
    b"data:", b"data: ", b"event:", b"event: ", b"id: 1", b"retry: 5", b":", b" ",
    b"\r", b"\n", b"\r\n", b"\n\n", b"x", b"{}", b"\xff", b"\x00", BOM, b"data",
]


def test_random_streams_match_the_reference_and_never_raise():
    rng = random.Random(20261130)
    for _ in range(400):
        stream = b"".join(rng.choice(ALPHABET) for _ in range(rng.randrange(1, 60)))
        cuts = sorted(rng.randrange(len(stream) + 1) for _ in range(rng.randrange(4)))
        chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
        assert feed_all(chunks) == reference(stream), stream


def test_random_bytes_never_raise():
    rng = random.Random(7)
    parser = SSEParser(max_event_bytes=300)
    for _ in range(300):
        chunk = rng.randbytes(rng.randrange(200))
        for name, data in parser.feed(chunk):
            assert name is None or isinstance(name, str)
            assert isinstance(data, bytes)


EVENT_PARTS = [
    b"data: {}", b"data:x", b"data", b"event: a", b"event:b", b"event", b": comment", b"id: 7",
    b"data: \xff", b"data: " + b"y" * 40,
]


def test_reads_of_whole_events_match_the_reference():
    """The common case (each read ends an event, nothing pending) takes a shortcut: it must
    agree with the line-by-line parse for any mix of fields, one or many events per read."""
    rng = random.Random(11)
    for _ in range(500):
        events = [b"\n".join(rng.choice(EVENT_PARTS) for _ in range(rng.randrange(1, 4))) + b"\n\n"
                  for _ in range(rng.randrange(1, 6))]
        per_read = rng.randrange(1, 4)
        chunks = [b"".join(events[i:i + per_read]) for i in range(0, len(events), per_read)]
        assert feed_all(chunks, SSEParser(max_event_bytes=30)) == reference(b"".join(events), 30), events
