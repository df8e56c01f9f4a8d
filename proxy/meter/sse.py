"""Incremental Server-Sent Events parser (WHATWG "event stream interpretation").

The relay hands it each read as it arrives; it returns the events that read
completed. Lines are split with bytes.split, never byte by byte, and only the
incomplete last line is kept between reads (as a list of pieces, so a long line
arriving in many reads is joined once, not once per read).
"""

from __future__ import annotations

_BOM = b"\xef\xbb\xbf"
DEFAULT_MAX_EVENT_BYTES = 32 * 1024 * 1024

Event = tuple[str | None, bytes]

_NAMES: dict[bytes, str] = {}  # event names decoded once: a stream repeats a handful
_MAX_NAMES = 512


def _name(raw: bytes) -> str:
    name = _NAMES.get(raw)
    if name is None:
        name = raw.decode("utf-8", "replace")
        if len(_NAMES) < _MAX_NAMES and len(raw) <= 64:
            _NAMES[raw] = name
    return name


class SSEParser:
    """Split a byte stream into (event name or None, data) events.

    Several `data:` lines of one event are joined with b"\\n". Comments, `id:`,
    `retry:` and unknown fields are ignored, as are events without data lines.
    An event whose data (or any one line) grows past `max_event_bytes` is
    dropped and counted in `oversized`; parsing resumes after its blank line.
    """

    __slots__ = (
        "max_event_bytes",
        "oversized",
        "_tail",
        "_tail_len",
        "_data",
        "_size",
        "_event",
        "_skipping",
        "_cr_pending",
        "_head",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self.oversized = 0
        self._tail: list[bytes] = []  # pieces of the incomplete last line
        self._tail_len = 0
        self._data: list[bytes] = []  # data lines of the event being read
        self._size = 0
        self._event: str | None = None
        self._skipping = False  # inside an oversized event: drop until blank line
        self._cr_pending = False  # last read ended in CR: a leading LF is its pair
        self._head: bytes | None = b""  # first bytes, until the BOM is ruled out

    @property
    def idle(self) -> bool:
        """Between events with nothing pending, the BOM ruled out: a read that ends with a blank line
        can then be split at its blank lines, each block one event's lines (proxy/meter/meter.py does)."""
        return (self._head is None and self._event is None
                and not (self._tail or self._data or self._cr_pending or self._skipping))

    def feed(self, chunk: bytes) -> list[Event]:
        if self._head is not None:
            chunk = self._strip_bom(chunk)
        if not chunk:
            return []
        if (chunk[-2:] == b"\n\n" and not self._tail and not self._data and not self._cr_pending
                and self._event is None and not self._skipping and b"\r" not in chunk):
            return self._whole_events(chunk)
        if self._cr_pending and chunk[0] == 10:
            chunk = chunk[1:]
        if b"\r" in chunk:
            self._cr_pending = chunk[-1] == 13
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        else:
            self._cr_pending = False
        lines = chunk.split(b"\n")
        last = lines.pop()
        events: list[Event] = []
        if lines:
            if self._tail:
                lines[0] = self._take_tail(lines[0])
            for line in lines:
                self._line(line, events)
        if last:
            self._keep_tail(last)
        return events

    def _whole_events(self, chunk: bytes) -> list[Event]:
        """The common read: whole events, nothing pending. An event of one `data: ` line, or of an
        `event: ` line and one `data: ` line, is cut out directly; any other block goes line by line."""
        events: list[Event] = []
        limit = self.max_event_bytes
        for block in chunk[:-2].split(b"\n\n"):
            if block[:6] == b"data: " and b"\n" not in block and len(block) - 5 <= limit:
                events.append((None, block[6:]))
                continue
            if block[:7] == b"event: " and block.count(b"\n") == 1:
                head, _, data = block.partition(b"\n")
                if data[:6] == b"data: " and len(data) - 5 <= limit and len(head) > 7:
                    events.append((_name(head[7:]), data[6:]))
                    continue
            for line in block.split(b"\n"):
                self._line(line, events)
            self._dispatch(events)
        return events

    def _strip_bom(self, chunk: bytes) -> bytes:
        head = self._head + chunk  # type: ignore[operator]  # called while _head is bytes
        if len(head) < 3 and _BOM.startswith(head):
            self._head = head
            return b""
        self._head = None
        return head[3:] if head.startswith(_BOM) else head

    def _take_tail(self, first: bytes) -> bytes:
        self._tail.append(first)
        line = b"".join(self._tail)
        self._tail = []
        self._tail_len = 0
        return line

    def _keep_tail(self, piece: bytes) -> None:
        self._tail.append(piece)
        self._tail_len += len(piece)
        if self._size + self._tail_len > self.max_event_bytes:
            self._overflow()
            # Remember that a line is open without keeping its bytes: the rest
            # of it, when its line end comes, is part of the dropped event.
            self._tail = [b"x"]
            self._tail_len = 0

    def _overflow(self) -> None:
        if not self._skipping:
            self.oversized += 1
            self._skipping = True
        self._data = []
        self._size = 0

    def _line(self, line: bytes, events: list[Event]) -> None:
        if not line:
            self._dispatch(events)
        elif self._skipping or line[0] == 58:  # b":" starts a comment
            return
        elif line[:5] == b"data:":
            value = line[6:] if line[5:6] == b" " else line[5:]
            self._size += len(value) + 1
            if self._size > self.max_event_bytes:
                self._overflow()
            else:
                self._data.append(value)
        elif line[:6] == b"event:":
            self._event = _name(line[7:] if line[6:7] == b" " else line[6:])
        elif line == b"data":  # a field name without a colon has an empty value
            self._data.append(b"")
        elif line == b"event":
            self._event = None

    def _dispatch(self, events: list[Event]) -> None:
        data = self._data
        if data and not self._skipping:
            events.append((self._event or None, data[0] if len(data) == 1 else b"\n".join(data)))
        self._data = []
        self._size = 0
        self._event = None
        self._skipping = False
