"""The injected key, masked in what is relayed back to the client.

On a route that injects the upstream key, the client holds only llmtap's client key and must never
learn the real one. Real Anthropic and OpenAI errors mask a key they echo; an aggregator or a
self-hosted gateway may not. So every byte relayed back on such a route (headers, body, WebSocket
frames) has the key replaced by as many `*`: the same length, so a Content-Length stays true and
nothing else of the answer moves.

A stream can split the key between two pieces: a piece's last bytes that could begin the key are
held back and go out with the next piece (or at the end). Only such a suffix is held, so an SSE
event (which ends in a blank line) is never delayed. On such a route the upstream is asked for an
uncompressed answer (`Accept-Encoding: identity`), since a key cannot be found in compressed bytes.
"""

from __future__ import annotations

from collections.abc import Iterable


class KeyMask:
    __slots__ = ("key", "mask", "held")

    def __init__(self, key: str) -> None:
        self.key = key.encode("utf-8", "surrogatepass")
        self.mask = b"*" * len(self.key)
        self.held = b""

    def piece(self, data: bytes) -> bytes:
        """`data` with the key masked; what could begin the key at its end held for the next piece."""
        if self.held:
            data, self.held = self.held + data, b""
        if self.key in data:
            data = data.replace(self.key, self.mask)
        keep = self._key_begins_at_end(data)
        if keep:
            data, self.held = data[:-keep], data[-keep:]
        return data

    def flush(self) -> bytes:
        """The bytes held back, at the body's end (they were not the key)."""
        held, self.held = self.held, b""
        return held

    def whole(self, data: bytes) -> bytes:
        """A piece that is all there is (a body come at once, a WebSocket message)."""
        return self.piece(data) + self.flush()

    def text(self, value: str) -> str:
        key = self.key.decode("utf-8", "surrogatepass")
        return value.replace(key, "*" * len(key)) if key in value else value

    def headers(self, items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        return [(name, self.text(value)) for name, value in items]

    def _key_begins_at_end(self, data: bytes) -> int:
        """How many of `data`'s last bytes are the key's first ones (0: none)."""
        key, first = self.key, self.key[:1]
        at = data.find(first, max(0, len(data) - len(key) + 1))
        while at != -1:
            if key.startswith(data[at:]):
                return len(data) - at
            at = data.find(first, at + 1)
        return 0


def mask_of(credential: str | None) -> KeyMask | None:
    return KeyMask(credential) if credential else None
