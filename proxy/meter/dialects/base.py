"""What every dialect gives the meter.

A dialect is one object per request. The meter hands it each complete SSE
event (or WebSocket text frame) of a stream, or the whole JSON body of a
non-streaming response. For each event it answers whether that event carried
output (a `Delta`), and it keeps what the response said about itself: usage,
model, finish reason, errors, and whether the terminal event was seen.

Dialects never raise on bad input: a malformed event increments
`parse_errors` and keeps the first message in `parse_error`.

The events most of a stream is made of (a text, thinking or tool-arguments
delta) are read without parsing their JSON: a dialect's quick pattern (`Quick`)
matches such an event whole, its SSE framing included (every byte of it: its
keys in the order the API sends them, its numbers, its strings), so a match
proves it is valid JSON of that shape, and its output is its string's
characters, counted from the match. An event that does not match, or whose
string has a `\\u` escape or invalid UTF-8, is parsed in full: the shortcut
gives the same result as the full parse or none (tests/test_dialect_quick.py
checks both against each other). Events that can carry usage, a finish reason,
an error or the terminal event never match a quick pattern (a chat chunk's
model is read from its match). The meter applies the pattern (`QuickReader`) to each event of
a read of whole SSE events, before any splitting (proxy/meter/meter.py, Meter._events):
no dialect code runs for a match. `on_event` always parses: on an event
already cut out (a WebSocket frame, an event split across reads) a match costs
about what the parse does, and a miss would cost both.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import orjson

from proxy.common.schema import ERROR_MESSAGE_MAX


ENDED = -1  # a tool call's end, before the meter stamps its time (Dialect.tool_calls)


class Delta(NamedTuple):
    """One output-carrying event. Dialects return it as the plain tuple (event_type, visible,
    chars), which equals the Delta: made once per event, a tuple costs a fraction of a dataclass
    (and of this NamedTuple, dearer still).

    event_type: a short stable name for the chunk table: "text",
        "reasoning" (thinking, reasoning summaries), "tool_args" (tool names,
        arguments and code), "refusal", and from the Responses API "audio"
        (base64 audio) and "transcript" (the text of generated speech).
    visible: True for text the user reads (not reasoning, not tool arguments).
    chars: characters of output in the event (for estimating tokens when the
        stream reports no usage).
    """

    event_type: str
    visible: bool
    chars: int


# Pieces of the quick patterns (see the module docstring). Each matches exactly what JSON allows
# (RFC 8259), or less: less only sends an event to the full parse.
NUMBER = rb"(?:0|[1-9][0-9]{0,17})"  # a non-negative integer orjson reads (under 2**63)
ASCII = rb'"[ !#-\[\]-~]*"'  # a string of printable ASCII without escapes: valid as it stands
# The inside of a string: no quote, backslash or control character but in an escape; `\u` escapes
# are left to the full parse (a surrogate pair is one character). Bytes past ASCII are checked as
# UTF-8 when the text is decoded (Quick).
TEXT = rb'(?P<text>[^"\\\x00-\x1f]*(?:\\["\\/bfnrt][^"\\\x00-\x1f]*)*)'


class Quick(NamedTuple):
    """A dialect's quick pattern (see the module docstring), compiled from the pattern of one
    event's JSON in two parts around its string: the head, with the named group `kind` (a key of
    `kinds`) and, for a dialect whose quick events carry the model, `model`; TEXT (the group
    `text`); the tail. `block` fullmatches one SSE event block (its `event:` and `data:` lines,
    without the blank line after them); a match is an output event of `kinds[kind]` whose data is
    the block from group 1 on, and whose characters are those of `text` decoded as UTF-8, less one
    per escape (two bytes each, a run of k backslashes holding ceil(k/2) of them); when that
    decoding fails or the text is empty, the block is parsed instead. A non-empty `model` group is
    the response's model, as a parse would set it.

    `rest` fullmatches TEXT and the tail from a position: a block that begins with the bytes an
    earlier match's head matched (up to its `text` group) and whose rest matches is a match too,
    with the same groups but `text` (a concatenation of what each part matches matches the whole);
    a stream's `QuickReader` keeps the last head so, while it repeats (the same content block, the same chunk
    id and model), only the rest is matched. None: the head changes with every event (a sequence
    number in it), the whole pattern is matched each time."""

    block: Callable[[bytes], re.Match[bytes] | None]
    rest: Callable[[bytes, int], re.Match[bytes] | None] | None
    kinds: dict[bytes, tuple[str, bool]]  # the `kind` group (always one of these) -> (event_type, visible)
    model: bool  # the head has a `model` group


def quick_pattern(head: bytes, tail: bytes, sse_name: bytes, kinds: dict[bytes, tuple[str, bool]], *,
                  steady_head: bool = True) -> Quick:
    """A Quick from the pattern of an event's JSON, `head` TEXT `tail`: its SSE block is
    `data: <json>`, after an optional `event: <name>` line (`sse_name` a pattern; the JSON's
    `type` decides, never the name). `steady_head`: the head repeats from event to event."""
    block = re.compile(rb"(?:event: " + sse_name + rb"\n)?data: (" + head + TEXT + tail + rb")")
    rest = re.compile(TEXT + tail).fullmatch if steady_head else None
    return Quick(block.fullmatch, rest, kinds, "model" in block.groupindex)


# Output events a stream's quick pattern may miss, less those it matched, before it stops trying it.
QUICK_GIVE_UP = 8


class QuickReader:
    """One stream's reading of its SSE blocks with its dialect's `Quick` (the meter's, Meter._events):
    the last head matched, so that a block that repeats it byte for byte has only its rest matched, and
    the output events the pattern missed, less those it matched, carried from one batch of reads to
    the next (`gives_up`)."""

    __slots__ = ("_block", "_rest", "_kinds", "_has_model", "head", "at_text", "kind", "visible", "at", "model",
                 "misses")

    def __init__(self, quick: Quick) -> None:
        self._block, self._rest, self._kinds, self._has_model = quick
        # The last head matched (none yet: b"\n\n" begins no block of a read split at its blank lines), where
        # its text begins, its event_type and visible, where its data begins (a size counts from there), its model.
        self.head, self.at_text, self.kind, self.visible, self.at = b"\n\n", 0, "", False, 0
        self.model: str | None = None
        self.misses = 0

    def event(self, block: bytes) -> tuple[str, bool, int, int, str | None] | None:
        """The output event one SSE block is (its lines, without the blank line after them), as
        (event_type, visible, size of its data, characters, the model it names or None); None when
        the pattern does not match it, or its text is empty or not UTF-8: the block is parsed instead."""
        rest = self._rest
        if rest is not None and block.startswith(self.head) and (r := rest(block, self.at_text)) is not None:
            text, kind, visible, at, model = r[1], self.kind, self.visible, self.at, self.model
        elif (m := self._block(block)) is not None:
            name, text = m.group("kind", "text")
            kind, visible = self._kinds[name]
            at = m.start(1)
            model = m["model"].decode() if self._has_model and m["model"] else None
            if rest is not None:
                self.at_text = m.start("text")
                self.head, self.kind, self.visible, self.at, self.model = block[:self.at_text], kind, visible, at, model
        else:
            return None
        try:
            n = len(text.decode())  # the characters (Quick says how)
        except UnicodeDecodeError:
            return None
        if not n:
            return None
        if b"\\" in text:
            n -= text.count(b"\\") - text.count(b"\\\\")
        return kind, visible, len(block) - at, n, model

    def gives_up(self, missed: int, matched: int) -> bool:
        """Whether the stream stops trying the pattern, given the output events of this batch of reads
        it missed and matched so far: a stream whose events it keeps missing (an API that copies
        another's with fields of its own, say) does, a miss costing a match on top of the parse. The
        answer is the same either way; only its cost changes."""
        return self.misses + missed - matched >= QUICK_GIVE_UP

    def settle(self, missed: int, matched: int) -> None:
        """The batch of reads is over: what it missed, less what it matched, carried to the next."""
        self.misses = max(0, self.misses + missed - matched)


@dataclass(slots=True)
class Usage:
    """Token counts as the OpenTelemetry GenAI conventions define them.

    input_tokens includes cached reads and cache creation (Anthropic's three
    fields are summed); output_tokens includes reasoning tokens.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_creation_tokens: int | None = None
    reasoning_tokens: int | None = None

    def seen(self) -> bool:
        return self.input_tokens is not None or self.output_tokens is not None


@dataclass(slots=True)
class Dialect:
    """Base class; also the generic dialect for paths no API claims."""

    name: ClassVar[str] = "generic"
    usage: Usage = field(default_factory=Usage)
    response_model: str | None = None
    finish_reason: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    terminal: bool = False
    empty_choices_chunks: int = 0
    parse_errors: int = 0
    parse_error: str | None = None
    # The tool calls the response asked for, in order: [call id, tool name, when its block ended:
    # 0 until it has, ENDED until the meter stamps the read that ended it (perf_counter_ns)]. None
    # until the first. Ids and names only, never arguments.
    tool_calls: list[list[Any]] | None = None
    unstamped: bool = False  # a call ended in the event just read: the meter stamps it (`stamp`)

    # Does this API end a stream with an explicit terminal event? If so, a
    # stream that ends without it is recorded as stream_truncated.
    has_terminal_event: ClassVar[bool] = False

    def on_event(self, data: bytes, event: str | None) -> Delta | None:
        """One complete SSE event (data lines joined) or WebSocket text frame."""
        return None

    # The dialect's quick pattern (see the module docstring), for the meter to read the events of a
    # read of whole SSE events with (proxy/meter/meter.py: Meter._events); None: every event is parsed.
    quick: ClassVar[Quick | None] = None

    # The generic dialect claims no format: a body that is not JSON is no parse error for it.
    strict_json: ClassVar[bool] = False

    def on_body(self, body: bytes) -> None:
        """The whole body of a non-streaming JSON response: an OpenAI-, Anthropic- or
        Gemini-shaped error body sets the error; anything else goes to `read_body`."""
        obj = self.load_body(body)
        if obj is None:
            return
        error = obj[0] if type(obj) is list and obj and type(obj[0]) is dict else obj  # Gemini wraps errors in an array
        try:
            if type(error) is dict and error.get("error"):
                self.note_error(error["error"])
            else:
                self.read_body(obj)
        except Exception as exc:
            self.note_exception("body", exc)

    def read_body(self, obj: Any) -> None:
        """A parsed non-streaming body that is not an error (each API reads its own)."""

    @staticmethod
    def tool_results(body: Any) -> list[tuple[str | None, str | None]] | None:
        """The tool results a request's parsed body carries that are new since the model last
        spoke, as (call id, tool name) in order (the name from the call in the body's own history,
        when it is there); None for none. Each API reads its own shape (proxy/meter/request_info.py)."""
        return None

    def add_tool_call(self, call_id: object, name: object) -> list[Any]:
        """A tool call the response asks for; its entry, to be marked ended with `end_tool_call`."""
        entry = [as_str(call_id), as_str(name), 0]
        if self.tool_calls is None:
            self.tool_calls = []
        self.tool_calls.append(entry)
        return entry

    def end_tool_call(self, entry: list[Any]) -> None:
        """The call's block ended with the event being read."""
        entry[2] = ENDED
        self.unstamped = True

    def stamp(self, t_ns: int) -> None:
        """The calls that ended in the events just read ended at `t_ns` (the meter's read time)."""
        for entry in self.tool_calls or ():
            if entry[2] == ENDED:
                entry[2] = t_ns
        self.unstamped = False

    def note_parse_error(self, message: str) -> None:
        self.parse_errors += 1
        if self.parse_error is None:
            self.parse_error = message[:200]

    def note_exception(self, where: str, exc: Exception) -> None:
        self.note_parse_error(f"{self.name} {where}: {type(exc).__name__}: {exc}")

    def note_error(self, error: object) -> None:
        """An API error object: OpenAI/Anthropic `{type, message}`, Responses
        `{code, message}`, Gemini `{code, message, status}`, or a bare string."""
        if isinstance(error, dict):
            kind = error.get("type") or error.get("status") or error.get("code")
            message = error.get("message")
        else:
            kind, message = None, error
        self.error_type = str(kind) if kind else "error"
        if message is not None:
            self.error_message = str(message)[:ERROR_MESSAGE_MAX * 2]  # room for redaction; the row keeps the max

    def load_body(self, body: bytes) -> Any:
        """The parsed JSON of a whole body, or None after noting why it is not."""
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if self.strict_json:
                self.note_exception("body", exc)
            return None
        self.terminal = True
        return obj


def results_after_last(messages: object, is_model: Callable[[Any], bool],
                       results: Callable[[Any], Iterable[tuple[Any, Any]]],
                       calls: Callable[[Any], Iterable[tuple[Any, Any]]]) -> list[tuple[str | None, str | None]] | None:
    """The tool results in the items of a request's history after the last one the model wrote
    (`is_model`), as (call id, tool name): `results(item)` gives an item's (call id, name or None),
    `calls(item)` the calls an item holds as (call id, name), which name the results that give none:
    those of the last model item and after it (Responses' calls are items of their own)."""
    if type(messages) is not list:
        return None
    last = next((i for i in range(len(messages) - 1, -1, -1) if type(messages[i]) is dict and is_model(messages[i])), -1)
    tail = [item for item in messages[max(last, 0):] if type(item) is dict]
    names = {as_str(c): as_str(n) for item in tail for c, n in calls(item)}
    found = [(as_str(c), as_str(n) or names.get(as_str(c))) for item in messages[last + 1:] if type(item) is dict
             for c, n in results(item)]
    return found or None


def blocks(content: object, kind: str) -> Iterable[dict[str, Any]]:
    """The blocks of a message's content list of one `type` (Anthropic's and Responses' shapes)."""
    if type(content) is list:
        for block in content:
            if type(block) is dict and block.get("type") == kind:
                yield block


def as_tokens(value: object) -> int | None:
    """A token count; None when absent. Any other type is a malformed event."""
    if value is None or type(value) is int:
        return value  # type: ignore[return-value]
    if type(value) is float and value.is_integer():
        return int(value)
    raise TypeError(f"token count is {type(value).__name__}")


def as_str(value: object) -> str | None:
    """A string field; None when absent. Any other type is a malformed event."""
    if value is None or type(value) is str:
        return value  # type: ignore[return-value]
    raise TypeError(f"expected a string, got {type(value).__name__}")
