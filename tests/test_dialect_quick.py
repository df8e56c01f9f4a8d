"""The quick patterns (proxy/meter/dialects/base.py) against the full parse: every event, every stream,
the same answer, whichever way its JSON is written, and malformed events the same parse error."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from collections.abc import Iterator

import orjson
import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.meter.dialects import anthropic, openai_chat, openai_responses
from proxy.meter.dialects.base import Dialect, Quick
from proxy.meter.meter import Meter
from proxy.meter.sse import SSEParser

MODULES = {anthropic.Anthropic: anthropic, openai_chat.OpenAIChat: openai_chat,
           openai_responses.OpenAIResponses: openai_responses}
QUICK_DIALECTS = list(MODULES)


def _never(data: bytes) -> None:
    return None


@contextlib.contextmanager
def full_parse_only() -> Iterator[None]:
    """Every dialect without its quick pattern: what the meter did before it had them."""
    saved = [(module, module._QUICK, cls.quick) for cls, module in MODULES.items()]
    try:
        for cls, module in MODULES.items():
            module._QUICK = Quick(_never, None, module._QUICK.kinds, module._QUICK.model)
            cls.quick = None
        yield
    finally:
        for (module, quick, attr), cls in zip(saved, MODULES):
            module._QUICK = quick
            cls.quick = attr


def state(dialect: Dialect) -> dict:
    """Every field a dialect keeps: usage, model, finish reason, errors, terminal, parse errors."""
    return {f.name: getattr(dialect, f.name) for f in dataclasses.fields(dialect)}


PATHS = {anthropic.Anthropic: "/v1/messages", openai_chat.OpenAIChat: "/v1/chat/completions",
         openai_responses.OpenAIResponses: "/v1/responses"}


def new_meter(cls: type[Dialect]) -> Meter:
    m = Meter(received_ns=0, method="POST", path=PATHS[cls], query={}, headers=CIMultiDictProxy(CIMultiDict()),
              route="/", upstream_host="up", tag=None)
    m.id = "same"
    m.response_started(200, CIMultiDictProxy(CIMultiDict({"content-type": "text/event-stream"})), 1000)
    return m


def framed(name: str | None, data: bytes) -> bytes:
    return (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + data + b"\n\n"


def each_read(cls: type[Dialect], events: list[tuple[str | None, bytes]]) -> list[tuple]:
    """Each event as a read of its own through one meter (after a first read that leaves its parser
    between events): what the meter and its dialect hold after each."""
    m = new_meter(cls)
    m.on_chunk(b": open\n\n", 1500)
    seen = []
    for i, (name, data) in enumerate(events):
        m.on_chunk(framed(name, data), 2000 + i)
        m.drain()
        seen.append((m.times[-1:], m.sizes[-1:], m.kinds[-1:], m.chars, m.first_text, state(m.dialect)))
    return seen


def both(cls: type[Dialect], events: list[tuple[str | None, bytes]]) -> None:
    """The events through a meter with the dialect's quick pattern and through one without: the same
    output events and the same dialect state after each event."""
    fast = each_read(cls, events)
    with full_parse_only():
        full = each_read(cls, events)
    for event, got, expected in zip(events, fast, full):
        assert got == expected, event


# --- how a string can be written in JSON ------------------------------------------------------------

CHARS = ["a", "Z", " ", "0", "é", "ß", "中", "😀", "\U0010ffff", "\uffff", "\ufffe", "\x7f", '"', "\\", "/",
         "\n", "\t", "\r", "\b", "\f", "\x00", "\x01", "\x1f", "\u2028", "\u00e9", "{", "}", ":", ","]
WORDS = ["type", '"type":"message_stop"', '"}}', '\\"', "usage", '"usage":{"output_tokens":9}', "[DONE]",
         "data: x\n\n", "event: error", "finish_reason", '"model":"other"', "\\u00e9", "\\ud83d\\ude00"]


def encode_char(ch: str, rng: random.Random) -> str:
    """One character as JSON may write it (any of the valid forms)."""
    code = ord(ch)
    forms = []
    short = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
    if ch in short:
        forms.append(short[ch])
    if ch == "/":
        forms.append("\\/")
    if code >= 0x20 and ch not in '"\\':
        forms.append(ch)
    if forms and rng.random() < 0.8:  # a \\u escape, now and then: those go to the full parse
        return rng.choice(forms)
    if code > 0xFFFF:
        hi, lo = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        return f"\\u{hi:04x}\\u{lo:04X}"
    return f"\\u{code:04x}"


def random_text(rng: random.Random) -> str:
    pieces = [rng.choice(CHARS) if rng.random() < 0.7 else rng.choice(WORDS) for _ in range(rng.randrange(0, 8))]
    return "".join(pieces)


def json_string(text: str, rng: random.Random, plain: float = 0.6) -> bytes:
    """`text` as a JSON string: most often as orjson writes it, else with any valid escapes."""
    if rng.random() < plain:
        return orjson.dumps(text)
    return ('"' + "".join(encode_char(ch, rng) for ch in text) + '"').encode()


BROKEN_STRINGS = [b'"\xff"', b'"\xc3"', b'"a\xed\xa0\x80b"', b'"\x01"', b'"a\nb"', b'"\\x"', b'"\\u12"', b'"\\ud83d"',
                  b'"\\udc00x"', b'"a"b"', b'"\\"', b'"tab\there"', b'"\xe4\xb8"', b'"\xf4\x90\x80\x80"', b'"\xc0\xaf"']


def corrupt(data: bytes, rng: random.Random) -> bytes:
    """A malformed event of the same shape: cut short, a byte changed, a stray byte, a bad escape."""
    how = rng.randrange(6)
    i = rng.randrange(1, len(data))
    if how == 0:
        return data[:i]
    if how == 1:
        return data[:i] + bytes([rng.choice(b'"\\{}[],:\x00\xff0 ')]) + data[i + 1:]
    if how == 2:
        return data[:i] + bytes([rng.choice(b'"\\\x01\xc3\n')]) + data[i:]
    if how == 3:
        return data + rng.choice([b" ", b"\n", b"x", b"}", b","])
    if how == 4:
        return data.replace(b'"index":0', b'"index":01').replace(b'"sequence_number":', b'"sequence_number":-0')
    return data.replace(b":", b": ", 1)


# --- events of each API's quick shape, written every way ----------------------------------------------


def anthropic_event(rng: random.Random) -> bytes:
    kind, key = rng.choice([("text_delta", "text"), ("thinking_delta", "thinking"), ("input_json_delta", "partial_json"),
                            ("signature_delta", "signature"), ("text_delta", "thinking"), ("citations_delta", "text")])
    text = json_string(random_text(rng), rng)
    index = rng.choice([b"0", b"1", b"12", b"123456789012345678901234"])
    if rng.random() < 0.8:
        return (b'{"type":"content_block_delta","index":' + index + b',"delta":{"type":"' + kind.encode() + b'","'
                + key.encode() + b'":' + text + b"}}")
    variants = [  # the same event written otherwise: the full parse reads them, the pattern need not
        b'{"type": "content_block_delta", "index": 0, "delta": {"type": "' + kind.encode() + b'", "' + key.encode()
        + b'": ' + text + b"}}",
        b'{"index":0,"type":"content_block_delta","delta":{"' + key.encode() + b'":' + text + b',"type":"' + kind.encode()
        + b'"}}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"' + kind.encode() + b'","' + key.encode() + b'":'
        + text + b',"extra":1}}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"' + kind.encode() + b'","' + key.encode() + b'":'
        + text + b'},"usage":{"output_tokens":3}}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"' + kind.encode() + b'","' + key.encode() + b'":'
        + text + b'},"type":"message_stop"}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"' + kind.encode() + b'","' + key.encode() + b'":5}}',
        b'{"type":"content_block_delta","index":0,"delta":{"type":"' + kind.encode() + b'","' + key.encode() + b'":'
        + rng.choice(BROKEN_STRINGS) + b"}}",
    ]
    return rng.choice(variants)


def responses_event(rng: random.Random) -> bytes:
    kind = rng.choice(list(openai_responses._OUTPUT) + ["response.output_text.done", "response.created", "error",
                                                        "response.completed", "response.foo.delta"])
    text = json_string(random_text(rng), rng)
    index = rng.choice([b',"content_index":0', b',"summary_index":1', b""])
    tail = rng.choice([b',"logprobs":[]', b',"logprobs":[],"obfuscation":"aBc9"', b',"obfuscation":""', b""])
    item = rng.choice([b'"msg_1"'] * 5 + [b'"rs_\\u0041"', b'"\xc3\xa9"', b'5'])
    seq = rng.choice([b"0", b"42"] * 3 + [b"007", b"99999999999999999999999"])
    if rng.random() < 0.8:
        return (b'{"type":"' + kind.encode() + b'","sequence_number":' + seq + b',"item_id":' + item
                + b',"output_index":1' + index + b',"delta":' + text + tail + b"}")
    return rng.choice([
        b'{"type": "' + kind.encode() + b'", "sequence_number": 1, "item_id": "m", "output_index": 0, "delta": ' + text + b"}",
        b'{"sequence_number":1,"type":"' + kind.encode() + b'","item_id":"m","output_index":0,"delta":' + text + b"}",
        b'{"type":"' + kind.encode() + b'","sequence_number":1,"item_id":"m","output_index":0,"delta":' + text
        + b',"delta":"again"}',
        b'{"type":"' + kind.encode() + b'","sequence_number":1,"item_id":"m","output_index":0,"delta":'
        + rng.choice(BROKEN_STRINGS) + b"}",
        b'{"type":"' + kind.encode() + b'","sequence_number":1,"item_id":"m","output_index":0,"delta":null}',
    ])


def chat_event(rng: random.Random) -> bytes:
    key = rng.choice(["content"] * 4 + ["refusal", "reasoning_content", "reasoning", "role", "tool_calls"])
    text = json_string(random_text(rng), rng)
    model = rng.choice([b'"gpt-4.1"'] * 6 + [b'""', b'"caf\xc3\xa9"', b'"a\\"b"', b"null", b"3"])
    head = (b'{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1764500000,"model":' + model
            + rng.choice([b"", b',"service_tier":"default"']) + rng.choice([b"", b',"system_fingerprint":"fp_1"']))
    finish = rng.choice([b"null"] * 6 + [b'"stop"', b'""'])
    logprobs = rng.choice([b',"logprobs":null', b""])
    tail = rng.choice([b',"usage":null', b',"usage":null,"obfuscation":"k2J9"', b"", b',"obfuscation":"x"'])
    if rng.random() < 0.8:
        return (head + b',"choices":[{"index":0,"delta":{"' + key.encode() + b'":' + text + b"}" + logprobs
                + b',"finish_reason":' + finish + b"}]" + tail + b"}")
    return rng.choice([
        head + b',"choices":[{"index":0,"delta":{"content":' + text + b'},"finish_reason":null}],"usage":{"prompt_tokens":1,'
        b'"completion_tokens":2}}',
        head + b',"choices":[{"index":0,"delta":{"role":"assistant","content":' + text + b'},"finish_reason":null}]}',
        head + b',"choices":[{"index":0,"delta":{"content":' + text + b'},"finish_reason":null},{"index":1,"delta":{"content":"b"},'
        b'"finish_reason":null}]}',
        head + b',"choices":[{"index":0,"delta":{"content":' + text + b'},"finish_reason":null}],"choices":[]}',
        head + b',"choices":[{"index":0,"delta":{"content":' + text + b'},"finish_reason":null}],"model":"later"}',
        head + b',"choices":[{"index":0,"delta":{"content":' + text + b'},"finish_reason":null}],"error":{"message":"m"}}',
        head + b',"choices": [{"index": 0, "delta": {"content": ' + text + b'}, "finish_reason": null}]}',
        head + b',"choices":[{"index":0,"delta":{"content":' + rng.choice(BROKEN_STRINGS) + b'},"finish_reason":null}]}',
    ])


BUILDERS = {anthropic.Anthropic: anthropic_event, openai_chat.OpenAIChat: chat_event,
            openai_responses.OpenAIResponses: responses_event}
NAMES = {anthropic.Anthropic: [None, "content_block_delta", "error"], openai_chat.OpenAIChat: [None],
         openai_responses.OpenAIResponses: [None, "response.output_text.delta", "error"]}


def generated(cls: type[Dialect], seed: int, n: int) -> list[tuple[str | None, bytes]]:
    rng = random.Random(seed)
    events = []
    for _ in range(n):
        data = BUILDERS[cls](rng)
        if rng.random() < 0.15:
            data = corrupt(data, rng)
        events.append((rng.choice(NAMES[cls]), data))
    return events


@pytest.mark.parametrize("cls", QUICK_DIALECTS)
def test_generated_events_agree_with_the_full_parse(cls):
    events = generated(cls, 1, 4000)
    both(cls, events)
    quick = MODULES[cls]._QUICK
    taken = sum(quick.block(framed(name, data)[:-2]) is not None for name, data in events)
    assert taken > 200  # the shortcut was taken, by many: the comparison is not empty


@pytest.mark.parametrize("cls", QUICK_DIALECTS)
def test_malformed_events_give_the_same_parse_error(cls):
    rng = random.Random(2)
    events = [(None, corrupt(BUILDERS[cls](rng), rng)) for _ in range(1500)]
    both(cls, events)
    with full_parse_only():
        reference = each_read(cls, events)[-1][-1]
    assert reference["parse_errors"] > 100  # many of them were malformed


ESCAPES = [  # (the JSON string, the text it is)
    (b'"a\\nb"', "a\nb"), (b'"\\"quoted\\""', '"quoted"'), (b'"\\u00e9"', "é"), (b'"\\ud83d\\ude00"', "😀"),
    (b'"\\\\"', "\\"), (b'"\\\\\\\\"', "\\\\"), (b'"\\\\\\""', '\\"'), (b'"\\\\n"', "\\n"), (b'"\\/"', "/"),
    (b'"caf\xc3\xa9 \xf0\x9f\x98\x80 \xe4\xb8\xad"', "café 😀 中"), (b'"\\b\\f\\r\\t"', "\b\f\r\t"),
    (b'"{\\"file_path\\": \\"/src/app.py\\"}"', '{"file_path": "/src/app.py"}'), (b'"\x7f"', "\x7f"),
    (b'"type\\":\\"message_stop"', 'type":"message_stop'), (b'"\xef\xbf\xbf"', "\uffff"),
]


@pytest.mark.parametrize(("string", "text"), ESCAPES)
def test_characters_are_counted_as_decoded(string, text):
    assert orjson.loads(string) == text
    cases = {
        anthropic.Anthropic: b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":' + string + b"}}",
        openai_chat.OpenAIChat: b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
                                b'"delta":{"content":' + string + b'},"finish_reason":null}]}',
        openai_responses.OpenAIResponses: b'{"type":"response.output_text.delta","sequence_number":1,"item_id":"m",'
                                          b'"output_index":0,"content_index":0,"delta":' + string + b"}",
    }
    for cls, data in cases.items():
        assert cls().on_event(data, None) == ("text", True, len(text)), cls.name
        [(times, sizes, kinds, chars, _, _)] = each_read(cls, [(None, data)])
        assert (sizes, kinds, chars) == ([len(data)], ["text"], len(text)), (cls.name, data)
        both(cls, [(None, data)])


def test_the_shortcut_is_taken_by_the_events_a_stream_is_made_of():
    """Not a timing: the usual delta of each API matches its quick pattern (else the shortcut is dead code)."""
    samples = {
        anthropic: b'{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\\"a\\": 1"}}',
        openai_chat: b'{"id":"chatcmpl-AbC","object":"chat.completion.chunk","created":1764500000,"model":"gpt-4.1",'
                     b'"service_tier":"default","system_fingerprint":"fp_5","choices":[{"index":0,"delta":{"content":" the"},'
                     b'"logprobs":null,"finish_reason":null}],"usage":null,"obfuscation":"k2J9"}',
        openai_responses: b'{"type":"response.output_text.delta","sequence_number":9,"item_id":"msg_1","output_index":1,'
                          b'"content_index":0,"delta":"Hel","logprobs":[],"obfuscation":"aBc"}',
    }
    for module, data in samples.items():
        assert module._QUICK.block(b"data: " + data) is not None, module.__name__


# --- whole streams through the meter ---------------------------------------------------------------

STRUCTURAL = {
    anthropic.Anthropic: [
        ("message_start", b'{"type":"message_start","message":{"id":"m","type":"message","role":"assistant",'
                          b'"model":"claude-x","content":[],"stop_reason":null,"usage":{"input_tokens":12,'
                          b'"cache_read_input_tokens":40,"output_tokens":1}}}'),
        ("ping", b'{"type":"ping"}'),
        ("content_block_start", b'{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}'),
        ("content_block_stop", b'{"type":"content_block_stop","index":0}'),
        ("message_delta", b'{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}'),
        ("message_stop", b'{"type":"message_stop"}'),
        ("error", b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'),
    ],
    openai_chat.OpenAIChat: [
        (None, b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[{"index":0,'
               b'"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}'),
        (None, b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-y","choices":[{"index":0,'
               b'"delta":{},"finish_reason":"stop"}],"usage":null}'),
        (None, b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"gpt-x","choices":[],'
               b'"usage":{"prompt_tokens":9,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":2}}}'),
        (None, b"[DONE]"),
        (None, b'{"error":{"type":"server_error","message":"boom"}}'),
    ],
    openai_responses.OpenAIResponses: [
        ("response.created", b'{"type":"response.created","sequence_number":0,"response":{"id":"r","status":"in_progress",'
                             b'"model":"gpt-5","usage":null}}'),
        ("response.output_item.added", b'{"type":"response.output_item.added","sequence_number":1,"output_index":0,'
                                       b'"item":{"id":"msg_1","type":"message"}}'),
        ("response.output_text.done", b'{"type":"response.output_text.done","sequence_number":5,"item_id":"msg_1",'
                                      b'"output_index":0,"content_index":0,"text":"x"}'),
        ("response.completed", b'{"type":"response.completed","sequence_number":9,"response":{"id":"r",'
                               b'"status":"completed","model":"gpt-5","usage":{"input_tokens":9,"output_tokens":3}}}'),
    ],
}
CLEAN = ["a", " the", "é", "😀", '"', "\\", "\n", "/", "type", '"type":"message_stop"', "中文"]


def canonical(cls: type[Dialect], rng: random.Random) -> tuple[str | None, bytes]:
    """A delta as the API sends it, its text as orjson writes it (raw UTF-8, short escapes)."""
    text = orjson.dumps("".join(rng.choice(CLEAN) for _ in range(rng.randrange(0, 5))))
    if cls is anthropic.Anthropic:
        kind, key = rng.choice([("text_delta", "text"), ("thinking_delta", "thinking"), ("input_json_delta", "partial_json")])
        return "content_block_delta", (b'{"type":"content_block_delta","index":%d,"delta":{"type":"%s","%s":%s}}'
                                       % (rng.randrange(3), kind.encode(), key.encode(), text))
    if cls is openai_chat.OpenAIChat:
        key = rng.choice([b"content", b"content", b"reasoning_content", b"refusal"])
        model = rng.choice([b"gpt-4.1", b"gpt-x", b""])
        return None, (b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"%s","choices":[{"index":0,'
                      b'"delta":{"%s":%s},"finish_reason":null}],"usage":null}' % (model, key, text))
    kind = rng.choice(list(openai_responses._OUTPUT)).encode()
    return kind.decode(), (b'{"type":"%s","sequence_number":%d,"item_id":"msg_1","output_index":0,"content_index":0,'
                           b'"delta":%s,"logprobs":[]}' % (kind, rng.randrange(100), text))


def stream(cls: type[Dialect], rng: random.Random) -> bytes:
    """A stream of SSE events: mostly quick-shaped deltas (some malformed), structural events between,
    written with the framing variants SSE allows."""
    out = []
    for _ in range(rng.randrange(1, 40)):
        if rng.random() < 0.4:
            name, data = canonical(cls, rng)
        elif rng.random() < 0.5:
            name, data = rng.choice(NAMES[cls]), BUILDERS[cls](rng)
        else:
            name, data = rng.choice(STRUCTURAL[cls])
        lines = (b"event: " + name.encode() + b"\n" if name else b"") + b"data: " + data + b"\n"
        if rng.random() < 0.3:
            lines = rng.choice([b": comment\n" + lines, lines.replace(b"data: ", b"data:"), lines.replace(b"\n", b"\r\n"),
                                b"id: 7\n" + lines, lines + b"\n", lines.replace(b"event: ", b"event:")])
        out.append(lines + (b"\r\n" if rng.random() < 0.05 else b"\n"))
    return b"".join(out)


def reads_of(data: bytes, rng: random.Random) -> list[bytes]:
    """The stream as a server's reads: whole events mostly, sometimes cut anywhere."""
    reads, i = [], 0
    while i < len(data):
        if rng.random() < 0.85:
            end = data.find(b"\n\n", i)
            j = len(data) if end < 0 else end + 2
            for _ in range(rng.choice([0, 0, 1, 2, 4])):  # several events in one read
                end = data.find(b"\n\n", j)
                j = len(data) if end < 0 else end + 2
        else:
            j = min(len(data), i + rng.randrange(1, 300))
        reads.append(data[i:j])
        i = j
    return reads


