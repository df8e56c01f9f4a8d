"""`--capture-bodies`: the request and response bodies of each request, in the `bodies` table.

Off by default. A `CapturingMeter` is the ordinary meter given a `ResponseTap` (proxy/meter/meter.py)
that keeps a copy of the decoded response, cut at `--capture-max-kb` (the `*_truncated` flags say
so), plus the request's decoded body; credentials and obvious secrets are redacted (`redact`) before
they leave the meter. When capture is off the plain `Meter` is used: the relay pays nothing.
"""

from __future__ import annotations

from typing import Any

from proxy.meter.decode import StreamDecoder
from proxy.meter.meter import Meter
from proxy.meter.redact import redact

class _Copy:
    """Keeps the first `limit` bytes given to it, and whether there were more; the meter's
    `ResponseTap` (a WebSocket frame kept as a line of its own)."""

    __slots__ = ("parts", "size", "limit", "truncated")

    def __init__(self, limit: int) -> None:
        self.parts: list[bytes] = []
        self.size, self.limit, self.truncated = 0, limit, False

    def add(self, data: bytes) -> None:
        if self.truncated:
            return
        room = self.limit - self.size
        if len(data) > room:
            self.truncated = True
            data = data[:room]
        if data:
            self.parts.append(data)
            self.size += len(data)

    on_body = add

    def on_frame(self, payload: bytes) -> None:
        self.add(payload + b"\n")

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", "replace")


class CapturingMeter(Meter):
    """Keeps the bodies row in `captured` when the request ends; the recorder hands it to the observers."""

    def __init__(self, *, max_bytes: int, **fields: Any) -> None:
        self._max = max_bytes
        self._response = _Copy(max_bytes)
        super().__init__(tap=self._response, **fields)

    def finish(self, outcome: Any, end_ns: int, error: tuple[str, str] | None = None) -> Any:
        request, request_cut = self._request_text()  # before the row: `finish` lets the request body go
        result = super().finish(outcome, end_ns, error)  # the response's last reads reach the tap here
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
