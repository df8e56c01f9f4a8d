"""Streaming decompression of the measuring copy, never of the relayed bytes.

The client receives the upstream's compressed bytes untouched; the meter needs
text. Output is bounded so that a body which expands enormously (a
decompression bomb) costs a metric, not memory.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Protocol

try:  # Python 3.14+
    from compression import zstd as _zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the Python version
    try:
        from backports import zstd as _zstd  # type: ignore[no-redef]
    except ImportError:
        _zstd = None

try:
    import brotli as _brotli
except ImportError:  # pragma: no cover
    _brotli = None

DEFAULT_LIMIT = 64 * 1024 * 1024  # decoded bytes measured per response
PIECE = 1024 * 1024  # the most one decompression step returns, so one read never balloons


class DecodeError(Exception):
    pass


class _Codec(Protocol):
    def pieces(self, data: bytes, size: int) -> Iterator[bytes]:
        """Decompress `data` (and whatever input is still buffered), `size` bytes at most at a time."""
        ...

    def complete(self) -> bool:
        """The compressed stream's end was seen."""
        ...


class _Zlib:
    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._d = zlib.decompressobj(wbits)
        self._started = False

    def pieces(self, data: bytes, size: int) -> Iterator[bytes]:
        try:
            out = self._d.decompress(data, size)
        except zlib.error:
            if self._started or self._wbits != 15:
                raise
            self._d = zlib.decompressobj(-15)  # "deflate" sent raw, as some servers do
            out = self._d.decompress(data, size)
        self._started = True
        while True:
            if out:
                yield out
            tail = self._d.unconsumed_tail
            if not tail:
                return
            out = self._d.decompress(tail, size)

    def complete(self) -> bool:
        return self._d.eof


class _Brotli:
    def __init__(self) -> None:
        if _brotli is None:
            raise DecodeError("brotli is not installed")
        if not hasattr(_brotli.Decompressor, "can_accept_more_data"):
            raise DecodeError("brotli >= 1.2 is needed to decode a response within a bound")
        self._d = _brotli.Decompressor()

    def pieces(self, data: bytes, size: int) -> Iterator[bytes]:
        out = self._d.process(data, output_buffer_limit=size)
        while True:
            if out:
                yield out
            if not out or self._d.can_accept_more_data():
                return
            out = self._d.process(b"", output_buffer_limit=size)

    def complete(self) -> bool:
        return bool(self._d.is_finished())


class _Zstd:
    def __init__(self) -> None:
        if _zstd is None:
            raise DecodeError("zstd support is not installed")
        self._d = _zstd.ZstdDecompressor()

    def pieces(self, data: bytes, size: int) -> Iterator[bytes]:
        out = self._d.decompress(data, size)
        while True:
            if out:
                yield out
            d = self._d
            if d.eof:
                if not d.unused_data:
                    return
                self._d = _zstd.ZstdDecompressor()  # concatenated frames
                out = self._d.decompress(d.unused_data, size)
            elif d.needs_input:
                return
            else:
                out = d.decompress(b"", size)

    def complete(self) -> bool:
        return self._d.eof


def _codec(encoding: str) -> _Codec | None:
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return _Zlib(47)  # gzip or zlib header, auto-detected
    if encoding == "deflate":
        return _Zlib(15)
    if encoding == "br":
        return _Brotli()
    if encoding == "zstd":
        return _Zstd()
    raise DecodeError(f"unsupported content-encoding {encoding!r}")


class StreamDecoder:
    """Feeds compressed chunks, yields decompressed pieces, up to `limit` bytes in all.

    No piece is larger than `PIECE`, whatever one compressed read expands to, and
    decoding stops for good (`exhausted`) once `limit` bytes have come out.
    """

    def __init__(self, content_encoding: str | None, limit: int = DEFAULT_LIMIT) -> None:
        codings = [c.strip().lower() for c in (content_encoding or "").split(",") if c.strip()]
        self.encoding = ", ".join(codings)
        self._codecs = [c for c in (_codec(e) for e in reversed(codings)) if c is not None]
        self._left = limit
        self.exhausted = False

    @property
    def identity(self) -> bool:
        return not self._codecs

    @property
    def complete(self) -> bool:
        """Every coding's end was seen (a whole body, not a cut one)."""
        return all(codec.complete() for codec in self._codecs)

    def pieces(self, data: bytes) -> Iterator[bytes]:
        if self.exhausted:
            return
        for piece in self._stage(0, data):
            if len(piece) > self._left:
                piece = piece[: self._left]
                self.exhausted = True
            self._left -= len(piece)
            if piece:
                yield piece
            if self.exhausted:
                return

    def _stage(self, i: int, data: bytes) -> Iterator[bytes]:
        if i == len(self._codecs):
            yield data
            return
        for piece in self._codecs[i].pieces(data, PIECE):
            yield from self._stage(i + 1, piece)

    def feed(self, data: bytes) -> bytes:
        return b"".join(self.pieces(data))


def decode_all(body: bytes, content_encoding: str | None, limit: int = DEFAULT_LIMIT) -> bytes:
    """The whole of a compressed body, bounded; raises DecodeError on bad input."""
    try:
        decoder = StreamDecoder(content_encoding, limit)
        out = decoder.feed(body)
        if not decoder.exhausted and not decoder.complete:
            raise DecodeError(f"the {content_encoding} body is truncated")
        return out
    except DecodeError:
        raise
    except Exception as exc:  # zlib.error, brotli.error, ZstdError
        raise DecodeError(f"cannot decode {content_encoding} body: {exc}") from None