def meter_row(cls: type[Dialect], reads: list[bytes]) -> tuple[dict, list[tuple], int]:
    m = new_meter(cls)
    for i, read in enumerate(reads):
        m.on_chunk(read, 2000 + i * 1000)
    chars = m.chars
    row, chunks = m.finish(None, 10 ** 9)
    row.pop("started_at")
    return row, chunks, chars


@pytest.mark.parametrize("cls", QUICK_DIALECTS)
def test_streams_through_the_meter_make_the_same_rows(cls, monkeypatch):
    rng = random.Random(cls.name)
    taken = []
    quick = MODULES[cls]._QUICK
    match, rest = quick.block, quick.rest
    counted = quick._replace(block=lambda b: taken.append(match(b)) or taken[-1],
                             rest=rest and (lambda b, at: taken.append(rest(b, at)) or taken[-1]))
    monkeypatch.setattr(cls, "quick", counted)
    for _ in range(200):
        reads = reads_of(stream(cls, rng), rng)
        fast = meter_row(cls, reads)
        with full_parse_only():
            full = meter_row(cls, reads)
        assert fast == full, reads
    assert sum(m is not None for m in taken) > 500, len(taken)  # many blocks took the shortcut


def test_an_oversized_quick_event_is_dropped_as_before():
    """A quick-shaped event past the parser's limit is relayed but not measured, with or without the shortcut."""
    import proxy.meter.meter as meter_module

    event = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
             b'"text":"' + b"x" * 5000 + b'"}}\n\n')
    saved = meter_module.MAX_SSE_EVENT
    meter_module.MAX_SSE_EVENT = 4096
    try:
        rows = [meter_row(anthropic.Anthropic, [b"event: ping\ndata: {}\n\n", event])]
        with full_parse_only():
            rows.append(meter_row(anthropic.Anthropic, [b"event: ping\ndata: {}\n\n", event]))
    finally:
        meter_module.MAX_SSE_EVENT = saved
    assert rows[0] == rows[1]
    assert rows[0][0]["output_events"] == 0 and "over" in rows[0][0]["parse_error"]


