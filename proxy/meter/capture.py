"""`--capture-bodies`: the request and response bodies of each request, in the `bodies` table.

Off by default. A `CapturingMeter` is the ordinary meter plus a copy of the
decoded bodies, each cut at `--capture-max-kb` (the `*_truncated` flags say so),
with credentials and obvious secrets redacted (`redact`) before they leave the
meter. When capture is off the plain `Meter` is used: the relay pays nothing.
"""

from __future__ import annotations

from typing import Any

from proxy.common.schema import Outcome
from proxy.meter.decode import StreamDecoder
from proxy.meter.meter import Meter
from proxy.meter.redact import redact
from proxy.meter.sse import Event

class _Tap:
    """Keeps the first `limit` bytes given to it, and whether there were more."""

    __slots__ = ("parts", "size", "limit", "truncated")

    def __init__(self, limit: int) -> None:
        self.parts: list[bytes] = []
        self.size, self.limit, self.truncated = 0, limit, False

    def add(self, data: bytes) -> None:
        room = self.limit - self.size
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        if data:
            self.parts.append(data)
            self.size += len(data)

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", "replace")


class _TeeSSE:
    """Stands in for the meter's SSE parser: copies the decoded stream, then parses it."""

    __slots__ = ("parser", "tap")

    def __init__(self, parser: Any, tap: _Tap) -> None:
        self.parser, self.tap = parser, tap

    def feed(self, data: bytes) -> list[Event]:
        if not self.tap.truncated:
            self.tap.add(data)
        return self.parser.feed(data)

    def __getattr__(self, name: str) -> Any:  # the parser's state (`idle`, `oversized`, its limit)
        return getattr(self.parser, name)


class CapturingMeter(Meter):
    """Keeps the bodies row in `captured` when the request ends; the recorder hands it to the observers."""

    def __init__(self, *, max_bytes: int, **fields: Any) -> None:
        super().__init__(**fields)
        self._max = max_bytes
        self._response = _Tap(max_bytes)

    def response_started(self, *args: Any, **kwargs: Any) -> None:
        super().response_started(*args, **kwargs)
        if self._sse is not None:
            self._sse = _TeeSSE(self._sse, self._response)  # type: ignore[assignment]
            self._quick = None  # every event through the parser, so that the tap copies each one

    def on_message(self, payload: bytes, t_ns: int) -> None:
        super().on_message(payload, t_ns)
        self._response.add(payload + b"\n")

    def finish(self, outcome: Outcome | None, end_ns: int, error: tuple[str, str] | None = None) -> Any:
        request, request_cut = self._request_text()
        self.drain()
        if self._body:  # a non-streaming response, decoded (the meter keeps it to parse usage)
            for part in self._body:
                self._response.add(part)
        result = super().finish(outcome, end_ns, error)
        secrets = self.secrets()
        response = self._response.text() if self._response.parts else None
        self.captured = (self.id, redact(request, secrets), redact(response, secrets), request_cut,
                         self._response.truncated)
        return result

    def _request_text(self) -> tuple[str | None, bool]:
        body = self.request_body
        if not body:
            return None, False
        try:
            decoded = StreamDecoder(self.headers.get("content-encoding"), self._max + 1).feed(body)
        except Exception:  # not decodable: keep what was sent
            decoded = body
        return decoded[: self._max].decode("utf-8", "replace"), len(decoded) > self._max


def make_meter(capture: bool, max_kb: int, **fields: Any) -> Meter:
    if capture:
        return CapturingMeter(max_bytes=max(0, max_kb) * 1024, **fields)
    return Meter(**fields)