def test_sse_parser_is_idle_only_between_events():
    parser = SSEParser()
    assert not parser.idle  # the BOM is not ruled out yet
    for chunk, idle in [(b"data: a\n\n", True), (b"data: b", False), (b"\n\n", True), (b"event: x\n", False),
                        (b"\n", True), (b"data: c\r", False), (b"\n\r\n", True), (b": comment\n", True)]:
        parser.feed(chunk)
        assert parser.idle is idle, chunk


def test_the_model_is_the_last_one_sent_within_a_read():
    def chunk(model: bytes, delta: bytes) -> bytes:
        return (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"' + model
                + b'","choices":[{"index":0,"delta":' + delta + b',"finish_reason":null}]}\n\n')

    read = chunk(b"a", b'{"content":"x"}') + chunk(b"b", b'{"content":"y","role":"assistant"}') + chunk(b"a", b'{"content":"z"}')
    for reads in ([read], [b"data: [DONE]\n\n", read], [read, chunk(b"b", b'{"content":"w","role":"assistant"}')]):
        fast = meter_row(openai_chat.OpenAIChat, reads)
        with full_parse_only():
            assert meter_row(openai_chat.OpenAIChat, reads) == fast
    assert meter_row(openai_chat.OpenAIChat, [b"data: [DONE]\n\n", read])[0]["response_model"] == "a"


def test_a_stream_the_pattern_keeps_missing_stops_trying_it():
    """vLLM's chunks carry a `stop_reason` of their own: the pattern misses every one; the rows are the
    same as ever, and the stream gives up matching after a few (only the cost changes)."""
    chunk = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
             b'"delta":{"content":"tok"},"logprobs":null,"finish_reason":null,"stop_reason":null}]}\n\n')
    reads = [chunk] * 100
    fast = meter_row(openai_chat.OpenAIChat, reads)
    with full_parse_only():
        assert meter_row(openai_chat.OpenAIChat, reads) == fast
    m = Meter(received_ns=0, method="POST", path="/v1/chat/completions", query={},
              headers=CIMultiDictProxy(CIMultiDict()), route="/", upstream_host="up", tag=None)
    m.response_started(200, CIMultiDictProxy(CIMultiDict({"content-type": "text/event-stream"})), 1000)
    for i, read in enumerate(reads):
        m.on_chunk(read, 2000 + i)
    m.drain()
    assert m._quick is None and m.output_events == 100
    plain = chunk.replace(b',"stop_reason":null', b"")
    m = Meter(received_ns=0, method="POST", path="/v1/chat/completions", query={},
              headers=CIMultiDictProxy(CIMultiDict()), route="/", upstream_host="up", tag=None)
    m.response_started(200, CIMultiDictProxy(CIMultiDict({"content-type": "text/event-stream"})), 1000)
    for i, read in enumerate([plain, chunk] * 100):  # every other event missed: it keeps trying
        m.on_chunk(read, 2000 + i)
    m.drain()
    assert m._quick is not None and m.output_events == 200


@pytest.mark.parametrize("cls", QUICK_DIALECTS)
def test_a_head_that_differs_by_one_byte_is_matched_whole(cls):
    """The meter matches only the rest of a block that repeats the last head byte for byte: one byte
    changed anywhere in it (the quote that opens the text, a digit, a key), and the block is matched
    or parsed whole, as without the shortcut."""
    rng = random.Random(7)
    for _ in range(400):
        name, data = canonical(cls, rng)
        block = framed(name, data)
        m = MODULES[cls]._QUICK.block(block[:-2])
        at = m.start("text") if m is not None else len(block) - 2
        i = rng.randrange(at)
        changed = block[:i] + bytes([rng.choice(b'"\\:,{}[]0 ax\xc3\n')]) + block[i + 1:]
        reads = [b": open\n\n", block, changed, block]
        fast = meter_row(cls, reads)
        with full_parse_only():
            assert meter_row(cls, reads) == fast, changed
